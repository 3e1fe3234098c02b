//! The set-based reserve statement: the common case of a group without the procedural function.
//!
//! Most groups are plain reserves: new ids, on stocked SKUs with stock for all of them, now and
//! then with a partition's expiry sweep that finds nothing due. For those the arrival-order
//! decision is trivial (every reserve is granted, every sweep expires nothing), so the group can
//! be written
//! by one prepared statement, a chain of data-modifying CTEs, instead of `apply_fenced_batch`,
//! whose per-call cost (expressions initialised anew in every transaction, one executor start
//! per inner statement) and per-command bookkeeping dominate small batches. The database still
//! does the checking: the statement fences every partition (the lease row `FOR KEY SHARE`, holder,
//! epoch, expiry, exactly as the function does, so the lock modes of DESIGN.md §5 are unchanged),
//! and the inventory `CHECK`s, the row epoch trigger and the unique reservation id apply as to any
//! writer.
//!
//! All or nothing, optimistically: the statement grants every reserve of the live partitions
//! (each SKU's row is updated only where it is in the partition and has stock for the sum of the
//! group's reserves of it) and inserts every reservation and ledger row, then checks that
//! nothing was left out: every SKU's row updated, no sweeping partition with an overdue hold. If
//! anything was, it aborts itself (`FA006`, `fenced_batch_abort` in `V9__set_based_reserves.sql`);
//! an id that exists already (a replay, a reuse) fails it on the unique index. Either way the
//! whole statement rolls back, nothing is written, and the caller runs the same group through
//! `apply_fenced_batch`, which decides every case (replays, mismatches, refusals, unknown SKUs) in
//! arrival order. Those cases are rare, so the common one pays for no lookups before it writes.
//! A partition whose fence fails is answered stale, as by the function, and writes nothing.
//!
//! Each new reservation records its client (`owner`, `V18__owners.sql`). Whose an existing id is
//! never matters here: the statement only inserts, so an existing id (the owner's replay, or
//! another client's id, answered as unknown) always goes to the function, which checks the owner
//! where it reads the row.
//!
//! Ledger rows are numbered as the function numbers them (`V12__ledger_positions.sql`): the
//! partition's counter in `ledger_positions` is raised by the group's row count in the same
//! statement, and the rows take the positions after the old value in command order.

use std::collections::HashMap;

use deadpool_postgres::ClientWrapper;
use tokio_postgres::error::SqlState;

use super::command::{Command, Outcome};
use super::fence::PartitionBatch;
use super::fence::{malformed, FencedError};
use crate::error::SQLSTATE_FAST_PATH_ABORTED;
use schema::wire::{Reservation, ReservationStatus};

const RESERVE: &str = "
WITH fence AS MATERIALIZED (
    SELECT l.partition, l.epoch
      FROM leases AS l
     WHERE l.partition = ANY ($2::integer[])
       AND l.epoch = ($3::bigint[])[array_position($2::integer[], l.partition)]
       AND l.holder_id = $1 AND l.expires_at > now()
       FOR KEY SHARE),
every AS MATERIALIZED (
    SELECT c.ord::integer AS ord, c.part, c.id, c.sku, c.qty, c.ttl, c.owner
      FROM unnest($4::integer[], $5::text[], $6::text[], $7::bigint[], $8::integer[],
                  $9::text[])
           WITH ORDINALITY AS c(part, id, sku, qty, ttl, owner, ord)),
cmd AS MATERIALIZED (
    SELECT c.*, f.epoch FROM every AS c JOIN fence AS f ON f.partition = c.part),
want AS MATERIALIZED (
    SELECT c.sku, c.part, c.epoch, sum(c.qty)::bigint AS total
      FROM cmd AS c
     WHERE c.id IS NOT NULL
     GROUP BY c.sku, c.part, c.epoch),
inv AS (
    UPDATE inventory AS i
       SET available = i.available - w.total, held = i.held + w.total, highest_epoch = w.epoch
      FROM want AS w
     WHERE i.sku = w.sku AND i.partition = w.part AND i.available >= w.total
 RETURNING i.sku),
res AS (
    INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                              ttl_seconds, request_fingerprint, expires_at, owner)
    SELECT c.id, c.sku, c.part, c.qty, 'held', c.epoch, c.ttl,
           c.sku || '/' || c.qty || '/' || c.ttl, now() + c.ttl * interval '1 second', c.owner
      FROM cmd AS c
     WHERE c.id IS NOT NULL
 RETURNING reservation_id, expires_at),
numbered AS (
    UPDATE ledger_positions AS p
       SET last_position = p.last_position + n.n
      FROM (SELECT c.part, count(*) AS n FROM cmd AS c WHERE c.id IS NOT NULL GROUP BY c.part) AS n
     WHERE p.partition = n.part
 RETURNING p.partition, p.last_position - n.n AS base),
led AS (
    INSERT INTO ledger (sku, partition, kind, reservation_id, d_on_hand, d_available, d_held,
                        d_confirmed, epoch, position)
    SELECT c.sku, c.part, 'reserve', c.id, 0, -c.qty, c.qty, 0, c.epoch,
           b.base + row_number() OVER (PARTITION BY c.part ORDER BY c.ord)
      FROM cmd AS c
      LEFT JOIN numbered AS b ON b.partition = c.part
     WHERE c.id IS NOT NULL
 RETURNING 1),
verdict AS (
    SELECT (SELECT count(*) FROM inv) = (SELECT count(*) FROM want)
           AND (SELECT count(*) FROM led) = (SELECT count(*) FROM cmd WHERE id IS NOT NULL)
           AND NOT EXISTS (SELECT 1
                             FROM cmd AS c JOIN reservations AS r
                               ON r.partition = c.part AND r.status = 'held'
                              AND r.expires_at <= now()
                            WHERE c.id IS NULL)
           AS whole)
SELECT e.ord,
       CASE WHEN c.ord IS NULL THEN 'stale' ELSE 'created' END,
       r.expires_at,
       coalesce(c.epoch, (SELECT l.epoch FROM leases AS l WHERE l.partition = e.part)),
       CASE WHEN NOT v.whole
            THEN fenced_batch_abort('a reserve it could not grant, or a sweep with work to do')
       END
  FROM every AS e
  LEFT JOIN cmd AS c ON c.ord = e.ord
  LEFT JOIN res AS r ON r.reservation_id = c.id
 CROSS JOIN verdict AS v
 ORDER BY e.ord";

/// Whether every batch of `group` can go to the set-based statement: only reserves and sweeps,
/// each id once in the whole group (a repeated id is decided against its earlier command, which
/// only the function does), each partition once (the function refuses a group naming one twice).
pub fn eligible(group: &[PartitionBatch<'_>]) -> bool {
    let mut partitions = std::collections::HashSet::new();
    group.iter().all(|b| reserves_only(b.commands))
        && group
            .iter()
            .all(|b| partitions.insert(b.fence.token.partition))
        && ids_unique(group)
}

/// Which batches of `group` may be taken out of it and written by the set-based statement on
/// their own: only reserves and sweeps, none of whose ids appears anywhere else in the group.
/// Taking them out changes no decision: they share neither a SKU (a SKU has one partition, a
/// partition one batch per group) nor an id with what stays.
pub fn separable(group: &[PartitionBatch<'_>]) -> Vec<bool> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for batch in group {
        for id in batch.commands.iter().filter_map(Command::reservation_id) {
            *seen.entry(id).or_default() += 1;
        }
    }
    group
        .iter()
        .map(|b| {
            reserves_only(b.commands)
                && b.commands
                    .iter()
                    .filter_map(Command::reservation_id)
                    .all(|id| seen.get(id) == Some(&1))
        })
        .collect()
}

/// Reserves and sweeps only, and no reserve of a client with a hold quota: only the function
/// decides those (against what the client holds, `V19__hold_quota_per_sku.sql`,
/// `V22__hold_quota_units.sql`).
fn reserves_only(commands: &[Command]) -> bool {
    !commands.is_empty()
        && commands.iter().all(|c| match c {
            Command::Reserve { owner, .. } => !owner.has_hold_quota(),
            Command::ExpireDue { .. } => true,
            _ => false,
        })
}

fn ids_unique(group: &[PartitionBatch<'_>]) -> bool {
    let mut seen = std::collections::HashSet::new();
    group
        .iter()
        .flat_map(|b| b.commands.iter().filter_map(Command::reservation_id))
        .all(|id| seen.insert(id))
}

/// Run an [`eligible`] group as the set-based statement. `None`: it could not grant everything
/// and rolled back, so nothing was written; run the group through the function. Otherwise one result per batch, as `apply_group` answers.
pub async fn reserve_group(
    client: &ClientWrapper,
    group: &[PartitionBatch<'_>],
) -> Result<Option<Vec<Result<Vec<Outcome>, FencedError>>>, FencedError> {
    let Some(first) = group.first() else {
        return Ok(Some(Vec::new()));
    };
    let total: usize = group.iter().map(|b| b.commands.len()).sum();
    let mut parts = Vec::with_capacity(total);
    let mut ids = Vec::with_capacity(total);
    let mut skus = Vec::with_capacity(total);
    let mut quantities = Vec::with_capacity(total);
    let mut ttls = Vec::with_capacity(total);
    let mut owners: Vec<Option<&str>> = Vec::with_capacity(total);
    for batch in group {
        for command in batch.commands {
            if !matches!(command, Command::Reserve { .. } | Command::ExpireDue { .. }) {
                return Err(malformed("the set-based statement carries reserves only"));
            }
            let (id, sku, quantity, ttl) = command.statement_row();
            parts.push(batch.fence.token.partition as i32);
            ids.push(id);
            skus.push(sku);
            quantities.push(quantity);
            ttls.push(ttl);
            owners.push(command.owner().client.as_deref());
        }
    }
    let fence_parts: Vec<i32> = group
        .iter()
        .map(|b| b.fence.token.partition as i32)
        .collect();
    let fence_epochs: Vec<i64> = group.iter().map(|b| b.fence.token.epoch).collect();
    let statement = client.prepare_cached(RESERVE).await?;
    let rows = match client
        .query(
            &statement,
            &[
                &first.fence.replica_id,
                &fence_parts,
                &fence_epochs,
                &parts,
                &ids,
                &skus,
                &quantities,
                &ttls,
                &owners,
            ],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if falls_back(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if rows.len() != total {
        return Err(malformed("one row per reserve expected"));
    }
    let mut rows = rows.iter();
    let mut results = Vec::with_capacity(group.len());
    for batch in group {
        let mut outcomes = Vec::with_capacity(batch.commands.len());
        let mut stale = None;
        for command in batch.commands {
            let row = rows.next().ok_or_else(|| malformed("missing row"))?;
            let result: &str = row.get(1);
            let epoch: Option<i64> = row.get(3);
            match result {
                "stale" => stale = Some(epoch),
                "created" if matches!(command, Command::ExpireDue { .. }) => {
                    outcomes.push(Outcome::Expired { count: 0 })
                }
                "created" => outcomes.push(created(command, batch, row.get(2), epoch)?),
                other => return Err(malformed(format!("unknown result {other:?}"))),
            }
        }
        results.push(match stale {
            Some(current) => Err(FencedError::stale(batch.fence.token, current)),
            None => Ok(outcomes),
        });
    }
    Ok(Some(results))
}

/// Errors after which nothing was written and the function decides instead: the statement's own
/// abort, and an id inserted concurrently by another partition's owner.
fn falls_back(error: &tokio_postgres::Error) -> bool {
    error
        .code()
        .is_some_and(|c| *c == SqlState::UNIQUE_VIOLATION || c.code() == SQLSTATE_FAST_PATH_ABORTED)
}

fn created(
    command: &Command,
    batch: &PartitionBatch<'_>,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
    epoch: Option<i64>,
) -> Result<Outcome, FencedError> {
    let Command::Reserve {
        reservation_id,
        sku,
        quantity,
        ..
    } = command
    else {
        return Err(malformed("not a reserve"));
    };
    Ok(Outcome::Reservation {
        reservation: Reservation {
            reservation_id: reservation_id.clone(),
            status: ReservationStatus::Held,
            sku: sku.clone(),
            quantity: *quantity,
            expires_at,
            partition: batch.fence.token.partition,
            epoch: epoch.ok_or_else(|| malformed("a hold without its epoch"))?,
        },
        created: true,
        replayed: false,
    })
}
