//! The fenced reservation transaction (design §6).
//!
//! [`fenced_transaction`] runs a batch of commands for one partition in one PostgreSQL
//! transaction:
//!
//! 1. **Fence.** `SELECT … FROM leases WHERE name = 'partition/P' FOR SHARE` must name this replica
//!    at this epoch with an unexpired lease. `FOR SHARE` conflicts with the row lock an acquiring
//!    `UPDATE` needs, so a newer owner's acquire either committed before this check (and the check
//!    sees the new epoch, because read-committed re-reads the latest version after waiting) or
//!    waits until this transaction ends. No write of this transaction can therefore commit after a
//!    newer epoch exists — for every row of the partition, including rows the new owner never
//!    touched (I4). Server-side `idle_in_transaction_session_timeout` bounds how long a paused
//!    owner can hold that share lock.
//! 2. **Row fence.** Every inventory write sets `highest_epoch = epoch`; a trigger refuses a lower
//!    epoch than the row already carries, whoever the writer is.
//! 3. **Idempotency.** The reservation (or adjustment) row is inserted first with
//!    `ON CONFLICT DO NOTHING`: the unique id decides every race, and a conflict replays the stored
//!    outcome (or 422 when sku/quantity differ).
//! 4. **Decrement-if-available** as one conditional `UPDATE`; not enough stock records a durable
//!    `rejected` outcome that later retries replay.
//! 5. A ledger row for every stock movement.
//!
//! A stale epoch aborts the whole transaction and surfaces as [`FencedError::StaleEpoch`], never
//! as a partial write.

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;

use crate::error::{classify, DbFailure};
use crate::partition::lease_name;
use crate::wire::{Adjustment, Reservation, ReservationStatus};

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
}

impl FencedError {
    pub fn failure(&self) -> DbFailure {
        match self {
            FencedError::StaleEpoch { .. } => DbFailure::StaleEpoch,
            FencedError::Db(e) => classify(e),
        }
    }
}

/// Run `commands` for `fence.partition` in one fenced transaction; one outcome per command, in
/// order. Either all effects commit under a still-valid epoch or none does.
pub async fn fenced_transaction(
    client: &mut deadpool_postgres::Object,
    fence: &Fence,
    commands: &[Command],
) -> Result<Vec<Outcome>, FencedError> {
    let tx = client.transaction().await?;
    check_lease_fence(&tx, fence).await?;
    let mut outcomes = Vec::with_capacity(commands.len());
    for command in commands {
        let outcome = apply(&tx, fence, command)
            .await
            .map_err(|e| match classify(&e) {
                DbFailure::StaleEpoch => FencedError::StaleEpoch {
                    partition: fence.partition,
                    ours: fence.epoch,
                    current: None,
                },
                _ => FencedError::Db(e),
            })?;
        outcomes.push(outcome);
    }
    tx.commit().await?;
    Ok(outcomes)
}

async fn check_lease_fence(tx: &Transaction<'_>, fence: &Fence) -> Result<(), FencedError> {
    let stmt = tx
        .prepare_cached(
            "SELECT holder_id, epoch, expires_at > now() FROM leases WHERE name = $1 FOR SHARE",
        )
        .await?;
    let row = tx.query_opt(&stmt, &[&lease_name(fence.partition)]).await?;
    let Some(row) = row else {
        return Err(FencedError::StaleEpoch {
            partition: fence.partition,
            ours: fence.epoch,
            current: None,
        });
    };
    let holder: Option<String> = row.get(0);
    let epoch: i64 = row.get(1);
    let live: Option<bool> = row.get(2);
    if holder.as_deref() != Some(fence.replica_id.as_str())
        || epoch != fence.epoch
        || live != Some(true)
    {
        return Err(FencedError::StaleEpoch {
            partition: fence.partition,
            ours: fence.epoch,
            current: Some(epoch),
        });
    }
    Ok(())
}

async fn apply(
    tx: &Transaction<'_>,
    fence: &Fence,
    command: &Command,
) -> Result<Outcome, tokio_postgres::Error> {
    match command {
        Command::Reserve {
            reservation_id,
            sku,
            quantity,
            ttl_seconds,
        } => reserve(tx, fence, reservation_id, sku, *quantity, *ttl_seconds).await,
        Command::Confirm { reservation_id } => {
            transition(tx, fence, reservation_id, Transition::Confirm).await
        }
        Command::Release { reservation_id } => {
            transition(tx, fence, reservation_id, Transition::Release).await
        }
        Command::Adjust {
            adjustment_id,
            sku,
            delta,
        } => adjust(tx, fence, adjustment_id, sku, *delta).await,
        Command::ExpireDue { limit } => {
            let count = expire(tx, fence, None, *limit).await?;
            Ok(Outcome::Expired { count })
        }
    }
}

async fn insert_ledger(
    tx: &Transaction<'_>,
    fence: &Fence,
    sku: &str,
    kind: &str,
    reservation_id: Option<&str>,
    adjustment_id: Option<&str>,
    deltas: [i64; 4],
) -> Result<(), tokio_postgres::Error> {
    let stmt = tx
        .prepare_cached(
            "INSERT INTO ledger (sku, partition, kind, reservation_id, adjustment_id,
                                 d_on_hand, d_available, d_held, d_confirmed, epoch)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .await?;
    tx.execute(
        &stmt,
        &[
            &sku,
            &(fence.partition as i32),
            &kind,
            &reservation_id,
            &adjustment_id,
            &deltas[0],
            &deltas[1],
            &deltas[2],
            &deltas[3],
            &fence.epoch,
        ],
    )
    .await?;
    Ok(())
}

async fn reserve(
    tx: &Transaction<'_>,
    fence: &Fence,
    reservation_id: &str,
    sku: &str,
    quantity: i64,
    ttl_seconds: u32,
) -> Result<Outcome, tokio_postgres::Error> {
    let insert = tx
        .prepare_cached(
            "INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                                       ttl_seconds, request_fingerprint, expires_at)
             VALUES ($1, $2, $3, $4::bigint, 'held', $5, $6::int, $2 || '/' || ($4::bigint)::text,
                     now() + $6::int * interval '1 second')
             ON CONFLICT (reservation_id) DO NOTHING
             RETURNING expires_at",
        )
        .await?;
    let inserted = tx
        .query_opt(
            &insert,
            &[
                &reservation_id,
                &sku,
                &(fence.partition as i32),
                &quantity,
                &fence.epoch,
                &(ttl_seconds as i32),
            ],
        )
        .await?;
    let Some(inserted) = inserted else {
        return replay_reservation(tx, reservation_id, sku, quantity).await;
    };
    let expires_at: DateTime<Utc> = inserted.get(0);

    let decrement = tx
        .prepare_cached(
            "UPDATE inventory
                SET available = available - $2, held = held + $2, highest_epoch = $3
              WHERE sku = $1 AND partition = $4 AND available >= $2
          RETURNING available",
        )
        .await?;
    let decremented = tx
        .query_opt(
            &decrement,
            &[&sku, &quantity, &fence.epoch, &(fence.partition as i32)],
        )
        .await?;
    if decremented.is_some() {
        insert_ledger(
            tx,
            fence,
            sku,
            "reserve",
            Some(reservation_id),
            None,
            [0, -quantity, quantity, 0],
        )
        .await?;
        return Ok(Outcome::Reservation {
            reservation: Reservation {
                reservation_id: reservation_id.to_owned(),
                status: ReservationStatus::Held,
                sku: sku.to_owned(),
                quantity,
                expires_at: Some(expires_at),
                partition: fence.partition,
                epoch: fence.epoch,
            },
            created: true,
            replayed: false,
        });
    }

    let available = tx
        .query_opt(
            "SELECT available FROM inventory WHERE sku = $1 AND partition = $2",
            &[&sku, &(fence.partition as i32)],
        )
        .await?;
    match available {
        None => {
            // Unknown SKU: nothing is recorded, so the same id works once the SKU exists.
            tx.execute(
                "DELETE FROM reservations WHERE reservation_id = $1",
                &[&reservation_id],
            )
            .await?;
            Ok(Outcome::NotFound {
                detail: format!("sku {sku} is not stocked"),
            })
        }
        Some(row) => {
            let available: i64 = row.get(0);
            tx.execute(
                "UPDATE reservations
                    SET status = 'rejected', available_at_refusal = $2, expires_at = NULL
                  WHERE reservation_id = $1",
                &[&reservation_id, &available],
            )
            .await?;
            Ok(Outcome::InsufficientStock {
                available,
                replayed: false,
            })
        }
    }
}

struct StoredReservation {
    reservation: Reservation,
    rejected: bool,
    available_at_refusal: Option<i64>,
    overdue: bool,
}

async fn load_reservation(
    tx: &Transaction<'_>,
    reservation_id: &str,
) -> Result<Option<StoredReservation>, tokio_postgres::Error> {
    let stmt = tx
        .prepare_cached(
            "SELECT sku, quantity, status, epoch, expires_at, partition, available_at_refusal,
                    coalesce(status = 'held' AND expires_at <= now(), false)
               FROM reservations WHERE reservation_id = $1",
        )
        .await?;
    let row = tx.query_opt(&stmt, &[&reservation_id]).await?;
    Ok(row.map(|row| {
        let status: String = row.get(2);
        StoredReservation {
            reservation: Reservation {
                reservation_id: reservation_id.to_owned(),
                status: parse_status(&status),
                sku: row.get(0),
                quantity: row.get(1),
                epoch: row.get(3),
                expires_at: row.get(4),
                partition: row.get::<_, i32>(5) as u32,
            },
            rejected: status == "rejected",
            available_at_refusal: row.get(6),
            overdue: row.get(7),
        }
    }))
}

fn parse_status(status: &str) -> ReservationStatus {
    match status {
        "confirmed" => ReservationStatus::Confirmed,
        "released" => ReservationStatus::Released,
        "expired" => ReservationStatus::Expired,
        // 'rejected' rows never reach callers as a status; they replay as insufficient stock.
        _ => ReservationStatus::Held,
    }
}

async fn replay_reservation(
    tx: &Transaction<'_>,
    reservation_id: &str,
    sku: &str,
    quantity: i64,
) -> Result<Outcome, tokio_postgres::Error> {
    let Some(stored) = load_reservation(tx, reservation_id).await? else {
        return Ok(Outcome::NotFound {
            detail: format!("sku {sku} is not stocked"),
        });
    };
    if stored.reservation.sku != sku || stored.reservation.quantity != quantity {
        return Ok(Outcome::Mismatch {
            detail: format!(
                "reservation {reservation_id} already exists for sku {} quantity {}",
                stored.reservation.sku, stored.reservation.quantity
            ),
        });
    }
    if stored.rejected {
        return Ok(Outcome::InsufficientStock {
            available: stored.available_at_refusal.unwrap_or(0),
            replayed: true,
        });
    }
    Ok(Outcome::Reservation {
        reservation: stored.reservation,
        created: false,
        replayed: true,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transition {
    Confirm,
    Release,
}

async fn transition(
    tx: &Transaction<'_>,
    fence: &Fence,
    reservation_id: &str,
    transition: Transition,
) -> Result<Outcome, tokio_postgres::Error> {
    let (target, kind) = match transition {
        Transition::Confirm => ("confirmed", "confirm"),
        Transition::Release => ("released", "release"),
    };
    let stmt = tx
        .prepare_cached(
            "UPDATE reservations
                SET status = $4, epoch = $2, updated_at = now()
              WHERE reservation_id = $1 AND partition = $3 AND status = 'held' AND expires_at > now()
          RETURNING sku, quantity, expires_at",
        )
        .await?;
    let row = tx
        .query_opt(
            &stmt,
            &[
                &reservation_id,
                &fence.epoch,
                &(fence.partition as i32),
                &target,
            ],
        )
        .await?;
    if let Some(row) = row {
        let sku: String = row.get(0);
        let quantity: i64 = row.get(1);
        // [on_hand, available, held, confirmed]
        let deltas = match transition {
            Transition::Confirm => [0, 0, -quantity, quantity],
            Transition::Release => [0, quantity, -quantity, 0],
        };
        let stock = tx
            .prepare_cached(
                "UPDATE inventory
                    SET available = available + $2, held = held + $3, confirmed = confirmed + $4,
                        highest_epoch = $5
                  WHERE sku = $1",
            )
            .await?;
        tx.execute(
            &stock,
            &[&sku, &deltas[1], &deltas[2], &deltas[3], &fence.epoch],
        )
        .await?;
        insert_ledger(tx, fence, &sku, kind, Some(reservation_id), None, deltas).await?;
        let status = match transition {
            Transition::Confirm => ReservationStatus::Confirmed,
            Transition::Release => ReservationStatus::Released,
        };
        return Ok(Outcome::Reservation {
            reservation: Reservation {
                reservation_id: reservation_id.to_owned(),
                status,
                sku,
                quantity,
                expires_at: row.get(2),
                partition: fence.partition,
                epoch: fence.epoch,
            },
            created: false,
            replayed: false,
        });
    }

    let Some(mut stored) = load_reservation(tx, reservation_id).await? else {
        return Ok(Outcome::NotFound {
            detail: format!("reservation {reservation_id} does not exist"),
        });
    };
    if stored.rejected {
        return Ok(Outcome::InsufficientStock {
            available: stored.available_at_refusal.unwrap_or(0),
            replayed: true,
        });
    }
    if stored.overdue {
        // The hold ran out but the sweeper has not reached it yet: expire it now, so the answer
        // and the stock agree.
        expire(tx, fence, Some(reservation_id), 1).await?;
        stored.reservation.status = ReservationStatus::Expired;
        stored.reservation.epoch = fence.epoch;
    }
    let current = stored.reservation.status;
    let already_done = matches!(
        (transition, current),
        (Transition::Confirm, ReservationStatus::Confirmed)
            | (Transition::Release, ReservationStatus::Released)
            // Releasing a hold that already expired leaves the client where it wanted to be.
            | (Transition::Release, ReservationStatus::Expired)
    );
    if already_done {
        Ok(Outcome::Reservation {
            reservation: stored.reservation,
            created: false,
            replayed: true,
        })
    } else {
        Ok(Outcome::InvalidState { current })
    }
}

/// Expire overdue holds of the partition (all due ones up to `limit`, or one named id) and give
/// their stock back. Returns how many were expired.
async fn expire(
    tx: &Transaction<'_>,
    fence: &Fence,
    only: Option<&str>,
    limit: i64,
) -> Result<u64, tokio_postgres::Error> {
    let stmt = tx
        .prepare_cached(
            "WITH due AS (
                 SELECT reservation_id FROM reservations
                  WHERE partition = $1 AND status = 'held' AND expires_at <= now()
                    AND ($4::text IS NULL OR reservation_id = $4)
                  ORDER BY expires_at
                  LIMIT $3
                  FOR UPDATE SKIP LOCKED)
             UPDATE reservations AS r
                SET status = 'expired', epoch = $2, updated_at = now()
               FROM due
              WHERE r.reservation_id = due.reservation_id
          RETURNING r.reservation_id, r.sku, r.quantity",
        )
        .await?;
    let rows = tx
        .query(
            &stmt,
            &[&(fence.partition as i32), &fence.epoch, &limit, &only],
        )
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let skus: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    let quantities: Vec<i64> = rows.iter().map(|r| r.get(2)).collect();
    let stock = tx
        .prepare_cached(
            "UPDATE inventory AS i
                SET held = i.held - t.q, available = i.available + t.q, highest_epoch = $1
               FROM (SELECT s, sum(q)::bigint AS q
                       FROM unnest($2::text[], $3::bigint[]) AS u(s, q) GROUP BY s) AS t
              WHERE i.sku = t.s",
        )
        .await?;
    tx.execute(&stock, &[&fence.epoch, &skus, &quantities])
        .await?;
    let ledger = tx
        .prepare_cached(
            "INSERT INTO ledger (sku, partition, kind, reservation_id,
                                 d_on_hand, d_available, d_held, d_confirmed, epoch)
             SELECT s, $1, 'expire', id, 0, q, -q, 0, $2
               FROM unnest($3::text[], $4::text[], $5::bigint[]) AS u(id, s, q)",
        )
        .await?;
    tx.execute(
        &ledger,
        &[
            &(fence.partition as i32),
            &fence.epoch,
            &ids,
            &skus,
            &quantities,
        ],
    )
    .await?;
    Ok(rows.len() as u64)
}

async fn adjust(
    tx: &Transaction<'_>,
    fence: &Fence,
    adjustment_id: &str,
    sku: &str,
    delta: i64,
) -> Result<Outcome, tokio_postgres::Error> {
    let partition = fence.partition as i32;
    let inserted = tx
        .query_opt(
            "INSERT INTO adjustments (adjustment_id, sku, partition, delta, status, epoch)
             VALUES ($1, $2, $3, $4, 'applied', $5)
             ON CONFLICT (adjustment_id) DO NOTHING RETURNING 1",
            &[&adjustment_id, &sku, &partition, &delta, &fence.epoch],
        )
        .await?;
    if inserted.is_none() {
        let row = tx
            .query_opt(
                "SELECT sku, delta, status, on_hand_after, available_after, partition, epoch
                   FROM adjustments WHERE adjustment_id = $1",
                &[&adjustment_id],
            )
            .await?;
        let Some(row) = row else {
            return Ok(Outcome::NotFound {
                detail: format!("sku {sku} is not stocked"),
            });
        };
        let stored_sku: String = row.get(0);
        let stored_delta: i64 = row.get(1);
        if stored_sku != sku || stored_delta != delta {
            return Ok(Outcome::Mismatch {
                detail: format!(
                    "adjustment {adjustment_id} already exists for sku {stored_sku} delta {stored_delta}"
                ),
            });
        }
        let status: String = row.get(2);
        let available: Option<i64> = row.get(4);
        if status == "refused" {
            return Ok(Outcome::ShrinkRefused {
                available: available.unwrap_or(0),
                replayed: true,
            });
        }
        return Ok(Outcome::Adjusted {
            adjustment: Adjustment {
                adjustment_id: adjustment_id.to_owned(),
                sku: stored_sku,
                delta,
                on_hand: row.get::<_, Option<i64>>(3).unwrap_or(0),
                available: available.unwrap_or(0),
                partition: row.get::<_, i32>(5) as u32,
                epoch: row.get(6),
            },
            replayed: true,
        });
    }

    let after = if delta > 0 {
        tx.query_opt(
            "INSERT INTO inventory (sku, partition, on_hand, available, highest_epoch)
             VALUES ($1, $2, $3, $3, $4)
             ON CONFLICT (sku) DO UPDATE
                SET on_hand = inventory.on_hand + EXCLUDED.on_hand,
                    available = inventory.available + EXCLUDED.available,
                    highest_epoch = EXCLUDED.highest_epoch
          RETURNING on_hand, available",
            &[&sku, &partition, &delta, &fence.epoch],
        )
        .await?
    } else {
        tx.query_opt(
            "UPDATE inventory
                SET on_hand = on_hand + $2::bigint, available = available + $2::bigint, highest_epoch = $3
              WHERE sku = $1 AND partition = $4 AND available >= -($2::bigint)
          RETURNING on_hand, available",
            &[&sku, &delta, &fence.epoch, &partition],
        )
        .await?
    };
    let Some(after) = after else {
        let current = tx
            .query_opt(
                "SELECT on_hand, available FROM inventory WHERE sku = $1",
                &[&sku],
            )
            .await?;
        return match current {
            None => {
                tx.execute(
                    "DELETE FROM adjustments WHERE adjustment_id = $1",
                    &[&adjustment_id],
                )
                .await?;
                Ok(Outcome::NotFound {
                    detail: format!("sku {sku} is not stocked; restock it first"),
                })
            }
            Some(row) => {
                let on_hand: i64 = row.get(0);
                let available: i64 = row.get(1);
                tx.execute(
                    "UPDATE adjustments SET status = 'refused', on_hand_after = $2,
                            available_after = $3
                      WHERE adjustment_id = $1",
                    &[&adjustment_id, &on_hand, &available],
                )
                .await?;
                Ok(Outcome::ShrinkRefused {
                    available,
                    replayed: false,
                })
            }
        };
    };
    let on_hand: i64 = after.get(0);
    let available: i64 = after.get(1);
    tx.execute(
        "UPDATE adjustments SET on_hand_after = $2, available_after = $3 WHERE adjustment_id = $1",
        &[&adjustment_id, &on_hand, &available],
    )
    .await?;
    let kind = if delta > 0 { "restock" } else { "shrink" };
    insert_ledger(
        tx,
        fence,
        sku,
        kind,
        None,
        Some(adjustment_id),
        [delta, delta, 0, 0],
    )
    .await?;
    Ok(Outcome::Adjusted {
        adjustment: Adjustment {
            adjustment_id: adjustment_id.to_owned(),
            sku: sku.to_owned(),
            delta,
            on_hand,
            available,
            partition: fence.partition,
            epoch: fence.epoch,
        },
        replayed: false,
    })
}
