//! When the router cannot get an answer within its retry deadline it says whether the request
//! may have been applied (`outcome_unknown`), and a client retry with the same id converges.
//! Also: the router starts (unready) without PostgreSQL, and the binary stops on SIGTERM.

use std::time::{Duration, Instant};

use crate::common::{http, owner_of, serial, Cluster};
use schema::partition::partition_for;
use schema::wire::{problem_type, Problem};
use serde_json::json;
use testkit::{free_port, ChildProcess};

const PARTITIONS: u32 = 8;

/// A SKU on a partition owned by `owner`.
fn sku_owned_by(map: &schema::wire::PartitionMap, owner: &str, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|sku| owner_of(map, partition_for(sku, PARTITIONS)).as_deref() == Some(owner))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_owner_yields_504_outcome_unknown_and_a_retry_converges() {
    let _serial = serial().await;
    let mut cluster = Cluster::start("giveup_frozen", 2, PARTITIONS).await;
    let router = cluster
        .router(|c| {
            // One attempt, capped by the deadline: the frozen owner never answers it.
            c.retry_deadline = Duration::from_millis(900);
        })
        .await;
    let map = cluster.map().await;
    let sku = sku_owned_by(&map, "alloc-0", "frozen");
    cluster.restock(&router.url, &sku, 10).await;

    cluster
        .allocator("alloc-0")
        .process
        .as_mut()
        .unwrap()
        .sigstop()
        .unwrap();
    let started = Instant::now();
    let response = http()
        .post(format!("{}/v1/reservations", router.url))
        .json(&json!({"reservation_id": "frozen-1", "sku": sku, "quantity": 1}))
        .send()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.status(), 504);
    let p: Problem = response.json().await.unwrap();
    assert_eq!(p.kind, problem_type::UPSTREAM_UNAVAILABLE);
    assert_eq!(
        p.outcome_unknown,
        Some(true),
        "a timed-out request may have been applied"
    );
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");

    // The owner wakes up (it finds its leases gone or takes them back); the client retries with
    // the same id until it gets a definitive answer, and there is exactly one hold.
    cluster
        .allocator("alloc-0")
        .process
        .as_mut()
        .unwrap()
        .sigcont()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let response = http()
            .post(format!("{}/v1/reservations", router.url))
            .json(&json!({"reservation_id": "frozen-1", "sku": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status != 503 && status != 504 {
            break status;
        }
        assert!(Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status == 201 || status == 200, "{status}");
    let rows: i64 = cluster
        .db()
        .await
        .query_one(
            "SELECT count(*) FROM reservations WHERE reservation_id = 'frozen-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reachable_owner_yields_503_outcome_not_applied() {
    let _serial = serial().await;
    let mut cluster = Cluster::start("giveup_down", 1, PARTITIONS).await;
    let router = cluster
        .router(|c| c.retry_deadline = Duration::from_millis(800))
        .await;
    cluster.restock(&router.url, "down-1", 10).await;
    cluster
        .allocator("alloc-0")
        .process
        .as_mut()
        .unwrap()
        .sigkill()
        .unwrap();
    // Give the router's connection pool a moment to notice the dead peer's closed keep-alive
    // connections: a request written into one of them just as the peer dies gets a reset, which
    // the router (correctly, conservatively) reports as outcome unknown.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The map still names the dead owner (its lease has not expired): connections are refused.
    let response = http()
        .post(format!("{}/v1/reservations", router.url))
        .json(&json!({"reservation_id": "down-r-1", "sku": "down-1", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let p: Problem = response.json().await.unwrap();
    assert_eq!(p.kind, problem_type::UPSTREAM_UNAVAILABLE);
    assert_eq!(
        p.outcome_unknown,
        Some(false),
        "nothing was ever sent: {p:?}"
    );
    assert_eq!(p.partition, Some(partition_for("down-1", PARTITIONS)));

    // Orders in the same situation: nothing could be held; release could not be confirmed
    // either, so the order's outcome is reported unknown and the client retries it later.
    let response = http()
        .post(format!("{}/v1/orders/down-o-1/reservations", router.url))
        .json(&json!({"lines": [{"sku": "down-1", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["outcome_unknown"], true, "{body}");
    assert_eq!(body["lines"][0]["outcome"], "unavailable");
    assert_eq!(body["lines"][0]["compensation"], "failed");

    // The replica comes back: the same order id now converges to a placed order.
    cluster.spawn_allocator("alloc-0");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = http()
            .post(format!("{}/v1/orders/down-o-1/reservations", router.url))
            .json(&json!({"lines": [{"sku": "down-1", "quantity": 1}]}))
            .send()
            .await
            .unwrap();
        if response.status() == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "order never placed: {}",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_unready_without_postgres_and_answers_503() {
    let _serial = serial().await;
    let mut config =
        router::RouterConfig::new(format!("postgres://postgres@127.0.0.1:{}/x", free_port()));
    config.listen = "127.0.0.1:0".into();
    config.db_timeout = Duration::from_millis(300);
    config.retry_deadline = Duration::from_millis(300);
    config.workers = Some(1);
    let router = crate::common::TestRouter::start(config).await;
    let client = http();
    let ready = client
        .get(format!("{}/readyz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready.headers().get("retry-after").is_some());
    let not_ready: Problem = ready.json().await.unwrap();
    assert_eq!(
        not_ready.kind,
        schema::wire::problem_type::STORAGE_UNAVAILABLE
    );
    let health = client
        .get(format!("{}/healthz", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let response = client
        .post(format!("{}/v1/reservations", router.url))
        .json(&json!({"reservation_id": "x", "sku": "s", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let p: Problem = response.json().await.unwrap();
    assert_eq!(p.outcome_unknown, Some(false));
    let response = client
        .get(format!("{}/v1/reservations/x", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let p: Problem = response.json().await.unwrap();
    assert_eq!(p.kind, problem_type::STORAGE_UNAVAILABLE);
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_from_env_and_stops_on_sigterm() {
    let _serial = serial().await;
    let cluster = Cluster::start("giveup_bin", 1, PARTITIONS).await;
    let port = free_port();
    let log = cluster.log_dir.join("router.log");
    let mut process = ChildProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_router")),
        ["serve"],
        &[
            ("DATABASE_URL".into(), cluster.db_url.clone()),
            ("REDIS_URL".into(), cluster.redis.url()),
            ("ROUTER_LISTEN".into(), format!("127.0.0.1:{port}")),
            ("ROUTER_POLL_INTERVAL_MS".into(), "500".into()),
            ("ROUTER_RETRY_DEADLINE_MS".into(), "3000".into()),
            ("RUST_LOG".into(), "info".into()),
        ],
        &log,
    )
    .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = http().get(format!("{base}/readyz")).send().await {
            if r.status() == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "router never ready: {}",
            process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.restock(&base, "bin-1", 3).await;
    process.sigterm().unwrap();
    let status = process.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(status.success(), "{status}: {}", process.log_tail(20));
    // Logs are JSON lines with lowercase messages and structured fields.
    let logs = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not json ({e}): {l}")))
        .collect();
    let messages: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["fields"]["message"].as_str())
        .collect();
    for expected in [
        "assignment map loaded",
        "router listening",
        "redis feed connected",
        "router stopped",
    ] {
        assert!(messages.contains(&expected), "{expected} in {messages:?}");
    }
    let ours = lines
        .iter()
        .filter(|l| {
            l["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("router"))
        })
        .filter_map(|l| l["fields"]["message"].as_str());
    for message in ours {
        assert!(
            message.chars().next().is_none_or(|c| !c.is_uppercase()),
            "{message}"
        );
    }
}
