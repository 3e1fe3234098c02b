//! Dispatch through its seams: an ownership table on a manual clock and a fake worker (a queue
//! the test reads), no database.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::lease::state::test_timing;
use crate::worker::WorkerHandle;

const PARTITION: u32 = 3;
const EPOCH: i64 = 7;

/// An ownership table holding [`PARTITION`] at [`EPOCH`], served by a worker whose queue (of
/// `capacity` items) the test reads.
fn owned(capacity: usize) -> (Arc<ManualClock>, Ownership, mpsc::Receiver<WorkItem>) {
    let clock = Arc::new(ManualClock::new());
    let ownership = Ownership::new(8, clock.clone(), test_timing());
    let (sender, queue) = mpsc::channel(capacity);
    let worker = WorkerHandle {
        sender,
        cancel: CancellationToken::new(),
        task: tokio::spawn(async {}),
    };
    ownership.install(FenceToken::new(PARTITION, EPOCH), clock.now(), worker);
    (clock, ownership, queue)
}

fn release(id: &str) -> Command {
    Command::Release {
        reservation_id: id.to_owned(),
        owner: Default::default(),
    }
}

fn request(command: Command, expected_epoch: Option<i64>) -> Dispatch {
    Dispatch {
        partition: PARTITION,
        expected_epoch,
        command,
        timeout: Duration::from_secs(5),
        stamps: Default::default(),
    }
}

fn answer(available: i64) -> Outcome {
    Outcome::InsufficientStock {
        available,
        replayed: false,
    }
}

#[tokio::test]
async fn commands_reach_the_worker_in_dispatch_order_and_come_back_with_the_tenure() {
    let (_clock, ownership, mut queue) = owned(8);
    let first = dispatch(&ownership, request(release("a"), Some(EPOCH)));
    let second = dispatch(&ownership, request(release("b"), None));
    let worker = async {
        for available in [1, 2] {
            let item = queue.recv().await.expect("a queued command");
            let id = match &item.command {
                Command::Release { reservation_id, .. } => reservation_id.clone(),
                other => panic!("unexpected command {other:?}"),
            };
            assert_eq!(id, if available == 1 { "a" } else { "b" }, "queue order");
            item.reply.send(Ok(answer(available))).unwrap();
        }
    };
    // `join!` polls in order, so "a" is queued before "b".
    let (first, second, ()) = tokio::join!(first, second, worker);
    let token = FenceToken::new(PARTITION, EPOCH);
    assert_eq!(first.unwrap(), (answer(1), token));
    assert_eq!(second.unwrap(), (answer(2), token));
}

#[tokio::test]
async fn a_partition_held_elsewhere_or_a_stale_epoch_is_not_owner_and_queues_nothing() {
    let (_clock, ownership, mut queue) = owned(8);
    let mut elsewhere = request(release("a"), None);
    elsewhere.partition = PARTITION + 1;
    assert_eq!(
        dispatch(&ownership, elsewhere).await,
        Err(WorkError::NotOwner {
            partition: PARTITION + 1
        })
    );
    // A router that expects another epoch has an out-of-date map: refused before queueing.
    assert_eq!(
        dispatch(&ownership, request(release("b"), Some(EPOCH - 1))).await,
        Err(WorkError::NotOwner {
            partition: PARTITION
        })
    );
    assert!(queue.try_recv().is_err(), "nothing reached the worker");
}

#[tokio::test]
async fn past_the_safe_deadline_the_partition_is_unavailable_without_an_unknown_outcome() {
    let (clock, ownership, mut queue) = owned(8);
    // TTL 5 s minus the 1 s margin: no renewal confirmed by then, no authority.
    clock.advance(Duration::from_secs(4));
    let error = dispatch(&ownership, request(release("a"), None))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            WorkError::Unavailable {
                outcome_unknown: false,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(queue.try_recv().is_err(), "nothing reached the worker");
}

#[tokio::test]
async fn a_full_queue_is_answered_at_once_and_nothing_was_applied() {
    let (_clock, ownership, _queue) = owned(1);
    // The first command takes the only slot and waits there (the worker never reads it).
    let queued = dispatch(&ownership, request(release("a"), None));
    tokio::pin!(queued);
    assert!(futures::poll!(&mut queued).is_pending());
    let error = dispatch(&ownership, request(release("b"), None))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        WorkError::Unavailable {
            partition: PARTITION,
            reason: "partition queue is full".into(),
            outcome_unknown: false,
        }
    );
}

#[tokio::test]
async fn a_worker_that_stops_without_answering_means_not_owner() {
    let (_clock, ownership, mut queue) = owned(8);
    let dropping = async {
        // Authority lost mid-batch: the worker goes away with the reply unsent.
        drop(queue.recv().await.expect("a queued command"));
    };
    let (result, ()) = tokio::join!(dispatch(&ownership, request(release("a"), None)), dropping);
    assert_eq!(
        result,
        Err(WorkError::NotOwner {
            partition: PARTITION
        })
    );
}

#[tokio::test]
async fn a_queued_command_past_its_deadline_has_an_unknown_outcome() {
    let (_clock, ownership, _queue) = owned(8);
    let mut slow = request(release("a"), None);
    // The worker holds the command and never answers: it may still apply it.
    slow.timeout = Duration::from_millis(20);
    let error = dispatch(&ownership, slow).await.unwrap_err();
    assert!(
        matches!(
            &error,
            WorkError::Unavailable {
                outcome_unknown: true,
                ..
            }
        ),
        "{error:?}"
    );
}
