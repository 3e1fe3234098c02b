//! Regression tests for failure modes found by exercising one replica as an operator would:
//! hold expiry under load, unknown-SKU requests against a large ledger, a row locked from
//! outside, idempotency fingerprints, overdue replays, stale router epochs and abandoned
//! queued commands. Real PostgreSQL, real HTTP.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use reqwest::StatusCode;
use schema::partition::partition_for;
use schema::wire::{problem_type, Problem, Reservation, ReservationStatus, HEADER_EXPECTED_EPOCH};
use serde_json::json;
use testkit::ApiClient;

async fn reserve_with(
    base: &str,
    body: serde_json::Value,
    headers: &[(&str, String)],
) -> reqwest::Response {
    let mut request = http().post(format!("{base}/v1/reservations")).json(&body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    request.send().await.expect("reserve")
}

async fn reserve(base: &str, id: &str, sku: &str, quantity: i64, ttl: u32) -> reqwest::Response {
    reserve_with(
        base,
        json!({"reservation_id": id, "sku": sku, "quantity": quantity, "ttl_seconds": ttl}),
        &[],
    )
    .await
}

async fn available(base: &str, sku: &str) -> i64 {
    ApiClient::new(base).inventory(sku).await.ok().available
}

async fn start(config: allocator::config::AllocatorConfig) -> TestReplica {
    let replica = TestReplica::start(config).await;
    wait_owns_all(&replica).await;
    replica
}

#[tokio::test]
async fn overdue_holds_come_back_while_their_partition_is_busy() {
    let db = migrated_database(PARTITIONS).await;
    let mut config = fast_config(&db, "busy");
    config.expiry_interval = Duration::from_millis(300);
    let replica = start(config).await;
    let base = replica.url.clone();
    let scarce = sku_in(2, "scarce");
    let busy = sku_in(2, "busy");
    restock(&base, &scarce, 5).await;
    restock(&base, &busy, 1_000_000).await;

    // Keep the partition's queue full with reserves on another SKU of the same partition, for
    // far longer than the holds' ttl. `after_back` counts load reserves answered once the holds
    // were seen back: a sweep starved by the queue would only run after the load ended.
    let stop = Instant::now() + Duration::from_secs(8);
    let back_seen = Arc::new(AtomicBool::new(false));
    let after_back = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..32)
        .map(|w| {
            let (base, busy) = (base.clone(), busy.clone());
            let (back_seen, after_back) = (back_seen.clone(), after_back.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop {
                    let id = format!("load-{w}-{n}");
                    // On an overloaded machine a reserve may be answered 503 or 421 (try
                    // again: a renewal unconfirmed, a stall that dropped the lease until it is
                    // retaken): the load only has to keep the partition busy.
                    let status = reserve(&base, &id, &busy, 1, 600).await.status();
                    assert!(
                        matches!(
                            status,
                            StatusCode::CREATED
                                | StatusCode::SERVICE_UNAVAILABLE
                                | StatusCode::MISDIRECTED_REQUEST
                        ),
                        "load reserve {id}: {status}"
                    );
                    if back_seen.load(Ordering::SeqCst) {
                        after_back.fetch_add(1, Ordering::SeqCst);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let held_at = Instant::now();
    for i in 0..5 {
        // A 503 or 421 (a renewal unconfirmed, the partition retaken on a loaded machine) is
        // retried with the same id, as a client would.
        let status = loop {
            let status = reserve(&base, &format!("short-{i}"), &scarce, 1, 1)
                .await
                .status();
            let again = matches!(
                status,
                StatusCode::SERVICE_UNAVAILABLE | StatusCode::MISDIRECTED_REQUEST
            );
            if !again || Instant::now() >= stop {
                break status;
            }
        };
        assert_eq!(status, StatusCode::CREATED);
    }
    // Each 201 took one of the five units; on a loaded machine the first may be back already,
    // so only the return of all five is awaited.
    let back = loop {
        if available(&base, &scarce).await == 5 {
            back_seen.store(true, Ordering::SeqCst);
            break held_at.elapsed();
        }
        assert!(
            Instant::now() < stop,
            "holds did not come back while the load ran"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let mut total = 0;
    for worker in load {
        total += worker.await.expect("load worker");
    }
    assert!(total > 100, "the partition was busy ({total} reserves)");
    let after = after_back.load(Ordering::SeqCst);
    assert!(
        after > 0,
        "holds came back after {back:?}, only once the partition's load had ended"
    );
    replica.stop().await;
}

#[tokio::test]
async fn unknown_sku_requests_stay_fast_with_a_million_ledger_rows() {
    let db = migrated_database(PARTITIONS).await;
    let replica = start(fast_config(&db, "ledger")).await;
    let base = replica.url.clone();
    restock(&base, "known", 1_000_000).await;
    let pg = client(&db).await;
    // A long history: one million ledger rows (balanced, referencing one adjustment), numbered
    // after the partition's last position as the fenced batch numbers its rows (a writer that
    // leaves `position` empty is numbered one row at a time, which a million rows cannot afford).
    pg.batch_execute(
        "INSERT INTO adjustments (adjustment_id, sku, partition, delta, status, epoch)
         SELECT 'history', sku, partition, 1, 'applied', highest_epoch FROM inventory WHERE sku = 'known';
         INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available, d_held,
                             d_confirmed, epoch, position)
         SELECT 'known', i.partition, 'restock', 'history', 0, 0, 0, 0, i.highest_epoch,
                p.last_position + g
           FROM inventory AS i
           JOIN ledger_positions AS p ON p.partition = i.partition,
                generate_series(1, 1000000) AS g
          WHERE i.sku = 'known';
         UPDATE ledger_positions SET last_position = last_position + 1000000
          WHERE partition = (SELECT partition FROM inventory WHERE sku = 'known');
         ANALYZE ledger;",
    )
    .await
    .expect("bulk ledger");

    async fn median_ms(samples: &mut [f64]) -> f64 {
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        samples[samples.len() / 2]
    }
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    let mut shrink_unknown = Vec::new();
    for i in 0..25 {
        let t = Instant::now();
        let r = reserve(&base, &format!("k-{i}"), "known", 1, 60).await;
        known.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.status(), StatusCode::CREATED);

        let t = Instant::now();
        let r = reserve(&base, &format!("u-{i}"), "never-stocked", 1, 60).await;
        unknown.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);

        let t = Instant::now();
        let r = http()
            .post(format!("{base}/v1/inventory/never-stocked/adjustments"))
            .json(&json!({"adjustment_id": format!("s-{i}"), "delta": -1}))
            .send()
            .await
            .unwrap();
        shrink_unknown.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
    let known = median_ms(&mut known).await;
    let unknown = median_ms(&mut unknown).await;
    let shrink = median_ms(&mut shrink_unknown).await;
    assert!(
        unknown <= known * 3.0 + 10.0 && shrink <= known * 3.0 + 10.0,
        "median ms: known {known:.1}, unknown-sku reserve {unknown:.1}, unknown-sku shrink {shrink:.1}"
    );
    // Nothing was recorded for the unknown SKU, so the ids work once it is stocked.
    let rows: i64 = pg
        .query_one(
            "SELECT (SELECT count(*) FROM reservations WHERE sku = 'never-stocked')
                  + (SELECT count(*) FROM adjustments WHERE sku = 'never-stocked')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
    replica.stop().await;
}

#[tokio::test]
async fn a_row_locked_from_outside_makes_only_its_partition_unavailable() {
    let db = migrated_database(PARTITIONS).await;
    let replica = start(fast_config(&db, "stuck")).await;
    let base = replica.url.clone();
    let stuck = sku_in(1, "stuck");
    let others: Vec<String> = (2..PARTITIONS).map(|p| sku_in(p, "free")).collect();
    restock(&base, &stuck, 1_000).await;
    for sku in &others {
        restock(&base, sku, 1_000).await;
    }

    // Another session holds the stuck SKU's row for two lease TTLs.
    let mut locker = client(&db).await;
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE",
        &[&stuck],
    )
    .await
    .unwrap();
    let until = Instant::now() + Duration::from_millis(2 * 2_000);
    // Requests for the stuck SKU keep arriving the whole time, so a batch of its partition is
    // always waiting on the row (as under real traffic).
    let stuck_callers: Vec<_> = (0..4)
        .map(|w| {
            let base = base.clone();
            let stuck = stuck.clone();
            tokio::spawn(async move {
                let (mut unavailable, mut n) = (0, 0);
                while Instant::now() < until {
                    let status = reserve(&base, &format!("stuck-{w}-{n}"), &stuck, 1, 600)
                        .await
                        .status();
                    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "stuck partition");
                    unavailable += 1;
                    n += 1;
                }
                unavailable
            })
        })
        .collect();
    let (mut ok, mut n) = (0, 0);
    while Instant::now() < until {
        let sku = &others[n % others.len()];
        let response = reserve(&base, &format!("free-{n}"), sku, 1, 600).await;
        let status = response.status();
        assert_eq!(
            status,
            StatusCode::CREATED,
            "other partitions keep serving: {}",
            response.text().await.unwrap_or_default()
        );
        ok += 1;
        n += 1;
    }
    let mut stuck_503 = 0;
    for caller in stuck_callers {
        stuck_503 += caller.await.expect("stuck caller");
    }
    assert!(ok > 20, "{ok} reserves served on other partitions");
    assert!(stuck_503 > 0);
    assert_eq!(
        replica.ownership.held().len(),
        PARTITIONS as usize,
        "no lease was lost while one row was stuck"
    );

    tx.rollback().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let response = reserve(&base, "stuck-after", &stuck, 1, 600).await;
        if response.status() == StatusCode::CREATED {
            break;
        }
        assert!(Instant::now() < deadline, "stuck partition never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    replica.stop().await;
}

#[tokio::test]
async fn every_field_that_changes_the_effect_is_in_the_fingerprint() {
    let db = migrated_database(PARTITIONS).await;
    let replica = start(fast_config(&db, "fingerprint")).await;
    let base = replica.url.clone();
    restock(&base, "fp", 10).await;
    assert_eq!(
        reserve(&base, "fp-1", "fp", 1, 60).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(
        reserve(&base, "fp-1", "fp", 1, 60).await.status(),
        StatusCode::OK
    );
    let longer = reserve(&base, "fp-1", "fp", 1, 600).await;
    assert_eq!(longer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: Problem = longer.json().await.unwrap();
    assert_eq!(problem.kind, problem_type::IDEMPOTENCY_MISMATCH);
    // Leaving the ttl out means the default (900 s), which is another ttl as well.
    let default_ttl = reserve_with(
        &base,
        json!({"reservation_id": "fp-1", "sku": "fp", "quantity": 1}),
        &[],
    )
    .await;
    assert_eq!(default_ttl.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(available(&base, "fp").await, 9, "nothing applied twice");
    replica.stop().await;
}

#[tokio::test]
async fn replaying_an_overdue_hold_reports_it_expired_and_frees_its_stock() {
    let db = migrated_database(PARTITIONS).await;
    let mut config = fast_config(&db, "overdue");
    // The sweeper stays away, so only the replay itself can notice the hold ran out.
    config.expiry_interval = Duration::from_secs(600);
    let replica = start(config).await;
    let base = replica.url.clone();
    restock(&base, "late", 3).await;
    assert_eq!(
        reserve(&base, "late-1", "late", 3, 1).await.status(),
        StatusCode::CREATED
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let replay = reserve(&base, "late-1", "late", 3, 1).await;
    assert_eq!(replay.status(), StatusCode::OK);
    let body: Reservation = replay.json().await.unwrap();
    assert_eq!(body.status, ReservationStatus::Expired, "never 'held'");
    assert_eq!(available(&base, "late").await, 3, "its stock is back");
    let confirm = ApiClient::new(base).confirm("late-1").await;
    assert_eq!(confirm.status, StatusCode::CONFLICT);
    let problem = confirm.problem();
    assert_eq!(problem.current_status, Some(ReservationStatus::Expired));
    let pg = client(&db).await;
    let (row, ledger) = ledger_balance(&pg, "late").await;
    assert_eq!(row, ledger, "ledger records the expiry");
    replica.stop().await;
}

#[tokio::test]
async fn a_router_expecting_another_epoch_is_sent_to_refresh() {
    let db = migrated_database(PARTITIONS).await;
    let replica = start(fast_config(&db, "epochs")).await;
    let base = replica.url.clone();
    restock(&base, "ep", 10).await;
    let partition = partition_for("ep", PARTITIONS);
    let epoch = replica
        .ownership
        .authority_any(partition)
        .expect("owned partition");
    let body = json!({"reservation_id": "ep-1", "sku": "ep", "quantity": 1, "ttl_seconds": 60});
    let stale = reserve_with(
        &base,
        body.clone(),
        &[(HEADER_EXPECTED_EPOCH, (epoch - 1).to_string())],
    )
    .await;
    assert_eq!(stale.status(), StatusCode::MISDIRECTED_REQUEST);
    let problem: Problem = stale.json().await.unwrap();
    assert_eq!(problem.kind, problem_type::NOT_OWNER);
    assert_eq!(problem.owner_id.as_deref(), Some("epochs"));
    assert_eq!(problem.epoch, Some(epoch), "names the epoch to route by");
    assert_eq!(available(&base, "ep").await, 10, "nothing applied");
    let current = reserve_with(&base, body, &[(HEADER_EXPECTED_EPOCH, epoch.to_string())]).await;
    assert_eq!(current.status(), StatusCode::CREATED);
    replica.stop().await;
}

#[tokio::test]
async fn queued_commands_whose_callers_gave_up_are_not_run() {
    let db = migrated_database(PARTITIONS).await;
    let mut config = fast_config(&db, "abandon");
    config.request_timeout = Duration::from_millis(300);
    // Renewals far apart, so the lease stays confirmed through the short lock below whatever
    // the lock design: only the queue's handling decides what runs.
    config.lease_ttl = Duration::from_secs(20);
    config.renew_interval = Duration::from_secs(8);
    // The first batch waits for the locked row instead of failing fast, so the commands queued
    // behind it are still there when the row comes free.
    config.lock_timeout = Duration::from_secs(5);
    config.statement_timeout = Duration::from_secs(5);
    // The settlement grace must outlast the longest statement (the config re-checks it).
    config.settlement_grace = Duration::from_secs(7);
    let replica = start(config).await;
    let base = replica.url.clone();
    restock(&base, "gone", 100).await;

    let mut locker = client(&db).await;
    let tx = locker.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM inventory WHERE sku = 'gone' FOR UPDATE", &[])
        .await
        .unwrap();
    // Callers that give up (the replica's own request deadline answers 503 for them) while the
    // partition is stuck behind the locked row.
    let callers: Vec<_> = (0..12)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(40 * i)).await;
                reserve(&base, &format!("gone-{i}"), "gone", 1, 600)
                    .await
                    .status()
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    }
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_000)).await;

    let pg = client(&db).await;
    let ran: i64 = pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE reservation_id LIKE 'gone-%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // At most the batch that was already waiting on the row commits.
    assert!(
        ran <= 1,
        "{ran} commands of callers that gave up were run afterwards"
    );
    assert_eq!(available(&base, "gone").await, 100 - ran);
    replica.stop().await;
}
