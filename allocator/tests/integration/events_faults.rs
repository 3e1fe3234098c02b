//! Change events under faults, with real processes: a relay SIGKILLed between Redis's
//! acknowledgement and its progress update, and Redis restarted empty. After each, Redis holds
//! every committed ledger row and settled window exactly once, in position order
//! ([`assert_delivered_once`]).

use std::time::{Duration, Instant};

use testkit::RedisServer;

use crate::common::*;
use crate::events::relay_config;
use crate::events_support::*;
use crate::processes::{spawn_replica_with, Replica};

pub(crate) const TTL_MS: u64 = 2000;

pub(crate) fn relay_env(redis_url: &str, pause_ms: Option<u64>) -> Vec<(String, String)> {
    let mut env = vec![
        ("REDIS_URL".to_owned(), redis_url.to_owned()),
        ("ALLOCATOR_EVENTS".to_owned(), "true".to_owned()),
        ("ALLOCATOR_EVENTS_INTERVAL_MS".to_owned(), "50".to_owned()),
    ];
    if let Some(ms) = pause_ms {
        env.push((
            allocator::faults::RELAY_PAUSE_ENV.to_owned(),
            ms.to_string(),
        ));
    }
    env
}

pub(crate) async fn owns_everything(replica: &Replica) {
    let id = replica.id.clone();
    wait_for_map(&replica.url, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &[&id])
    })
    .await;
}

pub(crate) async fn recorded_progress(db: &str) -> i64 {
    client(db)
        .await
        .query_one(
            "SELECT coalesce(sum(published), 0)::bigint FROM event_relay_progress",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// The relay appends to Redis, then stops before recording progress and is SIGKILLed there. Its
/// successor starts from the recorded (older) progress: the entries already in Redis are not
/// appended again, the rest are, and nothing is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_before_recording_progress_duplicates_nothing() {
    let redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    let mut first = spawn_replica_with(
        &db,
        "ev-kill-a",
        TTL_MS,
        relay_env(&redis.url(), Some(600_000)),
    );
    owns_everything(&first).await;
    stock(&first.url).await;
    mixed_load(&first.url, "kill-a", 10).await;

    // Appended, acknowledged, and not recorded: the relay sits in the fault hook.
    let start = Instant::now();
    loop {
        let in_redis: usize = read_redis(&redis.url()).await.values().map(Vec::len).sum();
        if in_redis > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        recorded_progress(&db).await,
        0,
        "progress recorded before the kill"
    );
    first.process.sigkill().expect("SIGKILL");

    let second = spawn_replica_with(&db, "ev-kill-b", TTL_MS, relay_env(&redis.url(), None));
    owns_everything(&second).await;
    mixed_load(&second.url, "kill-b", 10).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(30)).await;
    let delivered = assert_delivered_once(&db, &redis.url()).await;
    assert!(delivered > 0);
    let start = Instant::now();
    while recorded_progress(&db).await < delivered as i64 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "progress never recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis keeps nothing on disk: stopped and started again, it comes back empty. The relay
/// notices streams missing below what it published and publishes them again from the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_empty_gets_every_stream_again() {
    let mut redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(relay_config(&db, "ev-redis", &redis.url())).await;
    wait_owns_all(&replica).await;
    stock(&replica.url).await;
    mixed_load(&replica.url, "before", 10).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(20)).await;
    let before = recorded_progress(&db).await;
    assert!(before > 0);

    redis.stop().expect("stop redis");
    mixed_load(&replica.url, "while-down", 5).await;
    redis.start_again().await.expect("start redis again");
    let empty: usize = read_redis(&redis.url()).await.values().map(Vec::len).sum();
    assert!(empty < before as usize, "Redis came back with its streams");
    mixed_load(&replica.url, "after", 5).await;
    wait_no_holds(&db).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(30)).await;
    assert_delivered_once(&db, &redis.url()).await;
    replica.stop().await;
}

/// The relay follows the job lease: its holder is SIGKILLed while changes keep committing, the
/// other replica takes the lease over with a new term and continues from the recorded progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_moves_with_the_job_lease_when_its_holder_is_killed() {
    let redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    // Stocked while one replica owns everything; the second then takes its share.
    let a = spawn_replica_with(&db, "ev-hand-a", TTL_MS, relay_env(&redis.url(), None));
    owns_everything(&a).await;
    stock(&a.url).await;
    let mut a = Some(a);
    let b = spawn_replica_with(&db, "ev-hand-b", TTL_MS, relay_env(&redis.url(), None));
    let urls = [a.as_ref().unwrap().url.clone(), b.url.clone()];
    let (holder, term) = job_holder(&db).await;
    let mixed = |tag: &'static str| {
        let urls = urls.clone();
        async move {
            for url in &urls {
                mixed_load(url, tag, 8).await;
            }
        }
    };
    mixed("hand-1").await;
    let (mut victim, survivor) = if holder == "ev-hand-a" {
        (a.take().unwrap(), b)
    } else {
        (b, a.take().unwrap())
    };
    let during = tokio::spawn({
        let url = survivor.url.clone();
        async move { mixed_load(&url, "hand-2", 20).await }
    });
    victim
        .process
        .sigkill()
        .expect("SIGKILL the relay's holder");
    during.await.expect("load during the takeover");
    wait_for_map(&survivor.url, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &[&survivor.id])
    })
    .await;
    mixed_load(&survivor.url, "hand-3", 8).await;
    let new_term = crate::settlement_support::wait_for_holder(&db, &survivor.id).await;
    assert!(new_term > term, "the survivor relays under a newer term");
    wait_delivered(&db, &redis.url(), Duration::from_secs(30)).await;
    assert!(assert_delivered_once(&db, &redis.url()).await > 0);
}

/// The job's holder and term once somebody holds it.
pub(crate) async fn job_holder(db: &str) -> (String, i64) {
    let start = Instant::now();
    loop {
        let status = crate::settlement_support::status(db).await;
        if let Some(holder) = status.holder_id {
            return (holder, status.term);
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nobody holds the job"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
