//! A few seconds of the load tool against a real allocator and router (private PostgreSQL from
//! the allocator's testkit): closed loop with orders and holds that expire during the run, then
//! open loop at a small rate. Each run must exit 0 — its invariant checks passed — and write its
//! per-second series into the JSON and as an SVG chart beside it; a broken row must make
//! `loadtest check` exit 1.
//!
//! Needs the allocator binary (`cargo build -p allocator`); `cargo test --workspace` builds it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use router::{Application, RouterConfig};
use testkit::shared::fresh_database;
use testkit::{cargo_bin, free_port, ChildProcess};

const PARTITIONS: u32 = 4;

/// `loadtest SUB --target ROUTER --skus 20 --prefix smoke EXTRA...`.
fn loadtest(sub: &str, target: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args([sub, "--target", target, "--skus", "20", "--prefix", "smoke"])
        .args(extra)
        .output()
        .expect("run loadtest")
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("json report")).expect("parse report")
}

/// The SVG chart beside `json` must parse and draw every second of the JSON's timeline, with
/// as many operations as the report counted.
fn assert_chart(json_path: &Path, report: &serde_json::Value) {
    let seconds = report["timeline"]["seconds"].as_array().expect("timeline");
    assert!(!seconds.is_empty(), "{report}");
    let total: u64 = seconds
        .iter()
        .map(|s| {
            ["ok", "out_of_stock", "error"]
                .iter()
                .map(|k| s[k].as_u64().expect("count"))
                .sum::<u64>()
        })
        .sum();
    assert_eq!(
        total,
        report["latency"]["count"].as_u64().unwrap(),
        "{report}"
    );
    let svg_path = json_path.with_extension("svg");
    let svg = std::fs::read_to_string(&svg_path)
        .unwrap_or_else(|e| panic!("{}: {e}", svg_path.display()));
    let doc = roxmltree::Document::parse(&svg).expect("chart is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    // The series' colours, as `chart::SERIES_COLOURS` draws them: each series is the polylines
    // of its colour.
    let points_of = |colour: &str| -> usize {
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(colour))
            .filter_map(|n| n.attribute("points"))
            .map(|p| p.split_whitespace().count())
            .sum()
    };
    for (name, colour) in [
        ("ok", "#2E7D32"),
        ("out_of_stock", "#EF6C00"),
        ("error", "#C62828"),
    ] {
        assert_eq!(points_of(colour), seconds.len(), "{name} in {svg}");
    }
    let with_latency = seconds.iter().filter(|s| !s["p99_ms"].is_null()).count();
    let p99_points = points_of("#6A1B9A");
    assert_eq!(p99_points, with_latency, "{svg}");
}

fn show(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One `allocator serve` replica on a free port with quick campaigns and expiry, logging to
/// `log`; it is stopped when the returned process is dropped.
fn spawn_allocator(allocator_bin: &Path, db_url: &str, log: &Path) -> ChildProcess {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let args: Vec<String> = [
        "serve",
        "--database-url",
        db_url,
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--replica-id",
        "smoke-1",
        "--advertise-url",
        &url,
        "--campaign-interval-ms",
        "200",
        "--expiry-interval-ms",
        "200",
        "--pool-size",
        "4",
        "--http-workers",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ChildProcess::spawn(allocator_bin, args, &[], log).expect("spawn allocator")
}

/// Wait until the router at `router_url` shows every partition owned; `log` is the allocator's,
/// named when it never happens.
async fn wait_until_every_partition_is_owned(router_url: &str, log: &Path) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owned = match http.get(format!("{router_url}/v1/partitions")).send().await {
            Ok(r) => r.json::<serde_json::Value>().await.ok().is_some_and(|m| {
                m["partitions"].as_array().is_some_and(|ps| {
                    ps.len() == PARTITIONS as usize && ps.iter().all(|p| !p["owner_id"].is_null())
                })
            }),
            Err(_) => false,
        };
        if owned {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "partitions not owned; log {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_and_open_loop_keep_the_invariants() {
    let allocator_bin = cargo_bin("allocator");
    assert!(
        allocator_bin.is_file(),
        "{} is missing: run `cargo build -p allocator` first",
        allocator_bin.display()
    );
    let db_url = fresh_database("loadtest_smoke").await.expect("database");
    let migrate = Command::new(&allocator_bin)
        .args(["migrate", "--database-url", &db_url, "--partitions"])
        .arg(PARTITIONS.to_string())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run allocator migrate");
    assert!(migrate.status.success(), "migrate: {}", show(&migrate));

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("allocator.log");
    let _allocator = spawn_allocator(&allocator_bin, &db_url, &log);

    let mut config = RouterConfig::new(db_url.clone());
    config.listen = "127.0.0.1:0".to_owned();
    config.workers = Some(1);
    config.poll_interval = Duration::from_millis(200);
    let app = Application::build(config).await.expect("build router");
    let router_url = format!("http://127.0.0.1:{}", app.port());
    let shutdown = app.shutdown_token();
    let router_task = tokio::spawn(app.run_until_stopped());

    wait_until_every_partition_is_owned(&router_url, &log).await;

    let seed = loadtest("seed", &router_url, &["--stock", "100000"]);
    assert!(seed.status.success(), "seed: {}", show(&seed));

    // Closed loop with orders; 1 s holds, so some expire during the run and are read back.
    let closed = dir.path().join("closed.json");
    let out = loadtest(
        "run",
        &router_url,
        &[
            "--concurrency",
            "4",
            "--duration-secs",
            "2",
            "--skew",
            "zipf:1.1",
            "--order-ratio",
            "0.2",
            "--order-lines",
            "2",
            "--ttl-seconds",
            "1",
            "--settle-ms",
            "1500",
            "--progress-secs",
            "0",
            "--json-out",
            closed.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "closed loop: {}", show(&out));
    let report = json(&closed);
    assert_eq!(report["invariants"]["ok"], true);
    assert!(
        report["ops"]["order"]["operations"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["invariants"]["expired"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert_chart(&closed, &report);

    // Open loop at 40/s for 1.5 s: 60 scheduled, every one started or counted as not started.
    let open = dir.path().join("open.json");
    let out = loadtest(
        "run",
        &router_url,
        &[
            "--rate",
            "40",
            "--max-in-flight",
            "8",
            "--duration-secs",
            "1.5",
            "--confirm-ratio",
            "0.3",
            "--release-ratio",
            "0.3",
            "--progress-secs",
            "0",
            "--json-out",
            open.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "open loop: {}", show(&out));
    let report = json(&open);
    let pacing = &report["pacing"];
    assert_eq!(pacing["scheduled"], 60, "{report}");
    assert_eq!(
        pacing["started"].as_u64().unwrap() + pacing["not_started"].as_u64().unwrap(),
        60,
        "{report}"
    );
    assert_eq!(report["invariants"]["ok"], true);
    assert_chart(&open, &report);

    // A row that no longer balances makes the check fail.
    let (client, connection) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(
            "ALTER TABLE inventory DROP CONSTRAINT inventory_balance;
             UPDATE inventory SET on_hand = on_hand + 1 WHERE sku = 'smoke-0';",
        )
        .await
        .expect("break a row");
    let out = loadtest("check", &router_url, &[]);
    assert_eq!(out.status.code(), Some(1), "check: {}", show(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("smoke-0"));

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), router_task).await;
}
