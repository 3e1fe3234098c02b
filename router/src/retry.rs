//! The router's side of the retry rules: which upstream failures it retries, how it counts and
//! describes them, and what it answers when it gives up.
//!
//! Retrying is safe only because every mutating request the router forwards carries an id
//! (reservation id, adjustment id, or the reservation id in the path for confirm/release) and the
//! allocator replays the stored outcome for a known id (DESIGN.md §2 I3). GETs are naturally safe.
//!
//! When the router gives up it must tell the client whether the request *may* have been applied,
//! so the client knows to retry with the same id rather than assume nothing happened. That rule
//! is not written here: [`AttemptFailure::may_have_applied`] asks the client crate's
//! ([`allocator_client::retry::Attempt::may_have_applied`]), the one the client applies to the
//! router's own answers, so the two cannot drift. In short: nothing sent (a connection never
//! made) or a `421`/`503` the allocator answers before touching the database → not applied,
//! except a `503` whose problem says `outcome_unknown: true`; a timeout or a connection lost
//! after the request was (possibly) written → may be applied (a reset on a kept-alive connection
//! included: the router cannot tell "the peer was already dead" from "the peer read the request
//! and then crashed").
//!
//! What stays here is the router's own: failures that send nothing and that only a router has
//! (no owner in the map, an `http://` owner while the router speaks only TLS to allocators),
//! which count as a connection never made; `421` telling the forwarder to re-read the map before
//! the next attempt; only `421` and `503` being retried statuses (a `502`/`504` is a gateway's
//! answer, passed through); the `cause` label of the retry metric; and the give-up status.
//!
//! "May have been applied" is sticky across the attempts of one request: a timeout on attempt 1
//! followed by a clean `503` on attempt 2 still leaves attempt 1 possibly committed.
//!
//! Backoff ([`edge::Backoff`]) is exponential with "equal jitter": the delay for attempt `n`
//! lies in `[d/2, d]` with `d = min(max, base * 2^n)`. The lower half bound keeps a minimum spacing (a
//! crashed owner is not hammered); the random upper half spreads out many routers retrying the
//! same partition after one failover.

use allocator_client::retry::{Attempt, FailureKind};

/// Why an upstream attempt failed in a retryable way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// The map names no live owner for the partition (or is not loaded yet); nothing was sent.
    NoOwner,
    /// The allocator answered `421`: it does not own the partition (or not at the epoch we
    /// expected).
    Misdirected,
    /// The allocator answered `503`: the partition has no confirmed owner right now.
    Unavailable,
    /// The allocator answered `503` with `outcome_unknown: true`: it accepted the request but its
    /// own deadline passed first, so the request may still commit.
    Overdue,
    /// The connection could not be established (refused, unreachable, connect timeout).
    ConnectFailed,
    /// The owner advertises a plain `http://` URL while this router speaks only TLS to
    /// allocators (`--upstream-ca`): nothing was sent, no token left in clear text.
    PlainOwner,
    /// The attempt timed out after the connection was up: the request may be executing.
    Timeout,
    /// The connection broke after the request was (possibly) written: reset, closed mid-body.
    ConnectionLost,
}

/// The `cause` label of `router_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    Misdirected,
    Unavailable,
    Connect,
    Timeout,
}

impl RetryCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Misdirected => "misdirected",
            Self::Unavailable => "unavailable",
            Self::Connect => "connect",
            Self::Timeout => "timeout",
        }
    }
}

impl AttemptFailure {
    pub fn cause(self) -> RetryCause {
        match self {
            Self::NoOwner | Self::Unavailable | Self::Overdue => RetryCause::Unavailable,
            Self::Misdirected => RetryCause::Misdirected,
            Self::ConnectFailed | Self::PlainOwner | Self::ConnectionLost => RetryCause::Connect,
            Self::Timeout => RetryCause::Timeout,
        }
    }

    /// This failure as the client crate's rules see an attempt. The router-only failures that
    /// send nothing (no owner, a plain `http://` owner) are a connection never made.
    pub fn attempt(self) -> Attempt {
        let answered = |status, outcome_unknown| Attempt::Answered {
            status,
            retry_after: None,
            outcome_unknown,
        };
        match self {
            Self::NoOwner | Self::PlainOwner | Self::ConnectFailed => {
                Attempt::Failed(FailureKind::Connect)
            }
            Self::Timeout => Attempt::Failed(FailureKind::Timeout),
            Self::ConnectionLost => Attempt::Failed(FailureKind::Io),
            Self::Misdirected => answered(421, None),
            Self::Unavailable => answered(503, None),
            Self::Overdue => answered(503, Some(true)),
        }
    }

    /// Whether the allocator may have applied the request during this attempt, by the client
    /// crate's rule.
    pub fn may_have_applied(self) -> bool {
        self.attempt().may_have_applied()
    }

    /// Classify a failed transport attempt. A connect error is checked first: a connect timeout
    /// is both a timeout and a connect error, and nothing was sent in that case.
    pub fn from_transport_flags(is_connect: bool, is_timeout: bool) -> Self {
        if is_connect {
            Self::ConnectFailed
        } else if is_timeout {
            Self::Timeout
        } else {
            Self::ConnectionLost
        }
    }

    /// Classify an upstream status (and the `outcome_unknown` member of its problem body);
    /// `None` means the answer is final and goes to the client. Only `421` and `503` are retried;
    /// whether a `503` may have been applied is the client crate's rule.
    pub fn from_status(status: u16, outcome_unknown: Option<bool>) -> Option<Self> {
        match status {
            421 => Some(Self::Misdirected),
            503 => {
                let attempt = Attempt::Answered {
                    status,
                    retry_after: None,
                    outcome_unknown,
                };
                Some(if attempt.may_have_applied() {
                    Self::Overdue
                } else {
                    Self::Unavailable
                })
            }
            _ => None,
        }
    }
}

/// The HTTP status the router answers with when it gives up: `504` when the last attempt timed
/// out (the owner is there but slow), `503` otherwise.
pub fn give_up_status(last: AttemptFailure) -> u16 {
    if last == AttemptFailure::Timeout {
        504
    } else {
        503
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_unknown_only_after_possibly_sending() {
        use AttemptFailure::*;
        for f in [NoOwner, Misdirected, Unavailable, ConnectFailed, PlainOwner] {
            assert!(!f.may_have_applied(), "{f:?}");
        }
        for f in [Overdue, Timeout, ConnectionLost] {
            assert!(f.may_have_applied(), "{f:?}");
        }
    }

    #[test]
    fn transport_classification_prefers_connect() {
        // A connect timeout never sent anything.
        assert_eq!(
            AttemptFailure::from_transport_flags(true, true),
            AttemptFailure::ConnectFailed
        );
        assert_eq!(
            AttemptFailure::from_transport_flags(true, false),
            AttemptFailure::ConnectFailed
        );
        assert_eq!(
            AttemptFailure::from_transport_flags(false, true),
            AttemptFailure::Timeout
        );
        assert_eq!(
            AttemptFailure::from_transport_flags(false, false),
            AttemptFailure::ConnectionLost
        );
    }

    #[test]
    fn only_421_and_503_are_retried_statuses() {
        assert_eq!(
            AttemptFailure::from_status(421, None),
            Some(AttemptFailure::Misdirected)
        );
        assert_eq!(
            AttemptFailure::from_status(503, None),
            Some(AttemptFailure::Unavailable)
        );
        assert_eq!(
            AttemptFailure::from_status(503, Some(false)),
            Some(AttemptFailure::Unavailable)
        );
        // The owner took the request but ran out of time: it may still commit.
        assert_eq!(
            AttemptFailure::from_status(503, Some(true)),
            Some(AttemptFailure::Overdue)
        );
        for s in [200, 201, 400, 404, 409, 413, 422, 500, 502, 504] {
            assert_eq!(AttemptFailure::from_status(s, None), None, "{s}");
        }
    }

    #[test]
    fn causes_and_give_up_status() {
        assert_eq!(AttemptFailure::NoOwner.cause(), RetryCause::Unavailable);
        assert_eq!(AttemptFailure::ConnectionLost.cause(), RetryCause::Connect);
        assert_eq!(give_up_status(AttemptFailure::Timeout), 504);
        assert_eq!(give_up_status(AttemptFailure::ConnectFailed), 503);
        assert_eq!(give_up_status(AttemptFailure::Misdirected), 503);
        assert_eq!(give_up_status(AttemptFailure::PlainOwner), 503);
    }
}
