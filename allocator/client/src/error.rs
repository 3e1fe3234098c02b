//! What a call can fail with: one variant per problem type a caller acts on, and the two ways a
//! call runs out of time.

use std::fmt;
use std::time::Duration;

use schema::wire::{InvalidValue, Problem, ProblemType};

use crate::order::OrderFailure;
use crate::transport::{Response, TransportError};

/// A call that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `409 insufficient-stock`: `problem.available` says what was left.
    #[error("insufficient stock: {}", detail(.0))]
    InsufficientStock(Box<Problem>),
    /// `404 not-found`: no such SKU, reservation or stream.
    #[error("not found: {}", detail(.0))]
    NotFound(Box<Problem>),
    /// `422 idempotency-mismatch`: the id was used before with another payload.
    #[error("id reused with a different payload: {}", detail(.0))]
    IdempotencyMismatch(Box<Problem>),
    /// `409 invalid-state`: the reservation is not in a state that allows it
    /// (`problem.current_status`).
    #[error("transition not allowed: {}", detail(.0))]
    InvalidState(Box<Problem>),
    /// `409 shrink-below-held`: an adjustment would leave less on hand than is held.
    #[error("shrink below held stock: {}", detail(.0))]
    ShrinkBelowHeld(Box<Problem>),
    /// `409 order-failed`: no line of the order is held; each line's outcome is listed.
    #[error("order failed: {}", detail(&.0.problem))]
    OrderFailed(Box<OrderFailure>),
    /// `429 rate-limited`, with the server's `Retry-After`.
    #[error("rate limited (retry after {retry_after:?}): {}", detail(problem))]
    RateLimited {
        retry_after: Option<Duration>,
        problem: Box<Problem>,
    },
    /// `429 quota-exceeded`: `problem.quota` names the quota, `problem.limit` its value.
    #[error("quota exceeded: {}", detail(.0))]
    QuotaExceeded(Box<Problem>),
    /// `401 unauthenticated`: no token, or one the service does not know.
    #[error("unauthorized: {}", detail(.0))]
    Unauthorized(Box<Problem>),
    /// `403 forbidden` (a scope the token lacks) or `403 namespace-forbidden` (a SKU outside the
    /// client's namespaces).
    #[error("forbidden: {}", detail(.0))]
    Forbidden(Box<Problem>),
    /// `400 invalid-request` (also `405`, `413`), or a request value this client refused before
    /// sending it.
    #[error("invalid request: {}", detail(.0))]
    Invalid(Box<Problem>),
    /// The deadline passed and no attempt can have been applied (every one was refused before
    /// the service acted, or never sent).
    #[error("unavailable until the deadline: {last}")]
    Unavailable { last: Box<Last> },
    /// The deadline passed, or a refusal ended the call, after an attempt that may have been
    /// applied. Retry with the same `id` to learn the outcome.
    #[error("outcome unknown for id {id:?}: {last}")]
    OutcomeUnknown { id: Option<String>, last: Box<Last> },
    /// Any other answer: `500 internal`, a problem type this client does not know, or a body that
    /// is not what the route documents.
    #[error("unexpected answer {status}: {detail}")]
    Unexpected {
        status: u16,
        problem: Option<Box<Problem>>,
        detail: String,
    },
}

/// The last attempt of a call that ran out of time.
#[derive(Debug, Clone)]
pub enum Last {
    /// A retryable answer (`503`, `421`, `502`, `504`), with its problem if it had one.
    Answer {
        status: u16,
        problem: Option<Problem>,
    },
    /// No answer.
    Transport(TransportError),
}

impl fmt::Display for Last {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Last::Answer {
                status,
                problem: Some(problem),
            } => write!(f, "{status} {}", detail(problem)),
            Last::Answer { status, .. } => write!(f, "{status}"),
            Last::Transport(error) => write!(f, "{error}"),
        }
    }
}

impl Last {
    pub(crate) fn of(last: Result<Response, TransportError>) -> Last {
        match last {
            Ok(response) => Last::Answer {
                status: response.status.as_u16(),
                problem: serde_json::from_slice(&response.body).ok(),
            },
            Err(error) => Last::Transport(error),
        }
    }
}

fn detail(problem: &Problem) -> &str {
    problem.detail.as_deref().unwrap_or(&problem.title)
}

impl Error {
    /// The error of a final, unsuccessful answer.
    pub fn from_answer(response: &Response) -> Error {
        let status = response.status.as_u16();
        let problem: Problem = match serde_json::from_slice(&response.body) {
            Ok(problem) => problem,
            Err(_) => {
                return Error::Unexpected {
                    status,
                    problem: None,
                    detail: String::from_utf8_lossy(&response.body)
                        .chars()
                        .take(200)
                        .collect(),
                }
            }
        };
        let problem = Box::new(problem);
        match ProblemType::from_uri(&problem.kind) {
            Some(ProblemType::InsufficientStock) => Error::InsufficientStock(problem),
            Some(ProblemType::NotFound) => Error::NotFound(problem),
            Some(ProblemType::IdempotencyMismatch) => Error::IdempotencyMismatch(problem),
            Some(ProblemType::InvalidState) => Error::InvalidState(problem),
            Some(ProblemType::ShrinkBelowHeld) => Error::ShrinkBelowHeld(problem),
            Some(ProblemType::OrderFailed) => Error::OrderFailed(Box::new(
                serde_json::from_slice(&response.body).unwrap_or_else(|_| OrderFailure {
                    problem: *problem,
                    order_id: String::new(),
                    lines: Vec::new(),
                }),
            )),
            Some(ProblemType::RateLimited) => Error::RateLimited {
                retry_after: response.retry_after(),
                problem,
            },
            Some(ProblemType::QuotaExceeded) => Error::QuotaExceeded(problem),
            Some(ProblemType::Unauthenticated) => Error::Unauthorized(problem),
            Some(ProblemType::Forbidden | ProblemType::NamespaceForbidden) => {
                Error::Forbidden(problem)
            }
            Some(ProblemType::InvalidRequest) => Error::Invalid(problem),
            _ => Error::Unexpected {
                status,
                detail: detail(&problem).to_owned(),
                problem: Some(problem),
            },
        }
    }

    /// Whether this refusal settles the outcome of the id even after an earlier attempt that
    /// may have been applied: the service decided it from the id's stored state (a replayed
    /// refusal, an unknown SKU or id, a state that allows no transition) or from the request
    /// itself. A refusal before the id was looked at (credentials, rate limits, quotas) or an
    /// unexpected answer does not: the earlier attempt may still have taken effect.
    pub fn is_definitive(&self) -> bool {
        matches!(
            self,
            Error::InsufficientStock(_)
                | Error::NotFound(_)
                | Error::IdempotencyMismatch(_)
                | Error::InvalidState(_)
                | Error::ShrinkBelowHeld(_)
                | Error::OrderFailed(_)
                | Error::Invalid(_)
        )
    }

    /// Whether the call may have been applied although it failed.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Error::OutcomeUnknown { .. })
    }

    /// The problem document the service answered with, if any.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::InsufficientStock(p)
            | Error::NotFound(p)
            | Error::IdempotencyMismatch(p)
            | Error::InvalidState(p)
            | Error::ShrinkBelowHeld(p)
            | Error::QuotaExceeded(p)
            | Error::Unauthorized(p)
            | Error::Forbidden(p)
            | Error::Invalid(p)
            | Error::RateLimited { problem: p, .. } => Some(p),
            Error::OrderFailed(failure) => Some(&failure.problem),
            Error::Unexpected { problem, .. } => problem.as_deref(),
            Error::Unavailable { last } | Error::OutcomeUnknown { last, .. } => match &**last {
                Last::Answer { problem, .. } => problem.as_ref(),
                Last::Transport(_) => None,
            },
        }
    }

    /// The HTTP status of the answer behind this error; `None` when the last attempt got none.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Unexpected { status, .. } => Some(*status),
            Error::Unavailable { last } | Error::OutcomeUnknown { last, .. } => match &**last {
                Last::Answer { status, .. } => Some(*status),
                Last::Transport(_) => None,
            },
            other => other.problem().map(|p| p.status),
        }
    }
}

impl From<InvalidValue> for Error {
    /// A request value refused before sending, in the words the service would have used.
    fn from(error: InvalidValue) -> Error {
        Error::Invalid(Box::new(Problem::new(ProblemType::InvalidRequest, error.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: serde_json::Value) -> Response {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        Response {
            status: http::StatusCode::from_u16(status).unwrap(),
            headers,
            body: serde_json::to_vec(&body).unwrap().into(),
        }
    }

    fn problem(kind: ProblemType) -> serde_json::Value {
        serde_json::to_value(Problem::new(kind, "because")).unwrap()
    }

    #[test]
    fn every_problem_type_a_caller_acts_on_has_its_variant() {
        let cases = [
            (ProblemType::InsufficientStock, "InsufficientStock"),
            (ProblemType::NotFound, "NotFound"),
            (ProblemType::IdempotencyMismatch, "IdempotencyMismatch"),
            (ProblemType::InvalidState, "InvalidState"),
            (ProblemType::ShrinkBelowHeld, "ShrinkBelowHeld"),
            (ProblemType::OrderFailed, "OrderFailed"),
            (ProblemType::RateLimited, "RateLimited"),
            (ProblemType::QuotaExceeded, "QuotaExceeded"),
            (ProblemType::Unauthenticated, "Unauthorized"),
            (ProblemType::Forbidden, "Forbidden"),
            (ProblemType::NamespaceForbidden, "Forbidden"),
            (ProblemType::InvalidRequest, "Invalid"),
            (ProblemType::Internal, "Unexpected"),
        ];
        for (kind, variant) in cases {
            let error = Error::from_answer(&answer(kind.status(), problem(kind)));
            assert!(
                format!("{error:?}").starts_with(variant),
                "{kind:?}: {error:?}"
            );
            assert_eq!(error.status(), Some(kind.status()), "{kind:?}");
            assert_eq!(error.problem().map(|p| p.kind.as_str()), Some(kind.uri()));
        }
        match Error::from_answer(&answer(429, problem(ProblemType::RateLimited))) {
            Error::RateLimited { retry_after, .. } => {
                assert_eq!(retry_after, Some(Duration::from_secs(2)))
            }
            other => panic!("{other:?}"),
        }
        let garbage = Response {
            body: "<html>bad gateway</html>".into(),
            ..answer(500, serde_json::Value::Null)
        };
        assert!(matches!(
            Error::from_answer(&garbage),
            Error::Unexpected {
                status: 500,
                problem: None,
                ..
            }
        ));
    }

    #[test]
    fn only_refusals_decided_by_the_id_or_the_request_are_definitive() {
        let definitive = |kind: ProblemType| {
            Error::from_answer(&answer(kind.status(), problem(kind))).is_definitive()
        };
        for kind in [
            ProblemType::InsufficientStock,
            ProblemType::NotFound,
            ProblemType::IdempotencyMismatch,
            ProblemType::InvalidState,
            ProblemType::OrderFailed,
            ProblemType::InvalidRequest,
        ] {
            assert!(definitive(kind), "{kind:?}");
        }
        for kind in [
            ProblemType::Unauthenticated,
            ProblemType::Forbidden,
            ProblemType::RateLimited,
            ProblemType::QuotaExceeded,
            ProblemType::Internal,
        ] {
            assert!(!definitive(kind), "{kind:?}");
        }
    }

    #[test]
    fn an_order_failure_keeps_its_lines() {
        let mut body = problem(ProblemType::OrderFailed);
        body["order_id"] = "o-1".into();
        body["lines"] = serde_json::json!([{
            "index": 0, "sku": "a", "quantity": 2, "reservation_id": "order:o-1:0",
            "outcome": "refused", "compensation": "not_held",
            "problem": Problem::new(ProblemType::InsufficientStock, "none left"),
        }]);
        match Error::from_answer(&answer(409, body)) {
            Error::OrderFailed(failure) => {
                assert_eq!(failure.order_id, "o-1");
                assert_eq!(failure.lines[0].outcome, "refused");
                assert_eq!(failure.lines[0].compensation.as_deref(), Some("not_held"));
            }
            other => panic!("{other:?}"),
        }
    }
}
