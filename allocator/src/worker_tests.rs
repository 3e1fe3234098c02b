//! A partition worker through its seams: its tenure from a fake authority, its statements from
//! fake lanes. What a cancelled tenure's queued batch answers is decided here and in the lanes.

use super::*;
use crate::commit::fakes::*;
use crate::lease::state::Authority;
use crate::lease::FenceToken;

const PARTITION: u32 = 5;

struct Setup {
    statements: Arc<FakeStatements>,
    authority: Arc<FakeAuthority>,
    committer: Committer,
    started: mpsc::UnboundedReceiver<Vec<u32>>,
}

fn setup() -> Setup {
    let (statements, started) = FakeStatements::new();
    let (committer, _lanes) = Committer::spawn_with(statements.clone(), settings());
    Setup {
        statements,
        authority: FakeAuthority::new(),
        committer,
        started,
    }
}

impl Setup {
    fn worker(&self, token: FenceToken) -> WorkerHandle {
        let ctx = Arc::new(WorkerContext {
            committer: self.committer.clone(),
            replica_id: REPLICA.into(),
            batch_max: 16,
            queue_capacity: 16,
            // No sweep during a test.
            expiry_interval: Duration::from_secs(3600),
            expiry_batch: 100,
        });
        spawn_worker(ctx, self.authority.handle(token))
    }

    /// Hold the only lane with a statement of partition 0 until the sender fires.
    async fn hold_lane(&mut self) -> oneshot::Sender<()> {
        let open = self.statements.hold(0);
        let blocker = submit(
            &self.committer,
            &self.authority,
            FenceToken::new(0, 1),
            vec![reserve("z")],
            false,
        );
        let _ = blocker.await;
        assert_eq!(self.started.recv().await, Some(vec![0]));
        open
    }
}

impl Setup {
    /// A worker of [`PARTITION`] (tenure 1) whose first command, a reserve, is queued behind the
    /// held lane.
    async fn queued(&mut self) -> (oneshot::Sender<()>, FenceToken, WorkerHandle, Answer) {
        let open = self.hold_lane().await;
        let token = FenceToken::new(PARTITION, 1);
        let worker = self.worker(token);
        let answer = send(&worker, reserve("a"));
        // The worker asked its authority before queueing, then queued at once.
        until("the batch is queued", || self.authority.asked(token) >= 1).await;
        (open, token, worker, answer)
    }
}

type Answer = oneshot::Receiver<Result<Outcome, WorkError>>;

fn send(worker: &WorkerHandle, command: Command) -> Answer {
    let (reply, answer) = oneshot::channel();
    worker
        .sender
        .try_send(WorkItem {
            command,
            reply,
            stamps: Default::default(),
        })
        .expect("queue has room");
    answer
}

async fn answered(answer: Answer) -> Result<Outcome, WorkError> {
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("answered, not dropped")
}

fn ran(statements: &FakeStatements, partition: u32) -> bool {
    statements
        .calls()
        .iter()
        .any(|c| c.partitions().contains(&partition))
}

#[tokio::test]
async fn a_queued_batch_withdrawn_when_its_tenure_ends_is_not_owner_and_never_runs() {
    let mut s = setup();
    let (open, _, worker, answer) = s.queued().await;
    worker.cancel.cancel();
    assert_eq!(
        answered(answer).await,
        Err(WorkError::NotOwner {
            partition: PARTITION
        }),
        "withdrawn before any lane took it: nothing ran, so 421"
    );
    drop(open);
    // The lane gets to the queue after the withdrawal and finds nothing to run.
    let _ = submit(
        &s.committer,
        &s.authority,
        FenceToken::new(1, 1),
        vec![reserve("b")],
        false,
    )
    .await
    .1
    .await;
    assert!(!ran(&s.statements, PARTITION), "{:?}", s.statements.calls());
}

#[tokio::test]
async fn a_queued_batch_whose_renewal_became_unconfirmed_is_unavailable_and_never_runs() {
    let mut s = setup();
    let (open, token, _worker, answer) = s.queued().await;
    s.authority.set(token, Authority::Uncertain);
    drop(open);
    let error = answered(answer).await.unwrap_err();
    assert!(
        matches!(
            &error,
            WorkError::Unavailable {
                outcome_unknown: false,
                ..
            }
        ),
        "503 without an unknown outcome: {error:?}"
    );
    assert!(!ran(&s.statements, PARTITION));
}

#[tokio::test]
async fn a_batch_a_lane_already_took_has_an_unknown_outcome_when_the_tenure_ends() {
    let mut s = setup();
    let _open = s.statements.hold(PARTITION);
    let worker = s.worker(FenceToken::new(PARTITION, 1));
    let answer = send(&worker, reserve("a"));
    assert_eq!(
        s.started.recv().await,
        Some(vec![PARTITION]),
        "the statement runs"
    );
    worker.cancel.cancel();
    let error = answered(answer).await.unwrap_err();
    assert!(
        matches!(
            &error,
            WorkError::Unavailable {
                outcome_unknown: true,
                ..
            }
        ),
        "the statement may commit: {error:?}"
    );
}

#[tokio::test]
async fn a_refused_epoch_reports_the_tenure_lost_and_answers_not_owner() {
    let s = setup();
    s.statements
        .answer(PARTITION, crate::commit::fakes::Answer::Stale);
    let token = FenceToken::new(PARTITION, 1);
    let worker = s.worker(token);
    assert_eq!(
        answered(send(&worker, reserve("a"))).await,
        Err(WorkError::NotOwner {
            partition: PARTITION
        })
    );
    assert_eq!(
        *s.authority.losses.lock().unwrap(),
        vec![(token, LossCause::Fenced)]
    );
}

#[tokio::test]
async fn queued_commands_share_one_batch_in_arrival_order_and_a_lost_tenure_queues_nothing() {
    let mut s = setup();
    // The first command is taken alone; the rest queue behind it and become one batch.
    let (open, token, worker, first) = s.queued().await;
    let rest: Vec<_> = ["b", "c", "d"].map(|id| send(&worker, reserve(id))).into();
    drop(open);
    assert!(answered(first).await.is_ok());
    for answer in rest {
        assert_eq!(
            answered(answer).await,
            Ok(Outcome::Expired {
                count: u64::from(PARTITION)
            })
        );
    }
    let batches: Vec<Vec<Command>> = s
        .statements
        .calls()
        .into_iter()
        .filter(|c| c.partitions() == vec![PARTITION])
        .flat_map(|c| c.commands)
        .collect();
    assert_eq!(
        batches,
        vec![
            vec![reserve("a")],
            vec![reserve("b"), reserve("c"), reserve("d")]
        ]
    );
    // Lost meanwhile: the worker asks before queueing and answers without a statement.
    s.authority.set(token, Authority::NotHeld);
    let calls = s.statements.calls().len();
    assert_eq!(
        answered(send(&worker, reserve("e"))).await,
        Err(WorkError::NotOwner {
            partition: PARTITION
        })
    );
    assert_eq!(s.statements.calls().len(), calls);
}
