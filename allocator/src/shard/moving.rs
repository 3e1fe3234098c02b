//! `allocator shards move`: a fenced move of one partition to another shard (DESIGN.md §12).
//!
//! The steps, each idempotent, so that a move interrupted anywhere is finished by running it
//! again with the same arguments:
//! 1. **Fence the source.** The mover takes the partition's lease on the source under its own
//!    holder id, live owner or not: a new epoch, the row locked `FOR UPDATE` first, which waits
//!    for every batch of the old owner (they hold it `FOR KEY SHARE`) and makes its later ones
//!    stale. The lease runs for [`MOVE_LEASE`], so no allocator campaigns for it meanwhile.
//! 2. **Copy** the partition's rows, from one snapshot of the source, into one transaction on the
//!    target: inventory, reservations and adjustments replace whatever an earlier tenure of the
//!    partition left there; the ledger rows the target lacks are appended (new entry ids, the
//!    same positions) except those older than the target's oldest live time partition, and the
//!    target's archived totals of the partition's SKUs are set so that they and its live rows
//!    make the whole history the source knows (its archived totals and live rows; see
//!    [`ledger`]); the position range after the target's highest live one is recorded in
//!    `partition_moves_in`, so the target's settlement does not count it again (V24); the
//!    ledger position counter, the relay's progress and a lease row held by the mover, at an
//!    epoch above the source's.
//! 3. **Retire the source**: its lease row is deleted, so no owner can ever write the partition
//!    there again (a fenced batch needs its lease row), and the source's record agrees with the
//!    map it is about to get.
//! 4. **Flip the map** in the catalog under a new revision; routers follow it on their next read.
//! 5. **Release** the target's lease and announce it, so the target's allocators campaign at once.
//!
//! Before step 1, [`ledger::check`] refuses a move the copy could not make right (a source
//! whose ledger does not balance its inventory rows, a target ahead of the source's positions
//! or without ledger partitions for the source's clock), so a move does not fail once the
//! source is fenced for a reason it could have seen first.
//!
//! Between 3 and 4 the source's allocators would refuse to start (their record lacks a
//! partition the map still gives them); running the move again finishes it.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use schema::shard::{self, ShardName, ShardTarget};
use tokio_postgres::{Client, IsolationLevel, Transaction};

use crate::lease::store::HANDOFF_CHANNEL;
use schema::partition::lease_name;

mod ledger;

/// How long the mover's lease runs on either shard: far longer than a copy takes, so nobody
/// campaigns for the partition while it moves; an abandoned move is finished by running it again.
pub const MOVE_LEASE: Duration = Duration::from_secs(3600);

/// The mover's holder id for `partition`.
fn mover(partition: u32) -> String {
    format!("move/{partition}")
}

/// What [`move_partition`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub partition: u32,
    pub from: ShardName,
    pub to: ShardName,
    /// Ledger rows appended on the target.
    pub ledger_rows: u64,
    /// Positions the target lacked that it holds in its archived totals instead of as rows:
    /// archived on the source, or older than the target's oldest live time partition.
    pub ledger_rows_folded: u64,
    /// The catalog's map revision after the move.
    pub map_revision: i64,
}

/// Moves `partition` to shard `to`; `shards` are every shard, the catalog first.
pub async fn move_partition(
    shards: &[ShardTarget],
    partition: u32,
    to: &ShardName,
) -> anyhow::Result<Moved> {
    let names = shard::target_names(shards)?;
    let catalog = crate::sessions::connect(&shards[0].url).await?;
    let map = shard::store::read_map(&catalog)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the first --shard holds no shard map"))?;
    map.check_shards(&names)?;
    let from = map
        .shard_index(partition)
        .ok_or_else(|| anyhow::anyhow!("the cluster has no partition {partition}"))?;
    let to_index = names
        .iter()
        .position(|n| n == to)
        .ok_or_else(|| anyhow::anyhow!("{to} is not one of the shards given"))?;
    let holder = mover(partition);
    let mut target = crate::sessions::connect(&shards[to_index].url).await?;
    if from == to_index {
        // Already there: an earlier run may have stopped before releasing the target's lease.
        release(&target, partition, &holder).await?;
        return Ok(Moved {
            partition,
            from: to.clone(),
            to: to.clone(),
            ledger_rows: 0,
            ledger_rows_folded: 0,
            map_revision: map.revision,
        });
    }
    let mut source = crate::sessions::connect(&shards[from].url).await?;
    let (ledger_rows, ledger_rows_folded) = if has_lease_row(&source, partition).await? {
        // What the copy could not make right is refused here, before anything changes.
        ledger::check(&mut source, &target, partition).await?;
        let epoch = fence(&source, partition, &holder).await?;
        let copied = copy(
            &mut source,
            &mut target,
            partition,
            &holder,
            epoch,
            &names[from],
        )
        .await?;
        retire(&source, partition, &holder).await?;
        (copied.appended, copied.folded)
    } else {
        // Retired by an earlier run: the copy must be on the target, held by the mover.
        let held: Option<String> = target
            .query_opt(
                "SELECT holder_id FROM leases WHERE name = $1",
                &[&lease_name(partition)],
            )
            .await?
            .and_then(|r| r.get(0));
        anyhow::ensure!(
            held.as_deref() == Some(holder.as_str()),
            "partition {partition} has no lease row on {} and is not held by a move on {to}",
            names[from]
        );
        (0, 0)
    };
    let map_revision: i64 = catalog
        .query_one(
            "UPDATE shard_map SET shard = $2, revision = nextval('shard_map_revision')
              WHERE partition = $1 RETURNING revision",
            &[&(partition as i32), &to.as_str()],
        )
        .await?
        .get(0);
    release(&target, partition, &holder).await?;
    Ok(Moved {
        partition,
        from: names[from].clone(),
        to: to.clone(),
        ledger_rows,
        ledger_rows_folded,
        map_revision,
    })
}

async fn has_lease_row(client: &Client, partition: u32) -> anyhow::Result<bool> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM leases WHERE name = $1",
            &[&lease_name(partition)],
        )
        .await?
        .is_some())
}

/// Step 1: the mover's lease on the source, over any live owner; its epoch.
async fn fence(source: &Client, partition: u32, holder: &str) -> anyhow::Result<i64> {
    let row = source
        .query_one(
            "WITH target AS (SELECT name FROM leases WHERE name = $1 FOR UPDATE)
             UPDATE leases AS l
                SET holder_id = $2, holder_url = NULL,
                    epoch = CASE WHEN l.holder_id = $2 AND l.expires_at > now()
                                 THEN l.epoch ELSE l.epoch + 1 END,
                    revision = nextval('assignment_revision'),
                    acquired_at = now(), renewed_at = now(),
                    expires_at = now() + $3::bigint * interval '1 millisecond',
                    transitions = l.transitions + 1
               FROM target
              WHERE l.name = target.name
          RETURNING l.epoch",
            &[
                &lease_name(partition),
                &holder,
                &(MOVE_LEASE.as_millis() as i64),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// `COPY` the rows `select` yields on `from` into `into` on `to`, in binary (both shards run the
/// same migrations, so the columns match); how many.
async fn copy_rows(
    from: &Transaction<'_>,
    to: &Transaction<'_>,
    select: &str,
    into: &str,
) -> anyhow::Result<u64> {
    let out = from
        .copy_out(&format!("COPY ({select}) TO STDOUT (FORMAT binary)"))
        .await?;
    let sink = to
        .copy_in(&format!("COPY {into} FROM STDIN (FORMAT binary)"))
        .await?;
    let mut sink = std::pin::pin!(sink);
    let mut out = std::pin::pin!(out);
    while let Some(chunk) = out.next().await {
        sink.feed(chunk?).await?;
    }
    Ok(sink.as_mut().finish().await?)
}

/// Step 2: the partition's rows from one snapshot of the source into one transaction on the
/// target, and the target's lease row held by the mover; the ledger rows appended.
async fn copy(
    source: &mut Client,
    target: &mut Client,
    partition: u32,
    holder: &str,
    source_epoch: i64,
    source_name: &ShardName,
) -> anyhow::Result<ledger::Copied> {
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
    tx.execute(
        "INSERT INTO leases AS l (name, partition, holder_id, epoch, revision, acquired_at,
                                  renewed_at, expires_at)
         VALUES ($1, $2, $3, $4::bigint + 1, nextval('assignment_revision'), now(), now(),
                 now() + $5::bigint * interval '1 millisecond')
         ON CONFLICT (name) DO UPDATE
            SET holder_id = EXCLUDED.holder_id, holder_url = NULL,
                epoch = greatest(l.epoch + 1, EXCLUDED.epoch),
                revision = EXCLUDED.revision, acquired_at = now(), renewed_at = now(),
                expires_at = EXCLUDED.expires_at, transitions = l.transitions + 1",
        &[
            &lease_name(partition),
            &p,
            &holder,
            &source_epoch,
            &(MOVE_LEASE.as_millis() as i64),
        ],
    )
    .await?;
    tx.commit().await?;
    snapshot.commit().await?;
    Ok(copied)
}

/// Step 3: the source's lease row deleted, while the mover still holds it.
async fn retire(source: &Client, partition: u32, holder: &str) -> anyhow::Result<()> {
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

/// Step 5: the target's lease released and announced, when the mover still holds it.
async fn release(target: &Client, partition: u32, holder: &str) -> anyhow::Result<()> {
    target
        .query(
            "WITH released AS (
                 UPDATE leases SET holder_id = NULL, expires_at = now(),
                        transitions = transitions + 1
                  WHERE name = $1 AND holder_id = $2 RETURNING partition)
             SELECT pg_notify($3, partition::text) FROM released",
            &[&lease_name(partition), &holder, &HANDOFF_CHANNEL],
        )
        .await?;
    Ok(())
}
