//! This replica's view of which partitions it may act for, shared by the lease manager, the
//! dispatcher and (through [`PartitionAuthority`] handles) the partition workers.
//!
//! One slot per partition holds the [`LeaseState`] and, while the lease is held, the handle of
//! the partition's worker. The dispatcher asks [`Ownership::route`] before queuing work; workers
//! ask their authority handle again before every transaction, because authority can lapse while
//! a command waits in the queue.
//!
//! Every loss is also reported on a feed ([`Ownership::take_loss_feed`]): dropping authority is
//! local and immediate, but the database keeps naming this replica until the lease expires, so
//! the lease manager releases what it dropped (conditional on holder and epoch) and peers and
//! routers need not wait for the expiry.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use crate::authority::{AuthoritySource, PartitionAuthority};
use crate::clock::Clock;
use crate::lease::state::{Authority, LeaseState, LeaseTiming, LossCause};
use crate::lease::FenceToken;
use crate::metrics as m;
use crate::work::WorkItem;
use crate::worker::WorkerHandle;

#[derive(Debug)]
struct Slot {
    state: LeaseState,
    worker: Option<WorkerHandle>,
}

/// Where a request for a partition should go.
#[derive(Debug, Clone)]
pub enum Placement {
    Owned {
        token: FenceToken,
        sender: mpsc::Sender<WorkItem>,
    },
    Uncertain,
    NotOwned,
}

/// A lease whose authority this replica dropped; the database may still name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub token: FenceToken,
    pub cause: LossCause,
}

pub struct Ownership {
    slots: Vec<Mutex<Slot>>,
    clock: Arc<dyn Clock>,
    timing: LeaseTiming,
    /// Every loss, for the lease manager to release in the database. Unbounded because losses
    /// are few (at most one per held lease between acquisitions) and `lose` must never wait.
    losses: UnboundedSender<Dropped>,
    loss_feed: Mutex<Option<UnboundedReceiver<Dropped>>>,
}

impl Ownership {
    pub fn new(partition_count: u32, clock: Arc<dyn Clock>, timing: LeaseTiming) -> Self {
        let slots = (0..partition_count)
            .map(|_| {
                Mutex::new(Slot {
                    state: LeaseState::NotHeld,
                    worker: None,
                })
            })
            .collect();
        let (losses, loss_feed) = mpsc::unbounded_channel();
        Self {
            slots,
            clock,
            timing,
            losses,
            loss_feed: Mutex::new(Some(loss_feed)),
        }
    }

    /// The feed of dropped leases; the first caller (the lease manager) gets it.
    pub fn take_loss_feed(&self) -> Option<UnboundedReceiver<Dropped>> {
        self.loss_feed
            .lock()
            .expect("loss feed lock poisoned")
            .take()
    }

    pub fn partition_count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The clock every deadline of this table is measured with.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    pub fn timing(&self) -> &LeaseTiming {
        &self.timing
    }

    fn slot(&self, partition: u32) -> std::sync::MutexGuard<'_, Slot> {
        self.slots[partition as usize]
            .lock()
            .expect("ownership slot lock poisoned")
    }

    pub fn placement(&self, partition: u32) -> Placement {
        let now = self.clock.now();
        let slot = self.slot(partition);
        match (slot.state.authority(now), &slot.worker) {
            (Authority::Granted { epoch, .. }, Some(worker)) => Placement::Owned {
                token: FenceToken::new(partition, epoch),
                sender: worker.sender.clone(),
            },
            (Authority::NotHeld, _) => Placement::NotOwned,
            _ => Placement::Uncertain,
        }
    }

    /// The epoch under which this replica may act for `partition` right now, if any.
    pub fn authority_any(&self, partition: u32) -> Option<i64> {
        match self.slot(partition).state.authority(self.clock.now()) {
            Authority::Granted { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    /// Authority for `token`'s partition right now, for `token`'s epoch only.
    pub fn authority(&self, token: FenceToken) -> Authority {
        let now = self.clock.now();
        match self.slot(token.partition).state.authority(now) {
            Authority::Granted { epoch: held, .. } if held != token.epoch => Authority::NotHeld,
            other => other,
        }
    }

    /// The handle a worker for `token` gets: it can ask about that tenure and give it up, and
    /// nothing else.
    pub fn authority_handle(self: &Arc<Self>, token: FenceToken) -> PartitionAuthority {
        PartitionAuthority::new(token, self.clone())
    }

    /// Record a fresh acquisition (requested at `t0`) and the worker serving it.
    pub fn install(&self, token: FenceToken, t0: Instant, worker: WorkerHandle) {
        let mut slot = self.slot(token.partition);
        if let Some(old) = slot.worker.take() {
            old.cancel.cancel();
        }
        slot.state = LeaseState::on_acquired(&self.timing, t0, token.epoch);
        slot.worker = Some(worker);
        metrics::counter!(m::LEASE_ACQUISITIONS).increment(1);
        metrics::gauge!(m::PARTITION_EPOCH, "partition" => token.partition.to_string())
            .set(token.epoch as f64);
    }

    /// Every tenure this replica currently holds or is unsure about.
    pub fn held(&self) -> Vec<FenceToken> {
        (0..self.partition_count())
            .filter_map(|p| self.slot(p).state.epoch().map(|e| FenceToken::new(p, e)))
            .collect()
    }

    /// Apply a renewal of `token` sent at `t0` that the database confirmed.
    pub fn renewed(&self, token: FenceToken, t0: Instant) {
        let now = self.clock.now();
        let mut slot = self.slot(token.partition);
        if slot.state.epoch() == Some(token.epoch) {
            let next = slot.state.on_renewed(&self.timing, t0, now);
            if next == LeaseState::NotHeld {
                drop(slot);
                self.lose(token, LossCause::Deadline);
            } else {
                slot.state = next;
            }
        }
    }

    /// A renewal of `token` failed or its outcome is unknown.
    pub fn renew_failed(&self, token: FenceToken) {
        let mut slot = self.slot(token.partition);
        if slot.state.epoch() == Some(token.epoch) {
            slot.state = slot.state.on_renew_failed();
        }
    }

    /// Drop authority for `token`'s partition if it is still held at `token`'s epoch; returns
    /// the worker so the caller may wait for it to drain.
    pub fn lose(&self, token: FenceToken, cause: LossCause) -> Option<WorkerHandle> {
        let mut slot = self.slot(token.partition);
        if slot.state.epoch() != Some(token.epoch) {
            return None;
        }
        slot.state = LeaseState::NotHeld;
        let worker = slot.worker.take();
        if let Some(w) = &worker {
            w.cancel.cancel();
        }
        metrics::counter!(m::LEASE_LOSSES, "cause" => cause.as_str()).increment(1);
        tracing::warn!(
            partition = token.partition,
            epoch = token.epoch,
            cause = cause.as_str(),
            "lease lost, authority dropped"
        );
        let _ = self.losses.send(Dropped { token, cause });
        worker
    }

    /// Stop acting for `partition` on purpose (hand-off or shutdown): like a loss, but counted as
    /// a release by the caller.
    pub fn relinquish(&self, partition: u32) -> Option<(FenceToken, Option<WorkerHandle>)> {
        let mut slot = self.slot(partition);
        let epoch = slot.state.epoch()?;
        slot.state = LeaseState::NotHeld;
        let worker = slot.worker.take();
        if let Some(w) = &worker {
            w.cancel.cancel();
        }
        Some((FenceToken::new(partition, epoch), worker))
    }

    /// Watchdog tick: drop every lease whose safe deadline passed; returns the min remaining
    /// time over held leases (for the metric).
    pub fn expire_deadlines(&self) -> Option<Duration> {
        let now = self.clock.now();
        let mut min_remaining: Option<Duration> = None;
        let mut lapsed = Vec::new();
        for p in 0..self.partition_count() {
            let slot = self.slot(p);
            match slot.state.tick(now) {
                (_, Some(cause)) => lapsed.push((p, slot.state.epoch(), cause)),
                (LeaseState::Active { safe_until, .. }, None)
                | (LeaseState::Uncertain { safe_until, .. }, None) => {
                    let remaining = safe_until.saturating_duration_since(now);
                    min_remaining = Some(min_remaining.map_or(remaining, |m| m.min(remaining)));
                }
                (LeaseState::NotHeld, None) => {}
            }
        }
        for (partition, epoch, cause) in lapsed {
            if let Some(epoch) = epoch {
                self.lose(FenceToken::new(partition, epoch), cause);
            }
        }
        min_remaining
    }

    /// The process stalled: nothing it believed about its leases can be trusted any more.
    pub fn lose_all(&self, cause: LossCause) {
        for token in self.held() {
            self.lose(token, cause);
        }
    }
}

impl AuthoritySource for Ownership {
    fn authority(&self, token: FenceToken) -> Authority {
        Ownership::authority(self, token)
    }

    fn report_loss(&self, token: FenceToken, cause: LossCause) {
        // The worker reporting is the one being dropped; it drains on its own cancellation.
        let _ = self.lose(token, cause);
    }
}
