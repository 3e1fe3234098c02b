//! The settlement job's tasks: a lease keeper (campaign and renewal), an I/O-free watchdog (safe
//! deadline and process stalls) and a runner (claim and settle closed windows while authority
//! lasts). They share one [`LeaseState`] behind a mutex; only the runner talks to the settlement
//! tables, and it asks for authority again before every window.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::store;
use crate::clock::Clock;
use crate::error::{classify, describe, DbFailure};
use crate::events::{self, RelaySettings, TermSource};
use crate::lease::state::{Authority, LeaseState, LeaseTiming, LossCause};
use crate::metrics as m;

/// The `job` label of every settlement metric.
const JOB: &str = "settlement";
const WATCHDOG_PERIOD: Duration = Duration::from_millis(50);
/// Most windows settled per runner tick, so a long backlog never starves status reads.
const WINDOWS_PER_TICK: usize = 32;

#[derive(Debug, Clone)]
pub struct SettlementSettings {
    pub holder_id: String,
    /// Length of one settlement window.
    pub window: Duration,
    /// How long after a window's end (database clock) it may be claimed: longer than any batch
    /// statement may run (`statement_timeout`), because a confirmation is stamped with its
    /// transaction's start and may commit that much later.
    pub grace: Duration,
    /// How often the runner looks for a closed window and refreshes the lag gauge.
    pub poll_interval: Duration,
    pub campaign_interval: Duration,
    pub timing: LeaseTiming,
}

struct Job {
    settings: SettlementSettings,
    /// A pool of its own, so the job never takes a connection a request or a renewal waits for.
    pool: Pool,
    clock: Arc<dyn Clock>,
    lease: Mutex<LeaseState>,
}

/// Start the job's tasks; the handle finishes after `shutdown` fired and a held lease was
/// released (so a peer takes over at its next campaign, not after a TTL).
///
/// With `relay`, the change-event relay (DESIGN.md §14) runs under the same lease and term.
pub fn spawn(
    settings: SettlementSettings,
    pool: Pool,
    clock: Arc<dyn Clock>,
    relay: Option<RelaySettings>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    metrics::gauge!(m::JOB_WINDOW_SECONDS, "job" => JOB).set(settings.window.as_secs_f64());
    metrics::gauge!(m::JOB_LEADER, "job" => JOB).set(0.0);
    // Exported by every replica (0 unless it runs the relay), so the lag alert always has a
    // series to read.
    metrics::gauge!(m::EVENTS_LAG_ENTRIES).set(0.0);
    metrics::gauge!(m::EVENTS_LAG_SECONDS).set(0.0);
    let job = Arc::new(Job {
        settings,
        pool,
        clock,
        lease: Mutex::new(LeaseState::NotHeld),
    });
    tokio::spawn(async move {
        let stop = CancellationToken::new();
        let watchdog = tokio::spawn(job.clone().watchdog(stop.clone()));
        let runner = tokio::spawn(job.clone().runner(stop.clone()));
        let relay = relay.and_then(|relay| job.clone().spawn_relay(relay, stop.clone()));
        job.keeper(shutdown).await;
        stop.cancel();
        let _ = tokio::join!(watchdog, runner);
        if let Some(relay) = relay {
            let _ = relay.await;
        }
        job.release().await;
    })
}

impl Job {
    fn state(&self) -> LeaseState {
        *self.lease.lock().expect("job lease lock")
    }

    /// The relay asks for the term before every round, as the runner does before every window.
    fn spawn_relay(
        self: Arc<Self>,
        relay: RelaySettings,
        stop: CancellationToken,
    ) -> Option<JoinHandle<()>> {
        let job = self.clone();
        let term: TermSource = Arc::new(move || match job.state().authority(job.clock.now()) {
            Authority::Granted { epoch, .. } => Some(epoch),
            _ => None,
        });
        match events::spawn(relay, self.pool.clone(), term, stop) {
            Ok(task) => Some(task),
            Err(error) => {
                tracing::error!(%error, "event relay not started");
                None
            }
        }
    }

    fn set_state(&self, state: LeaseState) {
        *self.lease.lock().expect("job lease lock") = state;
    }

    /// Drop authority locally; the database keeps naming this replica until expiry or release.
    fn lose(&self, cause: LossCause) {
        let mut lease = self.lease.lock().expect("job lease lock");
        if let Some(term) = lease.epoch() {
            tracing::warn!(job = JOB, term, cause = cause.as_str(), "job lease lost");
            *lease = LeaseState::NotHeld;
            metrics::gauge!(m::JOB_LEADER, "job" => JOB).set(0.0);
        }
    }

    fn jittered_campaign(&self) -> Duration {
        edge::backoff::jitter(self.settings.campaign_interval, 0.2)
    }

    /// Campaign while not holding, renew while holding.
    async fn keeper(&self, shutdown: CancellationToken) {
        let timing = self.settings.timing;
        loop {
            let wait = match self.state() {
                LeaseState::NotHeld => {
                    self.campaign(&timing).await;
                    if self.state().epoch().is_some() {
                        timing.renew_interval
                    } else {
                        self.jittered_campaign()
                    }
                }
                held => self.renew(&timing, held).await,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn campaign(&self, timing: &LeaseTiming) {
        let t0 = self.clock.now();
        let attempt = tokio::time::timeout(timing.renew_interval, async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            store::acquire(&**client, &self.settings.holder_id, timing.ttl)
                .await
                .map_err(|e| describe(&e))
        })
        .await;
        match attempt {
            Ok(Ok(Some(term))) => {
                self.set_state(LeaseState::on_acquired(timing, t0, term));
                metrics::gauge!(m::JOB_LEADER, "job" => JOB).set(1.0);
                metrics::gauge!(m::JOB_TERM, "job" => JOB).set(term as f64);
                tracing::info!(job = JOB, term, "job lease acquired");
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::debug!(job = JOB, %error, "job campaign failed"),
            Err(_) => tracing::debug!(job = JOB, "job campaign timed out"),
        }
    }

    /// Returns how long to wait before the next renewal.
    async fn renew(&self, timing: &LeaseTiming, held: LeaseState) -> Duration {
        let Some(term) = held.epoch() else {
            return timing.renew_interval;
        };
        let t0 = self.clock.now();
        let attempt = tokio::time::timeout(timing.renew_attempt_timeout(), async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            store::renew(&**client, &self.settings.holder_id, term, timing.ttl)
                .await
                .map_err(|e| describe(&e))
        })
        .await;
        let ended = self.clock.now();
        let until_next = |confirmed| {
            timing
                .next_renewal(t0, ended, confirmed)
                .saturating_duration_since(ended)
        };
        let mut lease = self.lease.lock().expect("job lease lock");
        if lease.epoch() != Some(term) {
            // Lost (deadline, stall, fenced) while the renewal was in flight.
            return timing.renew_interval;
        }
        match attempt {
            Ok(Ok(true)) => {
                *lease = lease.on_renewed(timing, t0, self.clock.now());
                until_next(true)
            }
            Ok(Ok(false)) => {
                drop(lease);
                self.lose(LossCause::RenewRejected);
                timing.renew_interval
            }
            failed => {
                let reason = match failed {
                    Ok(Err(e)) => e,
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(job = JOB, term, %reason, "job lease renewal failed, job paused");
                *lease = lease.on_renew_failed();
                // Retry on the lease timing's schedule: a confirmed renewal before the deadline
                // restores authority.
                until_next(false)
            }
        }
    }

    async fn watchdog(self: Arc<Self>, stop: CancellationToken) {
        let margin = self.settings.timing.margin;
        crate::clock::watch(
            &*self.clock,
            WATCHDOG_PERIOD,
            margin,
            &stop,
            |now, stall| {
                if let Some(stall) = stall {
                    let stall_ms = stall.as_millis() as u64;
                    tracing::warn!(job = JOB, stall_ms, "process stall detected");
                    self.lose(LossCause::Stall);
                }
                let lost = {
                    let mut lease = self.lease.lock().expect("job lease lock");
                    let term = lease.epoch();
                    let (next, lost) = lease.tick(now);
                    *lease = next;
                    lost.zip(term)
                };
                if let Some((cause, term)) = lost {
                    tracing::warn!(job = JOB, term, cause = cause.as_str(), "job lease lost");
                    metrics::gauge!(m::JOB_LEADER, "job" => JOB).set(0.0);
                }
            },
        )
        .await;
    }

    async fn runner(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.settings.poll_interval) => {}
            }
            self.refresh_lag().await;
            for _ in 0..WINDOWS_PER_TICK {
                let Authority::Granted { epoch: term, .. } =
                    self.state().authority(self.clock.now())
                else {
                    break;
                };
                if !self.settle_next(term).await {
                    break;
                }
            }
        }
    }

    /// Every replica reports the lag, so an alert does not depend on which one holds the job.
    async fn refresh_lag(&self) {
        let Ok(client) = self.pool.get().await else {
            return;
        };
        if let Ok(lag) = schema::settlement::read_lag(&**client).await {
            metrics::gauge!(m::JOB_WINDOW_LAG, "job" => JOB).set(lag);
        }
    }

    /// Claim and settle one window; `true` when another may be due.
    async fn settle_next(&self, term: i64) -> bool {
        let client = match self.pool.get().await {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(job = JOB, %error, "no connection for the settlement job");
                return false;
            }
        };
        let s = &self.settings;
        let window = match store::claim_next(&**client, &s.holder_id, term, s.window, s.grace).await
        {
            Ok(Some(window)) => window,
            Ok(None) => return false,
            Err(error) => return self.step_failed(term, &error),
        };
        crate::faults::before_settle().await;
        match store::settle(&**client, term, window.start).await {
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
                true
            }
            Ok(None) => {
                // Settled meanwhile; only a newer term could have done that.
                metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "taken_over")
                    .increment(1);
                tracing::warn!(job = JOB, term, window_start = %window.start, "settlement window settled by a newer term");
                self.lose(LossCause::Fenced);
                false
            }
            Err(error) => self.step_failed(term, &error),
        }
    }

    fn step_failed(&self, term: i64, error: &tokio_postgres::Error) -> bool {
        if classify(error) == DbFailure::StaleEpoch {
            metrics::counter!(m::JOB_STALE_TERM_REJECTIONS, "job" => JOB).increment(1);
            metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "stale_term").increment(1);
            tracing::warn!(job = JOB, term, error = %describe(error), "settlement write refused: stale term");
            self.lose(LossCause::Fenced);
        } else {
            metrics::counter!(m::JOB_RUNS, "job" => JOB, "outcome" => "failed").increment(1);
            tracing::warn!(job = JOB, term, error = %describe(error), "settlement step failed");
        }
        false
    }

    async fn release(&self) {
        let Some(term) = self.state().epoch() else {
            return;
        };
        self.set_state(LeaseState::NotHeld);
        metrics::gauge!(m::JOB_LEADER, "job" => JOB).set(0.0);
        let released = tokio::time::timeout(self.settings.timing.renew_interval, async {
            let client = self.pool.get().await.ok()?;
            store::release(&**client, &self.settings.holder_id, term)
                .await
                .ok()
        })
        .await;
        if let Ok(Some(true)) = released {
            tracing::info!(job = JOB, term, "job lease released");
        }
    }
}
