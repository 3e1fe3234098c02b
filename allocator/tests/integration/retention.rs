//! The retention job (DESIGN.md §8a): terminal reservations and finished orders past the
//! idempotency horizon are removed by one replica at a time, in small batches, never a held
//! row and never one inside the horizon, under load and across a SIGKILL of the job's holder.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use schema::wire::ReserveRequest;
use testkit::{Answer, ApiClient};

use crate::common::*;
use crate::processes::spawn_replica_with;
use crate::retention_support::*;

const SKUS: [&str; 4] = ["ret-a", "ret-b", "ret-c", "ret-d"];

fn request(id: &str, sku: &str, quantity: i64) -> ReserveRequest {
    ReserveRequest {
        reservation_id: id.parse().expect("valid id"),
        sku: sku.parse().expect("valid sku"),
        quantity: quantity.try_into().expect("valid quantity"),
        ttl_seconds: None,
    }
}

/// The answer of `call` once it is not a "try again" (`503` while a renewal is unconfirmed, `421`
/// while the partition is retaken): what a client does with the same id, within 10 s.
async fn settled<T, F, Fut>(mut call: F) -> Answer<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer<T>>,
{
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = call().await;
        let again = matches!(answer.status.as_u16(), 421 | 503);
        if !again || Instant::now() >= give_up {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reserves for `duration`, each replayed at once (which must be exact); a third confirmed, a
/// third released, a third left held. Returns how many reserves were answered 201.
async fn reserve_load(api: ApiClient, worker: usize, duration: Duration) -> usize {
    let end = Instant::now() + duration;
    let mut created = 0;
    let mut i = 0usize;
    while Instant::now() < end {
        i += 1;
        let id = format!("load-{worker}-{i}");
        let req = request(&id, SKUS[i % SKUS.len()], 1);
        let first = api.reserve(&req).await;
        if first.status.as_u16() != 201 {
            continue;
        }
        created += 1;
        let again = settled(|| api.reserve(&req)).await;
        assert!(
            again.replayed(),
            "a replay inside the horizon is exact: {again:?}"
        );
        match i % 3 {
            0 => assert!(settled(|| api.confirm(&id)).await.status.is_success()),
            1 => assert!(settled(|| api.release(&id)).await.status.is_success()),
            _ => {}
        }
    }
    created
}

/// Under reserve load with a 2-second horizon, the job removes the old terminal rows and, as
/// the load's own rows age past the horizon, those too; it removes no hold and nothing inside
/// the horizon, keeps every ledger row, and the live stock still matches the held rows.
#[tokio::test]
async fn under_load_only_terminal_rows_past_the_horizon_are_removed() {
    let horizon = Duration::from_secs(2);
    let db = migrated_database(PARTITIONS).await;
    install_removal_log(&db).await;
    seed_history(&db, 2000, 50).await;
    let ledger_before = seeded_ledger_rows(&db).await;
    let replica = TestReplica::start(fast_config_with(
        &db,
        "ret-load",
        &["--idempotency-horizon-secs", "2", "--retention-batch", "20"],
    ))
    .await;
    wait_owns_all(&replica).await;
    for sku in SKUS {
        restock(&replica.url, sku, 1_000_000).await;
    }
    let created = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..4)
        .map(|w| {
            let api = replica.api.clone();
            let created = created.clone();
            tokio::spawn(async move {
                let n = reserve_load(api, w, Duration::from_secs(6)).await;
                created.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for task in load {
        task.await.expect("load task");
    }
    assert!(created.load(Ordering::Relaxed) > 0, "the load reserved");
    // The seeded terminal rows are gone, and so is the first finished order; the order whose
    // line is held and the pending one stay.
    wait_for_count(
        &db,
        "SELECT count(*) FROM reservations WHERE reservation_id ~ '^old-[0-9]+$'",
        0,
        Duration::from_secs(20),
    )
    .await;
    wait_for_count(
        &db,
        "SELECT count(*) FROM orders WHERE order_id = 'old-order-1'",
        0,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM orders WHERE order_id IN ('old-order-2', 'old-order-3')"
        )
        .await,
        2,
        "an order whose line is held, and a pending order, are kept"
    );
    // The load's released and confirmed rows aged past the horizon during the run.
    assert!(
        count(
            &db,
            "SELECT count(*) FROM removed_log WHERE reservation_id LIKE 'load-%'"
        )
        .await
            > 0,
        "the load's own terminal rows were removed once past the horizon"
    );
    assert_only_past_the_horizon(&db, horizon, 50).await;
    assert_eq!(
        seeded_ledger_rows(&db).await,
        ledger_before,
        "the ledger keeps every row"
    );
    let c = client(&db).await;
    for sku in SKUS {
        let (row, ledger) = ledger_balance(&c, sku).await;
        assert_eq!(row, ledger, "{sku}: the ledger still reproduces the row");
        let held: i64 = c
            .query_one(
                "SELECT coalesce(sum(quantity), 0)::bigint FROM reservations
                  WHERE sku = $1 AND status = 'held'",
                &[&sku],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(held, row.held, "{sku}: every hold is still a row");
    }
    replica.stop().await;
}

/// Inside the horizon a reuse with another payload is refused and the same payload replays;
/// after it the id is unknown again, and a reuse is a new reservation with its own decrement.
#[tokio::test]
async fn a_reuse_after_the_horizon_is_a_new_reservation() {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config_with(
        &db,
        "ret-reuse",
        &["--idempotency-horizon-secs", "1"],
    ))
    .await;
    wait_owns_all(&replica).await;
    restock(&replica.url, "ret-a", 10).await;
    let api = &replica.api;
    assert_eq!(
        api.reserve(&request("again-1", "ret-a", 1))
            .await
            .status
            .as_u16(),
        201
    );
    assert!(api.release("again-1").await.status.is_success());
    assert!(api
        .reserve(&request("again-1", "ret-a", 1))
        .await
        .replayed());
    assert_eq!(
        api.reserve(&request("again-1", "ret-a", 2))
            .await
            .status
            .as_u16(),
        422,
        "inside the horizon a reuse with another payload is refused"
    );

    wait_for_count(
        &db,
        "SELECT count(*) FROM reservations WHERE reservation_id = 'again-1'",
        0,
        Duration::from_secs(15),
    )
    .await;
    let reused = api.reserve(&request("again-1", "ret-a", 2)).await;
    assert_eq!(reused.status.as_u16(), 201, "a new reservation: {reused:?}");
    assert!(!reused.replayed());
    let stock = api.inventory("ret-a").await.ok();
    assert_eq!((stock.available, stock.held), (8, 2), "{stock:?}");
    let (row, ledger) = ledger_balance(&client(&db).await, "ret-a").await;
    assert_eq!(row, ledger, "the first reservation's ledger rows are kept");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM ledger WHERE reservation_id = 'again-1'"
        )
        .await,
        3,
        "reserve and release of the first, reserve of the second"
    );
    replica.stop().await;
}

/// Two replica processes: only the holder of `job/retention` removes rows. SIGKILLed mid-run,
/// it leaves every hold and ledger row; the other takes the lease with a new term and removes
/// the rest.
#[tokio::test]
async fn one_holder_removes_and_a_killed_holder_is_continued() {
    let db = migrated_database(PARTITIONS).await;
    install_removal_log(&db).await;
    seed_history(&db, 20_000, 50).await;
    let ledger_before = seeded_ledger_rows(&db).await;
    let env = || {
        vec![
            (
                "ALLOCATOR_IDEMPOTENCY_HORIZON_SECS".to_string(),
                "1".to_string(),
            ),
            ("ALLOCATOR_RETENTION_BATCH".to_string(), "5".to_string()),
        ]
    };
    let mut replicas = vec![
        spawn_replica_with(&db, "ret-kill-a", 2000, env()),
        spawn_replica_with(&db, "ret-kill-b", 2000, env()),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&db, "SELECT count(*) FROM removed_log").await < 500 {
        assert!(Instant::now() < deadline, "the job removed nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (Some(first), first_term) = retention_holder(&db).await else {
        panic!("nobody holds the retention job while it removes");
    };
    let victim = replicas
        .iter()
        .position(|r| r.id == first)
        .expect("a replica holds it");
    let mut killed = replicas.remove(victim);
    killed.process.sigkill().expect("SIGKILL");
    let removed_at_kill = count(&db, "SELECT count(*) FROM removed_log").await;
    assert!(
        removed_at_kill < 20_000,
        "killed mid-run ({removed_at_kill} removed)"
    );
    assert_only_past_the_horizon(&db, Duration::from_secs(1), 50).await;
    assert_eq!(seeded_ledger_rows(&db).await, ledger_before);

    wait_for_count(
        &db,
        "SELECT count(*) FROM reservations WHERE reservation_id ~ '^old-[0-9]+$'",
        0,
        Duration::from_secs(90),
    )
    .await;
    let (second, second_term) = retention_holder(&db).await;
    assert_eq!(second.as_deref(), Some(replicas[0].id.as_str()));
    assert!(second_term > first_term, "a new term");
    // One remover at a time: everything before the kill was removed by the first holder's
    // session, everything after by the second's.
    let removers: Vec<(String, i64)> = client(&db)
        .await
        .query(
            "SELECT remover, count(*) FROM removed_log GROUP BY remover ORDER BY min(removed_at)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let name = |id: &str| format!("allocator:{id}:retention");
    assert_eq!(removers.len(), 2, "{removers:?}");
    assert_eq!(removers[0].0, name(&first));
    assert_eq!(removers[1].0, name(&replicas[0].id));
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT count(*) FROM removed_log a JOIN removed_log b
                   ON a.remover = '{}' AND b.remover = '{}' AND a.removed_at > b.removed_at",
                name(&first),
                name(&replicas[0].id)
            ),
        )
        .await,
        0,
        "the two holders' removals never interleave"
    );
    assert_eq!(removers[0].1 + removers[1].1, 20_000);
    assert_only_past_the_horizon(&db, Duration::from_secs(1), 50).await;
    assert_eq!(seeded_ledger_rows(&db).await, ledger_before);
}
