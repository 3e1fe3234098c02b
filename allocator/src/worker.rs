//! One worker task per owned partition.
//!
//! The worker serialises its partition's commands and batches whatever is queued (up to
//! `batch_max`) into one fenced transaction: under hot-SKU skew many reservations for one row
//! then share one commit instead of queueing on the row lock. Before each batch it re-checks
//! authority, and it bounds the transaction by the lease's safe deadline: work never outlives
//! the authority it started under. It also sweeps its partition's overdue holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::DbFailure;
use crate::fenced::{fenced_transaction, Command, Fence, FencedError, Outcome};
use crate::lease::ownership::{Ownership, WorkerHandle};
use crate::lease::state::{Authority, LossCause};
use crate::metrics as m;

pub struct Job {
    pub command: Command,
    pub reply: oneshot::Sender<Result<Outcome, WorkError>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("command", &self.command)
            .finish()
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum WorkError {
    #[error("partition {partition} is not owned by this replica")]
    NotOwner { partition: u32 },
    /// The partition cannot serve right now. `outcome_unknown` is true when a commit may have
    /// happened (the client must retry with the same id to learn the outcome).
    #[error("partition {partition} unavailable: {reason}")]
    Unavailable {
        partition: u32,
        reason: String,
        outcome_unknown: bool,
    },
    /// The database refused the transaction for a reason other than fencing or availability
    /// (a constraint, an unexpected error). Nothing was committed.
    #[error("partition {partition} storage error: {reason}")]
    Storage { partition: u32, reason: String },
}

/// What every worker shares.
pub struct WorkerContext {
    pub pool: Pool,
    pub ownership: Arc<Ownership>,
    pub replica_id: String,
    pub batch_max: usize,
    pub queue_capacity: usize,
    pub expiry_interval: Duration,
    pub expiry_batch: i64,
}

pub fn spawn_worker(ctx: Arc<WorkerContext>, partition: u32, epoch: i64) -> WorkerHandle {
    let (sender, receiver) = mpsc::channel(ctx.queue_capacity);
    let cancel = CancellationToken::new();
    let worker = Worker {
        fence: Fence {
            partition,
            epoch,
            replica_id: ctx.replica_id.clone(),
        },
        ctx,
        cancel: cancel.clone(),
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
    fence: Fence,
    cancel: CancellationToken,
}

impl Worker {
    async fn run(self, mut receiver: mpsc::Receiver<Job>) {
        let partition = self.fence.partition;
        tracing::info!(
            partition,
            epoch = self.fence.epoch,
            "partition worker started"
        );
        let mut sweep = tokio::time::interval(self.ctx.expiry_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                job = receiver.recv() => {
                    let Some(job) = job else { break };
                    let mut batch = vec![job];
                    while batch.len() < self.ctx.batch_max {
                        match receiver.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    self.process(batch).await;
                }
                _ = sweep.tick() => self.sweep_expired().await,
            }
        }
        // Authority is gone: nothing queued may run; the router retries elsewhere.
        receiver.close();
        while let Ok(job) = receiver.try_recv() {
            let _ = job.reply.send(Err(WorkError::NotOwner { partition }));
        }
        tracing::info!(
            partition,
            epoch = self.fence.epoch,
            "partition worker stopped"
        );
    }

    fn deadline(&self) -> Result<Instant, WorkError> {
        match self
            .ctx
            .ownership
            .authority(self.fence.partition, self.fence.epoch)
        {
            Authority::Granted { safe_until, .. } => Ok(safe_until),
            Authority::Uncertain => Err(WorkError::Unavailable {
                partition: self.fence.partition,
                reason: "lease renewal unconfirmed".into(),
                outcome_unknown: false,
            }),
            Authority::NotHeld => Err(WorkError::NotOwner {
                partition: self.fence.partition,
            }),
        }
    }

    async fn process(&self, batch: Vec<Job>) {
        metrics::histogram!(m::BATCH_SIZE).record(batch.len() as f64);
        let commands: Vec<Command> = batch.iter().map(|j| j.command.clone()).collect();
        match self.execute(&commands).await {
            Ok(outcomes) => {
                for (job, outcome) in batch.into_iter().zip(outcomes) {
                    self.record(&job.command, &outcome);
                    let _ = job.reply.send(Ok(outcome));
                }
            }
            Err(error) if batch.len() > 1 && Self::worth_retrying_alone(&error) => {
                // One command tripped over something unexpected; do not let it fail the others.
                for job in batch {
                    let result = self
                        .execute(std::slice::from_ref(&job.command))
                        .await
                        .map(|mut o| o.remove(0));
                    if let Ok(outcome) = &result {
                        self.record(&job.command, outcome);
                    }
                    let _ = job.reply.send(result);
                }
            }
            Err(error) => {
                for job in batch {
                    let _ = job.reply.send(Err(error.clone()));
                }
            }
        }
    }

    fn worth_retrying_alone(error: &WorkError) -> bool {
        matches!(error, WorkError::Storage { .. })
    }

    fn record(&self, command: &Command, outcome: &Outcome) {
        metrics::counter!(m::RESERVATION_OUTCOMES, "op" => command.op(), "result" => outcome.result())
            .increment(1);
        let id = match command {
            Command::Reserve { reservation_id, .. }
            | Command::Confirm { reservation_id }
            | Command::Release { reservation_id } => reservation_id.as_str(),
            Command::Adjust { adjustment_id, .. } => adjustment_id.as_str(),
            // Sweeps log their own summary.
            Command::ExpireDue { .. } => return,
        };
        tracing::info!(
            partition = self.fence.partition,
            epoch = self.fence.epoch,
            op = command.op(),
            reservation_id = id,
            outcome = outcome.result(),
            "command applied"
        );
    }

    /// One fenced transaction bounded by the lease's safe deadline and by cancellation.
    async fn execute(&self, commands: &[Command]) -> Result<Vec<Outcome>, WorkError> {
        let partition = self.fence.partition;
        let safe_until = self.deadline()?;
        let started = Instant::now();
        let work = async {
            let mut client = self
                .ctx
                .pool
                .get()
                .await
                .map_err(|e| WorkError::Unavailable {
                    partition,
                    reason: format!("no database connection: {e}"),
                    outcome_unknown: false,
                })?;
            fenced_transaction(&mut client, &self.fence, commands)
                .await
                .map_err(|e| self.translate(e))
        };
        let result = tokio::select! {
            _ = self.cancel.cancelled() => Err(WorkError::Unavailable {
                partition,
                reason: "authority lost during the transaction".into(),
                outcome_unknown: true,
            }),
            timed = tokio::time::timeout_at(tokio::time::Instant::from_std(safe_until), work) => match timed {
                Ok(result) => result,
                Err(_) => Err(WorkError::Unavailable {
                    partition,
                    reason: "lease safe deadline reached during the transaction".into(),
                    outcome_unknown: true,
                }),
            },
        };
        metrics::histogram!(m::DB_TRANSACTION_DURATION).record(started.elapsed().as_secs_f64());
        result
    }

    fn translate(&self, error: FencedError) -> WorkError {
        let partition = self.fence.partition;
        match error.failure() {
            DbFailure::StaleEpoch => {
                metrics::counter!(m::STALE_EPOCH_REJECTIONS).increment(1);
                tracing::warn!(partition, epoch = self.fence.epoch, %error, "stale epoch refused by the database");
                self.ctx
                    .ownership
                    .lose(partition, self.fence.epoch, LossCause::Fenced);
                WorkError::NotOwner { partition }
            }
            DbFailure::Unavailable => WorkError::Unavailable {
                partition,
                reason: format!("database unavailable: {error}"),
                outcome_unknown: true,
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

    async fn sweep_expired(&self) {
        // Keep going while full batches come back, so a backlog drains in small transactions.
        for _ in 0..10 {
            let command = Command::ExpireDue {
                limit: self.ctx.expiry_batch,
            };
            match self.execute(std::slice::from_ref(&command)).await {
                Ok(outcomes) => {
                    let Some(Outcome::Expired { count }) = outcomes.first() else {
                        return;
                    };
                    if *count > 0 {
                        metrics::counter!(m::EXPIRED_HOLDS).increment(*count);
                        tracing::info!(
                            partition = self.fence.partition,
                            epoch = self.fence.epoch,
                            count,
                            "expired overdue holds"
                        );
                    }
                    if (*count as i64) < self.ctx.expiry_batch {
                        return;
                    }
                }
                Err(error) => {
                    tracing::debug!(partition = self.fence.partition, %error, "expiry sweep skipped");
                    return;
                }
            }
        }
    }
}
