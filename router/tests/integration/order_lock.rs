//! An order's lock and the submission that holds it: a submission keeps its session from idling
//! out however long it works, and sends nothing more once that session may have ended. Same
//! two-owner cluster as [`crate::order_races`] (one allocator behind a TCP proxy).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::ProxyMode;

use crate::common::{metric, serial};
use crate::order_races::{order, sku_owned_by, status_in_db, two_owner_cluster};

/// The router database session that holds an order's lock is killed while the order is being
/// compensated. The lock is gone, so another submission may decide the order (here it places it,
/// taking over the holds); the first submission must then send nothing more, or its late
/// releases free lines of the placed order.
///
/// 17 lines: 0–15 on the slow owner, whose reserves time out (the proxy holds them), and 16 on
/// the fast owner, which starts once line 0 is answered (16 lines are in flight at a time). The
/// compensating releases of lines 0–15 sit in the proxy (they are cut, never delivered); the
/// release of line 16 would only be sent when line 0's release gives up, after the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_whose_lock_session_is_killed_mid_compensation_sends_nothing_more() {
    const LINES: usize = 17;
    let _serial = serial().await;
    let (cluster, proxy, map) = two_owner_cluster("orders_killed").await;
    let first = cluster
        .router(|c| c.retry_deadline = Duration::from_millis(1500))
        .await;
    let second = cluster.router(|_| {}).await;
    let slow_sku = sku_owned_by(&map, "slow", "killed-slow");
    let fast_sku = sku_owned_by(&map, "fast", "killed-fast");
    cluster.restock(&second.url, &slow_sku, 100).await;
    cluster.restock(&second.url, &fast_sku, 100).await;
    let lines: Vec<Value> = (0..LINES)
        .map(|i| {
            let sku = if i < 16 { &slow_sku } else { &fast_sku };
            json!({"sku": sku, "quantity": 1})
        })
        .collect();
    let lines = Value::Array(lines);
    let db = cluster.db().await;
    let lost_before = metric(
        &first.url,
        "router_order_locks_lost_total{reason=\"closed\"}",
    )
    .await;

    // The reserves of lines 0–15 reach the slow owner after 1.2 s, later than the first
    // router's deadline; everything sent to it after that (the releases) is held for 20 s.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(1200)));
    let submitted = tokio::spawn({
        let (base, lines) = (first.url.clone(), lines.clone());
        async move { order(&base, "killed-1", &lines).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(ProxyMode::Delay(Duration::from_secs(20)));

    // Line 16 is held once the reserve phase ends; compensation starts right after.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held: i64 = db
            .query_one(
                "SELECT count(*) FROM reservations WHERE sku = $1 AND status = 'held'",
                &[&fast_sku],
            )
            .await
            .unwrap()
            .get(0);
        if held == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "line 16 was never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed: i64 = db
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT l.pid FROM pg_locks l \
               JOIN pg_class c ON c.oid = l.relation \
              WHERE c.relname = 'orders' AND l.pid <> pg_backend_pid()) s",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the first submission's session holds the order");
    let lost = "router_order_locks_lost_total{reason=\"closed\"}";

    // Another submission takes the order over while the first one's releases are still held.
    proxy.set_mode(ProxyMode::Pass);
    let (status, placed) = order(&second.url, "killed-1", &lines).await;
    assert!(status == 201 || status == 200, "{status} {placed}");
    // The releases the first submission sent before the kill never arrive.
    proxy.cut_all();

    let (status, body) = submitted.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["outcome_unknown"], true, "{body}");
    assert!(
        metric(&first.url, lost).await > lost_before,
        "the loss is counted for operators"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ids: Vec<&str> = placed["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reservation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), LINES, "{placed}");
    for id in ids {
        assert_eq!(
            status_in_db(&cluster, id).await.as_deref(),
            Some("held"),
            "{id} of the placed order was released by the submission that lost the lock"
        );
    }
    first.stop().await;
    second.stop().await;
}

/// An order whose phase outlasts its session's idle timeout (two lock waits): 100 lines, 16 in
/// flight at a time, every one slowed by the proxy. The submission keeps its lock alive while it
/// works, so it records its decision and answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_that_outlasts_the_idle_timeout_keeps_its_lock_and_is_decided() {
    const LINES: usize = 100;
    let _serial = serial().await;
    let (cluster, proxy, map) = two_owner_cluster("orders_long").await;
    let router = cluster
        .router(|c| {
            // Lock wait 2 × 2 s + 2 × 0.2 s = 4.4 s, so the session idles out after 8.8 s; seven
            // waves of 16 lines at 1.4 s each take about 10 s.
            c.retry_deadline = Duration::from_secs(2);
            c.db_timeout = Duration::from_millis(200);
        })
        .await;
    let sku = sku_owned_by(&map, "slow", "long-slow");
    cluster.restock(&router.url, &sku, LINES as i64).await;
    let lines = Value::Array(vec![json!({"sku": sku, "quantity": 1}); LINES]);
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(700)));
    let started = Instant::now();
    let (status, body) = order(&router.url, "long-1", &lines).await;
    let took = started.elapsed();
    proxy.set_mode(ProxyMode::Pass);
    println!("{LINES} lines answered {status} after {took:?}");
    assert!(
        took > Duration::from_millis(8800),
        "the scenario needs the phase to outlast the idle timeout: {took:?}"
    );
    assert_eq!(status, 201, "{body}");
    let recorded: String = cluster
        .db()
        .await
        .query_one("SELECT status FROM orders WHERE order_id = 'long-1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, "placed");
    router.stop().await;
}
