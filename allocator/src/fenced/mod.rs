//! The fenced reservation transaction (design §6).
//!
//! A batch of commands for one or more partitions runs as **one statement**: the server-side
//! function `apply_fenced_batch` (shipped as a migration) takes the whole batch as arrays and
//! returns one outcome per command. As an autocommit statement it is also one transaction, so a
//! batch of any size costs one round trip:
//!
//! 1. **Fence.** Each partition's lease row is read `FOR KEY SHARE` and must name this replica at
//!    this epoch with an unexpired lease. `FOR KEY SHARE` conflicts with the `FOR UPDATE` that an
//!    acquisition takes first, so a newer owner's acquire either committed before the check (and
//!    the check sees the new epoch) or waits until this transaction ends: no write of it can
//!    commit after a newer epoch exists, for any row of the partition (I4). It does not conflict
//!    with a renewal (a plain non-key `UPDATE`), so a stuck batch never fails renewals. A
//!    partition whose fence fails is answered [`FencedError::StaleEpoch`] without affecting the
//!    other partitions of the group.
//! 2. **Row fence.** Every inventory write sets `highest_epoch`; a trigger refuses a lower epoch
//!    than the row already carries, whoever the writer is.
//! 3. **Idempotency.** Existing ids are looked up once; a replay returns the stored outcome, a
//!    reuse with another payload (sku, quantity, ttl_seconds; sku, delta) is a mismatch (422).
//! 4. **Decrement-if-available** per command in arrival order, in memory over rows locked once
//!    per distinct SKU; then one bulk write per table, so a hot SKU gets one row update per batch.
//!    Not enough stock records a durable refusal; an unknown SKU records nothing.
//! 5. A ledger row for every stock movement; overdue holds the batch touches are expired in it.
//!
//! A stale epoch aborts a partition's part of the batch and surfaces as
//! [`FencedError::StaleEpoch`], never as a partial write.

mod batch;

pub use batch::{apply_group, fenced_transaction, PartitionBatch};

use crate::error::{classify, DbFailure};
use schema::wire::{Adjustment, Reservation, ReservationStatus};

/// The authority a transaction runs under.
#[derive(Debug, Clone)]
pub struct Fence {
    pub partition: u32,
    pub epoch: i64,
    pub replica_id: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Reserve {
        reservation_id: String,
        sku: String,
        quantity: i64,
        ttl_seconds: u32,
    },
    Confirm {
        reservation_id: String,
    },
    Release {
        reservation_id: String,
    },
    Adjust {
        adjustment_id: String,
        sku: String,
        delta: i64,
    },
    /// Expire up to `limit` overdue holds of the partition.
    ExpireDue {
        limit: i64,
    },
}

impl Command {
    /// Metric label.
    pub fn op(&self) -> &'static str {
        match self {
            Command::Reserve { .. } => "reserve",
            Command::Confirm { .. } => "confirm",
            Command::Release { .. } => "release",
            Command::Adjust { .. } => "adjust",
            Command::ExpireDue { .. } => "expire",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A reservation in its current state; `created` for a new hold, `replayed` when an earlier
    /// outcome of the same id (or an already-made transition) is returned.
    Reservation {
        reservation: Reservation,
        created: bool,
        replayed: bool,
    },
    InsufficientStock {
        available: i64,
        replayed: bool,
    },
    /// The id exists with a different payload.
    Mismatch {
        detail: String,
    },
    NotFound {
        detail: String,
    },
    InvalidState {
        current: ReservationStatus,
    },
    Adjusted {
        adjustment: Adjustment,
        replayed: bool,
    },
    ShrinkRefused {
        available: i64,
        replayed: bool,
    },
    Expired {
        count: u64,
    },
}

impl Outcome {
    /// Metric label.
    pub fn result(&self) -> &'static str {
        match self {
            Outcome::Reservation { replayed: true, .. } => "replayed",
            Outcome::Reservation { created: true, .. } => "held",
            Outcome::Reservation { .. } => "transitioned",
            Outcome::InsufficientStock { .. } => "insufficient_stock",
            Outcome::Mismatch { .. } => "mismatch",
            Outcome::NotFound { .. } => "not_found",
            Outcome::InvalidState { .. } => "invalid_state",
            Outcome::Adjusted { .. } => "adjusted",
            Outcome::ShrinkRefused { .. } => "shrink_refused",
            Outcome::Expired { .. } => "expired",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FencedError {
    /// The lease row or an inventory row names a newer epoch (or another holder, or the lease
    /// expired): this replica must stop acting for the partition.
    #[error("stale epoch {ours} for partition {partition} (lease epoch {current:?})")]
    StaleEpoch {
        partition: u32,
        ours: i64,
        current: Option<i64>,
    },
    #[error("database: {}", crate::error::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The batch function answered something this build does not understand (a schema and
    /// binary out of step).
    #[error("malformed batch answer: {0}")]
    Malformed(String),
}

impl FencedError {
    pub fn failure(&self) -> DbFailure {
        match self {
            FencedError::StaleEpoch { .. } => DbFailure::StaleEpoch,
            FencedError::Db(e) => classify(e),
            FencedError::Malformed(_) => DbFailure::Other,
        }
    }

    /// Whether the statement may have committed: only when the connection broke before an
    /// answer arrived. An error answered by the server means the statement rolled back.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            FencedError::Db(e) => e.code().is_none(),
            _ => false,
        }
    }
}
