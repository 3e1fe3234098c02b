//! The settlement job's status as read from PostgreSQL; any replica (or router) answers the same,
//! because the job's lease and its runs are rows, not anybody's memory.

use tokio_postgres::GenericClient;

use crate::wire::{SettledWindow, SettlementStatus};
use crate::SETTLEMENT_LEASE;

/// Read the job's holder, term, lease time left, last settled window and lag.
pub async fn read_status<C: GenericClient>(
    client: &C,
) -> Result<SettlementStatus, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT l.holder_id, l.epoch,
                    CASE WHEN l.holder_id IS NOT NULL AND l.expires_at > now()
                         THEN (extract(epoch FROM l.expires_at - now()) * 1000)::bigint END,
                    s.window_start, s.window_end, s.term, s.holder_id, s.reservations, s.quantity,
                    s.finished_at,
                    extract(epoch FROM now() - COALESCE(s.window_end, c.created_at))::float8,
                    (SELECT count(*) FROM settlement_runs WHERE status = 'settled')
               FROM leases AS l
               CROSS JOIN cluster_settings AS c
               LEFT JOIN LATERAL (
                    SELECT * FROM settlement_runs WHERE status = 'settled'
                     ORDER BY window_start DESC LIMIT 1) AS s ON true
              WHERE l.name = $1",
            &[&SETTLEMENT_LEASE],
        )
        .await?;
    let remaining: Option<i64> = row.get(2);
    let last_settled = row
        .get::<_, Option<chrono::DateTime<chrono::Utc>>>(3)
        .map(|window_start| SettledWindow {
            window_start,
            window_end: row.get(4),
            term: row.get(5),
            holder_id: row.get(6),
            reservations: row.get::<_, Option<i64>>(7).unwrap_or(0),
            total_quantity: row.get::<_, Option<i64>>(8).unwrap_or(0),
            settled_at: row.get(9),
        });
    Ok(SettlementStatus {
        // An expired lease names nobody, as in the assignment map.
        holder_id: if remaining.is_some() {
            row.get(0)
        } else {
            None
        },
        term: row.get(1),
        lease_remaining_ms: remaining,
        last_settled,
        settled_windows: row.get(11),
        lag_seconds: row.get(10),
    })
}

/// Seconds from the end of the last settled window (or the cluster's creation) to now, by the
/// database clock. Cheap enough for every replica to read every second: one index probe.
pub async fn read_lag<C: GenericClient>(client: &C) -> Result<f64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT extract(epoch FROM now() - COALESCE(
                        (SELECT window_end FROM settlement_runs WHERE status = 'settled'
                          ORDER BY window_start DESC LIMIT 1),
                        (SELECT created_at FROM cluster_settings)))::float8",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
