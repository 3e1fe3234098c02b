//! One worker task per owned partition (DESIGN.md §6, §7).
//!
//! The worker serialises its partition's commands and batches whatever is queued (up to
//! `batch_max`) into one fenced statement, handed to the [group committer](crate::commit):
//! under hot-SKU skew many reservations for one row then share one commit and one row update
//! instead of queueing on the row lock. Before each batch it re-checks authority, and it bounds
//! the wait by the lease's safe deadline: work never outlives the authority it started under.
//!
//! A worker knows its lease only through the [`PartitionAuthority`] it was started with, bound
//! to one (partition, epoch): it can ask whether it may still write and until when, and report
//! the tenure lost when the database refuses its epoch. It cannot see or change the ownership
//! table, so the replica layer that spawns workers is the only one that decides who owns what.
//!
//! Overdue holds are swept whenever a sweep is due, whatever the queue depth: a busy partition
//! carries the sweep as the first command of its next batch (so freed stock is available to the
//! reserves behind it), an idle one runs it on a timer. A sweep that expired a full batch is due
//! again at once, so a backlog drains in small steps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::authority::{PartitionAuthority, Withheld};
use crate::commit::{Claim, CommitError, Committer, Submission};
use crate::error::DbFailure;
use crate::fenced::{Command, Fence, FencedError, Outcome};
use crate::lease::state::LossCause;
use crate::metrics as m;
use crate::stages::{Mark, Stamps};
use crate::work::{WorkError, WorkItem};

/// What every worker shares.
pub struct WorkerContext {
    pub committer: Committer,
    pub replica_id: String,
    pub batch_max: usize,
    pub queue_capacity: usize,
    pub expiry_interval: Duration,
    pub expiry_batch: i64,
}

/// A running partition worker, as the ownership table keeps it.
#[derive(Debug)]
pub struct WorkerHandle {
    pub sender: mpsc::Sender<WorkItem>,
    /// Cancelled when authority is lost: the worker aborts its in-flight transaction and answers
    /// everything queued with "not owner".
    pub cancel: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

/// Start the worker for the tenure `authority` speaks for.
pub fn spawn_worker(ctx: Arc<WorkerContext>, authority: PartitionAuthority) -> WorkerHandle {
    let (sender, receiver) = mpsc::channel(ctx.queue_capacity);
    let cancel = CancellationToken::new();
    let worker = Worker {
        fence: Fence::new(authority.token(), ctx.replica_id.clone()),
        authority,
        ctx,
        cancel: cancel.clone(),
        solo: false,
    };
    let task = tokio::spawn(worker.run(receiver));
    WorkerHandle {
        sender,
        cancel,
        task,
    }
}

struct Worker {
    ctx: Arc<WorkerContext>,
    /// Asked before every transaction: authority can lapse while commands wait in the queue.
    authority: PartitionAuthority,
    /// What the database checks; the same tenure as `authority`, plus this replica's id.
    fence: Fence,
    cancel: CancellationToken,
    /// The previous batch failed: run the next one in a transaction of its own.
    solo: bool,
}

impl Worker {
    async fn run(mut self, mut receiver: mpsc::Receiver<WorkItem>) {
        let partition = self.fence.token.partition;
        tracing::info!(
            partition,
            epoch = self.fence.token.epoch,
            "partition worker started"
        );
        let mut next_sweep = Instant::now() + self.ctx.expiry_interval;
        loop {
            let idle_sweep = tokio::time::sleep_until(next_sweep.into());
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                job = receiver.recv() => {
                    let Some(job) = job else { break };
                    let mut batch = Vec::with_capacity(self.ctx.batch_max);
                    self.admit(job, &mut batch);
                    while batch.len() < self.ctx.batch_max {
                        match receiver.try_recv() {
                            Ok(job) => self.admit(job, &mut batch),
                            Err(_) => break,
                        }
                    }
                    let sweep = Instant::now() >= next_sweep;
                    if batch.is_empty() && !sweep {
                        continue;
                    }
                    let drained = self.process(batch, sweep).await;
                    if sweep {
                        next_sweep = self.after_sweep(drained);
                    }
                }
                _ = idle_sweep => {
                    let drained = self.process(Vec::new(), true).await;
                    next_sweep = self.after_sweep(drained);
                }
            }
        }
        // Authority is gone: nothing queued may run; the router retries elsewhere.
        receiver.close();
        while let Ok(job) = receiver.try_recv() {
            let _ = job.reply.send(Err(WorkError::NotOwner { partition }));
        }
        tracing::info!(
            partition,
            epoch = self.fence.token.epoch,
            "partition worker stopped"
        );
    }

    /// Take a job into the batch unless its caller has already given up (timed out or
    /// disconnected): running it would only feed a duplicate of a retry.
    fn admit(&self, job: WorkItem, batch: &mut Vec<WorkItem>) {
        if job.reply.is_closed() {
            metrics::counter!(m::ABANDONED_COMMANDS).increment(1);
        } else {
            job.stamps.mark(Mark::Admitted, Instant::now());
            batch.push(job);
        }
    }

    /// When the next sweep is due: at once while a backlog remains.
    fn after_sweep(&self, drained: Option<u64>) -> Instant {
        match drained {
            Some(count) if count as i64 >= self.ctx.expiry_batch => Instant::now(),
            _ => Instant::now() + self.ctx.expiry_interval,
        }
    }

    fn deadline(&self) -> Result<Instant, WorkError> {
        let partition = self.fence.token.partition;
        self.authority
            .write_deadline()
            .map_err(|withheld| match withheld {
                Withheld::Unconfirmed => WorkError::Unavailable {
                    partition,
                    reason: "lease renewal unconfirmed".into(),
                    outcome_unknown: false,
                },
                Withheld::Lost => WorkError::NotOwner { partition },
            })
    }

    /// Run `batch` (after a sweep when `sweep` is set) and answer every job. Returns how many
    /// holds the sweep expired, if it ran.
    async fn process(&mut self, batch: Vec<WorkItem>, sweep: bool) -> Option<u64> {
        crate::faults::before_batch(batch.iter().map(|job| &job.command));
        if !batch.is_empty() {
            metrics::histogram!(m::BATCH_SIZE).record(batch.len() as f64);
        }
        let mut commands = Vec::with_capacity(batch.len() + 1);
        if sweep {
            commands.push(Command::ExpireDue {
                limit: self.ctx.expiry_batch,
            });
        }
        commands.extend(batch.iter().map(|j| j.command.clone()));
        let stamps = Stamps::default();
        let executed = self.execute(commands, &stamps).await;
        for job in &batch {
            job.stamps.absorb_batch(&stamps);
        }
        match executed {
            Ok(mut outcomes) => {
                let drained = if sweep {
                    match outcomes.remove(0) {
                        Outcome::Expired { count } => Some(self.swept(count)),
                        _ => None,
                    }
                } else {
                    None
                };
                for (job, outcome) in batch.into_iter().zip(outcomes) {
                    record(&job.command, &outcome);
                    let _ = job.reply.send(Ok(outcome));
                }
                drained
            }
            Err(error) if batch.len() > 1 && matches!(error, WorkError::Storage { .. }) => {
                // One command tripped over something unexpected; do not let it fail the others.
                for job in batch {
                    let stamps = Stamps::default();
                    let result = self
                        .execute(vec![job.command.clone()], &stamps)
                        .await
                        .map(|mut o| o.remove(0));
                    job.stamps.absorb_batch(&stamps);
                    if let Ok(outcome) = &result {
                        record(&job.command, outcome);
                    }
                    let _ = job.reply.send(result);
                }
                None
            }
            Err(error) => {
                if batch.is_empty() {
                    tracing::debug!(partition = self.fence.token.partition, %error, "expiry sweep skipped");
                }
                for job in batch {
                    let _ = job.reply.send(Err(error.clone()));
                }
                None
            }
        }
    }

    fn swept(&self, count: u64) -> u64 {
        if count > 0 {
            metrics::counter!(m::EXPIRED_HOLDS).increment(count);
            tracing::info!(
                partition = self.fence.token.partition,
                epoch = self.fence.token.epoch,
                count,
                "expired overdue holds"
            );
        }
        count
    }

    /// One fenced statement through the group committer, bounded by the lease's safe deadline
    /// and by cancellation; `stamps` gets the batch's hand-over and its statement's marks.
    async fn execute(
        &mut self,
        commands: Vec<Command>,
        stamps: &Stamps,
    ) -> Result<Vec<Outcome>, WorkError> {
        let partition = self.fence.token.partition;
        // Not worth queueing while the tenure cannot write; the lane asks again before it runs.
        self.deadline()?;
        let (reply, answer) = oneshot::channel();
        let claim = Arc::new(Claim::default());
        let batch_stamps = Arc::new(Stamps::default());
        batch_stamps.mark(Mark::Submitted, Instant::now());
        let submission = Submission {
            stamps: batch_stamps.clone(),
            fence: self.fence.clone(),
            authority: self.authority.clone(),
            commands,
            solo: self.solo,
            claim: claim.clone(),
            reply,
        };
        if self.ctx.committer.submit(submission).await.is_err() {
            return Err(WorkError::Unavailable {
                partition,
                reason: "replica is shutting down".into(),
                outcome_unknown: false,
            });
        }
        let result = tokio::select! {
            // Withdrawn before a lane took it: it never runs, so the answer is a plain "not
            // owner". Taken: a statement may be carrying it, so the outcome is unknown.
            _ = self.cancel.cancelled() => Err(if claim.withdraw() {
                WorkError::NotOwner { partition }
            } else {
                WorkError::Unavailable {
                    partition,
                    reason: "authority lost during the transaction".into(),
                    outcome_unknown: true,
                }
            }),
            answer = answer => match answer {
                Ok(Ok(outcomes)) => Ok(outcomes),
                Ok(Err(CommitError::Ended)) => Err(WorkError::NotOwner { partition }),
                Ok(Err(CommitError::Fenced(error))) => Err(self.translate(error)),
                Ok(Err(CommitError::Unavailable { reason, outcome_unknown })) => {
                    Err(WorkError::Unavailable { partition, reason, outcome_unknown })
                }
                Err(_) => Err(WorkError::Unavailable {
                    partition,
                    reason: "commit lane stopped".into(),
                    outcome_unknown: true,
                }),
            },
        };
        stamps.absorb_batch(&batch_stamps);
        self.solo = matches!(
            result,
            Err(WorkError::Unavailable { .. } | WorkError::Storage { .. })
        );
        result
    }

    fn translate(&self, error: FencedError) -> WorkError {
        let partition = self.fence.token.partition;
        match error.failure() {
            DbFailure::StaleEpoch => {
                metrics::counter!(m::STALE_EPOCH_REJECTIONS).increment(1);
                tracing::warn!(partition, epoch = self.fence.token.epoch, %error, "stale epoch refused by the database");
                self.authority.report_loss(LossCause::Fenced);
                WorkError::NotOwner { partition }
            }
            DbFailure::Unavailable => WorkError::Unavailable {
                partition,
                reason: format!("database unavailable: {error}"),
                outcome_unknown: error.outcome_unknown(),
            },
            DbFailure::ConstraintViolation => {
                tracing::error!(partition, %error, "constraint refused a fenced write");
                WorkError::Storage {
                    partition,
                    reason: format!("constraint: {error}"),
                }
            }
            DbFailure::Other => {
                tracing::error!(partition, %error, "fenced transaction failed");
                WorkError::Storage {
                    partition,
                    reason: format!("database error: {error}"),
                }
            }
        }
    }
}

/// Count every applied command; per-command detail goes to the debug log only, so the hot path
/// does not format and write a line per reservation.
fn record(command: &Command, outcome: &Outcome) {
    metrics::counter!(m::RESERVATION_OUTCOMES, "op" => command.op(), "result" => outcome.result())
        .increment(1);
    tracing::debug!(
        op = command.op(),
        outcome = outcome.result(),
        ?command,
        "command applied"
    );
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
