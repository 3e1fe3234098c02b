use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::*;

/// A clock that moves only when told: by a sleep, or by an attempt taking time.
struct ManualClock {
    start: Instant,
    micros: AtomicU64,
    slept: Mutex<Vec<Duration>>,
}

impl ManualClock {
    fn new() -> ManualClock {
        ManualClock {
            start: Instant::now(),
            micros: AtomicU64::new(0),
            slept: Mutex::new(Vec::new()),
        }
    }

    fn advance(&self, by: Duration) {
        self.micros
            .fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    fn elapsed(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::SeqCst))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + self.elapsed()
    }

    fn sleep(&self, delay: Duration) -> impl Future<Output = ()> + Send {
        self.advance(delay);
        self.slept.lock().unwrap().push(delay);
        std::future::ready(())
    }

    fn unit(&self) -> f64 {
        0.5
    }
}

#[derive(Default)]
struct Seen {
    attempts: Vec<String>,
    retries: Vec<String>,
}

impl Observe for Seen {
    fn attempt(&mut self, attempt: &Attempt, _elapsed: Duration) {
        self.attempts.push(attempt.label().into_owned());
    }

    fn retry(&mut self, cause: &Attempt, _delay: Duration) {
        self.retries.push(cause.label().into_owned());
    }
}

fn answered(status: u16) -> Attempt {
    Attempt::Answered {
        status,
        retry_after: None,
        outcome_unknown: None,
    }
}

fn policy(deadline_ms: u64) -> Policy {
    Policy {
        attempt_timeout: Duration::from_millis(200),
        deadline: Duration::from_millis(deadline_ms),
        backoff: Backoff {
            base: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
    }
}

/// Runs `script` (one attempt outcome per call, each taking `took`) through [`run`].
async fn play(
    policy: Policy,
    clock: &ManualClock,
    script: Vec<Attempt>,
    took: Duration,
) -> (Ended<Attempt, ()>, Seen, Vec<Duration>) {
    let mut script = script.into_iter();
    let mut timeouts = Vec::new();
    let mut seen = Seen::default();
    let ended = run(
        policy,
        clock,
        |timeout| {
            timeouts.push(timeout);
            clock.advance(took.min(timeout));
            let next = script.next().expect("the script ran out");
            async move { Ok::<_, ()>(next) }
        },
        |result| *result.as_ref().unwrap(),
        &mut seen,
    )
    .await;
    (ended, seen, timeouts)
}

#[test]
fn statuses_and_failures_are_classified_like_the_router_does() {
    for status in [421, 502, 503, 504] {
        assert!(answered(status).is_retryable(), "{status}");
    }
    for status in [200, 201, 400, 401, 403, 404, 409, 422, 429, 500] {
        assert!(!answered(status).is_retryable(), "{status}");
    }
    assert!(!Attempt::Failed(FailureKind::Connect).may_have_applied());
    assert!(Attempt::Failed(FailureKind::Timeout).may_have_applied());
    assert!(Attempt::Failed(FailureKind::Io).may_have_applied());
    assert!(!answered(421).may_have_applied());
    assert!(!answered(503).may_have_applied());
    let with = |status, unknown| Attempt::Answered {
        status,
        retry_after: None,
        outcome_unknown: Some(unknown),
    };
    assert!(with(503, true).may_have_applied());
    assert!(answered(504).may_have_applied());
    assert!(answered(502).may_have_applied());
    assert!(!with(504, false).may_have_applied());
    assert_eq!(answered(503).label(), "503");
    assert_eq!(Attempt::Failed(FailureKind::Io).label(), "io");
}

#[tokio::test]
async fn retries_until_an_answer_is_final_with_growing_waits() {
    let clock = ManualClock::new();
    let script = vec![
        Attempt::Failed(FailureKind::Connect),
        answered(421),
        answered(503),
        answered(201),
    ];
    let (ended, seen, _) = play(policy(5_000), &clock, script, Duration::from_millis(1)).await;
    assert_eq!(*ended.last.as_ref().unwrap(), answered(201));
    assert!(!ended.gave_up);
    assert!(!ended.maybe_applied, "nothing before the 201 could apply");
    assert_eq!(ended.attempts, 4);
    assert_eq!(seen.attempts, ["connect", "421", "503", "201"]);
    assert_eq!(seen.retries, ["connect", "421", "503"]);
    // Equal jitter at 0.5 of the ceilings 20, 40, 80 ms.
    let slept = clock.slept.lock().unwrap().clone();
    assert_eq!(
        slept,
        [15, 30, 60].map(Duration::from_millis).to_vec(),
        "waits"
    );
}

#[tokio::test]
async fn a_maybe_applied_attempt_stays_maybe_applied_until_the_deadline() {
    let clock = ManualClock::new();
    // A timeout (the request may be executing), then clean refusals until time is up.
    let mut script = vec![Attempt::Failed(FailureKind::Timeout)];
    script.extend(std::iter::repeat_n(answered(503), 50));
    let (ended, seen, timeouts) =
        play(policy(1_000), &clock, script, Duration::from_millis(200)).await;
    assert!(ended.gave_up);
    assert!(
        ended.maybe_applied,
        "the timed-out attempt may still commit"
    );
    assert_eq!(*ended.last.as_ref().unwrap(), answered(503));
    // The first attempt got the whole attempt timeout; none ran past the deadline.
    assert_eq!(timeouts[0], Duration::from_millis(200));
    assert!(
        clock.elapsed() <= Duration::from_millis(1_000),
        "{:?}",
        clock.elapsed()
    );
    assert_eq!(seen.attempts.len(), ended.attempts as usize);
    assert_eq!(seen.retries.len() + 1, seen.attempts.len());
}

#[tokio::test]
async fn clean_refusals_until_the_deadline_leave_nothing_applied() {
    let clock = ManualClock::new();
    let script = std::iter::repeat_n(answered(421), 100).collect();
    let (ended, _, _) = play(policy(500), &clock, script, Duration::from_millis(5)).await;
    assert!(ended.gave_up);
    assert!(!ended.maybe_applied);
}

#[tokio::test]
async fn one_attempt_only_with_a_zero_deadline_and_its_full_timeout() {
    let clock = ManualClock::new();
    let (ended, seen, timeouts) = play(
        policy(1_000).once(),
        &clock,
        vec![Attempt::Failed(FailureKind::Io)],
        Duration::from_millis(1),
    )
    .await;
    assert!(ended.gave_up && ended.maybe_applied);
    assert_eq!(ended.attempts, 1);
    assert!(seen.retries.is_empty());
    assert_eq!(timeouts, [Duration::from_millis(200)]);
}

#[tokio::test]
async fn retry_after_is_honoured_up_to_the_cap() {
    let clock = ManualClock::new();
    let script = vec![
        Attempt::Answered {
            status: 503,
            retry_after: Some(Duration::from_secs(1)),
            outcome_unknown: None,
        },
        answered(200),
    ];
    play(policy(5_000), &clock, script, Duration::ZERO).await;
    // Ceiling min(1 s, cap 100 ms) = 100 ms, equal jitter at 0.5 → 75 ms.
    assert_eq!(*clock.slept.lock().unwrap(), [Duration::from_millis(75)]);
}

#[test]
fn the_last_attempt_is_cut_to_the_time_left() {
    let start = Instant::now();
    let state = Retrying::new(policy(300), start);
    assert_eq!(state.attempt_timeout(start), Duration::from_millis(200));
    assert_eq!(
        state.attempt_timeout(start + Duration::from_millis(250)),
        Duration::from_millis(50)
    );
    assert_eq!(
        state.attempt_timeout(start + Duration::from_secs(9)),
        Duration::from_millis(1)
    );
}
