//! The public API through a router in front of three real allocators: routing to the owner,
//! pass-through of the allocator's answers, and the router's own input validation.

use crate::common::{http, invalid_request_bodies, metric, owner_of, serial, Cluster};
use schema::partition::partition_for;
use schema::wire::{problem_type, Problem, ReservationStatus, ReserveRequest};

const PARTITIONS: u32 = 16;

async fn problem(response: reqwest::Response) -> (u16, Problem) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        content_type.as_deref(),
        Some("application/problem+json"),
        "status {status}"
    );
    (status, response.json().await.expect("problem body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_to_the_owner_and_passes_answers_through() {
    let _serial = serial().await;
    let cluster = Cluster::start("api_fwd", 3, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    let client = http();
    cluster.restock(base, "sku-a", 5).await;

    let api = &router.api;
    let reserve = |id: &str, sku: &str, quantity: i64| ReserveRequest {
        reservation_id: id.parse().expect("valid id"),
        sku: sku.parse().expect("valid sku"),
        quantity: quantity.try_into().expect("valid quantity"),
        ttl_seconds: None,
    };

    // New hold: 201 from the partition's owner.
    let answer = api.reserve(&reserve("r-1", "sku-a", 2)).await;
    assert_eq!(answer.status, 201);
    let served_by = answer.header("x-served-by").unwrap().to_owned();
    let r = answer.ok();
    assert_eq!(r.status, ReservationStatus::Held);
    assert_eq!(r.partition, partition_for("sku-a", PARTITIONS));
    let map = cluster.map().await;
    assert_eq!(Some(served_by), owner_of(&map, r.partition));

    // Replay: 200 + Idempotent-Replayed, same reservation.
    let answer = api.reserve(&reserve("r-1", "sku-a", 2)).await;
    assert_eq!(answer.status, 200);
    assert!(answer.replayed());
    assert_eq!(answer.ok().reservation_id, "r-1");

    // Reuse with another payload: 422.
    let answer = api.reserve(&reserve("r-1", "sku-a", 3)).await;
    let status = answer.status;
    let p = answer.problem();
    assert_eq!(
        (status.as_u16(), p.kind.as_str()),
        (422, problem_type::IDEMPOTENCY_MISMATCH)
    );

    // Out of stock: 409 with what is available.
    let answer = api.reserve(&reserve("r-2", "sku-a", 4)).await;
    let status = answer.status;
    let p = answer.problem();
    assert_eq!(
        (status.as_u16(), p.kind.as_str()),
        (409, problem_type::INSUFFICIENT_STOCK)
    );
    assert_eq!(p.available, Some(3));

    // Unknown SKU: the allocator's 404.
    assert_eq!(api.reserve(&reserve("r-3", "nope", 1)).await.status, 404);

    // Lifecycle by id (partition found through PostgreSQL).
    assert_eq!(api.reservation("r-1").await.status, 200);
    let confirm = api.confirm("r-1").await;
    assert_eq!(confirm.status, 200);
    assert_eq!(confirm.ok().status, ReservationStatus::Confirmed);
    let release = api.release("r-1").await;
    let status = release.status;
    let p = release.problem();
    assert_eq!(
        (status.as_u16(), p.kind.as_str()),
        (409, problem_type::INVALID_STATE)
    );
    assert_eq!(p.current_status, Some(ReservationStatus::Confirmed));

    // Unknown reservation: 404 without asking an allocator.
    let answer = api.reservation("missing").await;
    let status = answer.status;
    let p = answer.problem();
    assert_eq!(
        (status.as_u16(), p.kind.as_str()),
        (404, problem_type::NOT_FOUND)
    );

    // Ids with reserved characters survive the hop (percent-encoded both ways).
    let odd_id = "odd/id?x=1#%20 ü";
    assert_eq!(api.reserve(&reserve(odd_id, "sku-a", 1)).await.status, 201);
    let answer = api.reservation(odd_id).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.ok().reservation_id, odd_id);
    assert_eq!(api.release(odd_id).await.status, 200);

    // Inventory and the map.
    let answer = api.inventory("sku-a").await;
    assert_eq!(answer.status, 200);
    let inventory = answer.ok();
    assert_eq!((inventory.on_hand, inventory.available), (5, 3));
    let map = api.partitions().await.ok();
    assert_eq!(map.partition_count, PARTITIONS);
    assert!(map.partitions.iter().all(|p| p.owner_id.is_some()));
    assert_eq!(
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(metric(base, "router_forwards_total{outcome=\"success\"}").await >= 5.0);
    assert!(metric(base, "router_assignment_revision").await >= 1.0);
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        "router_upstream_latency_seconds_bucket{le=\"0.0005\"}",
        "router_upstream_latency_seconds_bucket{le=\"5\"}",
        "router_forward_duration_seconds_bucket{le=\"10\"}",
        "router_redis_feed_connected",
        "router_map_refreshes_total{cause=\"startup\"}",
    ] {
        assert!(text.contains(series), "{series} missing from /metrics");
    }

    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_bad_input_with_problems_and_never_500() {
    let _serial = serial().await;
    let cluster = Cluster::start("api_bad", 1, 4).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    let client = http();

    for (name, path, body) in invalid_request_bodies() {
        let response = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, p) = problem(response).await;
        assert_eq!(status, 400, "{name}: {p:?}");
        assert_eq!(p.kind, problem_type::INVALID_REQUEST, "{name}");
    }

    // A refused value is answered in the words of its rule, whether it came in a body, a path
    // segment or an order line.
    let refused = [
        (
            "/v1/reservations",
            r#"{"reservation_id":"a","sku":"bad sku","quantity":1}"#,
            "sku may contain only A-Z a-z 0-9 . _ : -",
        ),
        (
            "/v1/reservations",
            r#"{"reservation_id":"a","sku":"s","quantity":0}"#,
            "quantity must be between 1 and 1000000",
        ),
        (
            "/v1/inventory/bad%20sku/adjustments",
            r#"{"adjustment_id":"a","delta":1}"#,
            "sku may contain only A-Z a-z 0-9 . _ : -",
        ),
        (
            "/v1/orders/o-1/reservations",
            r#"{"lines":[{"sku":"s","quantity":1},{"sku":"s","quantity":0}]}"#,
            "lines[1]: quantity must be between 1 and 1000000",
        ),
    ];
    for (path, body, detail) in refused {
        let response = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, p) = problem(response).await;
        assert_eq!(status, 400, "{path} {body}");
        assert_eq!(p.detail.as_deref(), Some(detail), "{path} {body}");
        assert_eq!(p.title, "Invalid request");
    }

    // Oversized body: 413, as the allocator answers.
    let big = format!(
        r#"{{"reservation_id":"{}","sku":"s","quantity":1}}"#,
        "x".repeat(schema::wire::limits::BODY_MAX_BYTES)
    );
    let response = client
        .post(format!("{base}/v1/reservations"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    let (status, p) = problem(response).await;
    assert_eq!(status, 413, "{p:?}");

    // Unknown route and wrong method.
    let (status, _) = problem(client.get(format!("{base}/v2/x")).send().await.unwrap()).await;
    assert_eq!(status, 404);
    let (status, _) = problem(
        client
            .delete(format!("{base}/v1/reservations"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405);
    // Control characters in an id (path) are refused.
    let (status, _) = problem(
        client
            .get(format!("{base}/v1/reservations/a%01b"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);

    router.stop().await;
}
