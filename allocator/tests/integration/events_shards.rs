//! Change events over two shards (DESIGN.md §12, §14): each shard's relay publishes its own
//! settled windows to its own stream, `events:settlement` for the catalog shard and
//! `events:settlement:<shard>` for every other, each numbered 1, 2, 3, … by that shard's
//! database; the two never share a stream.

use std::collections::BTreeMap;
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
pub(crate) fn relay_on(mut config: AllocatorConfig, redis_url: &str) -> AllocatorConfig {
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

/// One settled window as a stream entry or a database row shows it: position, dedupe key,
/// window start, reservations and units (the units tell the two shards' windows apart: the
/// windows themselves start at the same instants on both).
type Window = (i64, String, String, i64, i64);

/// The settled windows of a Redis stream's entries.
fn entries(redis: &BTreeMap<String, Vec<(String, String, Value)>>, key: &str) -> Vec<Window> {
    let Some(entries) = redis.get(key) else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|(_, dedupe, json)| {
            (
                json["position"].as_i64().expect("a position"),
                dedupe.clone(),
                json["window_start"].as_str().unwrap_or_default().to_owned(),
                json["reservations"].as_i64().unwrap_or(-1),
                json["total_quantity"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// A database's settled windows in position order, as `stream`'s entries must carry them.
async fn database_windows(db: &str, stream: &str) -> Vec<Window> {
    client(db)
        .await
        .query(
            "SELECT position, window_start, coalesce(reservations, 0), coalesce(quantity, 0)
               FROM settlement_runs WHERE position IS NOT NULL ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let position: i64 = r.get(0);
            let start: chrono::DateTime<chrono::Utc> = r.get(1);
            (
                position,
                format!("{stream}:{position}"),
                serde_json::to_value(start)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned(),
                r.get(2),
                r.get(3),
            )
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
        assert!(
            Instant::now() < deadline,
            "no window settled on both shards"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Wait until each stream holds its database's last settled position (or time runs out).
    let streams = [
        ("events:settlement", &a, "settlement"),
        ("events:settlement:s1", &b, "settlement/s1"),
    ];
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
    // `GET /v1/events` answers a shard's settlement stream from its own database only.
    let mut wrong = Vec::new();
    let http = http();
    let get = |base: &str, stream: &str| {
        let url = format!("{base}/v1/events?partition={stream}&limit=1000");
        let request = http.get(url).send();
        async move {
            let answer = request.await.unwrap();
            let status = answer.status();
            (status, answer.json::<Value>().await.unwrap_or_default())
        }
    };
    for (base, stream, db) in [(&r0.url, "settlement", &a), (&r1.url, "settlement/s1", &b)] {
        let (status, page) = get(base, stream).await;
        let want = database_windows(db, stream).await;
        let got: Vec<i64> = page["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|e| e["position"].as_i64())
                    .collect()
            })
            .unwrap_or_default();
        let keys_ok = page["events"].as_array().is_some_and(|events| {
            events.iter().all(|e| {
                e["key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with(&format!("{stream}:")))
            })
        });
        // The database may have settled a window since: a prefix of it, at least the first.
        let prefix = want.iter().map(|w| w.0).take(got.len()).collect::<Vec<_>>();
        if status != StatusCode::OK
            || page["stream"] != stream
            || got.is_empty()
            || got != prefix
            || !keys_ok
        {
            wrong.push(format!("GET {stream} from its shard: {status} {page}"));
        }
    }
    for (base, stream) in [
        (&r1.url, "settlement"),
        (&r0.url, "settlement/s1"),
        (&r1.url, "settlement/s9"),
    ] {
        let (status, page) = get(base, stream).await;
        if status != StatusCode::NOT_FOUND {
            wrong.push(format!(
                "GET {stream} from another shard's replica: {status} {page}"
            ));
        }
    }
    r0.stop().await;
    r1.stop().await;

    let have = read_redis(&redis.url()).await;
    for (key, db, name) in streams {
        let want = database_windows(db, name).await;
        assert!(!want.is_empty(), "{name}: nothing settled");
        let positions: Vec<i64> = want.iter().map(|w| w.0).collect();
        assert_eq!(
            positions,
            (1..=want.len() as i64).collect::<Vec<_>>(),
            "{name}: the database numbers 1..n"
        );
        let got = entries(&have, key);
        if got != want {
            wrong.push(format!("{key}:\n  Redis    {got:?}\n  database {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "streams that do not hold exactly their shard's windows, in order:\n{}",
        wrong.join("\n")
    );
}
