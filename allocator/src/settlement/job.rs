//! The settlement job's [`Routine`]: claim and settle closed windows while authority lasts; every
//! replica reports the lag.

use std::time::Duration;

use super::store;
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
}

/// The settlement work; its lease is `job/settlement`.
pub struct Settlement(SettlementSettings);

impl Settlement {
    pub fn new(settings: SettlementSettings) -> Self {
        metrics::gauge!(m::JOB_WINDOW_SECONDS, "job" => JOB).set(settings.window.as_secs_f64());
        Self(settings)
    }

    fn step_failed(term: i64, error: &tokio_postgres::Error) -> Step {
        if classify(error) == DbFailure::StaleEpoch {
            metrics::counter!(m::JOB_STALE_TERM_REJECTIONS, "job" => JOB).increment(1);
            metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "stale_term").increment(1);
            tracing::warn!(job = JOB, term, error = %describe(error), "settlement write refused: stale term");
            Step::Fenced
        } else {
            metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "failed").increment(1);
            tracing::warn!(job = JOB, term, error = %describe(error), "settlement step failed");
            Step::Idle
        }
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
            metrics::gauge!(m::JOB_WINDOW_LAG, "job" => JOB).set(lag);
        }
    }

    /// Claim and settle one window.
    async fn step(&self, client: &tokio_postgres::Client, term: i64) -> Step {
        let s = &self.0;
        let window = match store::claim_next(client, &s.holder_id, term, s.window, s.grace).await {
            Ok(Some(window)) => window,
            Ok(None) => return Step::Idle,
            Err(error) => return Self::step_failed(term, &error),
        };
        crate::faults::before_settle().await;
        match store::settle(client, term, window.start).await {
            Ok(Some(settled)) => {
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "settled").increment(1);
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
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "taken_over")
                    .increment(1);
                tracing::warn!(job = JOB, term, window_start = %window.start, "settlement window settled by a newer term");
                Step::Fenced
            }
            Err(error) => Self::step_failed(term, &error),
        }
    }
}
