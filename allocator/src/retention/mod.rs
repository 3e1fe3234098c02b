//! The retention job: an idempotency horizon for reservations and orders (DESIGN.md §8a).
//!
//! A reservation id protects a retry for a configured horizon after its last transition
//! (`--idempotency-horizon-secs`, default 7 days). After that a *terminal* reservation
//! (`confirmed`, `released`, `expired`, `rejected`) is removed, and so is a finished order once
//! its lines are gone; a `held` reservation and a `pending` order are never removed. A reuse of
//! a removed id is a new request. The ledger keeps every row: it names its reservation by id as
//! plain text (no foreign key since V2) and balances on its own, and settlement reads only the
//! ledger, so removing a reservation changes no total and no settled window.
//!
//! The job is a singleton ([`crate::singleton`], lease `job/retention`) so replicas do not
//! compete for the same rows; correctness does not depend on that (any replica would remove
//! the same rows). Each step is one short statement over at most `batch` rows that skips rows
//! locked by the hot path ([`store`]). A job killed mid-run loses at most its uncommitted
//! statement; the next holder continues from the oldest row left.
//!
//! Every replica also exports the size and dead tuples of the watched tables, so the health of
//! the hot rows is visible whoever holds the job, and keeps the ledger's time partitions ahead
//! of the clock ([`partitions`]). With `--ledger-archive-dir` the holder also archives the
//! oldest ledger partition once it may go ([`archive`]), after the removals have caught up.

pub mod archive;
pub mod command;
pub mod orders;
pub mod partitions;
pub mod store;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::describe;
use crate::metrics as m;
use crate::singleton::{Routine, Step};
use archive::{ArchiveSettings, Archived, JobFence};
use store::Kept;

const JOB: &str = "retention";
/// The job lease's name.
pub const RETENTION_LEASE: &str = "job/retention";
/// Most batches per tick: a backlog is worked off at up to this many batches per poll interval.
const BATCHES_PER_TICK: usize = 64;

#[derive(Debug, Clone)]
pub struct RetentionSettings {
    pub holder_id: String,
    /// How long after its last transition a terminal reservation (or a finished order) is kept.
    pub horizon: Duration,
    /// Most rows one statement removes.
    pub batch: usize,
    /// Archive ledger partitions as they may go; `None`: the job archives nothing.
    pub archive: Option<ArchiveSettings>,
    /// The URLs of the cluster's other shards (`--shard`), whose order lines an order stored
    /// here waits for ([`orders`]); empty for one database.
    pub other_shards: Vec<String>,
    /// The shard whose rows it removes and archives: the `shard` label of its metrics.
    pub shard: String,
}

impl RetentionSettings {
    /// How often the job observes and looks for rows past the horizon: often enough that a row
    /// outlives the horizon by a fraction of it, never busier than every 100 ms.
    pub fn poll_interval(&self) -> Duration {
        (self.horizon / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }
}

/// After a failed archive attempt, the next waits this long (an export may be large).
const ARCHIVE_RETRY: Duration = Duration::from_secs(60);

pub struct Retention {
    settings: RetentionSettings,
    /// No archive attempt before this instant (set after a failure).
    archive_after: Mutex<Option<Instant>>,
}

impl Retention {
    pub fn new(settings: RetentionSettings) -> Self {
        metrics::gauge!(m::RETENTION_HORIZON_SECONDS).set(settings.horizon.as_secs_f64());
        // Exported from the start (0 until the job archives), so every replica has the series.
        metrics::counter!(m::LEDGER_ARCHIVED_PARTITIONS).increment(0);
        metrics::counter!(m::LEDGER_ARCHIVED_ROWS).increment(0);
        Self {
            settings,
            archive_after: Mutex::new(None),
        }
    }

    /// One archive attempt under `term`, unless a failure asked to wait.
    async fn archive(&self, client: &tokio_postgres::Client, term: i64) -> Step {
        let Some(settings) = &self.settings.archive else {
            return Step::Idle;
        };
        {
            let mut after = self.archive_after.lock().expect("archive retry lock");
            if after.is_some_and(|t| Instant::now() < t) {
                return Step::Idle;
            }
            *after = None;
        }
        let fence = JobFence {
            lease: RETENTION_LEASE,
            holder_id: &self.settings.holder_id,
            term,
        };
        match archive::archive_oldest(client, settings, None, Some(fence)).await {
            Ok(Archived::Done(p)) => {
                metrics::counter!(m::LEDGER_ARCHIVED_PARTITIONS).increment(1);
                metrics::counter!(m::LEDGER_ARCHIVED_ROWS).increment(p.rows as u64);
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "archived").increment(1);
                tracing::info!(job = JOB, term, partition = %p.name, rows = p.rows,
                    file = %p.file.display(), sha256 = %p.sha256, "ledger partition archived");
                Step::More
            }
            Ok(Archived::Refused { partition, reason }) => {
                tracing::debug!(job = JOB, %partition, %reason, "ledger partition kept");
                Step::Idle
            }
            Ok(Archived::Nothing) => Step::Idle,
            Ok(Archived::Fenced) => {
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "stale_term")
                    .increment(1);
                Step::Fenced
            }
            Err(error) => {
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "failed").increment(1);
                tracing::warn!(
                    job = JOB,
                    term,
                    error = format!("{error:#}"),
                    "ledger archive failed; retried later"
                );
                *self.archive_after.lock().expect("archive retry lock") =
                    Some(Instant::now() + ARCHIVE_RETRY);
                Step::Idle
            }
        }
    }
}

impl Routine for Retention {
    fn name(&self) -> &'static str {
        JOB
    }

    fn lease(&self) -> &'static str {
        RETENTION_LEASE
    }

    fn steps_per_tick(&self) -> usize {
        BATCHES_PER_TICK
    }

    async fn observe(&self, client: &tokio_postgres::Client) {
        match partitions::upkeep(client).await {
            Ok(p) => {
                if p.created > 0 {
                    tracing::info!(job = JOB, created = p.created, "ledger partitions created");
                }
                metrics::gauge!(m::LEDGER_PARTITIONS).set(p.attached as f64);
                metrics::gauge!(m::LEDGER_PARTITIONS_AHEAD_SECONDS).set(p.ahead_secs);
                metrics::gauge!(m::LEDGER_PARTITION_SPAN_SECONDS).set(p.span_secs);
            }
            Err(error) => {
                tracing::warn!(job = JOB, error = %describe(&error), "ledger partition upkeep failed")
            }
        }
        match store::table_health(client).await {
            Ok(tables) => {
                for t in tables {
                    let table = t.table;
                    metrics::gauge!(m::TABLE_BYTES, "table" => table.clone()).set(t.bytes as f64);
                    metrics::gauge!(m::TABLE_LIVE_TUPLES, "table" => table.clone())
                        .set(t.live_tuples as f64);
                    metrics::gauge!(m::TABLE_DEAD_TUPLES, "table" => table.clone())
                        .set(t.dead_tuples as f64);
                    metrics::gauge!(m::TABLE_UPDATES, "table" => table.clone())
                        .set(t.updates as f64);
                    metrics::gauge!(m::TABLE_HOT_UPDATES, "table" => table)
                        .set(t.hot_updates as f64);
                }
            }
            Err(error) => {
                tracing::debug!(job = JOB, error = %describe(&error), "table health read failed")
            }
        }
    }

    /// One batch of reservations; once they are caught up, one batch of orders; once both are,
    /// one archive attempt.
    async fn step(&self, client: &tokio_postgres::Client, term: i64) -> Step {
        let s = &self.settings;
        let batch = s.batch as i64;
        let mut full = false;
        for kept in Kept::ALL {
            let table = kept.table();
            let result = if kept == Kept::Orders && !s.other_shards.is_empty() {
                orders::remove_past_horizon(
                    client,
                    &s.other_shards,
                    &s.holder_id,
                    term,
                    s.horizon,
                    batch,
                )
                .await
            } else {
                store::remove_past_horizon(
                    client,
                    kept,
                    RETENTION_LEASE,
                    &s.holder_id,
                    term,
                    s.horizon,
                    batch,
                )
                .await
                .map_err(|e| anyhow::anyhow!(describe(&e)))
            };
            match result {
                Ok(r) if r.fenced => {
                    metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "stale_term")
                        .increment(1);
                    return Step::Fenced;
                }
                Ok(r) => {
                    metrics::counter!(m::RETENTION_REMOVED, "table" => table).increment(r.rows);
                    metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "removed")
                        .increment(1);
                    if r.rows >= s.batch as u64 {
                        full = true;
                        // Reservations first: an order waits for its lines anyway.
                        break;
                    }
                }
                Err(error) => {
                    metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.settings.shard.clone(), "outcome" => "failed")
                        .increment(1);
                    tracing::warn!(
                        job = JOB,
                        term,
                        table,
                        error = format!("{error:#}"),
                        "retention batch failed"
                    );
                    return Step::Idle;
                }
            }
        }
        if full {
            Step::More
        } else {
            self.archive(client, term).await
        }
    }
}
