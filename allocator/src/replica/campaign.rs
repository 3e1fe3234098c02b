//! The campaigner: take a fair share of the partitions, and start a supervised worker for each.
//!
//! Every `campaign_interval` ±20 % jitter it heartbeats, counts live replicas, acquires
//! partitions up to `ceil(P / live)` and hands back one surplus partition at a time, so a new or
//! returning replica gets work without a thundering herd. Leases the database still names this
//! replica for come first: a restart under the same id takes its own partitions back at once
//! (with new epochs) instead of waiting a TTL for them to expire. A peer's announced release or
//! departure (see [`handback`](super::handback)) starts an extra, acquire-only round at once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;

use super::manager::LeaseManager;
use crate::lease::state::LossCause;
use crate::lease::{store, FenceToken};
use crate::metrics as m;
use crate::worker::{spawn_worker, WorkerHandle};
use schema::hint::{AssignmentHint, HintKind};

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

impl LeaseManager {
    fn jittered(&self) -> Duration {
        edge::backoff::jitter(self.settings.campaign_interval, 0.2)
    }

    pub(super) async fn campaigner(self: &Arc<Self>, shutdown: CancellationToken) {
        // Register first and let peers that start at the same time register too, so the first
        // campaign already sees a fair share instead of grabbing every partition.
        let _ = self.campaign_round(Round::Register).await;
        // A peer that sees this replica register hands a partition back at once; take it then,
        // not after this first pause.
        let mut round = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(self.jittered()) => Round::Timed,
            _ = self.campaign_now.notified() => Round::Announced,
        };
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
        let mut held = self.ownership.held();
        if crate::negative_control::enabled() {
            // The negative control keeps tenures the database no longer grants; counted towards
            // the fair share they would keep every replica "full" while expired partitions go
            // unowned. Only leases the database still names this replica for count here.
            held.retain(|t| view.named_for_me.contains(&t.partition));
        }
        let plan = plan(
            round,
            view,
            &held,
            self.ownership.partition_count(),
            &mut rand::rng(),
        );
        match plan {
            Plan::Hold => {}
            Plan::Acquire { candidates, wanted } => {
                let mut wanted = wanted;
                for partition in candidates {
                    if wanted == 0 {
                        break;
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
                            self.installed(&a, t0);
                            wanted -= 1;
                        }
                        Ok(Ok(None)) => {} // somebody else was faster
                        Ok(Err(error)) => {
                            tracing::debug!(partition, %error, "acquire failed");
                        }
                        Err(_) => {
                            // Ambiguous: the acquire may have committed. Not installing it is
                            // safe; the lease simply lapses and is re-acquired with a newer epoch.
                            tracing::warn!(partition, "acquire timed out");
                            break;
                        }
                    }
                }
            }
            Plan::HandBack(partition) => {
                drop(client);
                self.release(partition).await;
            }
        }
        Ok(())
    }

    /// Serve a partition just acquired (requested at `t0`) and announce it.
    fn installed(&self, a: &store::Acquired, t0: std::time::Instant) {
        let token = a.token();
        let worker = self.spawn_supervised(token);
        self.ownership.install(token, t0, worker);
        metrics::histogram!(m::LEASE_VACANCY).record(a.vacant.as_secs_f64());
        tracing::info!(
            partition = token.partition,
            epoch = a.epoch,
            revision = a.revision,
            vacant_ms = a.vacant.as_millis() as u64,
            "lease acquired"
        );
        self.hints.publish(AssignmentHint {
            kind: HintKind::Acquire,
            partition: token.partition,
            epoch: a.epoch,
            revision: a.revision,
            owner_id: self.settings.replica_id.clone(),
        });
    }

    /// Start the worker for `token` under a supervisor: if the worker ends while its lease still
    /// grants it authority (it was not cancelled), the lease is dropped and thereby released.
    fn spawn_supervised(&self, token: FenceToken) -> WorkerHandle {
        let WorkerHandle {
            sender,
            cancel,
            task,
        } = spawn_worker(self.workers.clone(), self.ownership.authority_handle(token));
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
                partition = token.partition,
                epoch = token.epoch,
                how,
                "partition worker ended unexpectedly, giving its lease up"
            );
            ownership.lose(token, LossCause::WorkerFailed);
        });
        WorkerHandle {
            sender,
            cancel,
            task: supervisor,
        }
    }
}

/// What one campaign round does, decided from what it read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    Hold,
    /// Try `candidates` in this order until `wanted` of them are acquired.
    Acquire {
        candidates: Vec<u32>,
        wanted: usize,
    },
    /// Give this partition back.
    HandBack(u32),
}

/// The round's decision: below the fair share `ceil(P / live)`, acquire the difference, leases
/// the database still names this replica for first, then free ones in random order; above it,
/// on a timed round only, hand back one partition (the highest held).
fn plan(
    round: Round,
    view: store::CampaignView,
    held: &[FenceToken],
    partition_count: u32,
    rng: &mut impl rand::Rng,
) -> Plan {
    if round == Round::Register {
        return Plan::Hold;
    }
    let target = store::fair_share(view.partition_count, view.live_replicas) as usize;
    if held.len() < target {
        let holding: HashSet<u32> = held.iter().map(|t| t.partition).collect();
        let mut free = view.free;
        free.shuffle(rng);
        // Own leases first: taking them back moves nothing between replicas.
        let candidates = view
            .named_for_me
            .into_iter()
            .filter(|p| !holding.contains(p))
            .chain(free)
            .filter(|p| *p < partition_count)
            .collect();
        Plan::Acquire {
            candidates,
            wanted: target - held.len(),
        }
    } else if held.len() > target && round == Round::Timed {
        // One partition per round: gentle rebalancing, no herd.
        held.iter()
            .map(|t| t.partition)
            .max()
            .map_or(Plan::Hold, Plan::HandBack)
    } else {
        Plan::Hold
    }
}

#[cfg(test)]
#[path = "campaign_tests.rs"]
mod tests;
