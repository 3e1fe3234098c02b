//! Checks a move makes before it fences the source (DESIGN.md §12), beside [`super::ledger`]'s:
//! what would make the copy fail or lose something once the source is fenced is refused while
//! nothing has changed yet.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use chrono::{DateTime, Utc};
use tokio_postgres::Client;

/// How many ids one collision query sends.
const ID_CHUNK: usize = 10_000;

/// Refuses a move when a reservation or adjustment id of the partition on the source also names
/// a row of another partition on the target: the copy would hit the target's primary key after
/// the fence (an id names one command, I3).
pub(super) async fn no_id_collisions(
    source: &Client,
    target: &Client,
    partition: u32,
) -> anyhow::Result<()> {
    let p = partition as i32;
    for (table, column) in [
        ("reservations", "reservation_id"),
        ("adjustments", "adjustment_id"),
    ] {
        let ids: Vec<String> = source
            .query(
                &format!("SELECT {column} FROM {table} WHERE partition = $1"),
                &[&p],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for chunk in ids.chunks(ID_CHUNK) {
            let clashes: Vec<(String, i32)> = target
                .query(
                    &format!(
                        "SELECT {column}, partition FROM {table}
                          WHERE {column} = ANY ($1) AND partition <> $2
                          ORDER BY {column} LIMIT 5"
                    ),
                    &[&chunk, &p],
                )
                .await?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            if let Some((id, other)) = clashes.first() {
                bail!(
                    "{table} id {id:?} of partition {partition} also names a row of partition \
                     {other} on the target ({} such ids in this batch shown at most 5: {:?}); an \
                     id names one command, so the move is refused before anything changed",
                    clashes.len(),
                    clashes.iter().map(|(id, _)| id).collect::<Vec<_>>()
                );
            }
        }
    }
    Ok(())
}

/// The start of the target's oldest live ledger time partition, `None` when it has no lower
/// bound (nothing was ever archived there, so nothing is folded).
pub(super) async fn target_floor(target: &Client) -> anyhow::Result<Option<DateTime<Utc>>> {
    Ok(target
        .query_opt(
            "SELECT range_start FROM ledger_partitions ORDER BY range_end LIMIT 1",
            &[],
        )
        .await?
        .and_then(|r| r.get(0)))
}

/// Waits up to `wait` until the source's event relay has published every ledger row of the
/// partition that the target would fold into its archived totals (rows recorded before its
/// oldest live time partition: they will not be live there, so the target's relay, which starts
/// after the source's progress, would never publish them); refuses the move when it has not.
/// Rows recorded from now on are newer than the floor, so a check passed now stays passed.
pub(super) async fn folded_rows_published(
    source: &Client,
    target: &Client,
    partition: u32,
    wait: Duration,
) -> anyhow::Result<()> {
    let Some(floor) = target_floor(target).await? else {
        return Ok(());
    };
    let started = Instant::now();
    loop {
        let row = source
            .query_one(
                "SELECT coalesce((SELECT max(position) FROM ledger
                                   WHERE partition = $1 AND recorded_at < $2), 0),
                        coalesce((SELECT published FROM event_relay_progress
                                   WHERE stream = 'partition/' || $1::int), 0)",
                &[&(partition as i32), &floor],
            )
            .await?;
        let (folded_through, published): (i64, i64) = (row.get(0), row.get(1));
        if folded_through <= published {
            return Ok(());
        }
        ensure!(
            started.elapsed() < wait,
            "partition {partition}: the source's event relay has published through position \
             {published}, but the target would fold positions through {folded_through} (recorded \
             before its oldest ledger partition, {floor}) into archived totals, where its relay \
             never publishes them: the event stream would have a gap. Let the source's relay \
             catch up (is its Redis reachable?) and run the move again; nothing was changed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
