//! `loadtest events`, the example consumer, after a fault: an allocator relays a load's changes to
//! Redis, Redis is restarted empty (it keeps nothing on disk) and the relay republishes what a
//! bounded stream holds; a consumer started afterwards gets every ledger entry exactly once by
//! position, in order, filling what Redis no longer has from `GET /v1/events`.
//!
//! Needs the allocator binary (`cargo build -p allocator`); `cargo test --workspace` builds it.

use std::process::Command;
use std::time::{Duration, Instant};

use testkit::shared::fresh_database;
use testkit::{cargo_bin, free_port, ChildProcess, RedisServer};

const PARTITIONS: u32 = 4;

fn loadtest(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(args)
        .output()
        .expect("run loadtest")
}

fn show(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Run the workload for `secs` seconds against `target`.
fn load(target: &str, secs: &str) {
    let common = ["--target", target, "--skus", "20", "--prefix", "ev"];
    let run = [
        "--concurrency",
        "4",
        "--duration-secs",
        secs,
        "--confirm-ratio",
        "0.4",
        "--release-ratio",
        "0.3",
        "--ttl-seconds",
        "1",
        "--settle-ms",
        "1500",
        "--progress-secs",
        "0",
    ];
    let out = loadtest(&[&["run"][..], &common, &run].concat());
    assert!(out.status.success(), "run: {}", show(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_after_a_redis_restart_gets_every_entry_once() {
    let allocator_bin = cargo_bin("allocator");
    assert!(
        allocator_bin.is_file(),
        "run `cargo build -p allocator` first"
    );
    let mut redis = RedisServer::start().await.expect("redis");
    let db_url = fresh_database("loadtest_events").await.expect("database");
    let migrate = Command::new(&allocator_bin)
        .args(["migrate", "--database-url", &db_url, "--partitions", "4"])
        .output()
        .expect("run allocator migrate");
    assert!(migrate.status.success(), "migrate: {}", show(&migrate));

    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "serve",
        "--database-url",
        &db_url,
        "--listen",
        &listen,
        "--replica-id",
        "ev-1",
        "--campaign-interval-ms",
        "200",
        "--expiry-interval-ms",
        "200",
        "--pool-size",
        "4",
        "--http-workers",
        "1",
        "--redis-url",
        &redis.url(),
        "--events",
        "true",
        "--events-interval-ms",
        "50",
        "--events-max-len",
        "10",
    ];
    let log = dir.path().join("allocator.log");
    let _allocator = ChildProcess::spawn(&allocator_bin, args, &[], &log).expect("spawn allocator");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seed = loadtest(&[
            "seed", "--target", &url, "--skus", "20", "--prefix", "ev", "--stock", "100000",
        ]);
        if seed.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "seed: {}", show(&seed));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    load(&url, "2");
    redis.start_again().await.expect("restart redis empty");
    load(&url, "1");
    // The relay's rounds are 50 ms apart; the consumer stops after 3 s without news.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let partitions = PARTITIONS.to_string();
    let out = loadtest(&[
        "events",
        "--redis-url",
        &redis.url(),
        "--partitions",
        &partitions,
        "--target",
        &url,
        "--idle-secs",
        "3",
    ]);
    assert!(out.status.success(), "events: {}", show(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");

    let pg = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(pg.1);
    let rows =
        pg.0.query(
            "SELECT partition, count(*), max(position) FROM ledger GROUP BY partition",
            &[],
        )
        .await
        .unwrap();
    let mut total = 0;
    for r in rows {
        let (p, n, max): (i32, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(n, max, "partition {p} numbered with a gap");
        assert_eq!(
            report["last_position"][format!("partition/{p}")],
            max,
            "{report}"
        );
        total += n;
    }
    let settled: i64 =
        pg.0.query_one(
            "SELECT coalesce(max(position), 0) FROM settlement_runs",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let consumed = report["applied"].as_i64().unwrap() + report["filled"].as_i64().unwrap();
    assert_eq!(consumed, total + settled, "every entry once: {report}");
    assert!(
        report["filled"].as_i64().unwrap() > 0,
        "nothing was missing from Redis: {report}"
    );
    assert_eq!(report["gaps"], 0, "{report}");
    assert_eq!(report["key_mismatches"], 0, "{report}");
}
