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

use access::table::hash_hex;
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
fn spawn_allocator(
    allocator_bin: &Path,
    db_url: &str,
    log: &Path,
    envs: &[(String, String)],
) -> ChildProcess {
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
    ChildProcess::spawn(allocator_bin, args, envs, log).expect("spawn allocator")
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

/// The allocator binary and a fresh database migrated with [`PARTITIONS`].
async fn migrated(name: &str) -> (std::path::PathBuf, String) {
    let allocator_bin = cargo_bin("allocator");
    assert!(
        allocator_bin.is_file(),
        "{} is missing: run `cargo build -p allocator` first",
        allocator_bin.display()
    );
    let db_url = fresh_database(name).await.expect("database");
    let migrate = Command::new(&allocator_bin)
        .args(["migrate", "--database-url", &db_url, "--partitions"])
        .arg(PARTITIONS.to_string())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run allocator migrate");
    assert!(migrate.status.success(), "migrate: {}", show(&migrate));
    (allocator_bin, db_url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_and_open_loop_keep_the_invariants() {
    let (allocator_bin, db_url) = migrated("loadtest_smoke").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("allocator.log");
    let _allocator = spawn_allocator(&allocator_bin, &db_url, &log, &[]);

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

const HOARDER: &str = "hoarder-token-5b7d9f1a3c6e";
const GREEDY: &str = "greedy-token-0c2e4a6b8d1f";
const OPS: &str = "ops-token-7a9c1e3b5d8f";
const ROUTER_TOKEN: &str = "router-token-2d4f6a8c0e1b";

/// `loadtest hoard` through a router with authentication: a hoarder with `max_held_per_sku=2`
/// keeps 16 reserves of a hot SKU in flight and ends holding 2 units while two other clients buy
/// the rest; the same attack by a client without the quota holds more than 2 (so the quota is
/// what stops it), and `--expect-quota 2` makes that run fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hoarding_client_is_held_to_its_quota_while_others_buy() {
    let (allocator_bin, db_url) = migrated("loadtest_hoard").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write file");
        path
    };
    let line = |name: &str, scopes: &str, token: &str, options: &str| {
        format!("{name} {scopes} {} {options}\n", hash_hex(token.as_bytes()))
    };
    let allocator_auth = file(
        "allocator-auth",
        line("router-1", "router", ROUTER_TOKEN, ""),
    );
    let buyers = ["buyer-token-1e3a5c7b9d2f", "buyer-token-8f6d4b2a0c9e"];
    let router_auth = file(
        "router-auth",
        [
            line("hoarder", "reserve", HOARDER, "max_held_per_sku=2"),
            line("greedy", "reserve", GREEDY, ""),
            line("buyer-1", "reserve", buyers[0], ""),
            line("buyer-2", "reserve", buyers[1], ""),
            line("ops", "reserve,admin", OPS, ""),
        ]
        .concat(),
    );
    let log = dir.path().join("allocator.log");
    let envs = [
        ("ALLOCATOR_AUTH_FILE", allocator_auth.display().to_string()),
        ("ALLOCATOR_REQUIRE_ROUTER", "true".to_owned()),
    ]
    .map(|(k, v)| (k.to_owned(), v));
    let _allocator = spawn_allocator(&allocator_bin, &db_url, &log, &envs);
    let mut config = RouterConfig::new(db_url.clone());
    config.listen = "127.0.0.1:0".to_owned();
    config.workers = Some(1);
    config.poll_interval = Duration::from_millis(200);
    config.access.auth_file = Some(router_auth);
    config.upstream_token_file = Some(file("router-token", ROUTER_TOKEN.to_owned()));
    let app = Application::build(config).await.expect("build router");
    let router_url = format!("http://127.0.0.1:{}", app.port());
    let shutdown = app.shutdown_token();
    let router_task = tokio::spawn(app.run_until_stopped());

    for sku in ["hoard:1", "hoard:2"] {
        restock(&router_url, sku, 200, &log).await;
    }
    let tokens = [HOARDER, GREEDY, buyers[0], buyers[1]].map(|t| file(t, t.to_owned()));
    let hoard = |sku: &str, hoarder: &Path, quota: &str| {
        let (b1, b2) = (tokens[2].to_str().unwrap(), tokens[3].to_str().unwrap());
        let args = [
            "hoard",
            "--target",
            &router_url,
            "--sku",
            sku,
            "--hoarders",
            "16",
            "--buyers-per-client",
            "4",
            "--duration-secs",
            "3",
            "--expect-quota",
            quota,
            "--hoarder-token-file",
            hoarder.to_str().unwrap(),
            "--buyer-token-file",
            b1,
            "--buyer-token-file",
            b2,
        ];
        let out = Command::new(env!("CARGO_BIN_EXE_loadtest"))
            .args(args)
            .output()
            .expect("run loadtest hoard");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("report: {e}: {}", show(&out)));
        (out, report)
    };

    let (out, report) = hoard("hoard:1", &tokens[0], "2");
    println!("with the quota: {report}");
    assert!(out.status.success(), "{}", show(&out));
    assert!(
        report["hoarder"]["units"].as_u64().unwrap() <= 2,
        "{report}"
    );
    assert!(
        report["hoarder"]["quota_refusals"].as_u64().unwrap() > 0,
        "{report}"
    );
    let bought = report["buyers"]["units"].as_u64().unwrap();
    assert!(bought > 0, "{report}");
    assert_eq!(report["confirmed"].as_u64(), Some(bought), "{report}");

    // The same attack without a quota: the hoarder takes more, and the check names it.
    let (out, report) = hoard("hoard:2", &tokens[1], "2");
    println!("without the quota: {report}");
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(report["hoarder"]["units"].as_u64().unwrap() > 2, "{report}");
    assert_eq!(report["hoarder"]["quota_refusals"], 0, "{report}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("over its max_held_per_sku 2"));

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), router_task).await;
}

/// Restock `sku` by `units` with the admin token, retrying until its partition has an owner.
async fn restock(router_url: &str, sku: &str, units: i64, log: &Path) {
    let http = reqwest::Client::new();
    let body = serde_json::json!({"adjustment_id": format!("seed-{sku}"), "delta": units});
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = http
            .post(format!("{router_url}/v1/inventory/{sku}/adjustments"))
            .bearer_auth(OPS)
            .json(&body)
            .send()
            .await;
        if answer.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sku} not restocked; log {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
