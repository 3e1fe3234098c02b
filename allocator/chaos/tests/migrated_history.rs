//! A database that held a run's data before the lease history existed, migrated to the latest
//! schema and then checked by `chaos-check`: the rows written before the migration must not be
//! reported as stale-epoch writes (their write times are the migration's, and the epochs they
//! were superseded by were never recorded), and the rows written after it must still be judged.
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
    pg.query_one(
        "UPDATE leases SET holder_id = $1, epoch = epoch + 1, acquired_at = clock_timestamp(),
                renewed_at = clock_timestamp(),
                expires_at = clock_timestamp() + interval '1 minute'
          WHERE name = 'partition/0'
      RETURNING epoch",
        &[&holder],
    )
    .await
    .expect("acquire partition/0")
    .get(0)
}

/// One fenced batch of `(op, id, amount)` commands on partition 0; every command must succeed.
async fn batch(pg: &Client, holder: &str, epoch: i64, commands: &[(&str, &str, i64)]) {
    let n = commands.len();
    let ops: Vec<&str> = commands.iter().map(|c| c.0).collect();
    let ids: Vec<&str> = commands.iter().map(|c| c.1).collect();
    let amounts: Vec<i64> = commands.iter().map(|c| c.2).collect();
    let skus: Vec<Option<&str>> = commands
        .iter()
        .map(|c| matches!(c.0, "reserve" | "adjust").then_some(SKU))
        .collect();
    let ttls: Vec<Option<i32>> = commands
        .iter()
        .map(|c| (c.0 == "reserve").then_some(600))
        .collect();
    let rows = pg
        .query(
            "SELECT o_result FROM apply_fenced_batch($1, ARRAY[0], ARRAY[$2::bigint], $3, $4, $5,
                                                     $6, $7, $8)",
            &[
                &holder,
                &epoch,
                &vec![0i32; n],
                &ops,
                &ids,
                &skus,
                &amounts,
                &ttls,
            ],
        )
        .await
        .expect("apply_fenced_batch");
    let results: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        results
            .iter()
            .all(|r| matches!(r.as_str(), "created" | "transitioned" | "adjusted")),
        "{commands:?} answered {results:?}"
    );
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
