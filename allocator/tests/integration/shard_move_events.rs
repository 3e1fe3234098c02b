//! No gap in a partition's event stream across a move (DESIGN.md §12, §14, I14). A move into a
//! shard that archived the time of some of the source's rows folds those rows into archived
//! totals, where the target's relay never publishes them; so while the source's relay has not
//! published them the move waits, then refuses before the fence. Here the source's Redis is
//! frozen after part of the partition's rows were published, the target archives past the
//! unpublished rows' time, the move is refused; with Redis back it goes through, and the
//! partition's stream in Redis holds positions 1, 2, 3, … with none missing, the target's own
//! rows after the move included.

use std::time::{Duration, Instant};

use allocator::shard::MoveOptions;
use reqwest::StatusCode;
use schema::events::Stream;
use schema::shard::ShardName;
use testkit::RedisServer;

use crate::common::*;
use crate::events_shards::relay_on;
use crate::events_support::read_redis;
use crate::shard_moves::two_shards;
use crate::shard_moves_archived::archive_through;

const MOVED: u32 = 1;

/// The partition's (last position, published position) on `db`.
async fn progress(db: &tokio_postgres::Client) -> (i64, i64) {
    let r = db
        .query_one(
            "SELECT (SELECT last_position FROM ledger_positions WHERE partition = $1),
                    (SELECT published FROM event_relay_progress
                      WHERE stream = 'partition/' || $1::int)",
            &[&(MOVED as i32)],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

async fn wait_published(db: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (last, published) = progress(db).await;
        if published >= last {
            return;
        }
        assert!(Instant::now() < deadline, "published {published} of {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn holds(replica: &TestReplica, sku: &str, prefix: &str, n: usize) {
    for i in 0..n {
        assert_eq!(
            reserve(&replica.api, &format!("{prefix}-{i}"), sku, 1)
                .await
                .status,
            StatusCode::CREATED
        );
    }
}

#[tokio::test]
async fn a_move_does_not_fold_unpublished_rows_and_leaves_the_stream_contiguous() {
    let redis = RedisServer::start().await.expect("start redis");
    let (a, b, shards) = two_shards("mvevents", Some(2)).await;
    let r0 = TestReplica::start(relay_on(fast_config(&a, "r0"), &redis.url())).await;
    let r1 = TestReplica::start(relay_on(
        fast_config_with(&b, "r1", &["--catalog-url", &a]),
        &redis.url(),
    ))
    .await;
    let (db0, db1) = (client(&a).await, client(&b).await);
    let sku = sku_in(MOVED, "gap");
    restock(&r0.url, &sku, 1_000).await;
    holds(&r0, &sku, "published", 5).await;
    wait_published(&db0).await;

    // The source's relay stalls; more rows, which it cannot publish.
    redis.pause().expect("freeze redis");
    holds(&r0, &sku, "stalled", 5).await;
    let (last, published) = progress(&db0).await;
    assert!(
        published < last,
        "the relay published while Redis was frozen"
    );
    // The target archives past those rows' time: the move would fold them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now: chrono::DateTime<chrono::Utc> =
        db1.query_one("SELECT now()", &[]).await.unwrap().get(0);
    assert!(archive_through(&db1, now).await > 0, "s1 archived nothing");

    let to: ShardName = "s1".parse().unwrap();
    let hurried = MoveOptions {
        relay_wait: Some(Duration::from_secs(1)),
        ..MoveOptions::default()
    };
    let refused = allocator::shard::move_partition_with(&shards, MOVED, &to, &hurried)
        .await
        .expect_err("a move that folds unpublished rows is refused");
    assert!(format!("{refused:#}").contains("gap"), "{refused:#}");
    let holder: Option<String> = db0
        .query_one(
            "SELECT holder_id FROM leases WHERE partition = $1",
            &[&(MOVED as i32)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holder.as_deref(), Some("r0"), "the source was fenced");

    // With Redis back, the move waits for the relay and goes through.
    redis.resume().expect("thaw redis");
    let patient = MoveOptions {
        relay_wait: Some(Duration::from_secs(20)),
        ..MoveOptions::default()
    };
    let moved = allocator::shard::move_partition_with(&shards, MOVED, &to, &patient)
        .await
        .expect("move");
    assert!(moved.ledger_rows_folded > 0, "nothing folded: {moved:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !r1.ownership.held().iter().any(|t| t.partition == MOVED) {
        assert!(Instant::now() < deadline, "r1 did not take the partition");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holds(&r1, &sku, "after", 3).await;
    wait_published(&db1).await;
    let (last, _) = progress(&db1).await;

    let streams = read_redis(&redis.url()).await;
    let positions: Vec<i64> = streams
        .get(&Stream::Partition(MOVED).redis_key())
        .expect("the partition's stream")
        .iter()
        .map(|(_, _, event)| event["position"].as_i64().expect("a position"))
        .collect();
    let expected: Vec<i64> = (1..=last).collect();
    assert_eq!(positions, expected, "the partition's stream in Redis");
    r0.stop().await;
    r1.stop().await;
}
