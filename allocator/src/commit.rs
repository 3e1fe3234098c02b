//! Group commit: ready batches of several partitions share one transaction (DESIGN.md §6).
//!
//! Every partition worker hands its batch to the committer and waits for the answer, so a
//! partition never has more than one batch in flight and its commands stay in arrival order.
//! A few *lanes* (one database connection each at a time) take whatever batches are ready and
//! run them as one `apply_fenced_batch` statement: under spread traffic, where each partition's
//! batch holds one or two commands, this turns many small commits into one, which is what the
//! commit path of a durable PostgreSQL is bound by. A lane never waits to fill a group: an idle
//! system commits a lone batch at once.
//!
//! Isolation: each partition is fenced inside the statement and a failed fence drops only that
//! partition. A statement that fails as a whole (a lock wait timing out on one partition's row)
//! is re-run partition by partition so the others still commit, and the worker marks its next
//! batch `solo` so a partition in trouble stops holding groups up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::task::JoinHandle;

use crate::fenced::{apply_group, Command, Fence, FencedError, Outcome, PartitionBatch};
use crate::lease::FenceToken;
use crate::metrics as m;

/// One partition's batch waiting for a lane.
#[derive(Debug)]
pub struct Submission {
    /// Carries the partition's tenure into the statement, where the database checks it.
    pub fence: Fence,
    pub commands: Vec<Command>,
    /// The lease's safe deadline: the transaction must not be waited for beyond it.
    pub deadline: Instant,
    /// Run in a transaction of its own: the partition's previous batch failed, and whatever
    /// made it fail (a locked row) must not stall other partitions.
    pub solo: bool,
    pub reply: oneshot::Sender<Result<Vec<Outcome>, CommitError>>,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
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
    /// Concurrent group transactions (each holds one pooled connection while it runs).
    pub lanes: std::num::NonZeroUsize,
    /// Most partitions in one group; 1 turns group commit off.
    pub max_partitions: usize,
    /// Most commands in one group, so one statement stays short.
    pub max_commands: usize,
    /// Longest wait for a pooled connection.
    pub pool_wait: Duration,
}

/// Handle for submitting batches; cheap to clone.
#[derive(Clone)]
pub struct Committer {
    sender: mpsc::Sender<Submission>,
}

impl Committer {
    /// Start the lanes. They stop when every `Committer` clone is gone.
    pub fn spawn(pool: Pool, settings: CommitSettings) -> (Self, Vec<JoinHandle<()>>) {
        let (sender, receiver) = mpsc::channel(4096);
        let receiver = Arc::new(Mutex::new(receiver));
        let lanes = (0..settings.lanes.get())
            .map(|_| {
                let lane = Lane {
                    pool: pool.clone(),
                    settings,
                    receiver: receiver.clone(),
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
    pool: Pool,
    settings: CommitSettings,
    receiver: Arc<Mutex<mpsc::Receiver<Submission>>>,
}

impl Lane {
    async fn run(self) {
        loop {
            let mut group = Vec::new();
            let mut alone = Vec::new();
            {
                let mut receiver = self.receiver.lock().await;
                let Some(first) = receiver.recv().await else {
                    return;
                };
                if first.solo {
                    alone.push(first);
                } else {
                    let mut commands = first.commands.len();
                    group.push(first);
                    while group.len() < self.settings.max_partitions
                        && commands < self.settings.max_commands
                    {
                        match receiver.try_recv() {
                            Ok(next) if next.solo => alone.push(next),
                            Ok(next) => {
                                commands += next.commands.len();
                                group.push(next);
                            }
                            Err(_) => break,
                        }
                    }
                }
            }
            if !group.is_empty() {
                self.commit(group).await;
            }
            for submission in alone {
                self.commit(vec![submission]).await;
            }
        }
    }

    async fn commit(&self, group: Vec<Submission>) {
        let Some(deadline) = group.iter().map(|s| s.deadline).min() else {
            return;
        };
        metrics::histogram!(m::GROUP_PARTITIONS).record(group.len() as f64);
        let started = Instant::now();
        let result = self.run_statement(&group, deadline).await;
        metrics::histogram!(m::DB_TRANSACTION_DURATION).record(started.elapsed().as_secs_f64());
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

    async fn run_statement(
        &self,
        group: &[Submission],
        deadline: Instant,
    ) -> Result<Vec<Result<Vec<Outcome>, FencedError>>, CommitError> {
        let client = tokio::time::timeout(self.settings.pool_wait, self.pool.get())
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| CommitError::Unavailable {
                reason: format!("no database connection: {e}"),
                outcome_unknown: false,
            })?;
        let batches: Vec<PartitionBatch<'_>> = group
            .iter()
            .map(|s| PartitionBatch {
                fence: &s.fence,
                commands: &s.commands,
            })
            .collect();
        let work = apply_group(&client, &batches);
        match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), work).await {
            Ok(result) => result.map_err(CommitError::from),
            Err(_) => {
                // The statement may still be running; never hand this connection to anyone else.
                let _ = deadpool_postgres::Object::take(client);
                Err(CommitError::Unavailable {
                    reason: "lease safe deadline reached during the transaction".into(),
                    outcome_unknown: true,
                })
            }
        }
    }
}

impl CommitError {
    /// The same failure for every member of a group (database errors are not `Clone`).
    fn duplicate(&self) -> CommitError {
        match self {
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
