//! The router's Redis feed of ownership hints: with Redis down, polling alone follows an
//! ownership change (and a router started meanwhile still serves); with polling off, hints alone
//! keep the map current; a frozen (SIGSTOPped) Redis is noticed by the feed's ping and the feed
//! reconnects when Redis comes back. Routing never depends on Redis.

use std::time::{Duration, Instant};

use crate::common::{balanced, http, metric, owner_of, serial, Cluster};
use schema::partition::partition_for;
use serde_json::json;

const PARTITIONS: u32 = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_polling_follows_an_ownership_change() {
    let _serial = serial().await;
    let mut cluster = Cluster::start("failover_redis", 3, PARTITIONS).await;
    let router = cluster
        .router(|c| c.poll_interval = Duration::from_millis(300))
        .await;
    wait_metric(&router.url, "router_redis_feed_connected", 1.0).await;
    let skus: Vec<String> = (0..32).map(|i| format!("redis-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100).await;
    }

    // Redis goes away: the feed notices (ping) and the router keeps serving.
    cluster.redis.stop().unwrap();
    wait_metric(&router.url, "router_redis_feed_connected", 0.0).await;
    // A router started while Redis is down starts, loads the map and serves.
    let late_router = cluster
        .router(|c| c.poll_interval = Duration::from_millis(300))
        .await;
    let response = http()
        .post(format!("{}/v1/reservations", late_router.url))
        .json(&json!({"reservation_id": "redis-late", "sku": skus[0], "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);

    // Ownership changes with no hints: alloc-0 stops gracefully (releases its leases).
    let polls_before = metric(&router.url, "router_map_refreshes_total{cause=\"poll\"}").await;
    let process = cluster.allocator("alloc-0").process.as_mut().unwrap();
    process.sigterm().unwrap();
    process.wait_exit(Duration::from_secs(15)).await.unwrap();
    let map = cluster
        .wait_map(Duration::from_secs(20), |m| {
            balanced(m, &["alloc-1", "alloc-2"], PARTITIONS as usize / 2)
        })
        .await;
    // No traffic, no hints: only the poll can bring the router's map up to date.
    let deadline = Instant::now() + Duration::from_secs(3);
    while router.revision() < Some(map.revision) {
        assert!(
            Instant::now() < deadline,
            "router map stuck at {:?}, database at {}",
            router.revision(),
            map.revision
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(metric(&router.url, "router_map_refreshes_total{cause=\"poll\"}").await > polls_before);

    // Routing is correct straight away: no 421, no connect error to the stopped replica.
    let misdirected = metric(&router.url, "router_retries_total{cause=\"misdirected\"}").await;
    let connect = metric(&router.url, "router_retries_total{cause=\"connect\"}").await;
    let client = http();
    for (i, sku) in skus.iter().enumerate() {
        let response = client
            .post(format!("{}/v1/reservations", router.url))
            .json(&json!({"reservation_id": format!("redis-r-{i}"), "sku": sku, "quantity": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{sku}");
        let served_by = response.headers()["x-served-by"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            Some(served_by),
            owner_of(&map, partition_for(sku, PARTITIONS))
        );
    }
    assert_eq!(
        metric(&router.url, "router_retries_total{cause=\"misdirected\"}").await,
        misdirected
    );
    assert_eq!(
        metric(&router.url, "router_retries_total{cause=\"connect\"}").await,
        connect
    );

    // Redis returns: the feed reconnects on its own and re-reads the map.
    let reconnects = metric(
        &router.url,
        "router_map_refreshes_total{cause=\"reconnect\"}",
    )
    .await;
    cluster.redis.start_again().await.unwrap();
    wait_metric(&router.url, "router_redis_feed_connected", 1.0).await;
    assert!(
        metric(
            &router.url,
            "router_map_refreshes_total{cause=\"reconnect\"}"
        )
        .await
            > reconnects
    );
    late_router.stop().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hints_refresh_the_map_without_polling() {
    let _serial = serial().await;
    let mut cluster = Cluster::start("failover_hints", 3, PARTITIONS).await;
    let router = cluster
        .router(|c| c.poll_interval = Duration::from_secs(3600))
        .await;
    wait_metric(&router.url, "router_redis_feed_connected", 1.0).await;
    let hints_before = metric(&router.url, "router_map_refreshes_total{cause=\"hint\"}").await
        + metric(&router.url, "router_map_refreshes_total{cause=\"gap\"}").await;
    let started = Instant::now();
    let process = cluster.allocator("alloc-0").process.as_mut().unwrap();
    process.sigterm().unwrap();
    process.wait_exit(Duration::from_secs(15)).await.unwrap();
    let map = cluster
        .wait_map(Duration::from_secs(20), |m| {
            balanced(m, &["alloc-1", "alloc-2"], PARTITIONS as usize / 2)
        })
        .await;
    let settled = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(3);
    while router.revision() < Some(map.revision) {
        assert!(
            Instant::now() < deadline,
            "hints did not refresh the map: router at {:?}, database at {}",
            router.revision(),
            map.revision
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hints = metric(&router.url, "router_map_refreshes_total{cause=\"hint\"}").await
        + metric(&router.url, "router_map_refreshes_total{cause=\"gap\"}").await
        - hints_before;
    assert!(hints >= 1.0);
    let cached = router.cache.current().unwrap();
    for p in &map.partitions {
        assert_eq!(
            cached.destination(p.partition).map(|r| r.owner_id),
            p.owner_id,
            "partition {}",
            p.partition
        );
    }
    println!(
        "graceful stop of alloc-0: database map settled {} ms after sigterm, router map current \
         {} ms after sigterm without polling ({hints} hint-driven re-reads)",
        settled.as_millis(),
        started.elapsed().as_millis()
    );
    router.stop().await;
}

async fn wait_metric(base: &str, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let current = metric(base, series).await;
        if current == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {current}, expected {value}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_detected_by_ping_and_the_feed_recovers() {
    let _serial = serial().await;
    let cluster = Cluster::start("failover_frozen_redis", 1, 4).await;
    let router = cluster.router(|_| {}).await;
    wait_metric(&router.url, "router_redis_feed_connected", 1.0).await;
    // SIGSTOP: the TCP connection stays open but nothing answers; only the ping can tell.
    cluster.redis.pause().unwrap();
    wait_metric(&router.url, "router_redis_feed_connected", 0.0).await;
    // Routing does not depend on Redis.
    cluster.restock(&router.url, "frozen-redis-1", 1).await;
    cluster.redis.resume().unwrap();
    wait_metric(&router.url, "router_redis_feed_connected", 1.0).await;
    router.stop().await;
}
