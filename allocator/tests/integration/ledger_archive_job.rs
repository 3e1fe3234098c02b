//! The retention job archiving ledger partitions (`--ledger-archive-dir`): settlement settles
//! every window exactly across the archived boundary and across live partition boundaries, and
//! a holder SIGKILLed in the middle of an export leaves the partition in place for the next
//! holder, which archives it whole, once.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::ledger_support::*;
use crate::processes::spawn_replica_with;

const SKUS: [&str; 2] = ["job-a", "job-b"];

async fn scalar_i64(pg: &tokio_postgres::Client, sql: &str) -> i64 {
    pg.query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Wait until the boolean `sql` is true.
async fn wait_until(pg: &tokio_postgres::Client, sql: &str, what: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !pg
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get::<_, Option<bool>>(0)
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 2 s partitions, 3 s settlement windows, a 6 s horizon: the job archives partitions as their
/// windows settle, and every window that starts at or after the archived boundary is settled to
/// the ledger's confirmations in it, some across a live partition boundary (the horizon keeps
/// the last seconds' partitions); over all windows, the settled total is the archived
/// confirmations plus the live ones.
#[tokio::test]
async fn the_job_archives_and_settlement_goes_on_across_the_boundary() {
    let db = migrated_database_with_span(PARTITIONS, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let replica = TestReplica::start(fast_config_with(
        &db,
        "arch-job",
        &[
            "--idempotency-horizon-secs",
            "6",
            "--settlement-window-secs",
            "3",
            "--ledger-archive-dir",
            dir.path().to_str().unwrap(),
        ],
    ))
    .await;
    wait_owns_all(&replica).await;
    for sku in SKUS {
        restock(&replica.url, sku, 1_000_000).await;
    }
    let pg = client(&db).await;
    resolved_load(&replica, "before", &SKUS, Duration::from_secs(10)).await;
    wait_until(
        &pg,
        "SELECT count(*) >= 3 AND sum(d_confirmed) > 0 FROM ledger_archives",
        "three partitions archived, confirmations among them",
        Duration::from_secs(60),
    )
    .await;
    resolved_load(&replica, "after", &SKUS, Duration::from_secs(4)).await;
    wait_until(
        &pg,
        "SELECT (SELECT max(window_end) FROM settlement_runs WHERE status = 'settled')
                 > (SELECT max(recorded_at) FROM ledger WHERE kind = 'confirm')",
        "every confirmation settled",
        Duration::from_secs(30),
    )
    .await;
    replica.stop().await;

    let boundary = "(SELECT max(range_end) FROM ledger_archives)";
    let mismatched = scalar_i64(
        &pg,
        &format!(
            "WITH w AS (SELECT window_start, window_end FROM settlement_runs
                         WHERE status = 'settled' AND window_start >= {boundary}),
                  l AS (SELECT w.window_start, c.sku, count(*) AS n, sum(c.d_confirmed) AS q
                          FROM w JOIN ledger AS c ON c.kind = 'confirm'
                           AND c.recorded_at >= w.window_start AND c.recorded_at < w.window_end
                         GROUP BY 1, 2),
                  s AS (SELECT s.window_start, s.sku, s.reservations AS n, s.quantity AS q
                          FROM settlements AS s JOIN w USING (window_start))
             SELECT count(*) FROM (
                 (SELECT * FROM l EXCEPT SELECT * FROM s)
                 UNION ALL (SELECT * FROM s EXCEPT SELECT * FROM l)) AS d"
        ),
    )
    .await;
    assert_eq!(mismatched, 0, "windows after the boundary match the ledger");
    let across = scalar_i64(
        &pg,
        &format!(
            "SELECT count(*) FROM settlement_runs AS w
              WHERE w.status = 'settled' AND w.window_start >= {boundary} AND w.quantity > 0
                AND EXISTS (SELECT 1 FROM ledger_partitions AS p
                             WHERE p.range_start > w.window_start
                               AND p.range_start < w.window_end)"
        ),
    )
    .await;
    assert!(
        across > 0,
        "windows with confirmations span two live partitions"
    );
    let settled_total = scalar_i64(
        &pg,
        "SELECT sum(quantity)::bigint FROM settlement_runs WHERE status = 'settled'",
    )
    .await;
    let archived_and_live = scalar_i64(
        &pg,
        "SELECT ((SELECT sum(d_confirmed) FROM ledger_archives)
                 + (SELECT coalesce(sum(d_confirmed), 0) FROM ledger WHERE kind = 'confirm'))::bigint",
    )
    .await;
    assert_eq!(
        settled_total, archived_and_live,
        "every confirmation settled once"
    );
    for (_, file, ..) in recorded(&pg).await {
        assert!(sha256sum_accepts(Path::new(&file)), "{file}");
    }
    for sku in SKUS {
        let (row, ledger) = ledger_balance(&pg, sku).await;
        assert_eq!(row, ledger, "{sku}");
    }
}

async fn recorded(pg: &tokio_postgres::Client) -> Vec<(String, String, i64)> {
    pg.query(
        "SELECT name, file, rows FROM ledger_archives ORDER BY range_end",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

const BIG: i64 = 600_000;

/// Two replica processes share an archive directory. The first partition holds `BIG` rows;
/// the job's holder is SIGKILLed while it exports them (its file still `.partial`). The
/// partition stays attached, and the other replica takes the job with a new term and archives
/// it: one record, a file that passes `sha256sum -c` and restores to every row.
#[tokio::test]
async fn a_holder_killed_mid_export_leaves_the_partition_to_the_next_holder() {
    let db = migrated_database_with_span(PARTITIONS, 2).await;
    let pg = client(&db).await;
    let first = first_partition(&pg).await;
    pg.execute(
        "WITH bump AS (
             UPDATE ledger_positions SET last_position = last_position + $1 WHERE partition = 0
             RETURNING last_position - $1 AS base)
         INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available, d_held,
                             d_confirmed, epoch, recorded_at, position)
         SELECT 'ghost', 0, 'restock', 'big-' || g, 2, 2, 0, 0, 1, now() - interval '1 hour',
                bump.base + g
           FROM bump, generate_series(1, $1::bigint) AS g",
        &[&BIG],
    )
    .await
    .expect("a big first partition");
    let before = sums(&pg, &first).await;
    let dir = tempfile::tempdir().unwrap();
    let env = || {
        [
            ("ALLOCATOR_IDEMPOTENCY_HORIZON_SECS", "1"),
            ("ALLOCATOR_SETTLEMENT_WINDOW_SECS", "1"),
            ("ALLOCATOR_LEDGER_ARCHIVE_DIR", dir.path().to_str().unwrap()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<Vec<_>>()
    };
    let mut replicas = vec![
        spawn_replica_with(&db, "arch-kill-a", 2000, env()),
        spawn_replica_with(&db, "arch-kill-b", 2000, env()),
    ];
    let partial = dir.path().join(format!("{first}.csv.partial"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !partial.exists() {
        assert!(Instant::now() < deadline, "no export started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let holder: String = pg
        .query_one(
            "SELECT holder_id FROM leases WHERE name = 'job/retention'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let term_at_kill =
        scalar_i64(&pg, "SELECT epoch FROM leases WHERE name = 'job/retention'").await;
    let victim = replicas.iter().position(|r| r.id == holder).unwrap();
    let mut killed = replicas.remove(victim);
    killed.process.sigkill().expect("SIGKILL");
    assert_eq!(
        scalar_i64(&pg, "SELECT count(*) FROM ledger_archives").await,
        0,
        "killed before the partition went"
    );
    assert_eq!(sums(&pg, &first).await, before, "the partition is whole");

    wait_until(
        &pg,
        "SELECT EXISTS (SELECT 1 FROM ledger_archives WHERE range_start IS NULL)",
        "the next holder archives the first partition",
        Duration::from_secs(90),
    )
    .await;
    let term_after = scalar_i64(&pg, "SELECT epoch FROM leases WHERE name = 'job/retention'").await;
    assert!(term_after > term_at_kill, "a new term");
    let archives = recorded(&pg).await;
    let (name, file, rows) = &archives[0];
    assert_eq!(name, &first);
    assert_eq!(
        archives.iter().filter(|a| &a.0 == name).count(),
        1,
        "archived once"
    );
    assert_eq!(*rows, before.0);
    assert!(sha256sum_accepts(Path::new(file)), "{file}");
    allocator::retention::archive::restore(&pg, Path::new(file), "restored_after_kill")
        .await
        .expect("restore");
    assert_eq!(sums(&pg, "restored_after_kill").await, before);
    assert!(
        !partial.exists(),
        "the interrupted export was written again and renamed"
    );
    let ghost = scalar_i64(
        &pg,
        "SELECT d_on_hand FROM ledger_archived_totals WHERE sku = 'ghost'",
    )
    .await;
    assert_eq!(ghost, before.1[0]);
}
