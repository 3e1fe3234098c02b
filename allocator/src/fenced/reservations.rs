//! Reservations as the Rust side sees them: the one mapping of the stored status to the wire
//! status, and the one way a stored reservation becomes a [`Reservation`], whether it was read by
//! id (`GET`, and finding a reservation's partition before a transition) or came back in a batch
//! answer (a new hold, an idempotent replay, a confirm or release).
//!
//! Reading by id is not fenced: PostgreSQL is the authority, so any replica may answer, owner or
//! not. A status this build does not know is an error, never guessed at: a schema ahead of the
//! binary must show up as a failure, not as a plausible but wrong state.

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;

use super::answer::AnswerRow;
use super::command::Command;
use super::fence::{malformed, FencedError};
use schema::wire::{Reservation, ReservationStatus};

/// The stored status of a reserve that found too little stock. Such a row only makes a replay
/// answer the same refusal; it is not a reservation state on the wire.
pub const REFUSED: &str = "rejected";

/// A stored status outside the set this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reservation status {0:?}")]
pub struct UnknownStatus(pub String);

/// The wire status of a stored `reservations.status`; the only place the two are mapped.
pub fn status_from_stored(text: &str) -> Result<ReservationStatus, UnknownStatus> {
    match text {
        "held" => Ok(ReservationStatus::Held),
        "confirmed" => Ok(ReservationStatus::Confirmed),
        "released" => Ok(ReservationStatus::Released),
        "expired" => Ok(ReservationStatus::Expired),
        other => Err(UnknownStatus(other.to_owned())),
    }
}

/// A reservation's stored columns, however they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReservation {
    pub reservation_id: String,
    pub status: String,
    pub sku: String,
    pub quantity: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub partition: u32,
    pub epoch: i64,
    /// A hold past its expiry that no sweep has reached yet. It is over all the same, so it reads
    /// as expired; a batch expires the overdue holds it touches before it answers, so a batch
    /// answer is never overdue.
    pub overdue: bool,
}

impl StoredReservation {
    pub fn into_wire(self) -> Result<Reservation, UnknownStatus> {
        let status = match status_from_stored(&self.status)? {
            ReservationStatus::Held if self.overdue => ReservationStatus::Expired,
            status => status,
        };
        Ok(Reservation {
            reservation_id: self.reservation_id,
            status,
            sku: self.sku,
            quantity: self.quantity,
            expires_at: self.expires_at,
            partition: self.partition,
            epoch: self.epoch,
        })
    }
}

/// A reservation row read by id.
#[derive(Debug, Clone, PartialEq)]
pub enum ReservationRecord {
    Current(Reservation),
    /// The reserve was refused for want of stock; `available` is what there was.
    Refused {
        sku: String,
        partition: u32,
        available: i64,
    },
}

impl ReservationRecord {
    /// The partition whose owner may change the reservation.
    pub fn partition(&self) -> u32 {
        match self {
            ReservationRecord::Current(reservation) => reservation.partition,
            ReservationRecord::Refused { partition, .. } => *partition,
        }
    }

    /// The SKU it was made for (a client confined to SKU namespaces sees only its own).
    pub fn sku(&self) -> &str {
        match self {
            ReservationRecord::Current(reservation) => &reservation.sku,
            ReservationRecord::Refused { sku, .. } => sku,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("database: {}", crate::error::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("malformed stored reservation: {0}")]
    Malformed(#[from] UnknownStatus),
}

/// Read reservation `reservation_id` as the current request's client may see it
/// ([`access::current_owner`]): `None` when PostgreSQL does not know it, or when it is another
/// client's ([`access::Owner::may_act_on`]; such a read is audited).
pub async fn read_reservation<C: GenericClient>(
    client: &C,
    reservation_id: &str,
) -> Result<Option<ReservationRecord>, ReadError> {
    let Some(row) = client
        .query_opt(
            "SELECT sku, quantity, status, epoch, expires_at, partition, available_at_refusal,
                    status = 'held' AND expires_at <= now() AS overdue, owner
               FROM reservations WHERE reservation_id = $1",
            &[&reservation_id],
        )
        .await?
    else {
        return Ok(None);
    };
    // The owner never changes once the row is written; the fenced batch checks it again.
    if !access::owner_visible(row.get::<_, Option<&str>>(8)) {
        return Ok(None);
    }
    let status: String = row.get(2);
    let partition = row.get::<_, i32>(5) as u32;
    if status == REFUSED {
        return Ok(Some(ReservationRecord::Refused {
            sku: row.get(0),
            partition,
            available: row.get::<_, Option<i64>>(6).unwrap_or(0),
        }));
    }
    let stored = StoredReservation {
        reservation_id: reservation_id.to_owned(),
        status,
        sku: row.get(0),
        quantity: row.get(1),
        expires_at: row.get(4),
        partition,
        epoch: row.get(3),
        overdue: row.get::<_, Option<bool>>(7) == Some(true),
    };
    Ok(Some(ReservationRecord::Current(stored.into_wire()?)))
}

/// The reservation a batch answered for `command` (a new hold, a replay or a transition).
pub(super) fn reservation_from_answer(
    command: &Command,
    row: &AnswerRow<'_>,
) -> Result<Reservation, FencedError> {
    let reservation_id = command
        .reservation_id()
        .ok_or_else(|| malformed("reservation outcome for another command"))?;
    let stored = StoredReservation {
        reservation_id: reservation_id.to_owned(),
        status: row.status(),
        sku: row.sku(),
        quantity: row
            .quantity()
            .ok_or_else(|| malformed("reservation outcome without a quantity"))?,
        expires_at: row.expires_at(),
        partition: row.partition() as u32,
        epoch: row
            .epoch()
            .ok_or_else(|| malformed("reservation outcome without an epoch"))?,
        overdue: false,
    };
    stored.into_wire().map_err(|e| malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(status: &str, overdue: bool) -> StoredReservation {
        StoredReservation {
            reservation_id: "r".into(),
            status: status.into(),
            sku: "s".into(),
            quantity: 1,
            expires_at: None,
            partition: 0,
            epoch: 1,
            overdue,
        }
    }

    #[test]
    fn every_stored_state_maps_and_nothing_else_does() {
        for (text, status) in [
            ("held", ReservationStatus::Held),
            ("confirmed", ReservationStatus::Confirmed),
            ("released", ReservationStatus::Released),
            ("expired", ReservationStatus::Expired),
        ] {
            assert_eq!(status_from_stored(text), Ok(status));
        }
        assert!(status_from_stored(REFUSED).is_err());
        assert!(status_from_stored("archived").is_err());
    }

    #[test]
    fn an_overdue_hold_reads_as_expired_and_only_a_hold() {
        let status = |s, overdue| stored(s, overdue).into_wire().unwrap().status;
        assert_eq!(status("held", true), ReservationStatus::Expired);
        assert_eq!(status("held", false), ReservationStatus::Held);
        assert_eq!(status("confirmed", true), ReservationStatus::Confirmed);
        assert!(stored("archived", false).into_wire().is_err());
    }
}
