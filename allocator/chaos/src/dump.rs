//! The final dump: the tables the checker needs, as one JSON document.
//!
//! Timestamps the checker compares (`ledger.written_at` and `recorded_at`,
//! `lease_history.acquired_at`, settlement window bounds) are exported as integer microseconds
//! since the Unix epoch, so the checker needs no date parsing and loses no precision.
//!
//! What the database no longer holds is described, not reconstructed: the archived ledger
//! partitions (their end and last entry id) with the per-SKU sums of their rows (V17), and the
//! dump's time with the idempotency horizon the replicas ran with, before which the retention
//! job may have removed finished reservations and orders.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

/// (key in the dump, query producing its rows).
const TABLES: [(&str, &str); 14] = [
    (
        "inventory",
        "SELECT sku, partition, on_hand, available, held, confirmed, highest_epoch
           FROM inventory ORDER BY sku",
    ),
    (
        "reservations",
        "SELECT reservation_id, sku, partition, quantity, status, epoch, ttl_seconds
           FROM reservations ORDER BY reservation_id",
    ),
    (
        "ledger",
        "SELECT entry_id, sku, partition, kind, reservation_id, adjustment_id, d_on_hand,
                d_available, d_held, d_confirmed, epoch, position,
                (extract(epoch FROM written_at) * 1000000)::bigint AS written_us,
                (extract(epoch FROM recorded_at) * 1000000)::bigint AS recorded_us
           FROM ledger ORDER BY entry_id",
    ),
    (
        "adjustments",
        "SELECT adjustment_id, sku, partition, delta, status, epoch FROM adjustments
          ORDER BY adjustment_id",
    ),
    (
        "orders",
        "SELECT order_id, status, response_status, attempts, request FROM orders
          ORDER BY order_id",
    ),
    (
        "leases",
        "SELECT name, partition, holder_id, epoch, revision FROM leases ORDER BY name",
    ),
    (
        "lease_history",
        "SELECT name, partition, epoch, holder_id,
                (extract(epoch FROM acquired_at) * 1000000)::bigint AS acquired_us
           FROM lease_history ORDER BY history_id",
    ),
    (
        "settlement_runs",
        "SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS start_us,
                (extract(epoch FROM window_end) * 1000000)::bigint AS end_us,
                status, term, holder_id, reservations, quantity, position
           FROM settlement_runs ORDER BY window_start",
    ),
    (
        "event_relay_progress",
        "SELECT stream, published, term FROM event_relay_progress ORDER BY stream",
    ),
    (
        "settlements",
        "SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS start_us, sku, quantity,
                reservations, term
           FROM settlements ORDER BY window_start, sku",
    ),
    (
        "history_horizon",
        "SELECT first_entry_id FROM history_horizon",
    ),
    (
        "ledger_archives",
        "SELECT name, (extract(epoch FROM range_end) * 1000000)::bigint AS end_us, rows,
                last_entry_id
           FROM ledger_archives ORDER BY range_end",
    ),
    (
        "partition_moves_in",
        "SELECT partition, from_position, through_position, source_shard FROM partition_moves_in
          ORDER BY partition, from_position",
    ),
    (
        "ledger_archived_totals",
        "SELECT sku, d_on_hand, d_available, d_held, d_confirmed FROM ledger_archived_totals
          ORDER BY sku",
    ),
];

/// Writes the dump to `path`; `horizon` is the replicas' idempotency horizon, when known.
///
/// The replicas keep running (expiry sweeps still commit), so every table is read from one
/// snapshot: otherwise a sweep committing between two reads shows up as an expiry in the ledger
/// of a reservation the earlier read saw held.
pub async fn write(
    client: &tokio_postgres::Client,
    path: &Path,
    horizon: Option<Duration>,
) -> Result<()> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .context("starting the dump's snapshot")?;
    let mut doc = String::from("{");
    for (i, (key, query)) in TABLES.iter().enumerate() {
        let sql = format!("SELECT coalesce(json_agg(t), '[]'::json)::text FROM ({query}) t");
        let rows: String = client
            .query_one(&sql, &[])
            .await
            .with_context(|| format!("dumping {key}"))?
            .get(0);
        if i > 0 {
            doc.push(',');
        }
        doc.push_str(&format!("\n\"{key}\": {rows}"));
    }
    if let Some(horizon) = horizon {
        let dumped_us: i64 = client
            .query_one("SELECT (extract(epoch FROM now()) * 1000000)::bigint", &[])
            .await?
            .get(0);
        doc.push_str(&format!(
            ",\n\"retention\": [{{\"dumped_us\": {dumped_us}, \"horizon_us\": {}}}]",
            horizon.as_micros()
        ));
    }
    client.batch_execute("COMMIT").await?;
    doc.push_str("\n}\n");
    std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))
}

/// Writes the dump of every shard: `dump.json` for a one-database cluster; over several shards,
/// `dump-<shard>.json` for each and `shards.json` naming them in order with the partitions the
/// catalog's map gives each, which is what `chaos-check` merges them by.
pub async fn write_shards(
    shards: &[crate::shards::ShardDb],
    out: &Path,
    horizon: Option<Duration>,
) -> Result<()> {
    if let [only] = shards {
        return write(&only.client, &out.join("dump.json"), horizon).await;
    }
    let mut listed = Vec::new();
    for shard in shards {
        let file = format!("dump-{}.json", shard.name);
        write(&shard.client, &out.join(&file), horizon).await?;
        listed.push(serde_json::json!({
            "name": shard.name,
            "catalog": shard.catalog,
            "partitions": shard.partitions,
            "dump": file,
        }));
    }
    let doc = serde_json::json!({ "shards": listed });
    let path = out.join("shards.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}
