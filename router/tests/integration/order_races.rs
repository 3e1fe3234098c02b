//! Orders under timing faults: a reserve that lands after its compensation, and one order id
//! submitted through two routers at once. One allocator is reached through a delaying TCP proxy
//! (it advertises the proxy's address, so every router goes through it); the other is direct.

use std::time::{Duration, Instant};

use crate::common::{balanced, http, owner_of, serial, Cluster};
use schema::partition::partition_for;
use schema::wire::{PartitionMap, Reservation, ReservationStatus};
use serde_json::{json, Value};
use testkit::{ProxyMode, TcpProxy};

pub(crate) const PARTITIONS: u32 = 8;

/// A SKU on a partition owned by `owner`.
pub(crate) fn sku_owned_by(map: &PartitionMap, owner: &str, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|sku| owner_of(map, partition_for(sku, PARTITIONS)).as_deref() == Some(owner))
        .unwrap()
}

/// Two allocators, `slow` behind a proxy and `fast` direct, sharing the partitions.
pub(crate) async fn two_owner_cluster(name: &str) -> (Cluster, TcpProxy, PartitionMap) {
    two_owner_cluster_with(name, Vec::new()).await
}

/// [`two_owner_cluster`] with extra environment for the `slow` allocator only.
async fn two_owner_cluster_with(
    name: &str,
    slow_env: Vec<(String, String)>,
) -> (Cluster, TcpProxy, PartitionMap) {
    let mut cluster = Cluster::start(name, 0, PARTITIONS).await;
    cluster.allocator_env = slow_env;
    let proxy = cluster.spawn_allocator_behind_proxy("slow");
    cluster.allocator_env = Vec::new();
    cluster.spawn_allocator("fast");
    let map = cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &["slow", "fast"], PARTITIONS as usize / 2)
        })
        .await;
    (cluster, proxy, map)
}

pub(crate) async fn order(base: &str, order_id: &str, lines: &Value) -> (u16, Value) {
    let response = http()
        .post(format!("{base}/v1/orders/{order_id}/reservations"))
        .json(&json!({ "lines": lines }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// The reservation as the allocators have it now (`None` when the id is unknown).
async fn reservation(base: &str, id: &str) -> Option<Reservation> {
    let response = http()
        .get(format!("{base}/v1/reservations/{id}"))
        .send()
        .await
        .unwrap();
    match response.status().as_u16() {
        200 => Some(response.json().await.unwrap()),
        404 => None,
        other => panic!("GET {id}: {other} {}", response.text().await.unwrap()),
    }
}

/// Wait until reservation `id` exists (a late reserve landed) or `timeout` passes.
async fn wait_for_reservation(base: &str, id: &str, timeout: Duration) -> Option<Reservation> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(r) = reservation(base, id).await {
            return Some(r);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A line's reserve times out (the request sits in the proxy) while the other line is refused;
/// the compensating release then finds nothing, and the reserve commits afterwards. The order
/// must not answer a definite `409` in that case, and retrying it must end with nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_landing_after_its_release_never_hides_behind_a_definite_409() {
    const DELAY: Duration = Duration::from_millis(1500);
    const ROUNDS: usize = 4;
    let _serial = serial().await;
    let (cluster, proxy, map) = two_owner_cluster("orders_late").await;
    // One attempt per request (the deadline caps it), far shorter than the proxy's delay.
    let router = cluster
        .router(|c| c.retry_deadline = Duration::from_millis(400))
        .await;
    let slow_sku = sku_owned_by(&map, "slow", "late-slow");
    let short_sku = sku_owned_by(&map, "fast", "late-short");
    cluster.restock(&router.url, &slow_sku, 10).await;
    cluster.restock(&router.url, &short_sku, 1).await;
    let lines = json!([{"sku": slow_sku, "quantity": 1}, {"sku": short_sku, "quantity": 2}]);

    let mut exercised = 0;
    for round in 0..ROUNDS {
        let order_id = format!("late-{round}");
        let slow_line = schema::wire::order_line_id(&order_id, 0);
        // The reserve to the slow owner is read by the proxy and held for DELAY; everything
        // sent after the switch back (the release) passes at once.
        proxy.set_mode(ProxyMode::Delay(DELAY));
        let submitted = tokio::spawn({
            let (base, order_id, lines) = (router.url.clone(), order_id.clone(), lines.clone());
            async move { order(&base, &order_id, &lines).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.set_mode(ProxyMode::Pass);
        let (status, body) = submitted.await.unwrap();
        let late_reserve = body["lines"][0]["outcome"] == "unknown";
        exercised += usize::from(late_reserve);

        // Whatever the answer, the delayed reserve lands within DELAY of being sent.
        let landed = wait_for_reservation(&router.url, &slow_line, DELAY * 2).await;
        if status == 409 {
            assert_eq!(body["outcome_unknown"], false, "{body}");
            let held = landed.filter(|r| r.status == ReservationStatus::Held);
            assert!(
                held.is_none(),
                "round {round}: order answered a definite 409 but {slow_line} is held: {body}"
            );
        } else {
            assert_eq!(status, 503, "round {round}: {body}");
            assert_eq!(body["outcome_unknown"], true, "{body}");
            assert!(late_reserve, "{body}");
            assert_eq!(body["lines"][0]["compensation"], "unsettled", "{body}");
        }

        // The client retries an undecided order with the same id until it is decided.
        let mut answer = (status, body);
        for _ in 0..10 {
            if answer.0 != 503 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            answer = order(&router.url, &order_id, &lines).await;
        }
        assert_eq!(answer.0, 409, "round {round}: {}", answer.1);
        let final_state = reservation(&router.url, &slow_line).await;
        assert!(
            final_state
                .as_ref()
                .is_none_or(|r| r.status != ReservationStatus::Held),
            "round {round}: {slow_line} still held after the order failed: {final_state:?}"
        );
    }
    println!("{exercised} of {ROUNDS} rounds had a reserve land after its release");
    assert!(
        exercised > 0,
        "no round had a reserve outlive its attempt; the scenario was not reproduced"
    );
    let stock: Value = http()
        .get(format!("{}/v1/inventory/{slow_sku}", router.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stock["available"], 10, "{stock}");
    router.stop().await;
}

/// The same order through two routers at once: one router gives up on the slow line quickly
/// (and compensates), the other waits for it. Without serialising the order id the patient
/// router answers "placed" for holds the impatient one released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_through_two_routers_is_decided_once() {
    const DELAY: Duration = Duration::from_millis(800);
    const ROUNDS: usize = 6;
    let _serial = serial().await;
    let (cluster, proxy, map) = two_owner_cluster("orders_twice").await;
    let impatient = cluster
        .router(|c| c.retry_deadline = Duration::from_millis(300))
        .await;
    let patient = cluster.router(|_| {}).await;
    let slow_sku = sku_owned_by(&map, "slow", "twice-slow");
    let fast_sku = sku_owned_by(&map, "fast", "twice-fast");
    cluster.restock(&patient.url, &slow_sku, 100).await;
    cluster.restock(&patient.url, &fast_sku, 100).await;
    let lines = json!([{"sku": slow_sku, "quantity": 1}, {"sku": fast_sku, "quantity": 1}]);
    proxy.set_mode(ProxyMode::Delay(DELAY));

    let mut placed_rounds = 0;
    for round in 0..ROUNDS {
        let order_id = format!("twice-{round}");
        let ((a_status, a_body), (b_status, b_body)) = tokio::join!(
            order(&impatient.url, &order_id, &lines),
            order(&patient.url, &order_id, &lines)
        );
        let placed: Vec<&Value> = [(a_status, &a_body), (b_status, &b_body)]
            .into_iter()
            .filter(|(s, _)| *s == 200 || *s == 201)
            .map(|(_, b)| b)
            .collect();
        let failed = [a_status, b_status].contains(&409);
        assert!(
            placed.is_empty() || !failed,
            "round {round}: one submission placed, the other failed: {a_status} {a_body} / \
             {b_status} {b_body}"
        );
        // Requests the impatient router gave up on may still be in the proxy; let them land.
        tokio::time::sleep(DELAY + Duration::from_millis(300)).await;
        if !placed.is_empty() {
            placed_rounds += 1;
            for index in 0..2 {
                let id = schema::wire::order_line_id(&order_id, index);
                let r = reservation(&patient.url, &id).await;
                assert_eq!(
                    r.as_ref().map(|r| r.status),
                    Some(ReservationStatus::Held),
                    "round {round}: order answered placed ({a_status}/{b_status}) but {id} is \
                     {r:?}"
                );
            }
        }
    }
    println!("{placed_rounds} of {ROUNDS} rounds placed");
    impatient.stop().await;
    patient.stop().await;
}

/// The reservation's status as PostgreSQL has it (`None` when the id is unknown).
pub(crate) async fn status_in_db(cluster: &Cluster, id: &str) -> Option<String> {
    cluster
        .db()
        .await
        .query_opt(
            "SELECT status FROM reservations WHERE reservation_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Submit `order_id` until it is decided (anything but `503`), waiting `pause` between tries.
async fn until_decided(base: &str, order_id: &str, lines: &Value, pause: Duration) -> (u16, Value) {
    let mut answer = order(base, order_id, lines).await;
    for _ in 0..8 {
        if answer.0 != 503 {
            break;
        }
        tokio::time::sleep(pause).await;
        answer = order(base, order_id, lines).await;
    }
    answer
}

/// A line's first reserve attempt commits but its answer times out; the retry of that attempt is
/// answered `429` by the owner's per-client limit. A `429` says nothing about what an earlier
/// attempt did, so the line must be compensated like an unknown one: once the order is decided,
/// no line of it may stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_after_a_timed_out_reserve_leaves_nothing_of_a_failed_order_held() {
    const DELAY: Duration = Duration::from_millis(1000);
    /// Tokens per second of the slow owner's limit, and its burst.
    const RATE: f64 = 0.5;
    let _serial = serial().await;
    let env = |k: &str, v: String| (k.to_owned(), v);
    let (cluster, proxy, map) = two_owner_cluster_with(
        "orders_429",
        vec![
            env("ALLOCATOR_CLIENT_RATE", RATE.to_string()),
            env("ALLOCATOR_CLIENT_BURST", "2".to_owned()),
        ],
    )
    .await;
    let router = cluster
        .router(|c| {
            // Attempts time out well before the proxy delivers the answer; the retry is sent
            // after the first attempt has landed (backoff 0.5–1 s), within the deadline.
            c.allocator_request_timeout = Duration::from_millis(350);
            c.upstream_request_timeout = Duration::from_millis(600);
            c.backoff_base = Duration::from_millis(1000);
            c.backoff_max = Duration::from_millis(1000);
            c.retry_deadline = Duration::from_secs(4);
        })
        .await;
    let slow_sku = sku_owned_by(&map, "slow", "limit-slow");
    let fast_sku = sku_owned_by(&map, "fast", "limit-fast");
    cluster.restock(&router.url, &slow_sku, 10).await;
    cluster.restock(&router.url, &fast_sku, 10).await;
    let lines = json!([{"sku": slow_sku, "quantity": 1}, {"sku": fast_sku, "quantity": 1}]);
    let refill = Duration::from_secs_f64(2.0 / RATE + 0.5);

    // A full bucket of two, minus one: the first attempt takes the last token, its retry none.
    tokio::time::sleep(refill).await;
    let slow = &cluster.allocators[0];
    assert_eq!(slow.id, "slow");
    let probe = http()
        .get(format!(
            "http://127.0.0.1:{}/v1/inventory/{slow_sku}",
            slow.port
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 200);

    proxy.set_mode(ProxyMode::Delay(DELAY));
    let submitted = tokio::spawn({
        let (base, lines) = (router.url.clone(), lines.clone());
        async move { order(&base, "limited-1", &lines).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(ProxyMode::Pass);
    let (status, body) = submitted.await.unwrap();
    println!("first answer: {status} {body}");
    assert_eq!(
        body["lines"][0]["problem"]["status"], 429,
        "the scenario needs the retry refused by the limit: {body}"
    );

    // Whatever the first answer, retried (after the bucket refills) until it is decided.
    let (status, body) = if status == 503 {
        until_decided(&router.url, "limited-1", &lines, refill).await
    } else {
        (status, body)
    };
    assert_eq!(status, 409, "{body}");
    let line_ids: Vec<String> = body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["reservation_id"].as_str().unwrap().to_owned())
        .collect();
    for id in &line_ids {
        let state = status_in_db(&cluster, id).await;
        assert_ne!(
            state.as_deref(),
            Some("held"),
            "{id} of the failed order is still held: {body}"
        );
    }
    // Read from the database: the slow owner's limit would refuse another request.
    let available: i64 = cluster
        .db()
        .await
        .query_one(
            "SELECT available FROM inventory WHERE sku = $1",
            &[&slow_sku],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(available, 10);
    router.stop().await;
}
