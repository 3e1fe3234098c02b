//! The settlement job's statements: its two steps per window, claim and settle (the lease is
//! [`crate::singleton::store`]'s).
//!
//! Every write of a step is checked against the job's term by the tables' own trigger
//! (`settlement_term_fence`, migration V4), not by anything this module reads first: a holder
//! that slept through its lease learns it was replaced from the refusal (SQLSTATE `FA010`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::GenericClient;

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// A window claimed for settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// Claim the next window to settle, if it has closed by the database clock.
///
/// The next window starts where the last settled one ended, so windows never overlap and none is
/// skipped. Before anything was settled it is the run a former term left open, if any, and
/// otherwise the cluster's creation aligned down to the window length.
///
/// A run left `running` by a former term is taken over *as it was claimed*: its end is kept and
/// readiness is judged against that end with this term's grace, never against a window of this
/// term's length from the same start. Window length and grace are per-process settings, so the
/// term that takes over may run with others than the term that claimed; with a shorter window
/// (or a longer grace) it would otherwise settle a window whose confirmations can still commit.
pub async fn claim_next<C: GenericClient>(
    client: &C,
    holder_id: &str,
    term: i64,
    window: Duration,
    grace: Duration,
) -> Result<Option<Window>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "WITH next AS (
                 SELECT COALESCE(
                            (SELECT max(window_end) FROM settlement_runs WHERE status = 'settled'),
                            (SELECT min(window_start) FROM settlement_runs WHERE status = 'running'),
                            (SELECT to_timestamp(floor(extract(epoch FROM created_at) / $3::bigint)
                                                 * $3::bigint)
                               FROM cluster_settings)) AS start),
             candidate AS (
                 SELECT next.start,
                        COALESCE(open.window_end, next.start + $3::bigint * interval '1 second')
                            AS end_at
                   FROM next
                   LEFT JOIN settlement_runs AS open
                     ON open.window_start = next.start AND open.status = 'running')
             INSERT INTO settlement_runs AS r (window_start, window_end, status, term, holder_id)
             SELECT start, end_at, 'running', $2, $1
               FROM candidate
              WHERE end_at + $4::bigint * interval '1 millisecond' <= now()
             ON CONFLICT (window_start) DO UPDATE
                SET term = EXCLUDED.term, holder_id = EXCLUDED.holder_id, started_at = now()
              -- Judged again on the locked row: the run as it was claimed.
              WHERE r.status = 'running'
                AND r.window_end + $4::bigint * interval '1 millisecond' <= now()
          RETURNING r.window_start, r.window_end",
            &[
                &holder_id,
                &term,
                &(window.as_secs() as i64),
                &millis(grace),
            ],
        )
        .await?;
    Ok(row.map(|r| Window {
        start: r.get(0),
        end: r.get(1),
    }))
}

/// What settling one window wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub reservations: i64,
    pub quantity: i64,
}

/// Sum the window's confirmations per SKU into `settlements` and mark its run settled under this
/// term, in one statement. `None` when the window is already settled.
///
/// The run is deliberately not filtered by term: whether this term may still write is the
/// trigger's decision, so a former holder's attempt is refused (`FA010`) and counted instead of
/// quietly matching nothing.
pub async fn settle<C: GenericClient>(
    client: &C,
    term: i64,
    window_start: DateTime<Utc>,
) -> Result<Option<Settled>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "WITH run AS (
                 SELECT window_start, window_end FROM settlement_runs
                  WHERE window_start = $1 AND status = 'running'
                    FOR UPDATE),
             per_sku AS (
                 SELECT l.sku, sum(l.d_confirmed) AS quantity, count(*) AS reservations
                   FROM ledger AS l, run
                  WHERE l.kind = 'confirm'
                    AND l.recorded_at >= run.window_start AND l.recorded_at < run.window_end
                    -- Rows a partition move copied here: the source shard settles its own copy.
                    AND NOT EXISTS (SELECT 1 FROM partition_moves_in AS m
                                     WHERE m.partition = l.partition
                                       AND l.position BETWEEN m.from_position AND m.through_position)
                  GROUP BY l.sku),
             written AS (
                 INSERT INTO settlements (window_start, sku, quantity, reservations, term)
                 SELECT $1, sku, quantity, reservations, $2 FROM per_sku
              RETURNING quantity, reservations)
             UPDATE settlement_runs AS r
                SET status = 'settled', finished_at = now(), term = $2,
                    reservations = (SELECT COALESCE(sum(reservations), 0) FROM written),
                    quantity = (SELECT COALESCE(sum(quantity), 0) FROM written)
               FROM run
              WHERE r.window_start = run.window_start
          RETURNING r.reservations, r.quantity",
            &[&window_start, &term],
        )
        .await?;
    Ok(row.map(|r| Settled {
        reservations: r.get(0),
        quantity: r.get(1),
    }))
}
