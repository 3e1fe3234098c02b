//! The settlement job's [`Routine`]: claim and settle closed windows while authority lasts; every
//! replica reports the lag.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::store::{self, Settled, Window};
use crate::error::{classify, describe, DbFailure};
use crate::metrics as m;
use crate::singleton::{Routine, Step};

/// The `job` label of every settlement metric.
const JOB: &str = "settlement";
/// Most windows settled per runner tick, so a long backlog never starves status reads.
const WINDOWS_PER_TICK: usize = 32;

#[derive(Debug, Clone)]
pub struct SettlementSettings {
    /// Length of one settlement window.
    pub window: Duration,
    /// How long after a window's end (database clock) it may be claimed: longer than any batch
    /// statement may run (`statement_timeout`), because a confirmation is stamped with its
    /// transaction's start and may commit that much later.
    pub grace: Duration,
    pub holder_id: String,
    /// The shard whose rows it settles: the `shard` label of its metrics.
    pub shard: String,
}

/// The settlement work; its lease is `job/settlement`.
pub struct Settlement(SettlementSettings);

impl Settlement {
    pub fn new(settings: SettlementSettings) -> Self {
        metrics::gauge!(m::JOB_WINDOW_SECONDS, "job" => JOB, "shard" => settings.shard.clone())
            .set(settings.window.as_secs_f64());
        Self(settings)
    }

    fn step_failed(&self, term: i64, failure: Failure) -> Step {
        match failure {
            Failure::StaleTerm(error) => {
                metrics::counter!(m::JOB_STALE_TERM_REJECTIONS, "job" => JOB, "shard" => self.0.shard.clone()).increment(1);
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.0.shard.clone(), "outcome" => "stale_term")
                    .increment(1);
                tracing::warn!(job = JOB, term, %error, "settlement write refused: stale term");
                Step::Fenced
            }
            Failure::Other(error) => {
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.0.shard.clone(), "outcome" => "failed").increment(1);
                tracing::warn!(job = JOB, term, %error, "settlement step failed");
                Step::Idle
            }
        }
    }

    /// Claim the next closed window and settle it under `term`.
    async fn settle_next(&self, db: &impl Windows, term: i64) -> Step {
        let s = &self.0;
        let window = match db.claim_next(&s.holder_id, term, s.window, s.grace).await {
            Ok(Some(window)) => window,
            Ok(None) => return Step::Idle,
            Err(failure) => return self.step_failed(term, failure),
        };
        crate::faults::before_settle().await;
        match db.settle(term, window.start).await {
            Ok(Some(settled)) => {
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.0.shard.clone(), "outcome" => "settled").increment(1);
                tracing::info!(
                    job = JOB,
                    term,
                    window_start = %window.start,
                    reservations = settled.reservations,
                    quantity = settled.quantity,
                    "settlement window settled"
                );
                Step::More
            }
            Ok(None) => {
                // Settled meanwhile; only a newer term could have done that.
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "shard" => self.0.shard.clone(), "outcome" => "taken_over")
                    .increment(1);
                tracing::warn!(job = JOB, term, window_start = %window.start, "settlement window settled by a newer term");
                Step::Fenced
            }
            Err(failure) => self.step_failed(term, failure),
        }
    }
}

/// Why a statement of the job failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The tables' trigger refused the term: a newer holder exists.
    StaleTerm(String),
    /// Anything else; the step is tried again at the next tick.
    Other(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        match classify(&error) {
            DbFailure::StaleEpoch => Failure::StaleTerm(describe(&error)),
            _ => Failure::Other(describe(&error)),
        }
    }
}

/// The job's two statements ([`store`]); what they answer is what the job decides on.
pub trait Windows: Sync {
    /// [`store::claim_next`].
    fn claim_next(
        &self,
        holder_id: &str,
        term: i64,
        window: Duration,
        grace: Duration,
    ) -> impl Future<Output = Result<Option<Window>, Failure>> + Send;
    /// [`store::settle`].
    fn settle(
        &self,
        term: i64,
        window_start: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<Settled>, Failure>> + Send;
}

impl Windows for tokio_postgres::Client {
    async fn claim_next(
        &self,
        holder_id: &str,
        term: i64,
        window: Duration,
        grace: Duration,
    ) -> Result<Option<Window>, Failure> {
        Ok(store::claim_next(self, holder_id, term, window, grace).await?)
    }

    async fn settle(
        &self,
        term: i64,
        window_start: DateTime<Utc>,
    ) -> Result<Option<Settled>, Failure> {
        Ok(store::settle(self, term, window_start).await?)
    }
}

impl Routine for Settlement {
    fn name(&self) -> &'static str {
        JOB
    }

    fn lease(&self) -> &'static str {
        schema::SETTLEMENT_LEASE
    }

    fn steps_per_tick(&self) -> usize {
        WINDOWS_PER_TICK
    }

    /// Every replica reports the lag, so an alert does not depend on which one holds the job.
    async fn observe(&self, client: &tokio_postgres::Client) {
        if let Ok(lag) = schema::settlement::read_lag(client).await {
            metrics::gauge!(m::JOB_WINDOW_LAG, "job" => JOB, "shard" => self.0.shard.clone())
                .set(lag);
        }
    }

    /// Claim and settle one window.
    async fn step(&self, client: &tokio_postgres::Client, term: i64) -> Step {
        self.settle_next(client, term).await
    }
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;
