//! The router's own errors, each rendered as an RFC 9457 `application/problem+json` answer.
//!
//! Answers that come from an allocator (out of stock, invalid state, ...) are not errors here:
//! they are passed through verbatim by [`crate::forward`]. This enum covers what the router itself
//! decides: bad input, an unknown reservation, PostgreSQL unreachable for a routing lookup, and
//! giving up on an upstream within the retry deadline.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use schema::wire::{Problem, ProblemType};

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// Malformed, oversized or out-of-bounds input; never forwarded.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// The router knows the thing does not exist (e.g. no reservation with that id).
    #[error("not found: {0}")]
    NotFound(String),

    /// The id was used before with another request, as its home shard's directory records
    /// (DESIGN.md §12): the `422` one database gives.
    #[error("idempotency mismatch: {0}")]
    IdempotencyMismatch(String),

    /// PostgreSQL could not answer a routing lookup (reservation → partition) in time.
    #[error("routing storage unavailable: {0}")]
    Storage(String),

    /// Retries were exhausted. `outcome_unknown` tells the client whether the request may have
    /// been applied, i.e. whether it must retry with the same id before assuming anything.
    #[error("upstream unavailable for partition {partition:?}: {detail}")]
    Upstream {
        /// 503, or 504 when the last attempt timed out.
        status: u16,
        outcome_unknown: bool,
        partition: Option<u32>,
        detail: String,
    },

    /// A bug; should never be produced.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RouterError {
    /// The problem document for this error; type and title come from [`ProblemType`], so they
    /// read the same as the allocator's.
    pub fn problem(&self) -> Problem {
        let status = self.status_code().as_u16();
        match self {
            RouterError::InvalidRequest(detail) => {
                Problem::new(ProblemType::InvalidRequest, detail)
            }
            RouterError::NotFound(detail) => Problem::new(ProblemType::NotFound, detail),
            RouterError::IdempotencyMismatch(detail) => {
                Problem::new(ProblemType::IdempotencyMismatch, detail)
            }
            RouterError::Storage(detail) => Problem {
                outcome_unknown: Some(false),
                ..Problem::new(ProblemType::StorageUnavailable, detail)
            },
            RouterError::Upstream {
                outcome_unknown,
                partition,
                detail,
                ..
            } => Problem {
                partition: *partition,
                outcome_unknown: Some(*outcome_unknown),
                ..Problem::new(ProblemType::UpstreamUnavailable, detail)
            },
            RouterError::Internal(detail) => Problem::new(ProblemType::Internal, detail),
        }
        .with_status(status)
    }
}

impl ResponseError for RouterError {
    fn status_code(&self) -> StatusCode {
        match self {
            RouterError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            RouterError::NotFound(_) => StatusCode::NOT_FOUND,
            RouterError::IdempotencyMismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
            RouterError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
            RouterError::Upstream { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            RouterError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        edge::problem::body(edge::problem::builder(self.status_code()), &self.problem())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header;
    use schema::wire::{problem_type, PROBLEM_CONTENT_TYPE};

    #[test]
    fn upstream_problem_carries_outcome_unknown() {
        let err = RouterError::Upstream {
            status: 504,
            outcome_unknown: true,
            partition: Some(7),
            detail: "timed out".into(),
        };
        assert_eq!(err.status_code(), StatusCode::GATEWAY_TIMEOUT);
        let p = err.problem();
        assert_eq!(p.kind, problem_type::UPSTREAM_UNAVAILABLE);
        assert_eq!(p.status, 504);
        assert_eq!(p.outcome_unknown, Some(true));
        assert_eq!(p.partition, Some(7));
    }

    #[test]
    fn invalid_request_is_400_problem() {
        let resp = RouterError::InvalidRequest("bad".into()).error_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            resp.headers().get(header::CONTENT_TYPE).unwrap(),
            PROBLEM_CONTENT_TYPE
        );
    }
}
