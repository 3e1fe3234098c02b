//! Giving leases back to the database, so peers and routers need not wait for an expiry.
//!
//! Two paths. A deliberate hand-off ([`LeaseManager::release`]: rebalancing, shutdown) stops the
//! worker first and lets it drain, then releases. A local loss (stall, safe deadline, failed
//! worker, refused epoch) has already dropped authority without asking the database, which keeps
//! naming this replica until expiry; the dropped-lease releaser gives those back from the
//! ownership table's loss feed. Both are conditional on holder and epoch, so a lease re-acquired
//! meanwhile (newer epoch) or taken by a peer is left alone.
//!
//! Every release is announced by its own statement (`NOTIFY` on [`store::HANDOFF_CHANNEL`],
//! delivered at commit); the listener here wakes this replica's campaigner when a peer announces
//! one, so hand-offs between replicas take milliseconds.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::manager::LeaseManager;
use super::ownership::Dropped;
use crate::lease::{store, FenceToken};
use crate::metrics as m;
use schema::hint::{AssignmentHint, HintKind};

impl LeaseManager {
    pub(super) async fn release_dropped(
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
        let leases: Vec<FenceToken> = dropped.iter().map(|d| d.token).collect();
        for attempt in 1..=3u64 {
            let released = async {
                let client = self.pool.get().await.map_err(|e| e.to_string())?;
                store::release_dropped(&**client, &self.settings.replica_id, &leases)
                    .await
                    .map_err(|e| e.to_string())
            };
            let error = match tokio::time::timeout(Duration::from_secs(2), released).await {
                Ok(Ok(released)) => {
                    for store::Released { token, revision } in released {
                        metrics::counter!(m::DROPPED_LEASE_RELEASES).increment(1);
                        tracing::info!(
                            partition = token.partition,
                            epoch = token.epoch,
                            revision,
                            "dropped lease released"
                        );
                        self.publish_release(token, revision);
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
    pub(super) async fn release(&self, partition: u32) {
        let Some((token, worker)) = self.ownership.relinquish(partition) else {
            return;
        };
        if let Some(worker) = worker {
            let _ = tokio::time::timeout(Duration::from_secs(2), worker.task).await;
        }
        let epoch = token.epoch;
        let released = async {
            let client = self.pool.get().await.map_err(|e| e.to_string())?;
            store::release(&**client, token, &self.settings.replica_id)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(2), released).await {
            Ok(Ok(Some(revision))) => {
                metrics::counter!(m::LEASE_RELEASES).increment(1);
                tracing::info!(partition, epoch, revision, "lease released");
                self.publish_release(token, revision);
            }
            Ok(Ok(None)) => tracing::info!(partition, epoch, "lease was no longer ours to release"),
            Ok(Err(error)) => {
                tracing::warn!(partition, epoch, %error, "lease release failed; it will expire")
            }
            Err(_) => tracing::warn!(partition, epoch, "lease release timed out; it will expire"),
        }
    }

    pub(super) async fn release_all(&self) {
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
        futures::future::join_all(held.iter().map(|t| self.release(t.partition))).await;
    }

    /// Keep a `LISTEN` session on the hand-off channel and wake the campaigner on every
    /// announcement. Best effort: without it, peers still campaign at their period.
    pub(super) async fn listen_for_handoffs(self: Arc<Self>, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let session = crate::sessions::listen(&self.fence, store::HANDOFF_CHANNEL);
            let ended = tokio::select! {
                _ = stop.cancelled() => return,
                ended = session.run(|| self.campaign_now.notify_one()) => ended,
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "hand-off listener disconnected");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(edge::Backoff::RECONNECT.delay(failures)) => {}
            }
            failures = failures.saturating_add(1);
        }
    }

    fn publish_release(&self, token: FenceToken, revision: i64) {
        self.hints.publish(AssignmentHint {
            kind: HintKind::Release,
            partition: token.partition,
            epoch: token.epoch,
            revision,
            owner_id: self.settings.replica_id.clone(),
        });
    }
}
