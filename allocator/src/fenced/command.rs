//! The command protocol of a partition: what a worker can be asked to do, and what it answers.
//!
//! Commands are applied in arrival order within one fenced statement; each gets exactly one
//! [`Outcome`]. Business refusals (not enough stock, a reused id, a transition that is not
//! allowed) are outcomes, not errors: they commit like any other answer, so a replay of the same
//! id returns the same refusal.

use access::Owner;
use schema::wire::{Adjustment, Reservation, ReservationStatus};

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Reserve {
        reservation_id: String,
        sku: String,
        quantity: i64,
        ttl_seconds: u32,
        /// Recorded on a new reservation; a replay of another client's id is answered as an
        /// unknown one ([`Owner::may_act_on`]).
        owner: Owner,
    },
    Confirm {
        reservation_id: String,
        owner: Owner,
    },
    Release {
        reservation_id: String,
        owner: Owner,
    },
    /// A restock (positive `delta`) or shrink, for `owner`, whose client the new adjustment
    /// records (`V20__adjustment_owner.sql`; [`Owner::ANYONE`]: anonymous or unknown, as with
    /// authentication off).
    Adjust {
        adjustment_id: String,
        sku: String,
        delta: i64,
        owner: Owner,
    },
    /// Expire up to `limit` overdue holds of the partition.
    ExpireDue { limit: i64 },
}

impl Command {
    /// Metric label, and the operation name `apply_fenced_batch` expects.
    pub fn op(&self) -> &'static str {
        match self {
            Command::Reserve { .. } => "reserve",
            Command::Confirm { .. } => "confirm",
            Command::Release { .. } => "release",
            Command::Adjust { .. } => "adjust",
            Command::ExpireDue { .. } => "expire",
        }
    }

    /// The reservation a reserve, confirm or release is about.
    pub fn reservation_id(&self) -> Option<&str> {
        match self {
            Command::Reserve { reservation_id, .. }
            | Command::Confirm { reservation_id, .. }
            | Command::Release { reservation_id, .. } => Some(reservation_id),
            Command::Adjust { .. } | Command::ExpireDue { .. } => None,
        }
    }

    /// An adjustment's id, SKU and delta.
    pub fn adjustment(&self) -> Option<(&str, &str, i64)> {
        match self {
            Command::Adjust {
                adjustment_id,
                sku,
                delta,
                ..
            } => Some((adjustment_id, sku, *delta)),
            _ => None,
        }
    }

    /// Who a command is for: recorded on the reservation or adjustment it creates. Sweeps act
    /// for no client.
    /// The id, SKU, amount and TTL a command fills in the batch statements' parallel arrays
    /// (both statements lay a command out the same way). A sweep has no id: it only asks that
    /// nothing of its partition is due; its amount is its limit.
    pub fn statement_row(&self) -> (Option<&str>, Option<&str>, i64, i32) {
        match self {
            Command::Reserve {
                reservation_id,
                sku,
                quantity,
                ttl_seconds,
                ..
            } => (
                Some(reservation_id.as_str()),
                Some(sku.as_str()),
                *quantity,
                *ttl_seconds as i32,
            ),
            Command::Confirm { reservation_id, .. } | Command::Release { reservation_id, .. } => {
                (Some(reservation_id.as_str()), None, 0, 0)
            }
            Command::Adjust {
                adjustment_id,
                sku,
                delta,
                ..
            } => (Some(adjustment_id.as_str()), Some(sku.as_str()), *delta, 0),
            Command::ExpireDue { limit } => (None, None, *limit, 0),
        }
    }

    pub fn owner(&self) -> &Owner {
        match self {
            Command::Reserve { owner, .. }
            | Command::Confirm { owner, .. }
            | Command::Release { owner, .. }
            | Command::Adjust { owner, .. } => owner,
            Command::ExpireDue { .. } => &Owner::ANYONE,
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
    /// The client would hold more than its `quota` (`max_held_per_sku` of the SKU, or
    /// `max_held_units` over every SKU) allows, `limit`; it holds `held` (for a replay: held when
    /// it was refused). The refusal is stored under the id (V21, V22), so a retry of the same id
    /// replays it; a new id may go through once it holds less.
    HoldQuotaExceeded {
        quota: access::Quota,
        limit: i64,
        held: i64,
        detail: String,
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
            Outcome::HoldQuotaExceeded { .. } => "quota_exceeded",
            Outcome::Adjusted { .. } => "adjusted",
            Outcome::ShrinkRefused { .. } => "shrink_refused",
            Outcome::Expired { .. } => "expired",
        }
    }
}
