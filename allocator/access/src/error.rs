//! Refusals of the access check, rendered as RFC 9457 problems. One enum, one status mapping.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use schema::routes::Scope;

use crate::policy::Quota;
use schema::wire::{Problem, ProblemType, PROBLEM_CONTENT_TYPE};

/// The `WWW-Authenticate` challenge of every `401` (RFC 6750 §3).
pub const CHALLENGE: &str = "Bearer realm=\"allocator\"";
/// The challenge when a token was presented but is not valid.
pub const CHALLENGE_INVALID: &str = "Bearer realm=\"allocator\", error=\"invalid_token\"";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AccessError {
    #[error("a bearer token is required (Authorization: Bearer <token>)")]
    MissingToken,
    #[error("the Authorization header is not `Bearer <token>`")]
    MalformedToken,
    #[error("the bearer token is not known")]
    UnknownToken,
    #[error("client {client} does not hold the {} scope this operation requires", scope.as_str())]
    MissingScope { client: String, scope: Scope },
    #[error("this allocator answers routers only; client {client} does not hold the router scope")]
    RouterRequired { client: String },
    #[error("client {client} is over its rate of {rate} requests per second")]
    RateLimited {
        client: String,
        rate: f64,
        retry_after: u64,
    },
    #[error("client {client} already has {limit} requests in flight")]
    ConcurrencyLimited { client: String, limit: usize },
    #[error("client {client} may not touch sku {sku}: it is outside the client's namespaces")]
    OutsideNamespace { client: String, sku: String },
    #[error("client {client} asked for {requested} units; its {} is {limit}", quota.as_str())]
    QuotaExceeded {
        client: String,
        quota: Quota,
        limit: i64,
        requested: i64,
    },
    #[error("the router's client policy header is malformed: {reason}")]
    MalformedPolicy { reason: String },
}

impl AccessError {
    fn kind(&self) -> ProblemType {
        match self {
            AccessError::MissingToken | AccessError::MalformedToken | AccessError::UnknownToken => {
                ProblemType::Unauthenticated
            }
            AccessError::MissingScope { .. }
            | AccessError::RouterRequired { .. }
            | AccessError::MalformedPolicy { .. } => ProblemType::Forbidden,
            AccessError::RateLimited { .. } | AccessError::ConcurrencyLimited { .. } => {
                ProblemType::RateLimited
            }
            AccessError::OutsideNamespace { .. } => ProblemType::NamespaceForbidden,
            AccessError::QuotaExceeded { .. } => ProblemType::QuotaExceeded,
        }
    }

    /// The `outcome` label of the per-client request counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            AccessError::MissingToken | AccessError::MalformedToken | AccessError::UnknownToken => {
                "unauthenticated"
            }
            AccessError::MissingScope { .. }
            | AccessError::RouterRequired { .. }
            | AccessError::MalformedPolicy { .. } => "forbidden",
            AccessError::RateLimited { .. } => "rate_limited",
            AccessError::ConcurrencyLimited { .. } => "concurrency_limited",
            AccessError::OutsideNamespace { .. } => "namespace_forbidden",
            AccessError::QuotaExceeded { .. } => "quota_exceeded",
        }
    }

    /// Why a request was not authenticated (the `reason` label of the unauthenticated-requests
    /// counter); `None` for every other refusal.
    pub fn unauthenticated_reason(&self) -> Option<&'static str> {
        match self {
            AccessError::MissingToken => Some("missing_token"),
            AccessError::MalformedToken => Some("malformed_token"),
            AccessError::UnknownToken => Some("unknown_token"),
            _ => None,
        }
    }

    /// Whether this refusal is one of authentication or authorisation (audited), rather than
    /// of a limit (counted only).
    pub fn is_access_refusal(&self) -> bool {
        !matches!(
            self,
            AccessError::RateLimited { .. }
                | AccessError::ConcurrencyLimited { .. }
                | AccessError::QuotaExceeded { .. }
        )
    }

    /// Seconds to wait before retrying a `429`. A request refused for concurrency may go again
    /// as soon as one of the client's requests finishes; one second keeps retries from spinning.
    fn retry_after(&self) -> Option<u64> {
        match self {
            AccessError::RateLimited { retry_after, .. } => Some(*retry_after),
            AccessError::ConcurrencyLimited { .. } => Some(1),
            _ => None,
        }
    }

    pub fn problem(&self) -> Problem {
        let mut problem =
            Problem::new(self.kind(), self.to_string()).with_status(self.status_code().as_u16());
        if let AccessError::QuotaExceeded { quota, limit, .. } = self {
            problem.quota = Some(quota.as_str().to_owned());
            problem.limit = Some(*limit);
        }
        problem
    }
}

impl ResponseError for AccessError {
    fn status_code(&self) -> StatusCode {
        match self {
            AccessError::MissingToken | AccessError::MalformedToken | AccessError::UnknownToken => {
                StatusCode::UNAUTHORIZED
            }
            AccessError::MissingScope { .. }
            | AccessError::RouterRequired { .. }
            | AccessError::MalformedPolicy { .. }
            | AccessError::OutsideNamespace { .. } => StatusCode::FORBIDDEN,
            // A quota is the client's own allowance too. `max_quantity` refuses the request
            // whenever it is sent, so no `Retry-After` goes with it.
            AccessError::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            // Concurrency too: the client is over its own allowance, and a `503` would make a
            // router treat the owner as unavailable, refresh its map and retry elsewhere.
            AccessError::RateLimited { .. } | AccessError::ConcurrencyLimited { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut builder = HttpResponse::build(self.status_code());
        builder.insert_header((header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE));
        match self {
            AccessError::MissingToken => {
                builder.insert_header((header::WWW_AUTHENTICATE, CHALLENGE));
            }
            AccessError::MalformedToken | AccessError::UnknownToken => {
                builder.insert_header((header::WWW_AUTHENTICATE, CHALLENGE_INVALID));
            }
            _ => {}
        }
        if let Some(seconds) = self.retry_after() {
            builder.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        builder.body(serde_json::to_string(&self.problem()).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::wire::problem_type;

    #[test]
    fn statuses_types_and_headers() {
        let cases = [
            (
                AccessError::MissingToken,
                401,
                problem_type::UNAUTHENTICATED,
            ),
            (
                AccessError::UnknownToken,
                401,
                problem_type::UNAUTHENTICATED,
            ),
            (
                AccessError::MissingScope {
                    client: "a".into(),
                    scope: Scope::Admin,
                },
                403,
                problem_type::FORBIDDEN,
            ),
            (
                AccessError::RateLimited {
                    client: "a".into(),
                    rate: 1.0,
                    retry_after: 3,
                },
                429,
                problem_type::RATE_LIMITED,
            ),
            (
                AccessError::OutsideNamespace {
                    client: "a".into(),
                    sku: "other:1".into(),
                },
                403,
                problem_type::NAMESPACE_FORBIDDEN,
            ),
            (
                AccessError::QuotaExceeded {
                    client: "a".into(),
                    quota: Quota::MaxQuantity,
                    limit: 2,
                    requested: 3,
                },
                429,
                problem_type::QUOTA_EXCEEDED,
            ),
        ];
        for (error, status, kind) in cases {
            let response = error.error_response();
            assert_eq!(response.status().as_u16(), status, "{error}");
            assert_eq!(error.problem().kind, kind);
            assert_eq!(error.problem().status, status);
            assert_eq!(
                response.headers().get(header::CONTENT_TYPE).unwrap(),
                PROBLEM_CONTENT_TYPE
            );
            assert_eq!(
                response.headers().contains_key(header::WWW_AUTHENTICATE),
                status == 401
            );
        }
        let limited = AccessError::RateLimited {
            client: "a".into(),
            rate: 1.0,
            retry_after: 3,
        }
        .error_response();
        assert_eq!(limited.headers().get(header::RETRY_AFTER).unwrap(), "3");
        let quota = AccessError::QuotaExceeded {
            client: "a".into(),
            quota: Quota::MaxQuantity,
            limit: 2,
            requested: 3,
        };
        let problem = quota.problem();
        assert_eq!(
            (problem.quota.as_deref(), problem.limit),
            (Some("max_quantity"), Some(2))
        );
        assert!(!quota
            .error_response()
            .headers()
            .contains_key(header::RETRY_AFTER));
    }
}
