//! Archiving the ledger's oldest time partitions (DESIGN.md §8a): by the admin command, which
//! writes files that `sha256sum -c` accepts and that restore to exactly the rows that were
//! dropped; refused while the partition is inside the horizon, unsettled or unrelayed; and by
//! the retention job, with settlement going on across the archived boundary.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allocator::retention::archive::{self, ArchiveSettings, Archived};

use crate::common::*;
use crate::ledger_support::*;

const SKUS: [&str; 3] = ["arch-a", "arch-b", "arch-c"];

fn allocator_command(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_allocator"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run allocator")
}

/// Every archive file the database records, with its row count and sums.
async fn recorded_archives(pg: &tokio_postgres::Client) -> Vec<(String, PathBuf, i64, [i64; 4])> {
    pg.query(
        "SELECT name, file, rows, d_on_hand, d_available, d_held, d_confirmed
           FROM ledger_archives ORDER BY range_end",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| {
        let file: String = r.get(1);
        (
            r.get(0),
            PathBuf::from(file),
            r.get(2),
            [r.get(3), r.get(4), r.get(5), r.get(6)],
        )
    })
    .collect()
}

/// The command archives the partitions that may go; each file passes `sha256sum -c`, restores
/// into a table of its own with the recorded count and sums, and the restored rows with the
/// ledger left are exactly the ledger before archiving; a damaged file is refused.
#[tokio::test]
async fn the_command_archives_into_files_that_restore_exactly_the_dropped_rows() {
    let db = migrated_database_with_span(PARTITIONS, 2).await;
    let replica = TestReplica::start(fast_config_with(
        &db,
        "arch-cmd",
        &[
            "--idempotency-horizon-secs",
            "1",
            "--settlement-window-secs",
            "1",
        ],
    ))
    .await;
    wait_owns_all(&replica).await;
    for sku in SKUS {
        restock(&replica.url, sku, 1_000_000).await;
    }
    resolved_load(&replica, "cmd", &SKUS, Duration::from_secs(5)).await;
    let pg = client(&db).await;
    let whole = digest(&pg, "ledger").await;
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().to_str().unwrap();
    let args = [
        "ledger",
        "archive",
        "--database-url",
        &db,
        "--to",
        to,
        "--idempotency-horizon-secs",
        "1",
    ];
    // Settlement (1 s windows, 3 s grace) and the horizon let the load's partitions go within
    // seconds; archive until what the load wrote is all archived.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let out = allocator_command(&args);
        assert!(out.status.success(), "{out:?}");
        let live = sums(&pg, "ledger").await.0;
        if live == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{live} rows left");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    replica.stop().await;

    let archives = recorded_archives(&pg).await;
    let mut restored_tables = Vec::new();
    for (i, (name, file, rows, recorded)) in archives.iter().enumerate() {
        assert!(
            pg.query_opt("SELECT to_regclass($1)::text", &[name])
                .await
                .unwrap()
                .and_then(|r| r.get::<_, Option<String>>(0))
                .is_none(),
            "{name} was dropped"
        );
        assert!(sha256sum_accepts(file), "sha256sum -c {}", file.display());
        let table = format!("restored_{i}");
        let out = allocator_command(&[
            "ledger",
            "restore",
            "--database-url",
            &db,
            "--from",
            file.to_str().unwrap(),
            "--into",
            &table,
        ]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            sums(&pg, &table).await,
            (*rows, *recorded),
            "{name}: restored as recorded"
        );
        restored_tables.push(format!("SELECT * FROM {table}"));
    }
    assert!(archives.iter().map(|a| a.2).sum::<i64>() > 0, "rows went");
    restored_tables.push("SELECT * FROM ledger".into());
    let union = format!("({})", restored_tables.join(" UNION ALL "));
    assert_eq!(
        digest(&pg, &union).await,
        whole,
        "archived and left: every row once"
    );
    for sku in SKUS {
        let (row, ledger) = ledger_balance(&pg, sku).await;
        assert_eq!(
            row, ledger,
            "{sku}: archived sums and the rows left make the row"
        );
    }
    refuses_a_damaged_file(&db, &archives[archives.len() - 1].1);
}

fn refuses_a_damaged_file(db: &str, file: &Path) {
    let damaged = file.with_file_name("damaged.csv");
    let mut bytes = std::fs::read(file).unwrap();
    let last = bytes.len() - 2;
    bytes[last] = if bytes[last] == b'1' { b'2' } else { b'1' };
    std::fs::write(&damaged, bytes).unwrap();
    std::fs::copy(
        archive::checksum_path(file),
        archive::checksum_path(&damaged),
    )
    .unwrap();
    let out = allocator_command(&[
        "ledger",
        "restore",
        "--database-url",
        db,
        "--from",
        damaged.to_str().unwrap(),
        "--into",
        "restored_damaged",
    ]);
    assert!(!out.status.success(), "a damaged file was restored");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SHA-256"),
        "{out:?}"
    );
}

/// The oldest partition is kept while it is inside the horizon, while a window over it is
/// unsettled, and while the relay has not published every position in it; then it goes. A
/// later partition never goes before it.
#[tokio::test]
async fn a_partition_is_kept_until_past_the_horizon_settled_and_relayed() {
    let db = migrated_database_with_span(PARTITIONS, 1).await;
    let pg = client(&db).await;
    // In the oldest partition (it has no lower bound), numbered one row at a time.
    pg.batch_execute(
        "INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available,
                             d_held, d_confirmed, epoch, recorded_at)
         SELECT 'keep-' || g, g % 8, 'restock', 'keep-adj-' || g, 5, 5, 0, 0, 1,
                now() - interval '1 minute'
           FROM generate_series(1, 100) AS g",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = |horizon_secs: u64, require_relay: bool| ArchiveSettings {
        dir: dir.path().to_path_buf(),
        horizon: Duration::from_secs(horizon_secs),
        require_relay,
    };
    let refused = |outcome: Archived| match outcome {
        Archived::Refused { reason, .. } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let attempt = |s: ArchiveSettings| {
        let pg = &pg;
        async move { archive::archive_oldest(pg, &s, None, None).await.unwrap() }
    };

    let reason = refused(attempt(settings(3600, false)).await);
    assert!(
        reason.contains("inside the idempotency horizon"),
        "{reason}"
    );
    let reason = refused(attempt(settings(1, false)).await);
    assert!(reason.contains("not settled"), "{reason}");
    settle_until_now(&pg).await;
    let reason = refused(attempt(settings(1, true)).await);
    assert!(reason.contains("not relayed"), "{reason}");
    let second: String = pg
        .query_one(
            "SELECT name FROM ledger_partitions ORDER BY range_end OFFSET 1 LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let not_oldest: Option<String> = pg
        .query_one(
            "SELECT ledger_archive_refusal($1, interval '1 second', false)",
            &[&second],
        )
        .await
        .unwrap()
        .get(0);
    assert!(not_oldest.unwrap().contains("not the oldest"));
    assert_eq!(sums(&pg, "ledger_archives").await.0, 0, "nothing went yet");
    publish_everything(&pg).await;
    let mut archived_rows = 0;
    while archived_rows < 100 {
        match attempt(settings(1, false)).await {
            Archived::Done(p) => archived_rows += p.rows,
            other => panic!("the restocks' partitions may go now: {other:?}"),
        }
    }
    assert_eq!(archived_rows, 100);
    assert_eq!(sums(&pg, "ledger").await.0, 0);
}
