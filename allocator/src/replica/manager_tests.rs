//! The lease manager's decisions over the ownership table, on a manual clock: what a renewal
//! answer, a watchdog tick and a stall do to the partitions this replica serves.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::lease::state::test_timing;
use crate::replica::ownership::{Dropped, Placement};
use crate::worker::WorkerHandle;

fn table() -> (Arc<ManualClock>, Ownership) {
    let clock = Arc::new(ManualClock::new());
    let ownership = Ownership::new(8, clock.clone(), test_timing());
    (clock, ownership)
}

/// Install `token` as acquired now; the worker's cancel token tells whether it was stopped.
fn acquire(clock: &ManualClock, ownership: &Ownership, token: FenceToken) -> CancellationToken {
    let (sender, _queue) = mpsc::channel(1);
    let cancel = CancellationToken::new();
    let worker = WorkerHandle {
        sender,
        cancel: cancel.clone(),
        task: tokio::spawn(async {}),
    };
    ownership.install(token, clock.now(), worker);
    cancel
}

fn owned(ownership: &Ownership, partition: u32) -> Option<i64> {
    match ownership.placement(partition) {
        Placement::Owned { token, .. } => Some(token.epoch),
        Placement::Uncertain => Some(-1),
        Placement::NotOwned => None,
    }
}

fn uncertain(ownership: &Ownership, partition: u32) -> bool {
    matches!(ownership.placement(partition), Placement::Uncertain)
}

fn drain(feed: &mut mpsc::UnboundedReceiver<Dropped>) -> Vec<Dropped> {
    std::iter::from_fn(|| feed.try_recv().ok()).collect()
}

const SEC: Duration = Duration::from_secs(1);

#[tokio::test]
async fn renewed_partitions_get_a_new_deadline_and_refused_ones_are_lost_and_given_back() {
    let (clock, ownership) = table();
    let mut feed = ownership.take_loss_feed().unwrap();
    let tokens = [1, 2, 3].map(|p| FenceToken::new(p, 4));
    let cancels = tokens.map(|t| acquire(&clock, &ownership, t));
    clock.advance(SEC);
    let t1 = clock.now();
    // The database renewed 1 and 3 only: 2 is someone else's now.
    settle_renewal(&ownership, tokens.to_vec(), t1, Ok(vec![1, 3]));
    assert_eq!(owned(&ownership, 2), None);
    assert!(cancels[1].is_cancelled(), "its worker is stopped");
    assert_eq!(
        drain(&mut feed),
        vec![Dropped {
            token: tokens[1],
            cause: LossCause::RenewRejected
        }]
    );
    // Past the first deadline (acquired + 4 s), within the renewed one (t1 + 4 s).
    clock.advance(3 * SEC + SEC / 2);
    assert_eq!(watchdog_tick(&ownership, None), Some(SEC / 2));
    assert_eq!(
        (owned(&ownership, 1), owned(&ownership, 3)),
        (Some(4), Some(4))
    );
    assert!(!cancels[0].is_cancelled() && !cancels[2].is_cancelled());
}

#[tokio::test]
async fn a_failed_renewal_makes_every_held_partition_uncertain_until_one_is_confirmed() {
    let (clock, ownership) = table();
    let tokens = [0, 5].map(|p| FenceToken::new(p, 2));
    for token in tokens {
        acquire(&clock, &ownership, token);
    }
    clock.advance(SEC);
    settle_renewal(
        &ownership,
        tokens.to_vec(),
        clock.now(),
        Err("timed out".into()),
    );
    assert!(
        uncertain(&ownership, 0) && uncertain(&ownership, 5),
        "no new work, not lost"
    );
    assert_eq!(ownership.held(), tokens.to_vec(), "still renewed");
    clock.advance(SEC);
    settle_renewal(&ownership, tokens.to_vec(), clock.now(), Ok(vec![0, 5]));
    assert_eq!(
        (owned(&ownership, 0), owned(&ownership, 5)),
        (Some(2), Some(2))
    );
}

#[tokio::test]
async fn the_watchdog_drops_a_lease_at_its_safe_deadline_and_every_lease_after_a_stall() {
    let (clock, ownership) = table();
    let mut feed = ownership.take_loss_feed().unwrap();
    let early = FenceToken::new(1, 1);
    let late = FenceToken::new(2, 1);
    acquire(&clock, &ownership, early);
    clock.advance(2 * SEC);
    acquire(&clock, &ownership, late);
    // TTL 5 s minus the 1 s margin after the first acquisition.
    clock.advance(2 * SEC - Duration::from_millis(1));
    assert_eq!(
        watchdog_tick(&ownership, None),
        Some(Duration::from_millis(1))
    );
    assert!(drain(&mut feed).is_empty());
    clock.advance(Duration::from_millis(1));
    assert_eq!(watchdog_tick(&ownership, None), Some(2 * SEC));
    assert_eq!(owned(&ownership, 1), None);
    assert_eq!(owned(&ownership, 2), Some(1));
    // A tick that came late: the process slept and may have missed deadlines.
    assert_eq!(watchdog_tick(&ownership, Some(3 * SEC)), None);
    assert_eq!(owned(&ownership, 2), None);
    assert_eq!(
        drain(&mut feed),
        vec![
            Dropped {
                token: early,
                cause: LossCause::Deadline
            },
            Dropped {
                token: late,
                cause: LossCause::Stall
            },
        ]
    );
}

#[tokio::test]
async fn answers_about_an_ended_tenure_never_touch_its_successor() {
    let (clock, ownership) = table();
    let mut feed = ownership.take_loss_feed().unwrap();
    let old = FenceToken::new(3, 1);
    let new = FenceToken::new(3, 2);
    let old_worker = acquire(&clock, &ownership, old);
    let new_worker = acquire(&clock, &ownership, new);
    assert!(
        old_worker.is_cancelled(),
        "the ended tenure's worker is stopped"
    );
    // The old tenure's worker asks and reports: it gets nothing, and changes nothing.
    assert_eq!(
        ownership.authority(old),
        crate::lease::state::Authority::NotHeld
    );
    assert!(ownership.lose(old, LossCause::Fenced).is_none());
    settle_renewal(&ownership, vec![old], clock.now(), Ok(vec![]));
    settle_renewal(&ownership, vec![old], clock.now(), Err("late".into()));
    assert_eq!(owned(&ownership, 3), Some(2));
    assert!(!new_worker.is_cancelled());
    assert!(drain(&mut feed).is_empty());
    // Handed back on purpose: stopped, but not fed to the dropped-lease releaser.
    let (token, worker) = ownership.relinquish(3).expect("held");
    assert_eq!(token, new);
    assert!(worker.is_some() && new_worker.is_cancelled());
    assert_eq!(owned(&ownership, 3), None);
    assert!(drain(&mut feed).is_empty());
}
