//! Change events with in-process replicas: ledger positions are gap-free and in commit order at
//! every moment, and the relay publishes every ledger row and settled window to Redis once, in
//! order, under the event contract's schemas (DESIGN.md §14).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allocator::config::AllocatorConfig;
use allocator::events::EventsConfig;
use schema::events::{EventPage, Stream};
use testkit::RedisServer;

use crate::common::*;
use crate::events_support::*;

/// A replica relaying to `redis_url`, with one-second settlement windows.
pub(crate) fn relay_config(db: &str, id: &str, redis_url: &str) -> AllocatorConfig {
    let mut config = fast_config(db, id);
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

/// A reader that snapshots the ledger while the load commits: in every snapshot each partition's
/// visible positions are exactly 1..n. A commit-time hole (a later position visible before an
/// earlier one) is what would make a relay skip an entry forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn positions_are_gap_free_in_every_snapshot_while_batches_commit() {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "pos-a")).await;
    wait_owns_all(&replica).await;
    stock(&replica.url).await;

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let db = db.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let client = client(&db).await;
            let mut snapshots = 0;
            while !done.load(Ordering::Relaxed) {
                let rows = client
                    .query(
                        "SELECT partition, count(*), max(position) FROM ledger GROUP BY partition",
                        &[],
                    )
                    .await
                    .expect("snapshot");
                for r in rows {
                    let (p, n, max): (i32, i64, i64) = (r.get(0), r.get(1), r.get(2));
                    assert_eq!(
                        n, max,
                        "partition {p}: {n} rows visible up to position {max}"
                    );
                }
                snapshots += 1;
            }
            snapshots
        })
    };
    mixed_load(&replica.url, "pos", 60).await;
    // Let the expiries of the last holds commit too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    done.store(true, Ordering::Relaxed);
    let snapshots = sampler.await.expect("sampler");
    assert!(snapshots > 10, "only {snapshots} snapshots taken");

    let events = database_events(&db).await;
    assert_gap_free(&events);
    let client = client(&db).await;
    // The counter names the last position given, and a hold's movements are numbered in order.
    let wrong_counters: i64 = client
        .query_one(
            "SELECT count(*) FROM ledger_positions AS p
              WHERE p.last_position <> (SELECT coalesce(max(position), 0) FROM ledger
                                         WHERE partition = p.partition)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        wrong_counters, 0,
        "a counter disagrees with its partition's ledger"
    );
    let out_of_order: i64 = client
        .query_one(
            "SELECT count(*) FROM ledger AS h JOIN ledger AS t
                ON t.reservation_id = h.reservation_id AND t.kind <> 'reserve'
             WHERE h.kind = 'reserve' AND t.position <= h.position",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(out_of_order, 0, "a transition numbered before its hold");
    let kinds: i64 = client
        .query_one("SELECT count(DISTINCT kind) FROM ledger", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kinds, 5,
        "restock, reserve, confirm, release and expire all written"
    );
    replica.stop().await;
}

/// Every ledger row and every settled window reaches Redis once, in order, equal to the
/// database's event and valid under its JSON Schema; progress is recorded in PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_every_change_once_in_order() {
    let redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(relay_config(&db, "relay-a", &redis.url())).await;
    wait_owns_all(&replica).await;
    stock(&replica.url).await;
    mixed_load(&replica.url, "relay", 30).await;
    // A settled window after the confirmations: the settlement stream has an event.
    let client = client(&db).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let settled: i64 = client
            .query_one(
                "SELECT count(*) FROM settlement_runs WHERE status = 'settled' AND quantity > 0",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if settled > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no window settled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_delivered(&db, &redis.url(), Duration::from_secs(20)).await;
    let delivered = assert_delivered_once(&db, &redis.url()).await;
    assert!(delivered > 100, "only {delivered} events");

    // Progress follows Redis's acknowledgements.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let behind: i64 = client
            .query_one(
                "SELECT count(*) FROM ledger_positions AS p
                   JOIN event_relay_progress AS r ON r.stream = 'partition/' || p.partition
                  WHERE r.published <> p.last_position",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if behind == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{behind} streams' progress not recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replica.stop().await;
}

/// A backlog of many batches is published in one catch-up burst, not one batch per pause: the
/// rate a hot partition commits at is not capped at `batch` per `interval`. Written with the relay
/// off, the backlog's longest stream needs more than 12 batches of 5; one batch per 3 s pause would
/// take longer than the 20 s allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_of_many_batches_is_published_without_a_pause_per_batch() {
    let redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    let writer = TestReplica::start(fast_config(&db, "backlog-writer")).await;
    wait_owns_all(&writer).await;
    stock(&writer.url).await;
    mixed_load(&writer.url, "backlog", 40).await;
    writer.stop().await;
    let longest = database_events(&db)
        .await
        .values()
        .map(Vec::len)
        .max()
        .unwrap_or(0);
    assert!(
        longest > 60,
        "the backlog's longest stream has only {longest} entries"
    );

    let mut config = relay_config(&db, "backlog-relay", &redis.url());
    config.events = Some(EventsConfig {
        batch: 5.try_into().unwrap(),
        max_len: 100_000.try_into().unwrap(),
        interval: Duration::from_secs(3),
    });
    let relay = TestReplica::start(config).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(20)).await;
    wait_no_holds(&db).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(20)).await;
    assert_delivered_once(&db, &redis.url()).await;
    relay.stop().await;
}

/// `GET /v1/events` pages through a stream from the database, equal to what the relay publishes,
/// and refuses a bad query with a problem, never a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_paged_from_the_database_and_bad_queries_are_refused() {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "ev-http")).await;
    wait_owns_all(&replica).await;
    stock(&replica.url).await;
    mixed_load(&replica.url, "http", 8).await;
    let http = http();
    for (stream, want) in database_events(&db).await {
        let Stream::Partition(p) = stream else {
            continue;
        };
        let mut got = Vec::new();
        let mut after = 0;
        loop {
            let url = format!(
                "{}/v1/events?partition={p}&after={after}&limit=7",
                replica.url
            );
            let page: EventPage = http.get(url).send().await.unwrap().json().await.unwrap();
            assert_eq!(page.stream, stream.name());
            if page.events.is_empty() {
                assert_eq!(page.next_after, after);
                break;
            }
            after = page.next_after;
            got.extend(page.events);
        }
        assert_eq!(got, want, "{stream:?} paged over HTTP");
    }
    // A partition number the cluster does not have names no stream: 404, not bad input (the
    // document cannot know the partition count).
    let answer = http
        .get(format!("{}/v1/events?partition=99", replica.url))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
    for bad in [
        "",
        "?partition=1&after=-1",
        "?partition=1&limit=0",
        "?partition=x",
    ] {
        let answer = http
            .get(format!("{}/v1/events{bad}", replica.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{bad}");
        let content_type = answer.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(content_type, schema::wire::PROBLEM_CONTENT_TYPE, "{bad}");
    }
    replica.stop().await;
}
