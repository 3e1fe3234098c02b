//! This replica's view of which partitions it may act for, shared by the lease manager, the
//! partition workers and the HTTP handlers.
//!
//! One slot per partition holds the [`LeaseState`] and, while the lease is held, the handle of
//! the partition's worker. Handlers ask [`Ownership::route`] before queuing work; workers ask
//! [`Ownership::authority`] again before every transaction, because authority can lapse while a
//! command waits in the queue.
//!
//! Every loss is also reported on a feed ([`Ownership::take_loss_feed`]): dropping authority is
//! local and immediate, but the database keeps naming this replica until the lease expires, so
//! the lease manager releases what it dropped (conditional on holder and epoch) and peers and
//! routers need not wait for the expiry.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::state::{Authority, LeaseState, LeaseTiming, LossCause};
use crate::clock::Clock;
use crate::metrics as m;
use crate::worker::Job;

/// A running partition worker.
#[derive(Debug)]
pub struct WorkerHandle {
    pub sender: mpsc::Sender<Job>,
    /// Cancelled when authority is lost: the worker aborts its in-flight transaction and answers
    /// everything queued with "not owner".
    pub cancel: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Slot {
    state: LeaseState,
    worker: Option<WorkerHandle>,
}

/// Where a request for a partition should go.
#[derive(Debug, Clone)]
pub enum Route {
    Owned {
        epoch: i64,
        sender: mpsc::Sender<Job>,
    },
    Uncertain,
    NotOwned,
}

/// A lease whose authority this replica dropped; the database may still name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub partition: u32,
    pub epoch: i64,
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

    pub fn route(&self, partition: u32) -> Route {
        let now = self.clock.now();
        let slot = self.slot(partition);
        match (slot.state.authority(now), &slot.worker) {
            (Authority::Granted { epoch, .. }, Some(worker)) => Route::Owned {
                epoch,
                sender: worker.sender.clone(),
            },
            (Authority::NotHeld, _) => Route::NotOwned,
            _ => Route::Uncertain,
        }
    }

    /// The epoch under which this replica may act for `partition` right now, if any.
    pub fn authority_any(&self, partition: u32) -> Option<i64> {
        match self.slot(partition).state.authority(self.clock.now()) {
            Authority::Granted { epoch, .. } => Some(epoch),
            _ => None,
        }
    }

    /// Authority for `partition` at `epoch` right now; a worker calls this before each batch.
    pub fn authority(&self, partition: u32, epoch: i64) -> Authority {
        let now = self.clock.now();
        match self.slot(partition).state.authority(now) {
            Authority::Granted { epoch: held, .. } if held != epoch => Authority::NotHeld,
            other => other,
        }
    }

    /// Record a fresh acquisition and the worker serving it.
    pub fn install(&self, partition: u32, t0: Instant, epoch: i64, worker: WorkerHandle) {
        let mut slot = self.slot(partition);
        if let Some(old) = slot.worker.take() {
            old.cancel.cancel();
        }
        slot.state = LeaseState::on_acquired(&self.timing, t0, epoch);
        slot.worker = Some(worker);
        metrics::counter!(m::LEASE_ACQUISITIONS).increment(1);
        metrics::gauge!(m::PARTITION_EPOCH, "partition" => partition.to_string()).set(epoch as f64);
    }

    /// Every (partition, epoch) this replica currently holds or is unsure about.
    pub fn held(&self) -> Vec<(u32, i64)> {
        (0..self.partition_count())
            .filter_map(|p| self.slot(p).state.epoch().map(|e| (p, e)))
            .collect()
    }

    /// Apply a renewal sent at `t0` that the database confirmed for `partition` at `epoch`.
    pub fn renewed(&self, partition: u32, epoch: i64, t0: Instant) {
        let now = self.clock.now();
        let mut slot = self.slot(partition);
        if slot.state.epoch() == Some(epoch) {
            let next = slot.state.on_renewed(&self.timing, t0, now);
            if next == LeaseState::NotHeld {
                drop(slot);
                self.lose(partition, epoch, LossCause::Deadline);
            } else {
                slot.state = next;
            }
        }
    }

    /// A renewal of `partition` at `epoch` failed or its outcome is unknown.
    pub fn renew_failed(&self, partition: u32, epoch: i64) {
        let mut slot = self.slot(partition);
        if slot.state.epoch() == Some(epoch) {
            slot.state = slot.state.on_renew_failed();
        }
    }

    /// Drop authority for `partition` if it is still held at `epoch`; returns the worker so the
    /// caller may wait for it to drain.
    pub fn lose(&self, partition: u32, epoch: i64, cause: LossCause) -> Option<WorkerHandle> {
        let mut slot = self.slot(partition);
        if slot.state.epoch() != Some(epoch) {
            return None;
        }
        slot.state = LeaseState::NotHeld;
        let worker = slot.worker.take();
        if let Some(w) = &worker {
            w.cancel.cancel();
        }
        metrics::counter!(m::LEASE_LOSSES, "cause" => cause.as_str()).increment(1);
        tracing::warn!(
            partition,
            epoch,
            cause = cause.as_str(),
            "lease lost, authority dropped"
        );
        let _ = self.losses.send(Dropped {
            partition,
            epoch,
            cause,
        });
        worker
    }

    /// Stop acting for `partition` on purpose (hand-off or shutdown): like a loss, but counted as
    /// a release by the caller.
    pub fn relinquish(&self, partition: u32) -> Option<(i64, Option<WorkerHandle>)> {
        let mut slot = self.slot(partition);
        let epoch = slot.state.epoch()?;
        slot.state = LeaseState::NotHeld;
        let worker = slot.worker.take();
        if let Some(w) = &worker {
            w.cancel.cancel();
        }
        Some((epoch, worker))
    }

    /// Watchdog tick: drop every lease whose safe deadline passed; returns the min remaining
    /// time over held leases (for the metric).
    pub fn expire_deadlines(&self) -> Option<std::time::Duration> {
        let now = self.clock.now();
        let mut min_remaining: Option<std::time::Duration> = None;
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
                self.lose(partition, epoch, cause);
            }
        }
        min_remaining
    }

    /// The process stalled: nothing it believed about its leases can be trusted any more.
    pub fn lose_all(&self, cause: LossCause) {
        for (partition, epoch) in self.held() {
            self.lose(partition, epoch, cause);
        }
    }
}
