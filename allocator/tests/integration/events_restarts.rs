//! Change events across planned restarts, with real processes: the relay's holder stopped with
//! SIGTERM (a planned hand-off, as in a rolling deploy) while changes keep committing, and the
//! PostgreSQL server stopped and started again under a relaying replica. After each, Redis holds
//! every committed ledger row and settled window exactly once, in position order
//! ([`assert_delivered_once`]).

use std::time::Duration;

use testkit::{PgServer, RedisServer};

use crate::common::*;
use crate::events_faults::{job_holder, owns_everything, recorded_progress, relay_env, TTL_MS};
use crate::events_support::*;
use crate::processes::spawn_replica_with;

/// The relay's holder is stopped with SIGTERM under load: it hands its partitions back, releases
/// the job lease on its way out, and the other replica's relay continues under a newer term from
/// the recorded progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_handoff_moves_the_relay_without_a_gap_or_a_duplicate() {
    let redis = RedisServer::start().await.expect("start redis");
    let db = migrated_database(PARTITIONS).await;
    let a = spawn_replica_with(&db, "ev-term-a", TTL_MS, relay_env(&redis.url(), None));
    owns_everything(&a).await;
    stock(&a.url).await;
    let b = spawn_replica_with(&db, "ev-term-b", TTL_MS, relay_env(&redis.url(), None));
    for url in [&a.url, &b.url] {
        mixed_load(url, "term-1", 8).await;
    }
    let (holder, term) = job_holder(&db).await;
    let (mut leaving, staying) = if holder == a.id { (a, b) } else { (b, a) };
    let during = tokio::spawn({
        let url = staying.url.clone();
        async move { mixed_load(&url, "term-2", 20).await }
    });
    leaving
        .process
        .sigterm()
        .expect("SIGTERM the relay's holder");
    let status = leaving
        .process
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the holder exits after SIGTERM");
    assert!(status.success(), "the holder exited with {status}");
    assert!(
        leaving.process.log_tail(400).contains("job lease released"),
        "the holder did not release the job lease on its way out:\n{}",
        leaving.process.log_tail(40)
    );
    during.await.expect("load during the hand-off");
    wait_for_map(&staying.url, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &[&staying.id])
    })
    .await;
    mixed_load(&staying.url, "term-3", 8).await;
    let new_term = crate::settlement_support::wait_for_holder(&db, &staying.id).await;
    assert!(
        new_term > term,
        "the remaining replica relays under a newer term"
    );
    wait_no_holds(&db).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(30)).await;
    assert!(assert_delivered_once(&db, &redis.url()).await > 0);
}

/// PostgreSQL stops under a relaying replica and starts again: nothing is published while it is
/// away (the relay's reads and progress updates fail), and afterwards the relay continues from
/// its recorded progress — what it appended but could not record is not appended twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_continues_after_postgres_restarts() {
    let redis = RedisServer::start().await.expect("start redis");
    let mut pg = PgServer::start().await.expect("start postgres");
    let db = pg.create_database("events_pg_restart").await.unwrap();
    migrate(&db, PARTITIONS).await;
    let replica = spawn_replica_with(&db, "ev-pg", TTL_MS, relay_env(&redis.url(), None));
    owns_everything(&replica).await;
    stock(&replica.url).await;
    mixed_load(&replica.url, "pg-1", 10).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(20)).await;
    let before = recorded_progress(&db).await;
    assert!(before > 0, "nothing was relayed before the restart");

    pg.stop().await.expect("stop postgres");
    mixed_load(&replica.url, "pg-down", 3).await;
    tokio::time::sleep(Duration::from_millis(TTL_MS)).await;
    pg.restart().await.expect("start postgres again");
    owns_everything(&replica).await;
    mixed_load(&replica.url, "pg-2", 10).await;
    wait_no_holds(&db).await;
    wait_delivered(&db, &redis.url(), Duration::from_secs(30)).await;
    let delivered = assert_delivered_once(&db, &redis.url()).await;
    assert!(
        recorded_progress(&db).await > before,
        "the relay recorded no progress after the restart"
    );
    assert!(delivered as i64 > before);
}
