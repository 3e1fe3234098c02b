//! Change events over two shards (DESIGN.md §12, §14): each shard's relay publishes its own
//! settled windows to its own stream, `events:settlement` for the catalog shard and
//! `events:settlement:<shard>` for every other, each numbered 1, 2, 3, … by that shard's
//! database; the two never share a stream.

use std::time::{Duration, Instant};

use allocator::config::AllocatorConfig;
use allocator::events::EventsConfig;
use reqwest::StatusCode;
use serde_json::Value;
use testkit::RedisServer;

use crate::common::*;
use crate::events_support::read_redis;

/// Shards `s0` (the catalog) and `s1` over two fresh databases.
async fn migrated_two_shards() -> (String, String) {
    let a = testkit::shared::fresh_database("evshard-a").await.unwrap();
    let b = testkit::shared::fresh_database("evshard-b").await.unwrap();
    let args = allocator::config::MigrateArgs {
        database_url: None,
        shards: [("s0", &a), ("s1", &b)]
            .iter()
            .map(|(name, url)| format!("{name}={url}").parse().expect("shard target"))
            .collect(),
        partitions: Some(PARTITIONS),
        ledger_partition_span_secs: None,
    };
    allocator::shard::migrate(&args)
        .await
        .expect("migrate two shards");
    (a, b)
}

/// A replica relaying to `redis_url` with one-second settlement windows.
fn relay_on(mut config: AllocatorConfig, redis_url: &str) -> AllocatorConfig {
    config.redis_url = Some(redis_url.to_owned());
    config.events = Some(EventsConfig {
        batch: 100.try_into().unwrap(),
        max_len: 100_000.try_into().unwrap(),
        interval: Duration::from_millis(50),
    });
    config.settlement_window = Duration::from_secs(1);
    config.settlement_grace = Duration::from_millis(1500);
    config
}

/// The settled windows' positions of one database, in order.
async fn settled_positions(db: &str) -> Vec<i64> {
    client(db)
        .await
        .query(
            "SELECT position FROM settlement_runs WHERE position IS NOT NULL ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Settled windows with confirmed quantity in one database.
async fn windows_with_quantity(db: &str) -> i64 {
    client(db)
        .await
        .query_one(
            "SELECT count(*) FROM settlement_runs WHERE status = 'settled' AND quantity > 0",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Confirm `n` reservations of `sku` through `replica`.
async fn confirm_some(replica: &TestReplica, tag: &str, sku: &str, n: usize) {
    for i in 0..n {
        let id = format!("{tag}-{i}");
        assert_eq!(
            reserve(&replica.api, &id, sku, 1).await.status,
            StatusCode::CREATED,
            "{id}"
        );
        assert!(replica.api.confirm(&id).await.status.is_success(), "{id}");
    }
}

/// Positions, dedupe keys and window starts of a Redis stream's entries.
fn entries(redis: &std::collections::BTreeMap<String, Vec<(String, String, Value)>>, key: &str) -> Vec<(i64, String, String)> {
    redis
        .get(key)
        .map(|entries| {
            entries
                .iter()
                .map(|(_, dedupe, json)| {
                    (
                        json["position"].as_i64().expect("a position"),
                        dedupe.clone(),
                        json["window_start"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The window starts of a database's settled windows, as RFC 3339 text in position order.
async fn window_starts(db: &str) -> Vec<String> {
    client(db)
        .await
        .query(
            "SELECT window_start FROM settlement_runs WHERE position IS NOT NULL ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let t: chrono::DateTime<chrono::Utc> = r.get(0);
            serde_json::to_value(t).unwrap().as_str().unwrap().to_owned()
        })
        .collect()
}

/// Two shards, each settling windows with its own relay: the catalog's windows are
/// `events:settlement` (`settlement:N`), s1's are `events:settlement:s1` (`settlement/s1:N`),
/// each stream numbered 1..n like its database and complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_shard_publishes_its_settled_windows_to_its_own_stream() {
    let redis = RedisServer::start().await.expect("start redis");
    let (a, b) = migrated_two_shards().await;
    let r0 = TestReplica::start(relay_on(fast_config(&a, "evs-r0"), &redis.url())).await;
    let r1 = TestReplica::start(relay_on(
        fast_config_with(&b, "evs-r1", &["--catalog-url", &a]),
        &redis.url(),
    ))
    .await;
    let (sku_a, sku_b) = (sku_in(1, "evs-a"), sku_in(6, "evs-b"));
    // Each replica owns its shard's partitions before it is asked to serve them.
    let deadline = Instant::now() + Duration::from_secs(15);
    while r0.ownership.held().len() < 4 || r1.ownership.held().len() < 4 {
        assert!(Instant::now() < deadline, "shards not owned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    restock(&r0.url, &sku_a, 1000).await;
    restock(&r1.url, &sku_b, 1000).await;
    // Two rounds of confirmations a window apart: windows with quantity on both shards.
    for round in 0..2 {
        confirm_some(&r0, &format!("evs-a{round}"), &sku_a, 3).await;
        confirm_some(&r1, &format!("evs-b{round}"), &sku_b, 4).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while windows_with_quantity(&a).await < 1 || windows_with_quantity(&b).await < 1 {
        assert!(Instant::now() < deadline, "no window settled on both shards");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Wait until each stream holds its database's last settled position (or time runs out).
    let streams = [("events:settlement", &a, "settlement"), ("events:settlement:s1", &b, "settlement/s1")];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let have = read_redis(&redis.url()).await;
        let mut caught_up = true;
        for (key, db, _) in streams {
            let want = settled_positions(db).await;
            let got = entries(&have, key);
            caught_up &= got.last().map(|e| e.0) == want.last().copied();
        }
        if caught_up || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    r0.stop().await;
    r1.stop().await;

    let have = read_redis(&redis.url()).await;
    for (key, db, name) in streams {
        let want = settled_positions(db).await;
        assert!(!want.is_empty(), "{name}: nothing settled");
        assert_eq!(
            want,
            (1..=want.len() as i64).collect::<Vec<_>>(),
            "{name}: the database numbers 1..n"
        );
        let expected: Vec<(i64, String, String)> = want
            .iter()
            .zip(window_starts(db).await)
            .map(|(p, start)| (*p, format!("{name}:{p}"), start))
            .collect();
        let got = entries(&have, key);
        assert_eq!(got, expected, "{key}: each of its shard's windows once, in order");
    }
}
