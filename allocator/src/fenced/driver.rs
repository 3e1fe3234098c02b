//! The transaction driver: running a group of partition batches as one statement — the
//! set-based reserve statement ([`fast`]) when the group is only plain reserves and it can decide
//! them all, `apply_fenced_batch` otherwise — encoding the group as the arrays the function takes
//! and decoding its one-row-per-command answer back into [`Outcome`]s. Either way one statement
//! commits, so the group's answers are those of one transaction.

use deadpool_postgres::ClientWrapper;
use tokio_postgres::Row;

use super::adjustments::adjustment_from_answer;
use super::answer::AnswerRow;
use super::command::{Command, Outcome};
use super::fast;
use super::fence::{malformed, Fence, FencedError, PartitionBatch};
use super::reservations::{reservation_from_answer, status_from_stored};
use crate::error::SQLSTATE_CONCURRENT_ID;
use crate::metrics as m;

const APPLY: &str = "SELECT o_ord, o_result, o_replayed, o_status, o_sku, o_quantity, o_expires,
                            o_epoch, o_partition, o_available, o_on_hand, o_detail
                       FROM apply_fenced_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                                               $12, $13, $14)";

/// The same statement against the unfenced copy (negative control only, see
/// [`crate::negative_control`]).
const APPLY_UNFENCED: &str = "SELECT o_ord, o_result, o_replayed, o_status, o_sku, o_quantity,
                            o_expires, o_epoch, o_partition, o_available, o_on_hand, o_detail
                       FROM apply_fenced_batch_unfenced($1, $2, $3, $4, $5, $6, $7, $8, $9,
                                                   $10, $11, $12, $13, $14)";

/// How often a batch is re-run when a new id it wanted to insert was inserted concurrently by
/// another partition's owner (the id then replays, so a second attempt settles it).
const CONCURRENT_ID_ATTEMPTS: usize = 3;

/// Run `commands` for `fence.token.partition` as one fenced statement; one outcome per command,
/// in order. Either all effects commit under a still-valid epoch or none does.
pub async fn fenced_transaction(
    client: &ClientWrapper,
    fence: &Fence,
    commands: &[Command],
) -> Result<Vec<Outcome>, FencedError> {
    let mut results = apply_group(client, &[PartitionBatch { fence, commands }]).await?;
    results.pop().expect("one result per partition batch")
}

/// Run several partitions' batches in one statement (group commit). The outer error means the
/// statement failed as a whole and nothing was written; otherwise each partition gets its
/// outcomes, or [`FencedError::StaleEpoch`] when its fence failed (nothing of it was written,
/// the others committed).
pub async fn apply_group(
    client: &ClientWrapper,
    group: &[PartitionBatch<'_>],
) -> Result<Vec<Result<Vec<Outcome>, FencedError>>, FencedError> {
    if group.is_empty() {
        return Ok(Vec::new());
    }
    debug_assert!(group
        .iter()
        .all(|b| b.fence.replica_id == group[0].fence.replica_id));
    // The negative control disables the fence in the function only, so it never takes the
    // set-based statement.
    if !crate::negative_control::enabled() && fast::eligible(group) {
        if let Some(results) = fast::reserve_group(client, group).await? {
            metrics::counter!(m::BATCH_STATEMENTS, "path" => "set").increment(1);
            return Ok(results);
        }
        metrics::counter!(m::BATCH_STATEMENTS, "path" => "fallback").increment(1);
    }
    apply_function(client, group).await
}

/// Run a group through `apply_fenced_batch` alone, whatever it holds: what [`apply_group`] does
/// when the set-based statement does not apply, and the reference it is tested against.
pub async fn apply_function(
    client: &ClientWrapper,
    group: &[PartitionBatch<'_>],
) -> Result<Vec<Result<Vec<Outcome>, FencedError>>, FencedError> {
    let Some(first) = group.first() else {
        return Ok(Vec::new());
    };
    let replica_id = first.fence.replica_id.as_str();
    metrics::counter!(m::BATCH_STATEMENTS, "path" => "function").increment(1);
    let arrays = Arrays::encode(group);
    let sql = if crate::negative_control::enabled() {
        APPLY_UNFENCED
    } else {
        APPLY
    };
    let statement = client.prepare_cached(sql).await?;
    let mut attempt = 1;
    let rows = loop {
        let result = client
            .query(
                &statement,
                &[
                    &replica_id,
                    &arrays.fence_partitions,
                    &arrays.fence_epochs,
                    &arrays.partition,
                    &arrays.op,
                    &arrays.id,
                    &arrays.sku,
                    &arrays.amount,
                    &arrays.ttl,
                    &arrays.owner,
                    &arrays.any_owner,
                    &arrays.quota,
                    &arrays.units,
                    &arrays.elsewhere,
                ],
            )
            .await;
        match result {
            Err(e) if is_concurrent_id(&e) && attempt < CONCURRENT_ID_ATTEMPTS => attempt += 1,
            other => break other?,
        }
    };
    decode(group, &rows)
}

fn is_concurrent_id(error: &tokio_postgres::Error) -> bool {
    error
        .code()
        .is_some_and(|c| c.code() == SQLSTATE_CONCURRENT_ID)
}

/// The batch as parallel arrays, commands in group order (partition by partition).
#[derive(Debug, Default)]
struct Arrays<'a> {
    fence_partitions: Vec<i32>,
    fence_epochs: Vec<i64>,
    partition: Vec<i32>,
    op: Vec<&'static str>,
    id: Vec<Option<&'a str>>,
    sku: Vec<Option<&'a str>>,
    amount: Vec<i64>,
    ttl: Vec<i32>,
    /// The client a command is for (recorded on a new reservation or adjustment), and whether it
    /// may act on every client's reservations (`admin`, or authentication off).
    owner: Vec<Option<&'a str>>,
    any_owner: Vec<bool>,
    /// The client's `max_held_per_sku` and `max_held_units`, for reserves of clients that have
    /// them.
    quota: Vec<Option<i64>>,
    units: Vec<Option<i64>>,
    /// What the client of a reserve with `max_held_units` holds on the cluster's other shards
    /// (`V27__id_directory.sql`); `None` on one database.
    elsewhere: Vec<Option<i64>>,
}

impl<'a> Arrays<'a> {
    fn encode(group: &[PartitionBatch<'a>]) -> Self {
        let total = group.iter().map(|b| b.commands.len()).sum();
        let mut a = Arrays {
            partition: Vec::with_capacity(total),
            op: Vec::with_capacity(total),
            id: Vec::with_capacity(total),
            sku: Vec::with_capacity(total),
            amount: Vec::with_capacity(total),
            ttl: Vec::with_capacity(total),
            owner: Vec::with_capacity(total),
            any_owner: Vec::with_capacity(total),
            quota: Vec::with_capacity(total),
            units: Vec::with_capacity(total),
            elsewhere: Vec::with_capacity(total),
            ..Default::default()
        };
        for batch in group {
            let partition = batch.fence.token.partition as i32;
            a.fence_partitions.push(partition);
            a.fence_epochs.push(batch.fence.token.epoch);
            for command in batch.commands {
                let (id, sku, amount, ttl) = command.statement_row();
                a.partition.push(partition);
                a.op.push(command.op());
                a.id.push(id);
                a.sku.push(sku);
                a.amount.push(amount);
                a.ttl.push(ttl);
                let owner = command.owner();
                a.owner.push(owner.client.as_deref());
                a.any_owner.push(owner.any);
                let (quota, units) = match command {
                    Command::Reserve { .. } => {
                        (owner.held_per_sku_quota(), owner.held_units_quota())
                    }
                    _ => (None, None),
                };
                a.quota.push(quota);
                a.elsewhere.push(
                    units
                        .filter(|_| owner.held_elsewhere > 0)
                        .map(|_| owner.held_elsewhere),
                );
                a.units.push(units);
            }
        }
        a
    }
}

/// Split the answer rows back per partition, in command order.
fn decode(
    group: &[PartitionBatch<'_>],
    rows: &[Row],
) -> Result<Vec<Result<Vec<Outcome>, FencedError>>, FencedError> {
    let mut rows = rows.iter().map(AnswerRow);
    let mut results = Vec::with_capacity(group.len());
    for batch in group {
        let mut outcomes = Vec::with_capacity(batch.commands.len());
        let mut stale = None;
        for command in batch.commands {
            let row = rows
                .next()
                .ok_or_else(|| malformed("fewer rows than commands"))?;
            let result = row.result();
            if result == "stale" {
                stale = Some(row.epoch());
                continue;
            }
            outcomes.push(outcome(command, &result, &row)?);
        }
        results.push(match stale {
            Some(current) => Err(FencedError::stale(batch.fence.token, current)),
            None => Ok(outcomes),
        });
    }
    Ok(results)
}

fn outcome(command: &Command, result: &str, row: &AnswerRow<'_>) -> Result<Outcome, FencedError> {
    let replayed = row.replayed();
    Ok(match result {
        "created" | "replayed" | "transitioned" => Outcome::Reservation {
            reservation: reservation_from_answer(command, row)?,
            created: result == "created",
            replayed,
        },
        "insufficient" => Outcome::InsufficientStock {
            available: row.available(),
            replayed,
        },
        "mismatch" => Outcome::Mismatch {
            detail: row.detail(),
        },
        "not_found" => Outcome::NotFound {
            detail: row.detail(),
        },
        "quota" | "quota_units" => Outcome::HoldQuotaExceeded {
            quota: if result == "quota" {
                access::Quota::MaxHeldPerSku
            } else {
                access::Quota::MaxHeldUnits
            },
            limit: row.quantity().unwrap_or(0),
            held: row.available(),
            detail: row.detail(),
        },
        "invalid_state" => Outcome::InvalidState {
            current: status_from_stored(&row.status()).map_err(|e| malformed(e.to_string()))?,
        },
        "adjusted" => Outcome::Adjusted {
            adjustment: adjustment_from_answer(command, row)?,
            replayed,
        },
        "shrink_refused" => Outcome::ShrinkRefused {
            available: row.available(),
            replayed,
        },
        "expired" => Outcome::Expired {
            count: row.quantity().unwrap_or(0) as u64,
        },
        other => return Err(malformed(format!("unknown result {other:?}"))),
    })
}
