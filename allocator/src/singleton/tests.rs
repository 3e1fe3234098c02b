//! A job runner's tick on a manual clock: steps run only while the lease grants authority, each
//! under the term granted right before it.

use std::cell::RefCell;

use super::*;
use crate::clock::ManualClock;
use crate::lease::state::test_timing;

const SEC: Duration = Duration::from_secs(1);

/// A lease acquired now at `term`, and the term it grants as the clock moves.
fn leased(term: i64) -> (ManualClock, impl Fn() -> Option<i64>) {
    let clock = ManualClock::new();
    let state = LeaseState::on_acquired(&test_timing(), clock.now(), term);
    let reading = clock.clone();
    (clock, move || granted_term(&state, &reading))
}

#[tokio::test]
async fn steps_stop_at_the_safe_deadline_however_much_work_is_due() {
    let (clock, term) = leased(3);
    let ran = RefCell::new(Vec::new());
    // Every step takes a second; TTL 5 s minus the 1 s margin leaves four.
    let last = steps_while_granted(32, term, |term| {
        ran.borrow_mut().push(term);
        clock.advance(SEC);
        async { Step::More }
    })
    .await;
    assert_eq!(*ran.borrow(), vec![3; 4]);
    assert_eq!(last, Step::Idle);
}

#[tokio::test]
async fn an_unconfirmed_renewal_runs_no_step() {
    let clock = ManualClock::new();
    let state = LeaseState::on_acquired(&test_timing(), clock.now(), 2).on_renew_failed();
    let mut ran = 0;
    let last = steps_while_granted(
        8,
        || granted_term(&state, &clock),
        |_| {
            ran += 1;
            async { Step::More }
        },
    )
    .await;
    assert_eq!((ran, last), (0, Step::Idle));
}

#[tokio::test]
async fn a_tick_ends_at_its_limit_when_nothing_more_is_due_or_when_fenced() {
    let (_clock, term) = leased(1);
    let mut ran = 0;
    let last = steps_while_granted(5, &term, |_| {
        ran += 1;
        async { Step::More }
    })
    .await;
    assert_eq!(
        (ran, last),
        (5, Step::More),
        "a backlog never starves the observation"
    );

    for (stop, expected) in [(Step::Idle, 3), (Step::Fenced, 3)] {
        let mut ran = 0;
        let last = steps_while_granted(8, &term, |_| {
            ran += 1;
            let answer = if ran == 3 { stop } else { Step::More };
            async move { answer }
        })
        .await;
        assert_eq!((ran, last), (expected, stop));
    }
}
