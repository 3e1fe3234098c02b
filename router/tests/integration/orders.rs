//! All-or-nothing orders through a router in front of three allocators: success, failure with
//! compensation, retries converging, and an order "resumed" after a router died mid-way.

use crate::common::{http, serial, Cluster};
use schema::wire::{
    problem_type, Reservation, ReservationStatus, ReserveRequest, HEADER_ORDER_LINE,
};
use serde_json::{json, Value};
use testkit::ApiClient;

async fn order(base: &str, order_id: &str, lines: Value) -> (u16, Option<String>, Value) {
    let response = http()
        .post(format!("{base}/v1/orders/{order_id}/reservations"))
        .json(&json!({ "lines": lines }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, response.json().await.unwrap())
}

async fn available(base: &str, sku: &str) -> i64 {
    ApiClient::new(base).inventory(sku).await.ok().available
}

/// A single-line hold with the id an order gives its line.
fn line_hold(reservation_id: &str, sku: &str, quantity: i64) -> ReserveRequest {
    ReserveRequest {
        reservation_id: reservation_id.parse().expect("valid id"),
        sku: sku.parse().expect("valid sku"),
        quantity: quantity.try_into().expect("valid quantity"),
        ttl_seconds: None,
    }
}

/// The URL of the allocator owning `sku`'s partition.
async fn owner_url(cluster: &Cluster, sku: &str) -> String {
    let map = cluster.map().await;
    let partition = schema::partition::partition_for(sku, map.partition_count);
    map.partitions
        .iter()
        .find(|p| p.partition == partition)
        .and_then(|p| p.owner_url.clone())
        .expect("an owner")
}

/// The status of reservation `id`, on whichever shard holds it (at most one does).
async fn status_in_db(cluster: &Cluster, id: &str) -> Option<String> {
    let rows = cluster
        .query_every_shard(
            "SELECT status FROM reservations WHERE reservation_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert!(rows.len() <= 1, "{id} is stored on {} shards", rows.len());
    rows.first().map(|r| r.get(0))
}

/// Every line held: 201 with one reservation per line, ids derived from the order id; retrying
/// the same order replays it (200 + `Idempotent-Replayed`) and takes no extra stock. Expects
/// apple 10 and pear 1 in stock, and leaves apple at 8, pear at 0.
async fn a_held_order_replays(base: &str) {
    // 1. Every line held: 201 with one reservation per line, ids derived from the order id.
    let lines = json!([{"sku": "apple", "quantity": 2}, {"sku": "pear", "quantity": 1}]);
    let (status, _, body) = order(base, "o-1", lines.clone()).await;
    assert_eq!(status, 201, "{body}");
    let reservations: Vec<Reservation> =
        serde_json::from_value(body["reservations"].clone()).unwrap();
    let ids: Vec<&str> = reservations
        .iter()
        .map(|r| r.reservation_id.as_str())
        .collect();
    assert_eq!(ids, ["order:o-1:0", "order:o-1:1"]);
    assert!(reservations
        .iter()
        .all(|r| r.status == ReservationStatus::Held));
    assert_eq!(available(base, "apple").await, 8);
    assert_eq!(available(base, "pear").await, 0);

    // 2. Retrying the same order replays it: 200 + Idempotent-Replayed, no extra stock taken.
    let (status, replayed, body) = order(base, "o-1", lines).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(body["reservations"].as_array().unwrap().len(), 2);
    assert_eq!(available(base, "apple").await, 8);
}

/// One line short of stock: 409 order-failed and the held lines are released (compensation);
/// retrying the failed order replays the stored failure and holds nothing again.
async fn a_short_line_fails_the_order_and_releases_the_others(cluster: &Cluster, base: &str) {
    // 3. One line short of stock: 409 order-failed, the held line is released (compensation).
    let lines = json!([
        {"sku": "apple", "quantity": 3},
        {"sku": "plum", "quantity": 1},
        {"sku": "pear", "quantity": 1}
    ]);
    let (status, _, body) = order(base, "o-2", lines.clone()).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["type"], problem_type::ORDER_FAILED);
    assert_eq!(body["outcome_unknown"], false);
    let outcomes: Vec<&str> = body["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["held", "held", "refused"]);
    assert_eq!(
        body["lines"][2]["problem"]["type"],
        problem_type::INSUFFICIENT_STOCK
    );
    assert_eq!(body["lines"][0]["compensation"], "released");
    assert_eq!(body["lines"][1]["compensation"], "released");
    assert_eq!(available(base, "apple").await, 8);
    assert_eq!(available(base, "plum").await, 5);
    assert_eq!(
        status_in_db(cluster, "order:o-2:0").await.as_deref(),
        Some("released")
    );
    assert_eq!(
        status_in_db(cluster, "order:o-2:2").await.as_deref(),
        Some("rejected")
    );

    // 4. Retrying the failed order replays the stored failure; nothing is held again.
    let (status, replayed, replay) = order(base, "o-2", lines).await;
    assert_eq!(status, 409, "{replay}");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(replay, body);
    assert_eq!(available(base, "apple").await, 8);
    assert_eq!(available(base, "plum").await, 5);
}

/// Reusing order `o-5`'s id with changed lines is refused (an invalid line with 400, a changed
/// one with 422) before anything is reserved, so the original order's holds stay.
async fn a_changed_order_is_refused_and_keeps_its_holds(cluster: &Cluster, base: &str) {
    // 8. Reusing the order id with changed lines is refused (422) before anything is reserved,
    //    so the original order's holds stay.
    let (status, _, body) = order(
        base,
        "o-5",
        json!([
            {"sku": "plum", "quantity": 1},
            {"sku": "apple", "quantity": 1},
            {"sku": "fig", "quantity": 0}
        ]),
    )
    .await;
    assert_eq!(status, 400, "zero quantity is invalid: {body}");
    let (status, _, body) = order(
        base,
        "o-5",
        json!([
            {"sku": "plum", "quantity": 1},
            {"sku": "apple", "quantity": 1},
            {"sku": "apple", "quantity": 1}
        ]),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["type"], problem_type::IDEMPOTENCY_MISMATCH);
    assert_eq!(body["lines"], json!([]));
    assert_eq!(status_in_db(cluster, "order:o-5:2").await, None);
    assert_eq!(available(base, "plum").await, 3);
    assert_eq!(available(base, "apple").await, 7);
    assert_eq!(
        status_in_db(cluster, "order:o-5:1").await.as_deref(),
        Some("held")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_are_all_or_nothing_and_retries_converge() {
    let _serial = serial().await;
    let cluster = Cluster::start("orders", 3, 16).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    for (sku, stock) in [("apple", 10), ("pear", 1), ("plum", 5), ("fig", 3)] {
        cluster.restock(base, sku, stock).await;
    }

    // 1.-2. Every line held, and a retry of the order replays it.
    a_held_order_replays(base).await;
    // 3.-4. One line short of stock fails the order; the retry replays the failure.
    a_short_line_fails_the_order_and_releases_the_others(&cluster, base).await;

    // 5. Two lines for the same SKU are separate reservations.
    let (status, _, body) = order(
        base,
        "o-3",
        json!([{"sku": "fig", "quantity": 1}, {"sku": "fig", "quantity": 2}]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(available(base, "fig").await, 0);

    // 6. An unknown SKU fails the order like any refusal.
    let (status, _, body) = order(
        base,
        "o-4",
        json!([{"sku": "plum", "quantity": 1}, {"sku": "durian", "quantity": 1}]),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["lines"][1]["problem"]["status"], 404);
    assert_eq!(available(base, "plum").await, 5);

    // 7. A router that died mid-order: line 0 was reserved, nothing else happened. The client
    //    retries the order (through any router) and it converges to a complete order. (Line 0 is
    //    reserved as a router does it: at its owner, marked as an order line.)
    let line0 = http()
        .post(format!(
            "{}/v1/reservations",
            owner_url(&cluster, "plum").await
        ))
        .header(HEADER_ORDER_LINE, "true")
        .json(&line_hold("order:o-5:0", "plum", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(line0.status(), 201);
    let other_router = cluster.router(|_| {}).await;
    let (status, replayed, body) = order(
        &other_router.url,
        "o-5",
        json!([{"sku": "plum", "quantity": 2}, {"sku": "apple", "quantity": 1}]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(replayed, None);
    assert_eq!(available(base, "plum").await, 3);
    assert_eq!(available(base, "apple").await, 7);

    // 8. Reusing the order id with changed lines is refused before anything is reserved.
    a_changed_order_is_refused_and_keeps_its_holds(&cluster, base).await;

    // 9. A reservation made directly under the id a line had before order lines got their own
    //    namespace collides with nothing: the order is placed.
    let direct = router.api.reserve(&line_hold("o-6:0", "plum", 1)).await;
    assert_eq!(direct.status, 201);
    let (status, _, body) = order(
        base,
        "o-6",
        json!([{"sku": "plum", "quantity": 2}, {"sku": "apple", "quantity": 1}]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(available(base, "plum").await, 0);
    assert_eq!(available(base, "apple").await, 6);
    assert_eq!(
        status_in_db(&cluster, "o-6:0").await.as_deref(),
        Some("held")
    );

    other_router.stop().await;
    router.stop().await;
}

/// An order stored undecided by an earlier attempt (here: under the line ids routers used before
/// order lines had a namespace of their own): line 0 was held by that attempt, and line 1's id is
/// taken by another client with another payload. The order is refused (`422`) and the other
/// client's reservation stays, but the order's own hold must not: a replayed hold of an order
/// whose stored request matched is the order's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_colliding_line_never_strands_the_orders_own_holds() {
    let _serial = serial().await;
    let cluster = Cluster::start("orders_collide", 2, 8).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    cluster.restock(base, "plum", 5).await;
    cluster.restock(base, "apple", 5).await;
    let lines = json!([{"sku": "plum", "quantity": 2}, {"sku": "apple", "quantity": 1}]);
    // The order's row lives on the shard its id names (one database: the only one).
    let order_shard = schema::shard::order_shard("o-old", cluster.shard_count());
    cluster
        .shard_db(order_shard)
        .await
        .unwrap()
        .execute(
            "INSERT INTO orders (order_id, request, attempts) VALUES ($1, $2::text::jsonb, 1)",
            &[&"o-old", &json!({ "lines": lines }).to_string()],
        )
        .await
        .unwrap();
    // What the earlier attempt left: line 0 held under its line id.
    let earlier = router.api.reserve(&line_hold("o-old:0", "plum", 2)).await;
    assert_eq!(earlier.status, 201);
    // Another client's reservation under line 1's id, with another payload.
    let other = router.api.reserve(&line_hold("o-old:1", "apple", 3)).await;
    assert_eq!(other.status, 201);

    let (status, _, body) = order(base, "o-old", lines).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["type"], problem_type::IDEMPOTENCY_MISMATCH, "{body}");
    assert_eq!(body["lines"][1]["problem"]["status"], 422, "{body}");
    assert_ne!(
        status_in_db(&cluster, "o-old:0").await.as_deref(),
        Some("held"),
        "the order's own hold was stranded: {body}"
    );
    assert_eq!(available(base, "plum").await, 5);
    assert_eq!(
        status_in_db(&cluster, "o-old:1").await.as_deref(),
        Some("held"),
        "the other client's reservation is not the order's to release"
    );
    assert_eq!(available(base, "apple").await, 2);
    router.stop().await;
}

/// Order line ids live in a namespace of their own: a single reservation cannot take one, through
/// a router or directly at an allocator, so no client can occupy a line of someone's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_reservations_cannot_take_an_order_line_id() {
    let _serial = serial().await;
    let cluster = Cluster::start("orders_namespace", 1, 2).await;
    let router = cluster.router(|_| {}).await;
    cluster.restock(&router.url, "kiwi", 5).await;
    let direct = cluster.allocators[0].url.clone();
    for base in [router.url.as_str(), direct.as_str()] {
        let response = http()
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": "order:o-9:0", "sku": "kiwi", "quantity": 1}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 400, "{base}: {body}");
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(body["type"], problem_type::INVALID_REQUEST, "{body}");
        assert!(
            body["detail"].as_str().unwrap().contains("order:"),
            "the answer names the reserved prefix: {body}"
        );
    }
    assert_eq!(available(&router.url, "kiwi").await, 5);
    // The order itself holds its line under that id.
    let (status, _, body) =
        order(&router.url, "o-9", json!([{"sku": "kiwi", "quantity": 1}])).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["reservations"][0]["reservation_id"], "order:o-9:0");
    // Reading, confirming and releasing a line by its id stays open to the client.
    let got = router.api.reservation("order:o-9:0").await;
    assert_eq!(got.status, 200);
    router.stop().await;
}
