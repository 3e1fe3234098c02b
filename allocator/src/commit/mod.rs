//! Group commit: ready batches of several partitions share one transaction (DESIGN.md §6).
//!
//! Every partition worker hands its batch to the committer and waits for the answer, so a
//! partition never has more than one batch in flight and its commands stay in arrival order.
//! *Lanes* (one database connection each while a statement runs) take whatever batches are ready
//! and run them as one statement (the set-based reserve statement or `apply_fenced_batch`, see
//! [`crate::fenced`]): under spread traffic, where each partition's batch holds one or two
//! commands, this turns many small commits into one. A lane never waits to fill a group: a batch
//! that finds a lane free runs at once, alone if nothing else is queued.
//!
//! How many statements run at once adapts to the load ([`concurrency`]): every lane may run
//! while statements come back as fast as on a quiet database, so a ready batch never waits
//! behind an idle lane; only when statements slow down measurably (the database is busy) does
//! the limit shrink, towards the CPU count, and batches queue and share fewer, larger
//! statements, whose fixed cost is what a busy database saves on.
//!
//! One tenure per partition per group. A batch waits in the queue while its partition's tenure may
//! end (a stall, a refused renewal) and the partition be taken again, by this replica too: the
//! ended tenure's batch and its successor's would then meet in one group, where the database can
//! tell them apart only by epoch. So a batch is *claimed* exactly once, by the lane that takes it or
//! by its worker withdrawing it when the tenure ends (then it never runs and its commands are
//! answered "not owner"); a lane asks the batch's authority again right before the statement and
//! answers a batch of an ended tenure without running it; a group never takes a second batch of a
//! partition it already carries; and `apply_fenced_batch` refuses a group that names a partition
//! twice.
//!
//! Isolation: each partition is fenced inside the statement and a failed fence drops only that
//! partition. A statement that fails as a whole (a lock wait timing out on one partition's row)
//! is re-run partition by partition so the others still commit, and the worker marks its next
//! batch `solo` so a partition in trouble stops holding groups up.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

mod concurrency;
mod statements;

use self::concurrency::{Concurrency, Slots};
pub use self::statements::{GroupResult, PoolStatements, Statements};
use crate::authority::{PartitionAuthority, Withheld};
use crate::fenced::{Command, Fence, FencedError, Outcome, PartitionBatch};
use crate::lease::FenceToken;
use crate::metrics as m;
use crate::stages::{Mark, Stamps};

/// One partition's batch waiting for a lane.
#[derive(Debug)]
pub struct Submission {
    /// Carries the partition's tenure into the statement, where the database checks it.
    pub fence: Fence,
    /// The same tenure as the fence, asked again when a lane is about to run the batch: it may
    /// have ended while the batch waited. Its safe deadline bounds the wait for the statement.
    pub authority: PartitionAuthority,
    pub commands: Vec<Command>,
    /// Run in a transaction of its own: the partition's previous batch failed, and whatever
    /// made it fail (a locked row) must not stall other partitions.
    pub solo: bool,
    /// Taken by a lane or withdrawn by the worker, exactly once.
    pub claim: Arc<Claim>,
    /// The batch's stage marks: the lane sets when its statement started and answered.
    pub stamps: Arc<Stamps>,
    pub reply: oneshot::Sender<Result<Vec<Outcome>, CommitError>>,
}

impl Submission {
    fn batch(&self) -> PartitionBatch<'_> {
        PartitionBatch {
            fence: &self.fence,
            commands: &self.commands,
        }
    }
}

/// Who decides a queued batch's fate: the lane that takes it (it may run) or the worker that
/// withdraws it because its tenure ended (it never runs). Whoever comes first wins, so the worker
/// knows whether a statement may have carried its commands.
#[derive(Debug, Default)]
pub struct Claim(AtomicU8);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

impl Claim {
    /// A lane takes the batch; false when its worker withdrew it first.
    pub fn take(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The worker withdraws the batch; false when a lane took it first (it may run).
    pub fn withdraw(&self) -> bool {
        self.0
            .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The batch's tenure ended before a statement carried it: nothing of it ran.
    #[error("the tenure ended before the batch ran")]
    Ended,
    #[error(transparent)]
    Fenced(#[from] FencedError),
    #[error("{reason}")]
    Unavailable {
        reason: String,
        /// True when the transaction may have committed.
        outcome_unknown: bool,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct CommitSettings {
    /// Most concurrent group transactions (each holds one pooled connection while it runs).
    pub lanes: std::num::NonZeroUsize,
    /// Concurrent group transactions allowed however busy the database is: the floor the limit
    /// backs off to (see [`concurrency`]); at most `lanes`.
    pub min_lanes: std::num::NonZeroUsize,
    /// Most partitions in one group; 1 turns group commit off.
    pub max_partitions: usize,
    /// Most commands in one group, so one statement stays short.
    pub max_commands: usize,
    /// Longest wait for a pooled connection.
    pub pool_wait: Duration,
    /// Write groups of plain reserves with the set-based statement ([`crate::fenced::fast`]);
    /// off, every group goes through `apply_fenced_batch`.
    pub set_based_reserves: bool,
}

/// Handle for submitting batches; cheap to clone.
#[derive(Clone)]
pub struct Committer {
    sender: mpsc::Sender<Submission>,
}

impl Committer {
    /// Start the lanes on connections of `pool`. They stop when every `Committer` clone is gone.
    pub fn spawn(pool: Pool, settings: CommitSettings) -> (Self, Vec<JoinHandle<()>>) {
        let statements = PoolStatements {
            pool,
            pool_wait: settings.pool_wait,
        };
        Self::spawn_with(Arc::new(statements), settings)
    }

    /// Start the lanes, each group run by `statements`.
    pub fn spawn_with(
        statements: Arc<dyn Statements>,
        settings: CommitSettings,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let (sender, receiver) = mpsc::channel(4096);
        let receiver = Arc::new(Mutex::new(receiver));
        let slots = Arc::new(Slots::new(Concurrency::new(
            settings.min_lanes.get(),
            settings.lanes.get(),
        )));
        metrics::gauge!(m::COMMIT_CONCURRENCY).set(settings.lanes.get() as f64);
        let lanes = (0..settings.lanes.get())
            .map(|_| {
                let lane = Lane {
                    statements: statements.clone(),
                    settings,
                    receiver: receiver.clone(),
                    slots: slots.clone(),
                };
                tokio::spawn(lane.run())
            })
            .collect();
        (Self { sender }, lanes)
    }

    /// Queue a batch; the answer arrives on the submission's `reply`.
    pub async fn submit(&self, submission: Submission) -> Result<(), Submission> {
        self.sender.send(submission).await.map_err(|e| e.0)
    }
}

struct Lane {
    statements: Arc<dyn Statements>,
    settings: CommitSettings,
    receiver: Arc<Mutex<mpsc::Receiver<Submission>>>,
    /// Shared by the lanes: how many statements may run now.
    slots: Arc<Slots>,
}

impl Lane {
    async fn run(self) {
        loop {
            let mut group: Vec<Submission> = Vec::new();
            let mut alone = Vec::new();
            {
                let mut receiver = self.receiver.lock().await;
                let first = loop {
                    let Some(next) = receiver.recv().await else {
                        return;
                    };
                    // Beyond the concurrency limit, wait with the queue held: what arrives
                    // meanwhile joins this group.
                    self.slots.acquire().await;
                    // A withdrawn batch was answered by its worker; it never runs.
                    if next.claim.take() {
                        break next;
                    }
                    self.slots.cancel();
                };
                if first.solo {
                    alone.push(first);
                } else {
                    let mut partitions = HashSet::from([first.fence.token.partition]);
                    let mut commands = first.commands.len();
                    group.push(first);
                    while group.len() < self.settings.max_partitions
                        && commands < self.settings.max_commands
                    {
                        let Ok(next) = receiver.try_recv() else {
                            break;
                        };
                        if !next.claim.take() {
                            continue;
                        }
                        // One tenure per partition per group: a second batch of a partition
                        // (an ended tenure's beside its successor's) runs on its own, after.
                        if next.solo || !partitions.insert(next.fence.token.partition) {
                            alone.push(next);
                        } else {
                            commands += next.commands.len();
                            group.push(next);
                        }
                    }
                }
            }
            let started = Instant::now();
            if !group.is_empty() {
                self.commit(group).await;
            }
            for submission in alone {
                self.commit(vec![submission]).await;
            }
            let limit = self.slots.release(started.elapsed());
            metrics::gauge!(m::COMMIT_CONCURRENCY).set(limit as f64);
        }
    }

    async fn commit(&self, group: Vec<Submission>) {
        // Ask every batch's tenure again now: a batch of an ended tenure is answered and never
        // runs, and the statement is waited for no longer than the earliest safe deadline.
        let mut deadline: Option<Instant> = None;
        let mut live = Vec::with_capacity(group.len());
        for submission in group {
            match submission.authority.write_deadline() {
                Ok(until) => {
                    deadline = Some(deadline.map_or(until, |d| d.min(until)));
                    live.push(submission);
                }
                Err(withheld) => {
                    let _ = submission.reply.send(Err(CommitError::withheld(withheld)));
                }
            }
        }
        let (group, Some(deadline)) = (live, deadline) else {
            return;
        };
        // Batches of plain reserves go to the set-based statement; a group that also carries
        // other commands (a sweep, a confirm) is split so they do not drag the reserves into the
        // procedural function. Nothing the two statements decide depends on the other's.
        if group.len() > 1 && self.settings.set_based_reserves {
            let separable = {
                let batches: Vec<PartitionBatch<'_>> =
                    group.iter().map(Submission::batch).collect();
                crate::fenced::fast::separable(&batches)
            };
            if separable.contains(&true) && separable.contains(&false) {
                let (reserves, rest): (Vec<_>, Vec<_>) = group
                    .into_iter()
                    .zip(separable)
                    .partition(|(_, separable)| *separable);
                Box::pin(self.commit(reserves.into_iter().map(|(s, _)| s).collect())).await;
                Box::pin(self.commit(rest.into_iter().map(|(s, _)| s).collect())).await;
                return;
            }
        }
        metrics::histogram!(m::GROUP_PARTITIONS).record(group.len() as f64);
        let started = Instant::now();
        for submission in &group {
            submission.stamps.mark(Mark::Started, started);
        }
        let result = {
            let batches: Vec<PartitionBatch<'_>> = group.iter().map(Submission::batch).collect();
            let set_based = self.settings.set_based_reserves;
            self.statements.run(&batches, set_based, deadline).await
        };
        let ran = Instant::now();
        metrics::histogram!(m::DB_TRANSACTION_DURATION).record((ran - started).as_secs_f64());
        for submission in &group {
            submission.stamps.mark(Mark::Ran, ran);
        }
        match result {
            Ok(results) => {
                for (submission, result) in group.into_iter().zip(results) {
                    let _ = submission.reply.send(result.map_err(CommitError::from));
                }
            }
            Err(CommitError::Fenced(error)) if group.len() > 1 && !error.outcome_unknown() => {
                // The statement rolled back as a whole; one partition's trouble must not fail
                // the others, so each runs alone.
                tracing::debug!(%error, partitions = group.len(), "group failed, committing its partitions one by one");
                for submission in group {
                    Box::pin(self.commit(vec![submission])).await;
                }
            }
            Err(error) if group.len() == 1 => {
                if let Some(submission) = group.into_iter().next() {
                    let _ = submission.reply.send(Err(error));
                }
            }
            Err(error) => {
                for submission in group {
                    let _ = submission.reply.send(Err(error.duplicate()));
                }
            }
        }
    }
}

impl CommitError {
    /// Why a batch whose tenure no longer grants authority is not run.
    fn withheld(withheld: Withheld) -> CommitError {
        match withheld {
            Withheld::Lost => CommitError::Ended,
            Withheld::Unconfirmed => CommitError::Unavailable {
                reason: "lease renewal unconfirmed".into(),
                outcome_unknown: false,
            },
        }
    }

    /// The same failure for every member of a group (database errors are not `Clone`).
    fn duplicate(&self) -> CommitError {
        match self {
            CommitError::Ended => CommitError::Ended,
            CommitError::Fenced(FencedError::StaleEpoch {
                partition,
                ours,
                current,
            }) => CommitError::Fenced(FencedError::stale(
                FenceToken::new(*partition, *ours),
                *current,
            )),
            CommitError::Fenced(error) => CommitError::Unavailable {
                reason: error.to_string(),
                outcome_unknown: error.outcome_unknown(),
            },
            CommitError::Unavailable {
                reason,
                outcome_unknown,
            } => CommitError::Unavailable {
                reason: reason.clone(),
                outcome_unknown: *outcome_unknown,
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod fakes;
#[cfg(test)]
mod tests;
