//! The lease manager: three tasks sharing one [`Ownership`].
//!
//! * **watchdog** — pure and I/O-free, ticks every 50 ms: drops every lease whose safe deadline
//!   passed, and drops *all* leases when a tick arrives later than `period + margin` (the process
//!   was paused, e.g. SIGSTOP, and may have slept through its deadlines). It never waits on the
//!   database, so a slow database cannot look like a stall or delay a deadline.
//! * **renewer** — every `renew_interval` (~ttl/3) renews all held leases in one statement, with a
//!   timeout; a failure or timeout makes them `Uncertain` (no new work) and retries sooner.
//! * **campaigner** — every `campaign_interval` ±20 % jitter: heartbeats, counts live replicas,
//!   acquires partitions up to `ceil(P / live)` and hands back one surplus partition at a
//!   time, so a new or returning replica gets work without a thundering herd. Leases the
//!   database still names this replica for come first: a restart under the same id takes its
//!   own partitions back at once (with new epochs) instead of waiting a TTL for them to expire.
//! * **dropped-lease releaser** — authority is dropped locally (stall, safe deadline, failed
//!   worker) without asking the database, which keeps naming this replica until expiry; routers
//!   would keep being sent back with `421`. This task releases those leases, conditional on
//!   holder and epoch, so a peer (or this replica, with a new epoch) takes them at once.
//!
//! Workers are supervised: one that ends while it still has authority (a panic) would leave the
//! partition answering `503` while its lease is renewed forever, so its lease is dropped and
//! given up like any other loss.
//!
//! * **hand-off listener** — `LISTEN`s on [`store::HANDOFF_CHANNEL`]: every release (graceful
//!   stop, surplus hand-back, dropped lease) and every deregistration is announced by the
//!   releasing statement itself, and peers run a campaign round at once instead of at their next
//!   jittered period. Announcement-driven rounds only acquire; surplus is still handed back one
//!   partition per timed round, so a returning replica takes its share back gently, each
//!   partition through the same announced hand-off.
//!
//! On shutdown the replica first deregisters (so peers' fair share already counts it gone), then
//! releases every held lease (conditional on holder and epoch); peers take over within
//! milliseconds instead of a lease TTL.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ownership::{Dropped, Ownership, WorkerHandle};
use super::state::{LossCause, StallWatchdog};
use super::store;
use crate::hints::HintPublisher;
use crate::metrics as m;
use crate::worker::{spawn_worker, WorkerContext};
use schema::hint::{AssignmentHint, HintKind};

const WATCHDOG_PERIOD: Duration = Duration::from_millis(50);

/// Why a campaign round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// The first round: only register, so peers starting together see each other.
    Register,
    /// The periodic round: acquire up to the fair share, hand back one surplus partition.
    Timed,
    /// A peer announced a release or its departure: acquire only.
    Announced,
}

#[derive(Debug, Clone)]
pub struct ManagerSettings {
    pub replica_id: String,
    pub advertise_url: String,
    pub campaign_interval: Duration,
}

pub struct LeaseManager {
    settings: ManagerSettings,
    /// A small pool of its own, so renewals never queue behind request transactions.
    pool: Pool,
    ownership: Arc<Ownership>,
    workers: Arc<WorkerContext>,
    hints: HintPublisher,
    /// Set once the first campaign round has run; `/readyz` waits for it.
    ready: tokio::sync::watch::Sender<bool>,
    /// Woken by a peer's announced release or departure: campaign now, not at the next period.
    campaign_now: tokio::sync::Notify,
    database_url: String,
}

impl LeaseManager {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: ManagerSettings,
        database_url: String,
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
            database_url,
        })
    }

    /// Start the three tasks; the returned handle finishes after `shutdown` fired and every
    /// lease was released.
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) -> JoinHandle<()> {
        let stop_renewing = CancellationToken::new();
        let watchdog = tokio::spawn(self.clone().watchdog(stop_renewing.clone()));
        let renewer = tokio::spawn(self.clone().renewer(stop_renewing.clone()));
        let releaser = self
            .ownership
            .take_loss_feed()
            .map(|feed| tokio::spawn(self.clone().release_dropped(feed, stop_renewing.clone())));
        let listener = tokio::spawn(self.clone().listen_for_handoffs(stop_renewing.clone()));
        let this = self.clone();
        tokio::spawn(async move {
            this.campaigner(shutdown).await;
            // Keep renewing while releasing, so nothing lapses mid-hand-off; then stop.
            this.release_all().await;
            stop_renewing.cancel();
            let _ = tokio::join!(watchdog, renewer, listener);
            if let Some(releaser) = releaser {
                let _ = releaser.await;
            }
        })
    }

    async fn watchdog(self: Arc<Self>, stop: CancellationToken) {
        let mut dog = StallWatchdog::new(
            WATCHDOG_PERIOD,
            self.ownership.timing().margin,
            self.ownership.now(),
        );
        let mut tick = tokio::time::interval(WATCHDOG_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Some(stall) = dog.observe(self.ownership.now()) {
                metrics::counter!(m::PROCESS_STALLS).increment(1);
                tracing::warn!(
                    stall_ms = stall.as_millis() as u64,
                    "process stall detected, dropping every lease"
                );
                self.ownership.lose_all(LossCause::Stall);
            }
            let remaining = self.ownership.expire_deadlines();
            let held = self.ownership.held().len();
            metrics::gauge!(m::LEASES_HELD).set(held as f64);
            metrics::gauge!(m::LEASE_REMAINING_SECONDS)
                .set(remaining.map_or(0.0, |d| d.as_secs_f64()));
        }
    }

    async fn renewer(self: Arc<Self>, stop: CancellationToken) {
        let timing = *self.ownership.timing();
        let mut wait = timing.renew_interval;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let held = self.ownership.held();
            if held.is_empty() {
                wait = timing.renew_interval;
                continue;
            }
            let t0 = self.ownership.now();
            let attempt = tokio::time::timeout(timing.renew_interval, async {
                let client = self.pool.get().await.map_err(|e| e.to_string())?;
                store::renew(&**client, &self.settings.replica_id, &held, timing.ttl)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
            match attempt {
                Ok(Ok(renewed)) => {
                    for (partition, epoch) in held {
                        if renewed.contains(&partition) {
                            self.ownership.renewed(partition, epoch, t0);
                        } else {
                            metrics::counter!(m::LEASE_RENEW_FAILURES).increment(1);
                            self.ownership
                                .lose(partition, epoch, LossCause::RenewRejected);
                        }
                    }
                    wait = timing.renew_interval;
                }
                failed => {
                    let reason = match failed {
                        Ok(Err(e)) => e,
                        _ => "timed out".to_owned(),
                    };
                    tracing::warn!(held = held.len(), %reason, "lease renewal failed, partitions uncertain");
                    metrics::counter!(m::LEASE_RENEW_FAILURES).increment(held.len() as u64);
                    for (partition, epoch) in held {
                        self.ownership.renew_failed(partition, epoch);
                    }
                    // Retry soon: a confirmed renewal before the deadline restores service.
                    wait = timing.renew_interval / 4;
                }
            }
        }
    }

    fn jittered(&self) -> Duration {
        let base = self.settings.campaign_interval.as_secs_f64();
        Duration::from_secs_f64(base * rand::rng().random_range(0.8..1.2))
    }

    async fn campaigner(self: &Arc<Self>, shutdown: CancellationToken) {
        // Register first and let peers that start at the same time register too, so the first
        // campaign already sees a fair share instead of grabbing every partition.
        let _ = self.campaign_round(Round::Register).await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(self.jittered()) => {}
        }
        let mut round = Round::Timed;
        loop {
            if let Err(error) = self.campaign_round(round).await {
                tracing::warn!(%error, "campaign round failed");
            }
            let _ = self.ready.send(true);
            let next = tokio::time::sleep(self.jittered());
            tokio::pin!(next);
            round = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = &mut next => Round::Timed,
                _ = self.campaign_now.notified() => Round::Announced,
            };
        }
    }

    async fn campaign_round(&self, round: Round) -> anyhow::Result<()> {
        let timing = *self.ownership.timing();
        let client = self.pool.get().await?;
        let view = tokio::time::timeout(
            timing.renew_interval,
            store::heartbeat_and_view(
                &**client,
                &self.settings.replica_id,
                &self.settings.advertise_url,
                timing.ttl,
            ),
        )
        .await??;
        metrics::gauge!(m::LIVE_REPLICAS).set(view.live_replicas as f64);
        if round == Round::Register {
            return Ok(());
        }
        let target = store::fair_share(view.partition_count, view.live_replicas) as usize;
        let held = self.ownership.held();
        if held.len() < target {
            let holding: HashSet<u32> = held.iter().map(|(p, _)| *p).collect();
            let mut free = view.free;
            free.shuffle(&mut rand::rng());
            // Own leases first: taking them back moves nothing between replicas.
            let candidates = view
                .named_for_me
                .into_iter()
                .filter(|p| !holding.contains(p))
                .chain(free);
            let mut wanted = target - held.len();
            for partition in candidates {
                if wanted == 0 {
                    break;
                }
                if partition >= self.ownership.partition_count() {
                    continue;
                }
                let t0 = self.ownership.now();
                let acquired = tokio::time::timeout(
                    timing.renew_interval,
                    store::acquire(
                        &**client,
                        partition,
                        &self.settings.replica_id,
                        &self.settings.advertise_url,
                        timing.ttl,
                    ),
                )
                .await;
                match acquired {
                    Ok(Ok(Some(a))) => {
                        let worker = self.spawn_supervised(partition, a.epoch);
                        self.ownership.install(partition, t0, a.epoch, worker);
                        metrics::histogram!(m::LEASE_VACANCY).record(a.vacant.as_secs_f64());
                        tracing::info!(
                            partition,
                            epoch = a.epoch,
                            revision = a.revision,
                            vacant_ms = a.vacant.as_millis() as u64,
                            "lease acquired"
                        );
                        self.hints.publish(AssignmentHint {
                            kind: HintKind::Acquire,
                            partition,
                            epoch: a.epoch,
                            revision: a.revision,
                            owner_id: self.settings.replica_id.clone(),
                        });
                        wanted -= 1;
                    }
                    Ok(Ok(None)) => {} // somebody else was faster
                    Ok(Err(error)) => {
                        tracing::debug!(partition, %error, "acquire failed");
                    }
                    Err(_) => {
                        // Ambiguous: the acquire may have committed. Not installing it is safe;
                        // the lease simply lapses and is re-acquired with a newer epoch.
                        tracing::warn!(partition, "acquire timed out");
                        break;
                    }
                }
            }
        } else if held.len() > target && round == Round::Timed {
            // Give back one partition per round: gentle rebalancing, no herd.
            if let Some(&(partition, _)) = held.iter().max_by_key(|(p, _)| *p) {
                drop(client);
                self.release(partition).await;
            }
        }
        Ok(())
    }

    /// Start `partition`'s worker under a supervisor: if the worker ends while its lease still
    /// grants it authority (it was not cancelled), the lease is dropped and thereby released.
    fn spawn_supervised(&self, partition: u32, epoch: i64) -> WorkerHandle {
        let WorkerHandle {
            sender,
            cancel,
            task,
        } = spawn_worker(self.workers.clone(), partition, epoch);
        let ownership = self.ownership.clone();
        let cancelled = cancel.clone();
        let supervisor = tokio::spawn(async move {
            let ended = task.await;
            if ended.is_ok() && cancelled.is_cancelled() {
                return; // stopped on purpose
            }
            let how = match &ended {
                Err(error) if error.is_panic() => "panic",
                Err(_) => "aborted",
                Ok(()) => "exited",
            };
            metrics::counter!(m::WORKER_FAILURES).increment(1);
            tracing::error!(
                partition,
                epoch,
                how,
                "partition worker ended unexpectedly, giving its lease up"
            );
            ownership.lose(partition, epoch, LossCause::WorkerFailed);
        });
        WorkerHandle {
            sender,
            cancel,
            task: supervisor,
        }
    }

    async fn release_dropped(
        self: Arc<Self>,
        mut feed: UnboundedReceiver<Dropped>,
        stop: CancellationToken,
    ) {
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => break,
                dropped = feed.recv() => match dropped {
                    Some(dropped) => dropped,
                    None => return,
                },
            };
            // A stall drops every lease at once: give them back in one statement.
            let mut batch = vec![first];
            while let Ok(dropped) = feed.try_recv() {
                batch.push(dropped);
            }
            self.release_in_database(&batch).await;
        }
        let mut rest = Vec::new();
        while let Ok(dropped) = feed.try_recv() {
            rest.push(dropped);
        }
        if !rest.is_empty() {
            self.release_in_database(&rest).await;
        }
    }

    /// Release dropped leases, conditional on holder and epoch; a lease already re-acquired
    /// (newer epoch) or taken by a peer is left alone. A few quick retries, because the
    /// cancelled worker's transaction may still hold the lease row for a moment.
    async fn release_in_database(&self, dropped: &[Dropped]) {
        let leases: Vec<(u32, i64)> = dropped.iter().map(|d| (d.partition, d.epoch)).collect();
        for attempt in 1..=3u64 {
            let released = async {
                let client = self.pool.get().await.map_err(|e| e.to_string())?;
                store::release_dropped(&**client, &self.settings.replica_id, &leases)
                    .await
                    .map_err(|e| e.to_string())
            };
            let error = match tokio::time::timeout(Duration::from_secs(2), released).await {
                Ok(Ok(rows)) => {
                    for (partition, epoch, revision) in rows {
                        metrics::counter!(m::DROPPED_LEASE_RELEASES).increment(1);
                        tracing::info!(partition, epoch, revision, "dropped lease released");
                        self.hints.publish(AssignmentHint {
                            kind: HintKind::Release,
                            partition,
                            epoch,
                            revision,
                            owner_id: self.settings.replica_id.clone(),
                        });
                    }
                    return;
                }
                Ok(Err(error)) => error,
                Err(_) => "timed out".to_owned(),
            };
            tracing::warn!(count = leases.len(), attempt, %error, "releasing dropped leases failed");
            tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
        }
        tracing::warn!(
            count = leases.len(),
            "dropped leases not released; they will expire"
        );
    }

    /// Stop serving `partition`, let its worker drain, then release the lease.
    async fn release(&self, partition: u32) {
        let Some((epoch, worker)) = self.ownership.relinquish(partition) else {
            return;
        };
        if let Some(worker) = worker {
            let _ = tokio::time::timeout(Duration::from_secs(2), worker.task).await;
        }
        let released = async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            store::release(&**client, partition, &self.settings.replica_id, epoch)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(2), released).await {
            Ok(Ok(Some(revision))) => {
                metrics::counter!(m::LEASE_RELEASES).increment(1);
                tracing::info!(partition, epoch, revision, "lease released");
                self.hints.publish(AssignmentHint {
                    kind: HintKind::Release,
                    partition,
                    epoch,
                    revision,
                    owner_id: self.settings.replica_id.clone(),
                });
            }
            Ok(Ok(None)) => tracing::info!(partition, epoch, "lease was no longer ours to release"),
            Ok(Err(error)) => {
                tracing::warn!(partition, epoch, %error, "lease release failed; it will expire")
            }
            Err(_) => tracing::warn!(partition, epoch, "lease release timed out; it will expire"),
        }
    }

    async fn release_all(&self) {
        // Deregister first: peers that campaign on the first release announcement must already
        // count this replica gone, or their fair share would leave its partitions unowned.
        if let Ok(client) = self.pool.get().await {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                store::deregister(&**client, &self.settings.replica_id),
            )
            .await;
        }
        let held = self.ownership.held();
        tracing::info!(count = held.len(), "releasing every lease before exit");
        futures::future::join_all(held.iter().map(|(p, _)| self.release(*p))).await;
    }

    /// Keep a `LISTEN` session on the hand-off channel and wake the campaigner on every
    /// announcement. Best effort: without it, peers still campaign at their period.
    async fn listen_for_handoffs(self: Arc<Self>, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let session = crate::db::listen(&self.database_url, store::HANDOFF_CHANNEL);
            let ended = tokio::select! {
                _ = stop.cancelled() => return,
                ended = session.run(|| self.campaign_now.notify_one()) => ended,
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "hand-off listener disconnected");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}
