//! Orders past the horizon in a cluster of several shards (DESIGN.md §8a, §12). An order is
//! stored on its order shard and its lines on their SKUs' shards, so "an order goes only after
//! its lines" needs every shard: the candidates this shard would remove (finished, past the
//! horizon, no line left here) are looked up on every other shard (`--shard`), and only those
//! none of whose lines is left anywhere are removed, by the usual fenced statement restricted to
//! them. A shard that cannot be read keeps every candidate for a later batch.

use std::collections::HashSet;
use std::time::Duration;

use super::store::{self, Removed, LINE_IDS};

/// The candidates and their line ids: what [`store`]'s statement would remove, unlocked.
fn candidates_statement() -> String {
    format!(
        "SELECT o.order_id, {LINE_IDS} FROM orders AS o
          WHERE o.status <> 'pending'
            AND o.updated_at < now() - $1::bigint * interval '1 millisecond'
            AND NOT EXISTS (
                SELECT 1 FROM reservations AS r WHERE r.reservation_id = ANY ({LINE_IDS}))
          ORDER BY o.updated_at
          LIMIT $2"
    )
}

/// One batch of orders past the horizon whose lines are gone on this shard and on every one of
/// `other_shards` (URLs).
pub async fn remove_past_horizon(
    client: &tokio_postgres::Client,
    other_shards: &[String],
    holder_id: &str,
    term: i64,
    horizon: Duration,
    batch: i64,
) -> anyhow::Result<Removed> {
    let horizon_ms = horizon.as_millis() as i64;
    let rows = client
        .query(&candidates_statement(), &[&horizon_ms, &batch])
        .await?;
    if rows.is_empty() {
        return Ok(Removed {
            fenced: false,
            rows: 0,
        });
    }
    let candidates: Vec<(String, Vec<String>)> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let lines: Vec<&str> = candidates
        .iter()
        .flat_map(|(_, ids)| ids.iter().map(String::as_str))
        .collect();
    let mut left: HashSet<String> = HashSet::new();
    for url in other_shards {
        let shard = crate::sessions::connect(url).await?;
        let found = shard
            .query(
                "SELECT reservation_id FROM reservations WHERE reservation_id = ANY ($1)",
                &[&lines],
            )
            .await?;
        left.extend(found.iter().map(|r| r.get::<_, String>(0)));
    }
    let gone: Vec<String> = candidates
        .into_iter()
        .filter(|(_, ids)| ids.iter().all(|id| !left.contains(id)))
        .map(|(order, _)| order)
        .collect();
    if gone.is_empty() {
        return Ok(Removed {
            fenced: false,
            rows: 0,
        });
    }
    Ok(store::remove_orders_among(
        client,
        super::RETENTION_LEASE,
        holder_id,
        term,
        horizon,
        batch,
        &gone,
    )
    .await?)
}
