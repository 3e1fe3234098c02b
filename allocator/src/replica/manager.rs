//! The lease manager: four tasks sharing one [`Ownership`].
//!
//! * **watchdog** — pure and I/O-free, ticks every 50 ms: drops every lease whose safe deadline
//!   passed, and drops *all* leases when a tick arrives later than `period + margin` (the process
//!   was paused, e.g. SIGSTOP, and may have slept through its deadlines). It never waits on the
//!   database, so a slow database cannot look like a stall or delay a deadline.
//! * **renewer** — every `renew_interval` (~ttl/3) renews all held leases in one statement; each
//!   attempt has a time limit and a failed one is retried when that limit is up, both derived from
//!   the TTL and margin ([`LeaseTiming`](crate::lease::state::LeaseTiming)) so that two attempts
//!   can fail and the third still lands before the safe deadline. A failure or timeout makes the
//!   leases `Uncertain` (no new work) until a renewal is confirmed.
//! * **campaigner** ([`campaign`](super::campaign)) — every `campaign_interval` ±20 % jitter:
//!   heartbeats, counts live replicas, acquires partitions up to `ceil(P / live)` and hands back
//!   one surplus partition at a time, so a new or returning replica gets work without a
//!   thundering herd. Leases the database still names this replica for come first: a restart
//!   under the same id takes its own partitions back at once (with new epochs) instead of
//!   waiting a TTL for them to expire.
//! * **dropped-lease releaser** ([`handback`](super::handback)) — authority is dropped locally
//!   (stall, safe deadline, failed worker) without asking the database, which keeps naming this
//!   replica until expiry; routers would keep being sent back with `421`. This task releases
//!   those leases, conditional on holder and epoch, so a peer (or this replica, with a new epoch)
//!   takes them at once.
//!
//! Workers are supervised: one that ends while it still has authority (a panic) would leave the
//! partition answering `503` while its lease is renewed forever, so its lease is dropped and
//! given up like any other loss.
//!
//! * **hand-off listener** ([`handback`](super::handback)) — `LISTEN`s on
//!   [`store::HANDOFF_CHANNEL`]: every release (graceful stop, surplus hand-back, dropped lease)
//!   and every deregistration is announced by the releasing statement itself, and peers run a
//!   campaign round at once instead of at their next jittered period. Announced rounds only
//!   acquire; surplus is still handed back one partition per timed round, so a returning replica
//!   takes its share back gently, each partition through the same announced hand-off.
//!
//! On shutdown the replica first deregisters (so peers' fair share already counts it gone), then
//! releases every held lease (conditional on holder and epoch); peers take over within
//! milliseconds instead of a lease TTL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ownership::Ownership;
use crate::hint_publisher::HintPublisher;
use crate::lease::state::LossCause;
use crate::lease::{store, FenceToken};
use crate::metrics as m;
use crate::worker::WorkerContext;

const WATCHDOG_PERIOD: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
pub struct ManagerSettings {
    pub replica_id: String,
    pub advertise_url: String,
    pub campaign_interval: Duration,
    /// Whether to `LISTEN` for peers' hand-off announcements (see [`handback`](super::handback)).
    pub handoff_listen: bool,
}

pub struct LeaseManager {
    pub(super) settings: ManagerSettings,
    /// A small pool of its own, so renewals never queue behind request transactions.
    pub(super) pool: Pool,
    pub(super) ownership: Arc<Ownership>,
    /// Handed to every worker the campaigner starts.
    pub(super) workers: Arc<WorkerContext>,
    pub(super) hints: HintPublisher,
    /// Set once the first campaign round has run; `/readyz` waits for it.
    pub(super) ready: tokio::sync::watch::Sender<bool>,
    /// Woken by a peer's announced release or departure: campaign now, not at the next period.
    pub(super) campaign_now: tokio::sync::Notify,
    /// For the hand-off listener's own session, outside the pool (behind the same fence).
    pub(super) fence: Arc<storage::StorageFence>,
}

impl LeaseManager {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: ManagerSettings,
        fence: Arc<storage::StorageFence>,
        pool: Pool,
        ownership: Arc<Ownership>,
        workers: Arc<WorkerContext>,
        hints: HintPublisher,
        ready: tokio::sync::watch::Sender<bool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            settings,
            pool,
            ownership,
            workers,
            hints,
            ready,
            campaign_now: tokio::sync::Notify::new(),
            fence,
        })
    }

    /// Start the tasks; the returned handle finishes after `shutdown` fired and every lease was
    /// released.
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) -> JoinHandle<()> {
        let stop_renewing = CancellationToken::new();
        let watchdog = tokio::spawn(self.clone().watchdog(stop_renewing.clone()));
        let renewer = tokio::spawn(self.clone().renewer(stop_renewing.clone()));
        let releaser = self
            .ownership
            .take_loss_feed()
            .map(|feed| tokio::spawn(self.clone().release_dropped(feed, stop_renewing.clone())));
        let listener = self
            .settings
            .handoff_listen
            .then(|| tokio::spawn(self.clone().listen_for_handoffs(stop_renewing.clone())));
        let this = self.clone();
        tokio::spawn(async move {
            this.campaigner(shutdown).await;
            // Keep renewing while releasing, so nothing lapses mid-hand-off; then stop.
            this.release_all().await;
            stop_renewing.cancel();
            let _ = tokio::join!(watchdog, renewer);
            if let Some(listener) = listener {
                let _ = listener.await;
            }
            if let Some(releaser) = releaser {
                let _ = releaser.await;
            }
        })
    }

    async fn watchdog(self: Arc<Self>, stop: CancellationToken) {
        let margin = self.ownership.timing().margin;
        let clock = self.ownership.clock();
        crate::clock::watch(&*clock, WATCHDOG_PERIOD, margin, &stop, |_, stall| {
            // The negative control keeps its leases through stalls and past their deadlines.
            let remaining = if crate::negative_control::enabled() {
                None
            } else {
                watchdog_tick(&self.ownership, stall)
            };
            let held = self.ownership.held().len();
            metrics::gauge!(m::LEASES_HELD).set(held as f64);
            metrics::gauge!(m::LEASE_REMAINING_SECONDS)
                .set(remaining.map_or(0.0, |d| d.as_secs_f64()));
        })
        .await;
    }

    /// Renew every held lease in one statement on the schedule [`LeaseTiming`] derives from the
    /// TTL and margin: the regular renewal one interval after the last confirmed one, each
    /// attempt given up after [`LeaseTiming::renew_attempt_timeout`], a failed one retried at once
    /// when its time is up.
    async fn renewer(self: Arc<Self>, stop: CancellationToken) {
        let timing = *self.ownership.timing();
        let mut next = self.ownership.now() + timing.renew_interval;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next.into()) => {}
            }
            let held = self.ownership.held();
            let t0 = self.ownership.now();
            if held.is_empty() {
                next = t0 + timing.renew_interval;
                continue;
            }
            let attempt = self
                .renew_once(&held, t0 + timing.renew_attempt_timeout())
                .await;
            let ended = self.ownership.now();
            next = timing.next_renewal(t0, ended, attempt.is_ok());
            settle_renewal(&self.ownership, held, t0, attempt);
        }
    }

    /// One renewal attempt, given up at `deadline`. A connection whose statement was given up is
    /// discarded, not pooled: on a black-holed link the next attempt would queue behind it.
    async fn renew_once(&self, held: &[FenceToken], deadline: Instant) -> Result<Vec<u32>, String> {
        let deadline = tokio::time::Instant::from_std(deadline);
        let client = tokio::time::timeout_at(deadline, self.pool.get())
            .await
            .map_err(|_| "timed out waiting for a connection".to_owned())?
            .map_err(|e| e.to_string())?;
        let timing = self.ownership.timing();
        let renewal = store::renew(&**client, &self.settings.replica_id, held, timing.ttl);
        match tokio::time::timeout_at(deadline, renewal).await {
            Ok(result) => result.map_err(|e| crate::error::describe(&e)),
            Err(_) => {
                let _ = deadpool_postgres::Object::take(client);
                Err("timed out".to_owned())
            }
        }
    }
}

/// A watchdog tick: after a stall longer than the margin nothing this process believed about its
/// leases holds, so every one is dropped; otherwise those past their safe deadline are. Returns
/// the least time left on a held lease.
fn watchdog_tick(ownership: &Ownership, stall: Option<Duration>) -> Option<Duration> {
    if let Some(stall) = stall {
        metrics::counter!(m::PROCESS_STALLS).increment(1);
        tracing::warn!(
            stall_ms = stall.as_millis() as u64,
            "process stall detected, dropping every lease"
        );
        ownership.lose_all(LossCause::Stall);
    }
    ownership.expire_deadlines()
}

/// Apply a renewal attempt of `held` sent at `t0`: the partitions the database renewed get a new
/// safe deadline and the others are lost (their renewal was refused); a failed or timed-out
/// attempt leaves them uncertain until one is confirmed.
fn settle_renewal(
    ownership: &Ownership,
    held: Vec<FenceToken>,
    t0: Instant,
    attempt: Result<Vec<u32>, String>,
) {
    match attempt {
        Ok(renewed) => {
            for token in held {
                if renewed.contains(&token.partition) {
                    ownership.renewed(token, t0);
                } else {
                    metrics::counter!(m::LEASE_RENEW_FAILURES).increment(1);
                    // The negative control keeps a tenure the database no longer grants.
                    if !crate::negative_control::enabled() {
                        ownership.lose(token, LossCause::RenewRejected);
                    }
                }
            }
        }
        Err(reason) => {
            tracing::warn!(held = held.len(), %reason, "lease renewal failed, partitions uncertain");
            metrics::counter!(m::LEASE_RENEW_FAILURES).increment(held.len() as u64);
            for token in held {
                ownership.renew_failed(token);
            }
        }
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
