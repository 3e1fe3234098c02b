//! The pure rules of retrying one call: which attempts are retried, whether an attempt may have
//! been applied, how long to wait, and when to give up; and the loop that follows them over any
//! transport and clock ([`run`]), so the rules are tested with a fake of each.
//!
//! The rules are the router's towards its allocators (DESIGN.md §1, §9), seen from the caller:
//!
//! * never sent (connection refused, connect timeout) → not applied;
//! * `421` (not the owner) → not applied: an allocator answers it before touching the database;
//! * `503` → not applied, unless its problem says `outcome_unknown: true` (an allocator whose own
//!   deadline passed with the request queued, or a router that gave up after such an attempt);
//! * `502`/`504` → may be applied, unless its problem says `outcome_unknown: false`;
//! * a timeout or a connection lost after the request was (possibly) written → may be applied.
//!
//! "May have been applied" sticks across the attempts of one call.
//!
//! These rules live here, in the client crate and outside its `http` feature, because they are
//! the contract between every caller and the services: the router judges its own attempts
//! towards allocators by [`Attempt::may_have_applied`] too (`router::retry`), so what a router
//! tells its client and what this client concludes by itself cannot drift apart. The crate
//! depends on no service crate, so the router can depend on it without a circle.

use std::borrow::Cow;
use std::future::Future;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// How long one call may take and how it waits between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Longest wait for one attempt's answer (never beyond the deadline).
    pub attempt_timeout: Duration,
    /// Total time of one call, attempts and waits included. Zero makes one attempt only.
    pub deadline: Duration,
    /// The wait before each retry.
    pub backoff: Backoff,
}

impl Policy {
    /// 10 s per attempt, 30 s per call, waits from 25 ms up to 1 s.
    pub const DEFAULT: Policy = Policy {
        attempt_timeout: Duration::from_secs(10),
        deadline: Duration::from_secs(30),
        backoff: Backoff {
            base: Duration::from_millis(25),
            max: Duration::from_secs(1),
        },
    };

    /// The same timeout, one attempt only.
    pub fn once(self) -> Policy {
        Policy {
            deadline: Duration::ZERO,
            ..self
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::DEFAULT
    }
}

/// A transport failure, by what it says about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// No connection could be made: the request was never sent.
    Connect,
    /// No (complete) answer within the attempt's timeout: the request may be executing.
    Timeout,
    /// The connection broke after the request was (possibly) written: reset, closed mid-answer.
    Io,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Io => "io",
        }
    }
}

/// How one attempt ended, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// An HTTP answer, with its `Retry-After` and the `outcome_unknown` member of its problem.
    Answered {
        status: u16,
        retry_after: Option<Duration>,
        outcome_unknown: Option<bool>,
    },
    /// No answer.
    Failed(FailureKind),
}

impl Attempt {
    /// Whether the call goes on after this attempt (if its deadline allows).
    pub fn is_retryable(&self) -> bool {
        match self {
            Attempt::Answered { status, .. } => matches!(status, 421 | 502 | 503 | 504),
            Attempt::Failed(_) => true,
        }
    }

    /// Whether the request may have been applied during this retryable attempt. A final answer
    /// is judged by what it says instead ([`crate::Error::is_definitive`]).
    pub fn may_have_applied(&self) -> bool {
        match *self {
            Attempt::Failed(kind) => kind != FailureKind::Connect,
            Attempt::Answered {
                status: 503,
                outcome_unknown,
                ..
            } => outcome_unknown == Some(true),
            Attempt::Answered {
                status: 502 | 504,
                outcome_unknown,
                ..
            } => outcome_unknown != Some(false),
            Attempt::Answered { .. } => false,
        }
    }

    /// The server's requested wait, if it named one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Attempt::Answered { retry_after, .. } => *retry_after,
            Attempt::Failed(_) => None,
        }
    }

    /// `"503"`, `"timeout"`, `"connect"`, `"io"`: the label an attempt or a retry is counted by.
    pub fn label(&self) -> Cow<'static, str> {
        match self {
            Attempt::Answered { status, .. } => Cow::Owned(status.to_string()),
            Attempt::Failed(kind) => Cow::Borrowed(kind.as_str()),
        }
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The attempt's answer is final.
    Done,
    /// Wait this long, then try again.
    Wait(Duration),
    /// The next attempt would start past the deadline.
    GiveUp,
}

/// One call's retry state.
#[derive(Debug, Clone)]
pub struct Retrying {
    policy: Policy,
    deadline: Instant,
    retries: u32,
    maybe_applied: bool,
}

impl Retrying {
    pub fn new(policy: Policy, now: Instant) -> Retrying {
        Retrying {
            policy,
            deadline: now + policy.deadline,
            retries: 0,
            maybe_applied: false,
        }
    }

    /// The next attempt's timeout: the policy's, but never past the deadline (at least 1 ms, so
    /// that a last attempt is still made).
    pub fn attempt_timeout(&self, now: Instant) -> Duration {
        let left = self.deadline.saturating_duration_since(now);
        if self.policy.deadline.is_zero() {
            return self.policy.attempt_timeout;
        }
        self.policy
            .attempt_timeout
            .min(left)
            .max(Duration::from_millis(1))
    }

    /// Whether any attempt so far may have been applied.
    pub fn maybe_applied(&self) -> bool {
        self.maybe_applied
    }

    /// Retries made so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// After `attempt` ended at `now`; `unit` is uniform in `[0, 1)` for the jitter.
    pub fn after(&mut self, attempt: &Attempt, now: Instant, unit: f64) -> Step {
        if !attempt.is_retryable() {
            return Step::Done;
        }
        self.maybe_applied |= attempt.may_have_applied();
        let delay = self
            .policy
            .backoff
            .delay_after_with(self.retries, attempt.retry_after(), unit);
        if now + delay >= self.deadline {
            return Step::GiveUp;
        }
        self.retries += 1;
        Step::Wait(delay)
    }
}

/// The time a call runs on.
pub trait Clock {
    fn now(&self) -> Instant;
    fn sleep(&self, delay: Duration) -> impl Future<Output = ()> + Send;
    /// Uniform in `[0, 1)`, for the jitter.
    fn unit(&self) -> f64;
}

/// Tokio's timer and the thread's random number generator.
#[cfg(feature = "http")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

#[cfg(feature = "http")]
impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, delay: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(delay)
    }

    fn unit(&self) -> f64 {
        rand::random()
    }
}

/// How a call ended: the last attempt's result, whether it was the last for lack of time, and
/// whether any attempt may have been applied.
#[derive(Debug)]
pub struct Ended<R, E> {
    pub last: Result<R, E>,
    pub gave_up: bool,
    pub maybe_applied: bool,
    pub attempts: u32,
}

/// Sees every attempt of a call and every retry (the load generator counts them, a test or a
/// history records them). Both methods do nothing by default.
pub trait Observe {
    /// An attempt ended as `attempt`, `elapsed` after it started.
    fn attempt(&mut self, attempt: &Attempt, elapsed: Duration) {
        let _ = (attempt, elapsed);
    }

    /// The call waits `delay`, then tries again because of `cause`.
    fn retry(&mut self, cause: &Attempt, delay: Duration) {
        let _ = (cause, delay);
    }
}

impl Observe for () {}

/// Run attempts (`attempt(timeout)`) under `policy` until one is final or time is up. `classify`
/// tells how an attempt ended; `observe` sees every attempt and every retry.
pub async fn run<R, E, F, Fut>(
    policy: Policy,
    clock: &impl Clock,
    mut attempt: F,
    classify: impl Fn(&Result<R, E>) -> Attempt,
    observe: &mut (dyn Observe + Send),
) -> Ended<R, E>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<R, E>>,
{
    let mut state = Retrying::new(policy, clock.now());
    loop {
        let started = clock.now();
        let result = attempt(state.attempt_timeout(started)).await;
        let kind = classify(&result);
        let now = clock.now();
        observe.attempt(&kind, now.saturating_duration_since(started));
        let step = state.after(&kind, now, clock.unit());
        match step {
            Step::Wait(delay) => {
                observe.retry(&kind, delay);
                clock.sleep(delay).await;
            }
            Step::Done | Step::GiveUp => {
                return Ended {
                    last: result,
                    gave_up: step == Step::GiveUp,
                    maybe_applied: state.maybe_applied(),
                    attempts: state.retries() + 1,
                }
            }
        }
    }
}

#[cfg(all(test, feature = "http"))]
#[path = "retry_tests.rs"]
mod tests;
