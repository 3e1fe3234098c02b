//! The ledger's part of a move (DESIGN.md §12), for shards that archive their ledgers (§8a):
//! the partition's history travels whole, part of it as rows and part as archived totals.
//!
//! A shard's ledger is its live rows plus, per SKU, the totals of the rows it archived
//! (`ledger_archived_totals`, V17); for every SKU, totals plus live rows equal its inventory row.
//! A move keeps that true on the target:
//! - **Rows.** The source's live rows the target lacks (`position > have`, `have` the target's
//!   highest live position of the partition) are appended, except those recorded before the
//!   start of the target's oldest live time partition: the target has archived (dropped) that
//!   time, so it has nowhere to put them; they are *folded* into its archived totals instead.
//!   An archive that has counted the oldest partition keeps rows out of it until it has
//!   dropped it (V25), so none is dropped unrecorded.
//! - **Totals.** For every SKU of the partition (its inventory rows on the source), the target's
//!   archived totals become the source's whole history of the SKU (its archived totals plus its
//!   live rows) less the target's live rows after the copy, in all four delta columns and the
//!   row count. A target's archived totals of a moved-in SKU are thus the history it does not
//!   hold live: what it archived itself, what the source had archived, and the folded rows. A
//!   SKU whose computed totals are all zero has no totals row.
//!
//! The folded rows are still within `have + 1 ..= last`, the range recorded in
//! `partition_moves_in`: they were not written on the target, so its settlement must never count
//! them (it cannot: they are not live there; the source settles its own copy).
//!
//! [`check`] runs before the fence and refuses what a copy could not make right, so that a
//! move never fails after the source is fenced for want of something it could have seen.

use anyhow::{ensure, Context};
use chrono::{DateTime, Utc};
use tokio_postgres::{Client, GenericClient, Transaction};

/// How far past the source's clock the target's last ledger partition must reach: rows the
/// source writes until the fence, stamped with its clock, must have a partition on the target.
const AHEAD_SECS: f64 = 10.0;

/// Makes a repeatable-read `snapshot` of the source agree with its archives: the ledger's
/// ACCESS SHARE lock, taken before the snapshot, lets an archive that is detaching finish first
/// (its drop and its totals are then both seen) or makes it wait until the snapshot is done
/// (neither). A dropped partition is not versioned, so a snapshot taken before such a commit
/// would read the ledger without the partition's rows and the totals without their sums.
pub(super) async fn pin_archives(snapshot: &Transaction<'_>) -> anyhow::Result<()> {
    snapshot
        .batch_execute("LOCK TABLE ledger IN ACCESS SHARE MODE")
        .await
        .context("locking the source's ledger against a concurrent archive")
}

/// Per SKU: rows and the sums of d_on_hand, d_available, d_held, d_confirmed.
type History = Vec<(String, [i64; 5])>;

/// The whole ledger history of the partition's SKUs on `db` (archived totals plus live rows),
/// and its inventory rows, per SKU.
const HISTORY: &str = "
    WITH live AS (
        SELECT sku, count(*) AS rows, sum(d_on_hand) AS on_hand, sum(d_available) AS available,
               sum(d_held) AS held, sum(d_confirmed) AS confirmed
          FROM ledger WHERE partition = $1 GROUP BY sku)
    SELECT i.sku,
           (coalesce(t.rows, 0) + coalesce(l.rows, 0))::bigint,
           (coalesce(t.d_on_hand, 0) + coalesce(l.on_hand, 0))::bigint,
           (coalesce(t.d_available, 0) + coalesce(l.available, 0))::bigint,
           (coalesce(t.d_held, 0) + coalesce(l.held, 0))::bigint,
           (coalesce(t.d_confirmed, 0) + coalesce(l.confirmed, 0))::bigint,
           i.on_hand, i.available, i.held, i.confirmed
      FROM inventory AS i
      LEFT JOIN ledger_archived_totals AS t ON t.sku = i.sku
      LEFT JOIN live AS l ON l.sku = i.sku
     WHERE i.partition = $1
     ORDER BY i.sku";

/// The partition's SKUs' whole history on `db`; with `balanced`, refused unless every SKU's
/// history equals its inventory row.
async fn history(
    db: &impl GenericClient,
    partition: i32,
    balanced: bool,
) -> anyhow::Result<History> {
    let mut out = Vec::new();
    for r in db.query(HISTORY, &[&partition]).await? {
        let sku: String = r.get(0);
        let sums: [i64; 5] = [r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)];
        let row: [i64; 4] = [r.get(6), r.get(7), r.get(8), r.get(9)];
        ensure!(
            !balanced || sums[1..] == row,
            "SKU {sku} of partition {partition}: its archived totals plus live ledger sum to \
             {:?} (on_hand, available, held, confirmed), its inventory row is {row:?}; a move \
             cannot carry a history that does not balance",
            &sums[1..]
        );
        out.push((sku, sums));
    }
    Ok(out)
}

/// The partition's highest live ledger position on `db`, 0 for none.
async fn live_top(db: &impl GenericClient, partition: i32) -> anyhow::Result<i64> {
    Ok(db
        .query_one(
            "SELECT coalesce(max(position), 0) FROM ledger WHERE partition = $1",
            &[&partition],
        )
        .await?
        .get(0))
}

/// Before the fence: refuses a move whose copy could not be made right. The source's history of
/// the partition must balance its inventory rows (a move carries it, it cannot repair it); the
/// target must hold no live position of the partition beyond the source's last; and the
/// target's ledger partitions must reach [`AHEAD_SECS`] past the source's clock (created now if
/// they do not), so that every row written before the fence has a partition to go to.
pub(super) async fn check(
    source: &mut Client,
    target: &Client,
    partition: u32,
) -> anyhow::Result<()> {
    let p = partition as i32;
    {
        // One snapshot, so inventory and ledger agree.
        let snapshot = source
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        pin_archives(&snapshot).await?;
        history(&snapshot, p, true)
            .await
            .context("checking the source before the move")?;
        snapshot.commit().await?;
    }
    let (last, source_now): (i64, f64) = {
        let row = source
            .query_one(
                "SELECT coalesce((SELECT last_position FROM ledger_positions
                                   WHERE partition = $1), 0),
                        extract(epoch FROM now())::float8",
                &[&p],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    let top = live_top(target, p).await?;
    ensure!(
        top <= last,
        "the target holds ledger position {top} of partition {partition}, past the source's \
         last ({last}): the shards' histories of it differ"
    );
    // Another caller may be creating partitions at the same moment (it returns 0 then).
    for attempt in 0.. {
        target
            .execute("SELECT ledger_ensure_partitions()", &[])
            .await?;
        let end: f64 = target
            .query_one(
                "SELECT coalesce(extract(epoch FROM max(range_end)), 0)::float8
                   FROM ledger_partitions",
                &[],
            )
            .await?
            .get(0);
        if end >= source_now + AHEAD_SECS {
            break;
        }
        ensure!(
            attempt < 10,
            "the target's ledger partitions end {:.1} s past the source's clock, fewer than \
             {AHEAD_SECS} s: its clock is behind, or it cannot create partitions",
            end - source_now
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

/// What [`copy`] did.
pub(super) struct Copied {
    /// The target's highest live position before the copy.
    pub have: i64,
    /// Rows appended.
    pub appended: u64,
    /// Rows older than the target's oldest live time partition, carried in its archived totals.
    pub folded: u64,
}

/// In the copy's transactions: appends the source's rows the target can hold and lacks, then
/// sets the target's archived totals of the partition's SKUs (module docs). `last` is the
/// source's last position of the partition, in `snapshot`.
pub(super) async fn copy(
    snapshot: &Transaction<'_>,
    tx: &Transaction<'_>,
    partition: u32,
    last: i64,
) -> anyhow::Result<Copied> {
    let p = partition as i32;
    // Archiving counts and sums a time partition, then detaches and drops it under the
    // ledger's ACCESS EXCLUSIVE lock; it takes the partition's SHARE lock before counting
    // (V25), so no row can be put into it between its count and its drop. Held from here to
    // commit, this lock keeps the oldest live partition read below from going (inserts by the
    // target's own allocators are not blocked).
    tx.batch_execute("LOCK TABLE ledger IN ROW EXCLUSIVE MODE")
        .await?;
    let have = live_top(tx, p).await?;
    // The first partition has no lower bound (NULL): nothing is folded then.
    let floor: Option<DateTime<Utc>> = tx
        .query_opt(
            "SELECT range_start FROM ledger_partitions ORDER BY range_end LIMIT 1",
            &[],
        )
        .await?
        .and_then(|r| r.get(0));
    let after = floor.map_or_else(String::new, |f| {
        format!(" AND recorded_at >= '{}'::timestamptz", f.to_rfc3339())
    });
    const LEDGER_COLUMNS: &str = "sku, partition, kind, reservation_id, adjustment_id, d_on_hand, \
         d_available, d_held, d_confirmed, epoch, recorded_at, written_at, position";
    let select = format!(
        "SELECT {LEDGER_COLUMNS} FROM ledger WHERE partition = {p} AND position > {have}{after} \
         ORDER BY position"
    );
    let appended =
        super::rows::copy_rows(snapshot, tx, &select, &format!("ledger ({LEDGER_COLUMNS})"))
            .await?;
    let history = history(snapshot, p, false).await?;
    let (skus, sums): (Vec<String>, Vec<[i64; 5]>) = history.into_iter().unzip();
    let column = |k: usize| sums.iter().map(|s| s[k]).collect::<Vec<i64>>();
    tx.execute(
        "WITH whole (sku, rows, on_hand, available, held, confirmed) AS (
             SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
                                  $6::bigint[], $7::bigint[])),
         live AS (
             SELECT sku, count(*) AS rows, sum(d_on_hand) AS on_hand,
                    sum(d_available) AS available, sum(d_held) AS held,
                    sum(d_confirmed) AS confirmed
               FROM ledger WHERE partition = $1 AND sku = ANY ($2) GROUP BY sku),
         archived AS (
             SELECT w.sku, (w.rows - coalesce(l.rows, 0))::bigint AS rows,
                    (w.on_hand - coalesce(l.on_hand, 0))::bigint AS on_hand,
                    (w.available - coalesce(l.available, 0))::bigint AS available,
                    (w.held - coalesce(l.held, 0))::bigint AS held,
                    (w.confirmed - coalesce(l.confirmed, 0))::bigint AS confirmed
               FROM whole AS w LEFT JOIN live AS l USING (sku)),
         emptied AS (
             DELETE FROM ledger_archived_totals AS t USING archived AS a
              WHERE t.sku = a.sku AND a.rows = 0 AND a.on_hand = 0 AND a.available = 0
                AND a.held = 0 AND a.confirmed = 0)
         INSERT INTO ledger_archived_totals AS t
                (sku, rows, d_on_hand, d_available, d_held, d_confirmed)
         SELECT sku, rows, on_hand, available, held, confirmed FROM archived
          WHERE NOT (rows = 0 AND on_hand = 0 AND available = 0 AND held = 0 AND confirmed = 0)
         ON CONFLICT (sku) DO UPDATE
            SET rows = EXCLUDED.rows, d_on_hand = EXCLUDED.d_on_hand,
                d_available = EXCLUDED.d_available, d_held = EXCLUDED.d_held,
                d_confirmed = EXCLUDED.d_confirmed",
        &[
            &p,
            &skus,
            &column(0),
            &column(1),
            &column(2),
            &column(3),
            &column(4),
        ],
    )
    .await?;
    let lacked = u64::try_from(last - have).unwrap_or(0);
    Ok(Copied {
        have,
        appended,
        folded: lacked.saturating_sub(appended),
    })
}
