//! The retention job's statements: one small batch of reservations or orders past the horizon,
//! and the table-health read.
//!
//! Each batch is one autocommit statement: its own fence (the job's lease row read `FOR KEY
//! SHARE`, which only an acquisition's `FOR UPDATE` conflicts with), then the oldest rows past the
//! horizon locked `FOR UPDATE SKIP LOCKED` — a row a fenced batch or an order submission has
//! locked is left for a later batch, never waited for — then a delete by `ctid` (a TID scan). The
//! statement locks at most `batch` rows, no inventory row and no partition lease, and holds them
//! for one statement.

use std::time::Duration;

use tokio_postgres::GenericClient;

/// What one batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// False when the lease no longer names this holder at this term: nothing was removed.
    pub fenced: bool,
    pub rows: u64,
}

fn removed(row: &tokio_postgres::Row) -> Removed {
    Removed {
        fenced: !row.get::<_, bool>(0),
        rows: row.get::<_, i64>(1) as u64,
    }
}

const FENCE: &str = "fence AS (
     SELECT 1 FROM leases
      WHERE name = $1 AND holder_id = $2 AND epoch = $3 AND expires_at > now()
        FOR KEY SHARE)";

/// What the job removes rows of, in the order it works through them: reservations first (the
/// terminal ones, then the frozen holds a partition that moved away left behind), since an order
/// waits for its lines anyway; then orders; then id claims (V27).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Reservations,
    FrozenHolds,
    Orders,
    Claims,
}

impl Kept {
    pub const ALL: [Kept; 4] = [
        Kept::Reservations,
        Kept::FrozenHolds,
        Kept::Orders,
        Kept::Claims,
    ];

    /// The table's name, also the `table` label of its metrics.
    pub fn table(self) -> &'static str {
        match self {
            Kept::Reservations | Kept::FrozenHolds => "reservations",
            Kept::Orders => "orders",
            Kept::Claims => "id_claims",
        }
    }

    fn statement(self) -> String {
        match self {
            Kept::Reservations => reservations_statement(),
            Kept::FrozenHolds => frozen_holds_statement(),
            Kept::Orders => orders_statement(),
            Kept::Claims => claims_statement(),
        }
    }
}

/// Remove up to `batch` rows of `kept` past `horizon` (see the statements), under the job's fence.
pub async fn remove_past_horizon<C: GenericClient>(
    client: &C,
    kept: Kept,
    lease: &str,
    holder_id: &str,
    term: i64,
    horizon: Duration,
    batch: i64,
) -> Result<Removed, tokio_postgres::Error> {
    let horizon_ms = horizon.as_millis() as i64;
    let row = client
        .query_one(
            &kept.statement(),
            &[&lease, &holder_id, &term, &horizon_ms, &batch],
        )
        .await?;
    Ok(removed(&row))
}

/// Up to `$5` terminal reservations whose last transition is older than the horizon. A `held`
/// reservation is never removed, however old.
fn reservations_statement() -> String {
    format!(
        "WITH {FENCE},
         victims AS (
             SELECT ctid FROM reservations
              WHERE status <> 'held'
                AND updated_at < now() - $4::bigint * interval '1 millisecond'
                AND EXISTS (SELECT 1 FROM fence)
              ORDER BY updated_at
              LIMIT $5
                FOR UPDATE SKIP LOCKED),
         gone AS (
             DELETE FROM reservations
              WHERE ctid = ANY (ARRAY(SELECT ctid FROM victims)) AND status <> 'held'
          RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM gone)"
    )
}

/// Up to `$5` holds of partitions this shard no longer holds (no lease row: the partition moved
/// to another shard, which serves its live copy, DESIGN.md §12) whose expiry is older than the
/// horizon. Nobody sweeps such a frozen copy and nobody may serve it; it is only kept as long as a
/// terminal reservation would be, so that it does not linger.
fn frozen_holds_statement() -> String {
    format!(
        "WITH {FENCE},
         victims AS (
             SELECT r.ctid FROM reservations AS r
              WHERE r.status = 'held'
                AND r.expires_at < now() - $4::bigint * interval '1 millisecond'
                AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.partition = r.partition)
                AND EXISTS (SELECT 1 FROM fence)
              ORDER BY r.expires_at
              LIMIT $5
                FOR UPDATE OF r SKIP LOCKED),
         gone AS (
             DELETE FROM reservations
              WHERE ctid = ANY (ARRAY(SELECT ctid FROM victims))
          RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM gone)"
    )
}

/// Up to `$5` id claims (V27) whose command's last possible change (its creation plus its TTL)
/// is older than the horizon: by then its reservation is past the horizon too.
fn claims_statement() -> String {
    format!(
        "WITH {FENCE},
         victims AS (
             SELECT ctid FROM id_claims
              WHERE settled_by < now() - $4::bigint * interval '1 millisecond'
                AND EXISTS (SELECT 1 FROM fence)
              ORDER BY settled_by
              LIMIT $5
                FOR UPDATE SKIP LOCKED),
         gone AS (
             DELETE FROM id_claims
              WHERE ctid = ANY (ARRAY(SELECT ctid FROM victims))
          RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM gone)"
    )
}

/// Up to `$5` finished orders (`placed`, `failed`, `refused`) decided longer than the horizon ago and none of whose line reservations is left here (in either line-id form), so an
/// order goes only after its lines: while a line is kept, a resubmission still replays. With
/// `among`, only the orders `$6` names ([`crate::retention::orders`] checked the other shards).
fn orders_statement_among(among: bool) -> String {
    let among = if among {
        "AND o.order_id = ANY ($6::text[])"
    } else {
        ""
    };
    format!(
        "WITH {FENCE},
         victims AS (
             SELECT o.ctid FROM orders AS o
              WHERE o.status <> 'pending'
                AND o.updated_at < now() - $4::bigint * interval '1 millisecond'
                AND EXISTS (SELECT 1 FROM fence)
                {among}
                AND NOT EXISTS (
                    SELECT 1 FROM reservations AS r
                     WHERE r.reservation_id = ANY ({LINE_IDS}))
              ORDER BY o.updated_at
              LIMIT $5
                FOR UPDATE OF o SKIP LOCKED),
         gone AS (
             DELETE FROM orders
              WHERE ctid = ANY (ARRAY(SELECT ctid FROM victims)) AND status <> 'pending'
          RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM fence), (SELECT count(*) FROM gone)"
    )
}

fn orders_statement() -> String {
    orders_statement_among(false)
}

/// The reservation ids of order `o`'s lines, in both line-id forms.
pub(crate) const LINE_IDS: &str = "ARRAY(
                           SELECT form || o.order_id || ':' || i
                             FROM generate_series(0, jsonb_array_length(o.request -> 'lines') - 1)
                                  AS i,
                                  unnest(ARRAY['order:', '']) AS form)";

/// Like [`remove_past_horizon`] for orders, but only among `orders`.
#[allow(clippy::too_many_arguments)]
pub async fn remove_orders_among<C: GenericClient>(
    client: &C,
    lease: &str,
    holder_id: &str,
    term: i64,
    horizon: Duration,
    batch: i64,
    orders: &[String],
) -> Result<Removed, tokio_postgres::Error> {
    let horizon_ms = horizon.as_millis() as i64;
    let row = client
        .query_one(
            &orders_statement_among(true),
            &[&lease, &holder_id, &term, &horizon_ms, &batch, &orders],
        )
        .await?;
    Ok(removed(&row))
}

/// The tables whose health is exported: the hot ones and the ones that grow with history.
pub const WATCHED_TABLES: &[&str] = &[
    "inventory",
    "leases",
    "reservations",
    "ledger",
    "orders",
    "adjustments",
    "lease_history",
];

/// One table's statistics (`pg_stat_user_tables`) and size on disk; a partitioned table's (the
/// ledger, V17) are the sums over its partitions.
#[derive(Debug, Clone, PartialEq)]
pub struct TableHealth {
    pub table: String,
    /// Heap, indexes and TOAST.
    pub bytes: i64,
    pub live_tuples: i64,
    pub dead_tuples: i64,
    pub updates: i64,
    /// Updates that were heap-only (no index entry written).
    pub hot_updates: i64,
}

pub async fn table_health<C: GenericClient>(
    client: &C,
) -> Result<Vec<TableHealth>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT w.name, sum(pg_total_relation_size(t.relid))::bigint,
                    sum(s.n_live_tup)::bigint, sum(s.n_dead_tup)::bigint,
                    sum(s.n_tup_upd)::bigint, sum(s.n_tup_hot_upd)::bigint
               FROM unnest($1::text[]) AS w(name)
               JOIN pg_class AS c ON c.oid = to_regclass(quote_ident(w.name))
              CROSS JOIN LATERAL (
                    SELECT relid FROM pg_partition_tree(c.oid) WHERE isleaf
                     UNION ALL
                    SELECT c.oid WHERE c.relkind = 'r') AS t
               JOIN pg_stat_user_tables AS s ON s.relid = t.relid
              GROUP BY w.name",
            &[&WATCHED_TABLES],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| TableHealth {
            table: r.get(0),
            bytes: r.get(1),
            live_tuples: r.get(2),
            dead_tuples: r.get(3),
            updates: r.get(4),
            hot_updates: r.get(5),
        })
        .collect())
}
