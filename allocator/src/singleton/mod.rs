//! Lease-guarded singleton jobs (DESIGN.md §8): settlement and retention.
//!
//! Every replica is a candidate for each job's lease (`job/<name>`). A job runs three tasks: a
//! lease keeper (campaign and renewal), an I/O-free watchdog (safe deadline and process stalls)
//! and a runner that asks for authority again before every step and runs steps while it lasts.
//! They share one [`LeaseState`] behind a mutex, so the jobs follow the partition leases' rules:
//! a job stops at its safe deadline, on an ambiguous renewal (no new steps while uncertain), and
//! after a process stall longer than the margin. The lease's epoch is the job's *term*; each
//! job's writes check it inside their own statement, so a holder that slept through its lease
//! is refused rather than trusted.
//!
//! What a job does is a [`Routine`]: a per-tick observation every replica makes (gauges that must
//! not depend on who holds the job) and a step run under a term. Each job has a pool of its own,
//! so it never takes a connection a request or a renewal waits for.
//!
//! [`LeaseState`]: crate::lease::state::LeaseState

pub mod store;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::error::describe;
use crate::lease::state::{Authority, LeaseState, LeaseTiming, LossCause};
use crate::metrics as m;

const WATCHDOG_PERIOD: Duration = Duration::from_millis(50);

/// What one step of a job found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// More work may be due now.
    More,
    /// Nothing more until the next tick (or the step failed and is retried then).
    Idle,
    /// The database refused this term: a newer holder exists. Authority is dropped.
    Fenced,
}

/// The work of one singleton job.
pub trait Routine: Send + Sync + 'static {
    /// The `job` label of its metrics; its lease is `job/<name>`.
    fn name(&self) -> &'static str;
    /// The lease row's name.
    fn lease(&self) -> &'static str;
    /// Most steps per tick, so a long backlog never starves the observation.
    fn steps_per_tick(&self) -> usize;
    /// Refresh what every replica reports, holder or not.
    fn observe(&self, client: &tokio_postgres::Client) -> impl Future<Output = ()> + Send;
    /// One unit of work under `term`.
    fn step(&self, client: &tokio_postgres::Client, term: i64)
        -> impl Future<Output = Step> + Send;
}

#[derive(Debug, Clone)]
pub struct JobSettings {
    pub holder_id: String,
    /// The shard the job works on: the `shard` label of its metrics (each shard runs its own).
    pub shard: String,
    /// How often the runner observes and looks for work.
    pub poll_interval: Duration,
    pub campaign_interval: Duration,
    pub timing: LeaseTiming,
}

struct Job<W> {
    work: W,
    settings: JobSettings,
    pool: Pool,
    clock: Arc<dyn Clock>,
    lease: Mutex<LeaseState>,
}

/// The job's term while its lease is held with authority, `None` otherwise; a companion asks
/// before every unit of its work, as the runner does before every step.
pub type TermSource = Arc<dyn Fn() -> Option<i64> + Send + Sync>;

/// A task that runs beside a job's runner under the same lease and term (the change-event relay
/// beside settlement, DESIGN.md §14): started with the job's term source, its pool and a stop
/// token; `None` when it could not start. The job waits for it before releasing the lease.
pub type Companion =
    Box<dyn FnOnce(TermSource, Pool, CancellationToken) -> Option<JoinHandle<()>> + Send>;

/// Start the job's tasks; the handle finishes after `shutdown` fired and a held lease was
/// released (so a peer takes over at its next campaign, not after a TTL).
pub fn spawn<W: Routine>(
    work: W,
    settings: JobSettings,
    pool: Pool,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    spawn_with(work, settings, pool, clock, None, shutdown)
}

/// [`spawn`], with a companion task under the same lease.
pub fn spawn_with<W: Routine>(
    work: W,
    settings: JobSettings,
    pool: Pool,
    clock: Arc<dyn Clock>,
    companion: Option<Companion>,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    metrics::gauge!(m::JOB_LEADER, "job" => work.name(), "shard" => settings.shard.clone())
        .set(0.0);
    let job = Arc::new(Job {
        work,
        settings,
        pool,
        clock,
        lease: Mutex::new(LeaseState::NotHeld),
    });
    tokio::spawn(async move {
        let stop = CancellationToken::new();
        let watchdog = tokio::spawn(job.clone().watchdog(stop.clone()));
        let runner = tokio::spawn(job.clone().runner(stop.clone()));
        let companion = companion.and_then(|start| {
            let holder = job.clone();
            let term: TermSource = Arc::new(move || holder.term());
            start(term, job.pool.clone(), stop.clone())
        });
        job.keeper(shutdown).await;
        stop.cancel();
        let _ = tokio::join!(watchdog, runner);
        if let Some(companion) = companion {
            let _ = companion.await;
        }
        job.release().await;
    })
}

impl<W: Routine> Job<W> {
    fn name(&self) -> &'static str {
        self.work.name()
    }

    /// The term while the lease grants authority right now.
    fn term(&self) -> Option<i64> {
        granted_term(&self.state(), &*self.clock)
    }

    fn state(&self) -> LeaseState {
        *self.lease.lock().expect("job lease lock")
    }

    fn set_state(&self, state: LeaseState) {
        *self.lease.lock().expect("job lease lock") = state;
    }

    /// Drop authority locally; the database keeps naming this replica until expiry or release.
    fn lose(&self, cause: LossCause) {
        let mut lease = self.lease.lock().expect("job lease lock");
        if let Some(term) = lease.epoch() {
            *lease = LeaseState::NotHeld;
            self.report_loss(term, cause);
        }
    }

    /// Log and export that this replica no longer runs the job.
    fn report_loss(&self, term: i64, cause: LossCause) {
        tracing::warn!(
            job = self.name(),
            term,
            cause = cause.as_str(),
            "job lease lost"
        );
        metrics::gauge!(m::JOB_LEADER, "job" => self.name(), "shard" => self.settings.shard.clone()).set(0.0);
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
            store::acquire(
                &**client,
                self.work.lease(),
                &self.settings.holder_id,
                timing.ttl,
            )
            .await
            .map_err(|e| describe(&e))
        })
        .await;
        match attempt {
            Ok(Ok(Some(term))) => {
                self.set_state(LeaseState::on_acquired(timing, t0, term));
                metrics::gauge!(m::JOB_LEADER, "job" => self.name(), "shard" => self.settings.shard.clone()).set(1.0);
                metrics::gauge!(m::JOB_TERM, "job" => self.name(), "shard" => self.settings.shard.clone()).set(term as f64);
                tracing::info!(job = self.name(), term, "job lease acquired");
            }
            Ok(Ok(None)) => {}
            Ok(Err(error)) => tracing::debug!(job = self.name(), %error, "job campaign failed"),
            Err(_) => tracing::debug!(job = self.name(), "job campaign timed out"),
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
            store::renew(
                &**client,
                self.work.lease(),
                &self.settings.holder_id,
                term,
                timing.ttl,
            )
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
                tracing::warn!(job = self.name(), term, %reason, "job lease renewal failed, job paused");
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
                    tracing::warn!(job = self.name(), stall_ms, "process stall detected");
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
                    self.report_loss(term, cause);
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
            let client = match self.pool.get().await {
                Ok(client) => client,
                Err(error) => {
                    tracing::debug!(job = self.name(), %error, "no connection for the job");
                    continue;
                }
            };
            self.work.observe(&client).await;
            let steps = self.work.steps_per_tick();
            let step = |term| self.work.step(&client, term);
            if steps_while_granted(steps, || self.term(), step).await == Step::Fenced {
                self.lose(LossCause::Fenced);
            }
        }
    }

    async fn release(&self) {
        let Some(term) = self.state().epoch() else {
            return;
        };
        self.set_state(LeaseState::NotHeld);
        metrics::gauge!(m::JOB_LEADER, "job" => self.name(), "shard" => self.settings.shard.clone()).set(0.0);
        let released = tokio::time::timeout(self.settings.timing.renew_interval, async {
            let client = self.pool.get().await.ok()?;
            store::release(&**client, self.work.lease(), &self.settings.holder_id, term)
                .await
                .ok()
        })
        .await;
        if let Ok(Some(true)) = released {
            tracing::info!(job = self.name(), term, "job lease released");
        }
    }
}

/// The term a lease in `state` grants authority under right now, if any: not while a renewal is
/// unconfirmed, not at or past the safe deadline.
pub(crate) fn granted_term(state: &LeaseState, clock: &dyn Clock) -> Option<i64> {
    match state.authority(clock.now()) {
        Authority::Granted { epoch, .. } => Some(epoch),
        _ => None,
    }
}

/// One runner tick's steps: at most `limit`, each under the term `term` grants right before it,
/// until a step finds nothing more to do or is fenced. Returns the last step's answer
/// ([`Step::Idle`] when authority was not granted).
pub(crate) async fn steps_while_granted<F: Future<Output = Step>>(
    limit: usize,
    term: impl Fn() -> Option<i64>,
    mut step: impl FnMut(i64) -> F,
) -> Step {
    for _ in 0..limit {
        let Some(term) = term() else {
            return Step::Idle;
        };
        match step(term).await {
            Step::More => {}
            other => return other,
        }
    }
    Step::More
}

#[cfg(test)]
mod tests;
