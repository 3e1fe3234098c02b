//! The settlement job's decisions over a fake pair of statements that keeps runs like the
//! tables do and judges readiness on its own "database clock" with the grace it is given; the
//! statements themselves (readiness in SQL, a takeover keeping the claimed end) are tested
//! against PostgreSQL in the integration tests (`settlement`, `settlement_takeover`).

use std::sync::Mutex;

use chrono::TimeDelta;

use super::*;

const MINUTE: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Claim {
        term: i64,
        window: Duration,
        grace: Duration,
    },
    Settle {
        term: i64,
        start: DateTime<Utc>,
    },
}

struct FakeRuns {
    now: Mutex<DateTime<Utc>>,
    /// Where the next window starts: the end of the last settled one.
    next: Mutex<DateTime<Utc>>,
    /// The run claimed and not settled, and the term that holds it.
    open: Mutex<Option<(Window, i64)>>,
    settled: Mutex<Vec<Window>>,
    calls: Mutex<Vec<Call>>,
    /// Make the next statement fail.
    fail: Mutex<Option<Failure>>,
    /// What a newer term does between this term's claim and its settle.
    before_settle: Mutex<Option<Interference>>,
}

#[derive(Debug, Clone, Copy)]
enum Interference {
    /// Claims the open run for itself (a takeover).
    TakenOver(i64),
    /// Claims and settles it itself.
    SettledBy,
}

impl FakeRuns {
    fn new(origin: DateTime<Utc>) -> Self {
        Self {
            now: Mutex::new(origin),
            next: Mutex::new(origin),
            open: Mutex::new(None),
            settled: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
            fail: Mutex::new(None),
            before_settle: Mutex::new(None),
        }
    }

    fn set_now(&self, now: DateTime<Utc>) {
        *self.now.lock().unwrap() = now;
    }

    fn settled(&self) -> Vec<Window> {
        self.settled.lock().unwrap().clone()
    }
}

impl Windows for FakeRuns {
    async fn claim_next(
        &self,
        _holder_id: &str,
        term: i64,
        window: Duration,
        grace: Duration,
    ) -> Result<Option<Window>, Failure> {
        self.calls.lock().unwrap().push(Call::Claim {
            term,
            window,
            grace,
        });
        if let Some(failure) = self.fail.lock().unwrap().take() {
            return Err(failure);
        }
        let start = *self.next.lock().unwrap();
        let mut open = self.open.lock().unwrap();
        let end = match *open {
            Some((claimed, _)) if claimed.start == start => claimed.end,
            _ => start + TimeDelta::from_std(window).unwrap(),
        };
        if end + TimeDelta::from_std(grace).unwrap() > *self.now.lock().unwrap() {
            return Ok(None);
        }
        let claimed = Window { start, end };
        *open = Some((claimed, term));
        Ok(Some(claimed))
    }

    async fn settle(&self, term: i64, start: DateTime<Utc>) -> Result<Option<Settled>, Failure> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Settle { term, start });
        if let Some(failure) = self.fail.lock().unwrap().take() {
            return Err(failure);
        }
        let mut open = self.open.lock().unwrap();
        if let (Some(interference), Some((claimed, _))) =
            (self.before_settle.lock().unwrap().take(), *open)
        {
            match interference {
                Interference::TakenOver(newer) => *open = Some((claimed, newer)),
                Interference::SettledBy => {
                    *open = None;
                    *self.next.lock().unwrap() = claimed.end;
                    self.settled.lock().unwrap().push(claimed);
                }
            }
        }
        match *open {
            Some((claimed, holder)) if claimed.start == start => {
                if holder != term {
                    return Err(Failure::StaleTerm("FA010".into()));
                }
                *open = None;
                *self.next.lock().unwrap() = claimed.end;
                self.settled.lock().unwrap().push(claimed);
                Ok(Some(Settled {
                    reservations: 1,
                    quantity: 1,
                }))
            }
            _ => Ok(None),
        }
    }
}

fn origin() -> DateTime<Utc> {
    DateTime::from_timestamp(1_700_000_040, 0).unwrap()
}

fn job(window: Duration) -> Settlement {
    Settlement::new(SettlementSettings {
        window,
        grace: GRACE,
        holder_id: "replica-a".into(),
        shard: "main".into(),
    })
}

fn at(minutes: i64, seconds: i64) -> DateTime<Utc> {
    origin() + TimeDelta::minutes(minutes) + TimeDelta::seconds(seconds)
}

#[tokio::test]
async fn each_closed_window_is_claimed_and_then_settled_under_the_same_term_in_order() {
    let runs = FakeRuns::new(origin());
    runs.set_now(at(3, 5));
    let job = job(MINUTE);
    let mut steps = Vec::new();
    loop {
        let step = job.settle_next(&runs, 7).await;
        steps.push(step);
        if step != Step::More {
            break;
        }
    }
    assert_eq!(steps, vec![Step::More, Step::More, Step::More, Step::Idle]);
    let starts: Vec<_> = runs.settled().iter().map(|w| w.start).collect();
    assert_eq!(
        starts,
        vec![at(0, 0), at(1, 0), at(2, 0)],
        "no gap, no overlap"
    );
    let calls = runs.calls.lock().unwrap().clone();
    assert_eq!(
        calls[..2],
        [
            Call::Claim {
                term: 7,
                window: MINUTE,
                grace: GRACE
            },
            Call::Settle {
                term: 7,
                start: at(0, 0)
            },
        ]
    );
}

#[tokio::test]
async fn a_window_waits_for_its_end_plus_the_grace_on_the_database_clock() {
    let runs = FakeRuns::new(origin());
    let job = job(MINUTE);
    runs.set_now(at(1, 5) - TimeDelta::milliseconds(1));
    assert_eq!(job.settle_next(&runs, 1).await, Step::Idle);
    assert!(runs.settled().is_empty());
    assert_eq!(
        runs.calls.lock().unwrap().len(),
        1,
        "nothing to settle, no settle sent"
    );
    runs.set_now(at(1, 5));
    assert_eq!(job.settle_next(&runs, 1).await, Step::More);
}

#[tokio::test]
async fn a_window_a_newer_term_took_over_or_settled_fences_this_term_out() {
    let job = job(MINUTE);
    for interference in [Interference::TakenOver(5), Interference::SettledBy] {
        let runs = FakeRuns::new(origin());
        runs.set_now(at(1, 5));
        *runs.before_settle.lock().unwrap() = Some(interference);
        assert_eq!(
            job.settle_next(&runs, 4).await,
            Step::Fenced,
            "{interference:?}"
        );
        let settled_by_4 = runs.calls.lock().unwrap().contains(&Call::Settle {
            term: 4,
            start: at(0, 0),
        });
        assert!(settled_by_4, "it claimed and tried to settle");
    }
    // The trigger refuses the term already at the claim.
    let runs = FakeRuns::new(origin());
    runs.set_now(at(1, 5));
    *runs.fail.lock().unwrap() = Some(Failure::StaleTerm("FA010".into()));
    assert_eq!(job.settle_next(&runs, 4).await, Step::Fenced);
    assert!(runs.settled().is_empty());
}

#[tokio::test]
async fn a_failed_statement_is_tried_again_next_tick_without_stepping_down() {
    let runs = FakeRuns::new(origin());
    runs.set_now(at(1, 5));
    let job = job(MINUTE);
    *runs.fail.lock().unwrap() = Some(Failure::Other("connection reset".into()));
    assert_eq!(job.settle_next(&runs, 2).await, Step::Idle);
    assert_eq!(job.settle_next(&runs, 2).await, Step::More);
    assert_eq!(runs.settled().len(), 1);
}

#[tokio::test]
async fn the_job_steps_down_at_the_safe_deadline_with_windows_still_due() {
    use crate::clock::{Clock, ManualClock};
    use crate::lease::state::{test_timing, LeaseState};
    use crate::singleton::{granted_term, steps_while_granted};

    let runs = FakeRuns::new(origin());
    runs.set_now(at(10, 5));
    let clock = ManualClock::new();
    let lease = LeaseState::on_acquired(&test_timing(), clock.now(), 6);
    let job = job(MINUTE);
    // Each window takes a second to settle; TTL 5 s minus the 1 s margin leaves four.
    let step = |term| {
        clock.advance(Duration::from_secs(1));
        job.settle_next(&runs, term)
    };
    let last = steps_while_granted(32, || granted_term(&lease, &clock), step).await;
    assert_eq!(last, Step::Idle);
    assert_eq!(runs.settled().len(), 4, "ten windows were due");
}
