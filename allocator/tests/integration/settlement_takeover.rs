//! Settlement takeovers across a change of configuration: a new term whose window length (or
//! grace) differs from the term that claimed the open run must settle exactly that run — its
//! start and its end — and only once its end plus the new term's grace has passed by the
//! database clock.

use std::time::{Duration, Instant};

use allocator::settlement::store;
use allocator::singleton::store as lease;
use chrono::{DateTime, Utc};
use schema::SETTLEMENT_LEASE;

use crate::common::*;
use crate::settlement_support::*;

/// A run of `settlement_runs` as (start, end, status, term, holder).
type Run = (DateTime<Utc>, DateTime<Utc>, String, i64, String);

async fn runs(db: &str) -> Vec<Run> {
    client(db)
        .await
        .query(
            "SELECT window_start, window_end, status, term, holder_id FROM settlement_runs
              ORDER BY window_start",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// A replica with 6-second windows claims the cluster's first window and is killed before it
/// settles it; the replica that takes over runs with 1-second windows. The cluster began 1.5 s
/// into a 6-second window, so the first 1-second window starts elsewhere than the claimed one:
/// the new term must still finish the claimed window, as it was claimed, and continue from its
/// end.
#[tokio::test]
async fn a_shorter_window_takes_over_the_claimed_window_as_claimed() {
    let db = migrated_database(PARTITIONS).await;
    client(&db)
        .await
        .execute(
            "UPDATE cluster_settings
                SET created_at = to_timestamp(floor(extract(epoch FROM now()) / 6) * 6 - 4.5)",
            &[],
        )
        .await
        .unwrap();
    // A pauses between its first claim and the settle, long enough to be killed there.
    let mut a = replica(&db, "settle-len-a", settlement_env_with(6, Some(5000)));
    let a_term = wait_for_holder(&db, "settle-len-a").await;
    let b = replica(&db, "settle-len-b", settlement_env_with(1, None));
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "len");

    let (claimed_start, _) = wait_for_running_run(&db, "settle-len-a").await;
    a.process.sigkill().unwrap();
    let claimed_end = runs(&db)
        .await
        .into_iter()
        .find(|r| r.0 == claimed_start)
        .expect("the claimed run")
        .1;
    assert_eq!(
        claimed_end - claimed_start,
        chrono::Duration::seconds(6),
        "A claimed a 6-second window"
    );

    let b_term = wait_for_holder(&db, "settle-len-b").await;
    assert!(b_term > a_term, "a new term: {b_term} > {a_term}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = runs(&db).await;
        let claimed = all.iter().find(|r| r.0 == claimed_start);
        if claimed.is_some_and(|r| r.2 == "settled") {
            let r = claimed.unwrap();
            assert_eq!(r.1, claimed_end, "the claimed window's end was kept");
            assert_eq!((r.3, r.4.as_str()), (b_term, "settle-len-b"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the claimed window was not settled by the new term: {all:?}\n{}",
            b.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Contiguous windows from the claimed one on, each settled after its end plus the grace,
    // every confirmation exactly once.
    drain_and_check(&db, load).await;
    let after: Vec<Run> = runs(&db)
        .await
        .into_iter()
        .filter(|r| r.0 >= claimed_end && r.2 == "settled")
        .collect();
    assert!(
        after
            .iter()
            .all(|r| r.1 - r.0 == chrono::Duration::seconds(1)),
        "the new term's own windows are 1 s long: {after:?}"
    );
    drop(b);
}

/// Waits until the database clock is `offset` into a `period`-second cycle (± a bit) and
/// returns the start of the cycle before the current one, as the cluster's creation.
async fn align_creation(db: &str, period: i64, within: std::ops::Range<f64>) -> DateTime<Utc> {
    let pg = client(db).await;
    loop {
        let phase: f64 = pg
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) % $1::bigint)::float8",
                &[&period],
            )
            .await
            .unwrap()
            .get(0);
        if within.contains(&phase) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pg.query_one(
        "UPDATE cluster_settings
            SET created_at = to_timestamp(floor(extract(epoch FROM clock_timestamp()) / $1::bigint)
                                          * $1::bigint - $1::bigint)
         RETURNING created_at",
        &[&period],
    )
    .await
    .unwrap()
    .get(0)
}

/// Term 1 claims a 4-second window with a tiny grace; term 2 runs with 1-second windows and a
/// 3.5 s grace (a longer statement timeout). Term 2 may take the run over only once the claimed
/// window's end plus its own grace has passed — not the end of a 1-second window from the same
/// start — and it settles the window as claimed.
#[tokio::test]
async fn a_takeover_waits_for_the_claimed_window_to_close() {
    let db = migrated_database(PARTITIONS).await;
    let ttl = Duration::from_secs(60);
    let start = align_creation(&db, 4, 0.5..2.5).await;
    let pg = client(&db).await;

    let term1 = lease::acquire(&pg, SETTLEMENT_LEASE, "len-a", ttl)
        .await
        .unwrap()
        .unwrap();
    let claimed = store::claim_next(
        &pg,
        "len-a",
        term1,
        Duration::from_secs(4),
        Duration::from_millis(1),
    )
    .await
    .unwrap()
    .expect("the first 4-second window has closed");
    assert_eq!(
        (claimed.start, claimed.end - claimed.start),
        (start, chrono::Duration::seconds(4))
    );
    assert!(lease::release(&pg, SETTLEMENT_LEASE, "len-a", term1)
        .await
        .unwrap());

    let term2 = lease::acquire(&pg, SETTLEMENT_LEASE, "len-b", ttl)
        .await
        .unwrap()
        .unwrap();
    let grace = Duration::from_millis(3500);
    let window = Duration::from_secs(1);
    let early = store::claim_next(&pg, "len-b", term2, window, grace)
        .await
        .unwrap();
    let now: DateTime<Utc> = pg.query_one("SELECT now()", &[]).await.unwrap().get(0);
    assert!(
        now < claimed.end + chrono::Duration::milliseconds(3500),
        "the test ran too late to show anything: {now} vs {claimed:?}"
    );
    assert_eq!(
        early, None,
        "claimed at {now}, before the claimed window's end {} plus the grace",
        claimed.end
    );

    let closes = claimed.end + chrono::Duration::milliseconds(3500);
    loop {
        let now: DateTime<Utc> = pg.query_one("SELECT now()", &[]).await.unwrap().get(0);
        if now >= closes {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken = store::claim_next(&pg, "len-b", term2, window, grace)
        .await
        .unwrap();
    assert_eq!(
        taken,
        Some(claimed),
        "the run is taken over as it was claimed"
    );
    store::settle(&pg, term2, claimed.start)
        .await
        .unwrap()
        .expect("settled");
    let all = runs(&db).await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        (all[0].1, all[0].2.as_str(), all[0].3),
        (claimed.end, "settled", term2)
    );
}
