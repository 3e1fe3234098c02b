//! A database that held a run's data before the lease history existed, migrated to the latest
//! schema and then checked by `chaos-check`: the rows written before the migration must not be
//! reported as stale-epoch writes (their write times are the migration's, and the epochs they
//! were superseded by were never recorded), and the rows written after it must still be judged.
//! And a database whose oldest ledger partitions were archived and whose finished reservations
//! were removed past the horizon: it checks clean from what the dump says of both, and the same
//! dump without that is reported.
//!
//! The run's data is written by `apply_fenced_batch`, the one statement every allocator sends,
//! under leases taken as allocators take them: an owner at epoch 1, then a takeover at epoch 2
//! before the migration, and a takeover at epoch 3 after it.

use std::path::Path;
use std::time::Duration;

use testkit::PgServer;
use tokio_postgres::Client;

mod before_history {
    // Every migration up to the one that added the lease history, applied by the same runner
    // (and so with the same recorded checksums) as `allocator migrate`.
    refinery::embed_migrations!("../../schema/migrations");
}

const SKU: &str = "migrated-sku";

/// Take `partition/0` for `holder` with the next epoch, as a campaign does (so after V5 the
/// history trigger records it).
async fn acquire(pg: &Client, holder: &str) -> i64 {
    testkit::fenced::acquire(pg, "partition/0", holder).await
}

/// One fenced batch of `(op, id, amount)` commands on partition 0 and [`SKU`].
async fn batch(pg: &Client, holder: &str, epoch: i64, commands: &[(&str, &str, i64)]) {
    let commands: Vec<(&str, &str, &str, i64)> =
        commands.iter().map(|c| (c.0, c.1, SKU, c.2)).collect();
    testkit::fenced::batch(pg, holder, 0, epoch, &commands).await
}

fn write_run(dir: &Path) {
    // The run's operations are not the point here: an empty history, the database's own rows.
    std::fs::write(dir.join("history.jsonl"), "").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_with_data_checks_clean() {
    let server = PgServer::start().await.expect("private PostgreSQL");
    let url = server.create_database("migrated").await.unwrap();
    let mut pg = server.connect_url(&url).await.unwrap();

    before_history::migrations::runner()
        .set_target(refinery::Target::Version(4))
        .run_async(&mut pg)
        .await
        .expect("V1–V4");
    pg.batch_execute(
        "INSERT INTO cluster_settings (partition_count) VALUES (1);
         INSERT INTO leases (name, partition) VALUES ('partition/0', 0), ('job/settlement', NULL);",
    )
    .await
    .unwrap();

    // The old run: owner a at epoch 1 stocks and holds, owner b takes over (epoch 2) and
    // confirms, all before the lease history existed.
    let e1 = acquire(&pg, "old-a").await;
    batch(
        &pg,
        "old-a",
        e1,
        &[("adjust", "adj-1", 10), ("reserve", "r1", 2)],
    )
    .await;
    batch(&pg, "old-a", e1, &[("reserve", "r2", 3)]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e2 = acquire(&pg, "old-b").await;
    batch(
        &pg,
        "old-b",
        e2,
        &[("confirm", "r1", 0), ("release", "r2", 0)],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    // Migrate to the latest schema, as `allocator migrate` does.
    schema::initialise(&mut pg, Some(1))
        .await
        .expect("migrate to the latest");

    // The run goes on: b writes, c takes over and writes.
    batch(&pg, "old-b", e2, &[("reserve", "r3", 1)]).await;
    let e3 = acquire(&pg, "new-c").await;
    batch(
        &pg,
        "new-c",
        e3,
        &[("confirm", "r3", 0), ("adjust", "adj-2", 5)],
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    chaos::dump::write(&pg, &dir.path().join("dump.json"), None)
        .await
        .expect("dump");
    write_run(dir.path());
    // The five rows of the old run are below the horizon, the three written since are not.
    let dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("dump.json")).unwrap())
            .unwrap();
    assert_eq!(dump["history_horizon"][0]["first_entry_id"], 6, "{dump}");
    assert_eq!(dump["ledger"].as_array().map(Vec::len), Some(8));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_chaos-check"))
        .arg(dir.path())
        .output()
        .expect("run chaos-check");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chaos-check reported violations on a migrated database:\n{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.contains("checker: 0 violations"), "{printed}");
}

/// `kind` with its request, answered `status`, sent and answered at `sent_ms`/`done_ms`.
fn op(kind: &str, request: serde_json::Value, status: i64, sent_ms: i64, done_ms: i64) -> String {
    serde_json::json!({
        "kind": kind, "request": request, "status": status,
        "invoke_wall_ms": sent_ms, "complete_wall_ms": done_ms,
    })
    .to_string()
}

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Settle everything before now in one window, as the settlement job's claim and settle do.
async fn settle_until_now(pg: &Client) {
    let term: i64 = pg
        .query_one(
            "UPDATE leases SET holder_id = 'settler', epoch = epoch + 1,
                    expires_at = clock_timestamp() + interval '1 minute'
              WHERE name = 'job/settlement' RETURNING epoch",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    pg.batch_execute(&format!(
        "INSERT INTO settlement_runs (window_start, window_end, status, term, holder_id)
         VALUES ('2000-01-01', now(), 'running', {term}, 'settler');
         INSERT INTO settlements (window_start, sku, quantity, reservations, term)
         SELECT '2000-01-01', sku, sum(d_confirmed), count(*), {term} FROM ledger
          WHERE kind = 'confirm' GROUP BY sku;
         UPDATE settlement_runs SET status = 'settled', finished_at = now(),
                reservations = (SELECT sum(reservations) FROM settlements),
                quantity = (SELECT sum(quantity) FROM settlements)
          WHERE status = 'running';"
    ))
    .await
    .expect("settle");
}

/// Archive the oldest partitions while they may go (horizon 1 s); returns the rows archived.
async fn archive_all(pg: &Client) -> i64 {
    let mut archived = 0;
    loop {
        let oldest: Option<(String, Option<String>)> = pg
            .query_opt(
                "SELECT name, ledger_archive_refusal(name, interval '1 second', false)
                   FROM ledger_partitions ORDER BY range_end LIMIT 1",
                &[],
            )
            .await
            .unwrap()
            .map(|r| (r.get(0), r.get(1)));
        let Some((name, None)) = oldest else {
            return archived;
        };
        let rows: i64 = pg
            .query_one(&format!("SELECT count(*) FROM {name}"), &[])
            .await
            .unwrap()
            .get(0);
        let refused: Option<String> = pg
            .query_one(
                "SELECT ledger_archive_detach($1, interval '1 second', false, $2, 'x.csv',
                                              repeat('0', 64))",
                &[&name, &rows],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(refused, None);
        archived += rows;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archived_and_pruned_history_checks_clean() {
    let server = PgServer::start().await.expect("private PostgreSQL");
    let url = server.create_database("archived").await.unwrap();
    let mut pg = server.connect_url(&url).await.unwrap();
    let options = schema::InitOptions {
        partitions: Some(1),
        ledger_partition_span: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    schema::initialise_with(&mut pg, options).await.unwrap();
    let mut history = Vec::new();
    let e1 = acquire(&pg, "a").await;
    let t0 = wall_ms();
    batch(
        &pg,
        "a",
        e1,
        &[
            ("adjust", "adj-1", 10),
            ("reserve", "r1", 2),
            ("reserve", "r2", 3),
        ],
    )
    .await;
    batch(&pg, "a", e1, &[("confirm", "r1", 0), ("release", "r2", 0)]).await;
    let t1 = wall_ms();
    let reserve =
        |id: &str, q: i64| serde_json::json!({"reservation_id": id, "sku": SKU, "quantity": q});
    let id = |id: &str| serde_json::json!({"reservation_id": id});
    history.push(op(
        "adjust",
        serde_json::json!({"adjustment_id": "adj-1", "sku": SKU, "delta": 10}),
        201,
        t0,
        t1,
    ));
    history.push(op("reserve", reserve("r1", 2), 201, t0, t1));
    history.push(op("reserve", reserve("r2", 3), 201, t0, t1));
    history.push(op("confirm", id("r1"), 200, t0, t1));
    history.push(op("release", id("r2"), 200, t0, t1));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    settle_until_now(&pg).await;
    assert!(archive_all(&pg).await >= 5, "the first run's rows went");

    // Later: r3 held, r4 reserved and released; then the retention job's removal past 1 s.
    let t2 = wall_ms();
    batch(
        &pg,
        "a",
        e1,
        &[
            ("reserve", "r3", 1),
            ("reserve", "r4", 1),
            ("adjust", "adj-2", 5),
        ],
    )
    .await;
    batch(&pg, "a", e1, &[("release", "r4", 0)]).await;
    let t3 = wall_ms();
    history.push(op("reserve", reserve("r3", 1), 201, t2, t3));
    history.push(op("reserve", reserve("r4", 1), 201, t2, t3));
    history.push(op("release", id("r4"), 200, t2, t3));
    history.push(op(
        "adjust",
        serde_json::json!({"adjustment_id": "adj-2", "sku": SKU, "delta": 5}),
        201,
        t2,
        t3,
    ));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let removed = pg
        .execute(
            "DELETE FROM reservations WHERE status <> 'held' AND updated_at < now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(removed, 3, "r1, r2 and r4 removed past the horizon");

    let dir = tempfile::tempdir().unwrap();
    chaos::dump::write(
        &pg,
        &dir.path().join("dump.json"),
        Some(Duration::from_secs(1)),
    )
    .await
    .expect("dump");
    std::fs::write(dir.path().join("history.jsonl"), history.join("\n") + "\n").unwrap();
    let check = |dir: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_chaos-check"))
            .arg(dir)
            .output()
            .expect("run chaos-check")
    };
    let out = check(dir.path());
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "archived and pruned history reported:\n{printed}"
    );
    assert!(printed.contains("checker: 0 violations"), "{printed}");

    // The same dump without what it says of the archive and the horizon.
    let mut dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("dump.json")).unwrap())
            .unwrap();
    let map = dump.as_object_mut().unwrap();
    map.remove("ledger_archives");
    map.remove("retention");
    std::fs::write(dir.path().join("dump.json"), dump.to_string()).unwrap();
    let out = check(dir.path());
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a missing prefix went unnoticed:\n{printed}"
    );
    for rule in ["oversell", "ledger-row-mismatch", "acked-hold-missing"] {
        let found = printed
            .lines()
            .find(|l| l.starts_with(rule))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        assert!(found > 0, "{rule} did not fire:\n{printed}");
    }
}
