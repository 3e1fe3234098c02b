//! What the retention tests share: a removal log (a test-only trigger recording every deleted
//! reservation, with when, its last change and which session removed it), seeded history older
//! than any horizon, and the checks every test ends with.

use std::time::{Duration, Instant};

use crate::common::*;

/// SKU of the seeded history: no inventory row, so the seeded rows never touch live stock.
pub(crate) const GHOST: &str = "ghost";

/// Record every deleted reservation. `remover` is the deleting session's `application_name`
/// (`allocator:<replica>:retention` for the job).
pub(crate) async fn install_removal_log(db: &str) {
    client(db)
        .await
        .batch_execute(
            "CREATE TABLE removed_log (
                 reservation_id text NOT NULL,
                 status         text NOT NULL,
                 updated_at     timestamptz NOT NULL,
                 removed_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
                 remover        text NOT NULL DEFAULT current_setting('application_name'));
             CREATE FUNCTION log_removed() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO removed_log (reservation_id, status, updated_at)
                 VALUES (OLD.reservation_id, OLD.status, OLD.updated_at);
                 RETURN OLD;
             END $$;
             CREATE TRIGGER log_removed AFTER DELETE ON reservations
                 FOR EACH ROW EXECUTE FUNCTION log_removed();",
        )
        .await
        .expect("removal log");
}

/// `terminal` reservations an hour old (all four terminal states, with their ledger rows: a
/// reserve and a release, which balance), `held` old holds that have not expired, and three old
/// orders: one finished with no line left, one finished whose line is still held, one pending.
pub(crate) async fn seed_history(db: &str, terminal: i64, held: i64) {
    let c = client(db).await;
    c.execute(
        "INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                                   ttl_seconds, request_fingerprint, expires_at,
                                   created_at, updated_at)
         SELECT 'old-' || g, $1, 0, 1,
                (ARRAY['confirmed', 'released', 'expired', 'rejected'])[1 + g % 4], 1, 900,
                $1 || '/1/900', NULL, now() - interval '1 hour', now() - interval '1 hour'
           FROM generate_series(1, $2::bigint) AS g
         UNION ALL
         SELECT 'old-held-' || g, $1, 0, 1, 'held', 1, 900, $1 || '/1/900',
                now() + interval '1 day', now() - interval '1 hour', now() - interval '1 hour'
           FROM generate_series(1, $3::bigint) AS g
         UNION ALL
         SELECT 'order:old-order-2:0', $1, 0, 1, 'held', 1, 900, $1 || '/1/900',
                now() + interval '1 day', now() - interval '1 hour', now() - interval '1 hour'",
        &[&GHOST, &terminal, &held],
    )
    .await
    .expect("seed reservations");
    c.execute(
        // Numbered after the partition's last position as the fenced batch numbers its rows
        // (the counter raised first, so it is locked); a writer that leaves `position` empty is
        // numbered one row at a time.
        "WITH bump AS (
             UPDATE ledger_positions SET last_position = last_position + 2 * $2::bigint
              WHERE partition = 0
             RETURNING last_position - 2 * $2::bigint AS base)
         INSERT INTO ledger (sku, partition, kind, reservation_id, d_on_hand, d_available,
                             d_held, d_confirmed, epoch, recorded_at, position)
         SELECT $1, 0, k.kind, 'old-' || g, 0, k.d, -k.d, 0, 1, now() - interval '1 hour',
                bump.base + 2 * (g - 1) + k.n
           FROM bump, generate_series(1, $2::bigint) AS g,
                (VALUES ('reserve', -1, 1), ('release', 1, 2)) AS k(kind, d, n)",
        &[&GHOST, &terminal],
    )
    .await
    .expect("seed ledger");
    c.batch_execute(
        "INSERT INTO orders (order_id, request, status, response_status, response, attempts,
                             created_at, updated_at)
         VALUES ('old-order-1', '{\"lines\": [{\"sku\": \"ghost\", \"quantity\": 1}]}',
                 'placed', 201, '{}', 1, now() - interval '1 hour', now() - interval '1 hour'),
                ('old-order-2', '{\"lines\": [{\"sku\": \"ghost\", \"quantity\": 1}]}',
                 'placed', 201, '{}', 1, now() - interval '1 hour', now() - interval '1 hour'),
                ('old-order-3', '{\"lines\": [{\"sku\": \"ghost\", \"quantity\": 1}]}',
                 'pending', NULL, NULL, 1, now() - interval '1 hour', now() - interval '1 hour')",
    )
    .await
    .expect("seed orders");
}

pub(crate) async fn count(db: &str, sql: &str) -> i64 {
    client(db)
        .await
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

pub(crate) async fn wait_for_count(db: &str, sql: &str, want: i64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = count(db, sql).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {got}, not {want} within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Nothing the job removed was held or had changed within `horizon`, and the seeded holds and
/// the ledger are all still there.
pub(crate) async fn assert_only_past_the_horizon(db: &str, horizon: Duration, held: i64) {
    let inside = count(
        db,
        &format!(
            "SELECT count(*) FROM removed_log
              WHERE status = 'held'
                 OR removed_at - updated_at < {} * interval '1 millisecond'",
            horizon.as_millis()
        ),
    )
    .await;
    assert_eq!(
        inside, 0,
        "a held row or one inside the horizon was removed"
    );
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM reservations WHERE reservation_id LIKE 'old-held-%'"
        )
        .await,
        held,
        "every old hold is kept"
    );
}

/// The ledger's rows for the seeded history: two per terminal reservation, all kept.
pub(crate) async fn seeded_ledger_rows(db: &str) -> i64 {
    count(db, "SELECT count(*) FROM ledger WHERE sku = 'ghost'").await
}

/// The lease `job/retention`: (holder, term).
pub(crate) async fn retention_holder(db: &str) -> (Option<String>, i64) {
    let row = client(db)
        .await
        .query_one(
            "SELECT CASE WHEN expires_at > now() THEN holder_id END, epoch
               FROM leases WHERE name = 'job/retention'",
            &[],
        )
        .await
        .expect("the retention lease row");
    (row.get(0), row.get(1))
}
