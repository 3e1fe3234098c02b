//! The steps of a move on the shards (DESIGN.md §12): each a single statement or transaction,
//! conditional on the mover's holder id where the lease row is the mover's, so a stale attempt
//! that wakes up late changes nothing a newer one wrote.

use schema::partition::lease_name;
use schema::shard::ShardName;
use tokio_postgres::{Client, IsolationLevel};

use super::ledger;
use super::record::holder_pattern;
use super::rows::copy_rows;
use super::MOVE_LEASE;
use crate::lease::store::HANDOFF_CHANNEL;
use crate::lease::take::{take_lease, LeaseTake, When};

pub(super) async fn has_lease_row(client: &Client, partition: u32) -> anyhow::Result<bool> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM leases WHERE name = $1",
            &[&lease_name(partition)],
        )
        .await?
        .is_some())
}

/// Step 1: the mover's lease on the source, over any live owner; its epoch. The lease takers'
/// statement ([`take_lease`], `When::Always`): its `FOR UPDATE` waits for the batches still
/// holding the row `FOR KEY SHARE` under the owner's epoch.
pub(super) async fn fence(source: &Client, partition: u32, holder: &str) -> anyhow::Result<i64> {
    let taken = take_lease(
        source,
        LeaseTake {
            name: &lease_name(partition),
            holder,
            url: None,
            ttl: MOVE_LEASE,
            when: When::Always,
            new_revision: true,
        },
    )
    .await?;
    let taken = taken.ok_or_else(|| {
        anyhow::anyhow!("the source has no lease row of partition {partition} to fence")
    })?;
    Ok(taken.epoch)
}

/// Step 2: the partition's rows from one snapshot of the source into one transaction on the
/// target, and the target's lease row held by the mover and marked incoming (`moving_in`, so
/// no allocator of the target campaigns for it before the release); what the ledger copy did
/// and the target lease's epoch.
pub(super) async fn copy(
    source: &mut Client,
    target: &mut Client,
    partition: u32,
    holder: &str,
    source_epoch: i64,
    source_name: &ShardName,
) -> anyhow::Result<(ledger::Copied, i64)> {
    let p = partition as i32;
    let snapshot = source
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    ledger::pin_archives(&snapshot).await?;
    let tx = target.transaction().await?;
    // What an earlier tenure of the partition on this shard left is replaced, except the
    // append-only ledger, which is continued.
    for table in ["reservations", "adjustments", "inventory", "id_claims"] {
        tx.execute(&format!("DELETE FROM {table} WHERE partition = $1"), &[&p])
            .await?;
        let select = format!("SELECT * FROM {table} WHERE partition = {p}");
        copy_rows(&snapshot, &tx, &select, table).await?;
    }
    let (last, published): (i64, i64) = {
        let row = snapshot
            .query_one(
                "SELECT coalesce((SELECT last_position FROM ledger_positions WHERE partition = $1), 0),
                        coalesce((SELECT published FROM event_relay_progress
                                   WHERE stream = 'partition/' || $1::int), 0)",
                &[&p],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    let copied = ledger::copy(&snapshot, &tx, partition, last).await?;
    // Every position after the target's highest live one, appended or folded: its settlement
    // skips them (the folded ones are not live there anyway). When the target archived all it
    // held, an earlier move in may have started at the same position: the range is widened.
    if last > copied.have {
        tx.execute(
            "INSERT INTO partition_moves_in AS m
                    (partition, from_position, through_position, source_shard)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (partition, from_position) DO UPDATE
                SET through_position = greatest(m.through_position, EXCLUDED.through_position),
                    source_shard = EXCLUDED.source_shard, moved_at = now()",
            &[&p, &(copied.have + 1), &last, &source_name.as_str()],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO ledger_positions (partition, last_position) VALUES ($1, $2)
         ON CONFLICT (partition) DO UPDATE SET last_position = greatest(ledger_positions.last_position, EXCLUDED.last_position)",
        &[&p, &last],
    )
    .await?;
    tx.execute(
        "INSERT INTO event_relay_progress (stream, published) VALUES ('partition/' || $1::int, $2)
         ON CONFLICT (stream) DO NOTHING",
        &[&p, &published],
    )
    .await?;
    let target_epoch: i64 = tx
        .query_one(
            "INSERT INTO leases AS l (name, partition, holder_id, epoch, revision, acquired_at,
                                  renewed_at, expires_at, moving_in)
         VALUES ($1, $2, $3, $4::bigint + 1, nextval('assignment_revision'), now(), now(),
                 now() + $5::bigint * interval '1 millisecond', true)
         ON CONFLICT (name) DO UPDATE
            SET holder_id = EXCLUDED.holder_id, holder_url = NULL, moving_in = true,
                epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
                revision = EXCLUDED.revision, acquired_at = now(), renewed_at = now(),
                expires_at = EXCLUDED.expires_at, transitions = l.transitions + 1
         RETURNING epoch",
            &[
                &lease_name(partition),
                &p,
                &holder,
                &source_epoch,
                &(MOVE_LEASE.as_millis() as i64),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    snapshot.commit().await?;
    Ok((copied, target_epoch))
}

/// Step 3: the source's lease row deleted, while the mover still holds it.
pub(super) async fn retire(source: &Client, partition: u32, holder: &str) -> anyhow::Result<()> {
    let deleted = source
        .execute(
            "DELETE FROM leases WHERE name = $1 AND holder_id = $2",
            &[&lease_name(partition), &holder],
        )
        .await?;
    anyhow::ensure!(
        deleted == 1,
        "the source's lease of partition {partition} was taken from the move"
    );
    Ok(())
}

/// Step 5: the target's lease released, no longer incoming, and announced, when the mover still
/// holds it.
pub(super) async fn release(target: &Client, partition: u32, holder: &str) -> anyhow::Result<()> {
    target
        .query(
            "WITH released AS (
                 UPDATE leases SET holder_id = NULL, expires_at = now(), moving_in = false,
                        transitions = transitions + 1
                  WHERE name = $1 AND holder_id = $2 RETURNING partition)
             SELECT pg_notify($3, partition::text) FROM released",
            &[&lease_name(partition), &holder, &HANDOFF_CHANNEL],
        )
        .await?;
    Ok(())
}

/// Whether the target holds an incoming lease row of the partition.
pub(super) async fn has_incoming_row(target: &Client, partition: u32) -> anyhow::Result<bool> {
    Ok(target
        .query_opt(
            "SELECT 1 FROM leases WHERE name = $1 AND moving_in",
            &[&lease_name(partition)],
        )
        .await?
        .is_some())
}

/// On a re-run after the retire: the target's incoming lease row taken by this attempt's holder
/// at a new epoch, from any earlier mover of the partition ([`take_lease`], `When::Incoming`);
/// the epoch.
pub(super) async fn take_over_target(
    target: &Client,
    partition: u32,
    holder: &str,
) -> anyhow::Result<i64> {
    let taken = take_lease(
        target,
        LeaseTake {
            name: &lease_name(partition),
            holder,
            url: None,
            ttl: MOVE_LEASE,
            when: When::Incoming {
                held_by: &holder_pattern(partition),
            },
            new_revision: true,
        },
    )
    .await?;
    taken.map(|t| t.epoch).ok_or_else(|| {
        anyhow::anyhow!(
            "partition {partition} has no lease row on its source and no incoming one held by \
             a mover on its target: abort the move and check both shards' records"
        )
    })
}

/// Abort, on the target: the incoming lease row deleted, so the target's record never names the
/// partition; the copied rows stay behind, as a source's do after a move out, with nothing to
/// serve them. Returns the deleted row's epoch.
pub(super) async fn drop_incoming(target: &Client, partition: u32) -> anyhow::Result<Option<i64>> {
    Ok(target
        .query_opt(
            "DELETE FROM leases WHERE name = $1 AND moving_in RETURNING epoch",
            &[&lease_name(partition)],
        )
        .await?
        .map(|r| r.get(0)))
}

/// Abort, on the source: its lease row given back free, at an epoch not below `epoch` (so the
/// next owner's is above every epoch the move wrote), restored first when the move had retired
/// it, and announced so the source's allocators campaign at once. A row that no mover of the
/// partition holds (a live owner: the move never fenced it) is left alone.
pub(super) async fn give_back_source(
    source: &Client,
    partition: u32,
    epoch: i64,
) -> anyhow::Result<()> {
    source
        .query(
            "WITH restored AS (
                 INSERT INTO leases (name, partition, epoch, revision, expires_at)
                 VALUES ($1, $2, $3, nextval('assignment_revision'), now())
                 ON CONFLICT (name) DO UPDATE
                    SET holder_id = NULL, holder_url = NULL, expires_at = now(),
                        epoch = greatest(leases.epoch, EXCLUDED.epoch),
                        revision = EXCLUDED.revision, transitions = leases.transitions + 1
                  WHERE leases.holder_id ~ $4
                 RETURNING partition)
             SELECT pg_notify($5, partition::text) FROM restored",
            &[
                &lease_name(partition),
                &(partition as i32),
                &epoch,
                &holder_pattern(partition),
                &HANDOFF_CHANNEL,
            ],
        )
        .await?;
    Ok(())
}
