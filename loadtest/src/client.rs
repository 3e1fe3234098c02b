//! The HTTP side: one [`allocator_client::Client`] for the whole process (its pooled HTTP/1.1
//! transport and its retry rule), and the labels the reports count calls and attempts by.
//!
//! The retry rule is the client crate's (DESIGN.md §1, §9): an ambiguous or "try again" answer
//! — `503` (no confirmed owner; `Retry-After`), `421` (allocator: not the owner), `502`/`504`
//! (router gave up upstream), a timeout, a refused or broken connection — is retried with the
//! *same* request (same reservation or adjustment id, so the server replays the original
//! outcome) until the operation's deadline. Every attempt is recorded into the operation's
//! [`OpTrace`] (status or transport failure, latency) and every retry by its cause.

use std::time::Duration;

use allocator_client::backoff::Backoff;
use allocator_client::{Attempt, Client, Error, Last, Observe, Policy};

use crate::stats::OpTrace;

/// The process's client of `target`.
pub fn api(
    target: &str,
    request_timeout: Duration,
    connect_timeout: Duration,
    deadline: Duration,
    backoff: Backoff,
    max_idle: usize,
    token: Option<String>,
) -> anyhow::Result<Client> {
    let mut builder = Client::builder(target)
        .policy(Policy {
            attempt_timeout: request_timeout,
            deadline,
            backoff,
        })
        .connect_timeout(connect_timeout)
        .max_idle_per_host(max_idle);
    if let Some(token) = token {
        builder = builder.token(token);
    }
    Ok(builder.build()?)
}

impl Observe for OpTrace {
    fn attempt(&mut self, attempt: &Attempt, elapsed: Duration) {
        self.attempts.push((attempt.label().into_owned(), elapsed));
    }

    fn retry(&mut self, cause: &Attempt, _delay: Duration) {
        self.retries.push(cause.label().into_owned());
    }
}

/// How a failed call is counted: `insufficient_stock`, `idempotency_mismatch`, `order_failed`,
/// `invalid_state`, `not_found`, `gave_up_{cause}` (the deadline passed on a retryable last
/// attempt), `unparsable_{status}` (a success without the documented body), `http_{status}`.
pub fn failure_label(error: &Error) -> String {
    match error {
        Error::InsufficientStock(_) => "insufficient_stock".to_owned(),
        Error::IdempotencyMismatch(_) => "idempotency_mismatch".to_owned(),
        Error::OrderFailed(_) => "order_failed".to_owned(),
        Error::InvalidState(_) => "invalid_state".to_owned(),
        Error::NotFound(_) => "not_found".to_owned(),
        Error::Unavailable { last } | Error::OutcomeUnknown { last, .. } => match &**last {
            Last::Transport(e) => format!("gave_up_{}", e.kind.as_str()),
            Last::Answer { status, .. } if matches!(status, 421 | 502 | 503 | 504) => {
                format!("gave_up_{status}")
            }
            Last::Answer { status, .. } => format!("http_{status}"),
        },
        Error::Unexpected { status, .. } if (200..300).contains(status) => {
            format!("unparsable_{status}")
        }
        other => other
            .status()
            .map_or_else(|| "error".to_owned(), |s| format!("http_{s}")),
    }
}

/// Whether a failed call may have left something held: it may have been applied, it gave up
/// (re-read after the run either way), or it is a `5xx` or an unreadable success.
pub fn may_hold(error: &Error) -> bool {
    match error {
        Error::OutcomeUnknown { .. } | Error::Unavailable { .. } => true,
        other => other
            .status()
            .is_none_or(|s| s >= 500 || (200..300).contains(&s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocator_client::wire::{Problem, ProblemType};
    use allocator_client::{FailureKind, TransportError};

    fn problem(kind: ProblemType) -> Box<Problem> {
        Box::new(Problem::new(kind, "x"))
    }

    #[test]
    fn failures_are_labelled_as_the_reports_count_them() {
        let stock = Error::InsufficientStock(problem(ProblemType::InsufficientStock));
        assert_eq!(failure_label(&stock), "insufficient_stock");
        assert!(!may_hold(&stock));
        let timeout = Error::OutcomeUnknown {
            id: None,
            last: Box::new(Last::Transport(TransportError {
                kind: FailureKind::Timeout,
                status: None,
                detail: String::new(),
            })),
        };
        assert_eq!(failure_label(&timeout), "gave_up_timeout");
        assert!(may_hold(&timeout));
        let unavailable = Error::Unavailable {
            last: Box::new(Last::Answer {
                status: 503,
                problem: None,
            }),
        };
        assert_eq!(failure_label(&unavailable), "gave_up_503");
        let limited = Error::RateLimited {
            retry_after: None,
            problem: problem(ProblemType::RateLimited),
        };
        assert_eq!(failure_label(&limited), "http_429");
        assert!(!may_hold(&limited));
        let internal = Error::Unexpected {
            status: 500,
            problem: None,
            detail: String::new(),
        };
        assert_eq!(failure_label(&internal), "http_500");
        assert!(may_hold(&internal));
        let unparsable = Error::Unexpected {
            status: 201,
            problem: None,
            detail: String::new(),
        };
        assert_eq!(failure_label(&unparsable), "unparsable_201");
    }
}
