//! Tenant namespaces and the per-request quantity cap of a replica, over real HTTP: a client
//! confined to SKU prefixes reaches nothing else (reads, reservations, adjustments), a
//! reservation of another namespace is a `404` by id, and a request over `max_quantity` is a
//! `429` naming the quota, all refused before anything is written.

use std::path::Path;

use crate::auth::{metric, write_auth_file, ROUTER};
use crate::common::*;
use reqwest::{Method, StatusCode};
use schema::wire::{problem_type, HEADER_CLIENT, HEADER_CLIENT_POLICY};
use serde_json::{json, Value};

const ACME: &str = "acme-token-51c3a9e7d0b2";
const ACME_OPS: &str = "acme-ops-token-0d2e4f6a8b1c";
const OPS: &str = "ops-token-9a7c5e3b1d0f";

struct Answer {
    status: StatusCode,
    body: Value,
}

async fn send(
    method: Method,
    url: &str,
    token: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = http().request(method, url).bearer_auth(token);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer { status, body }
}

fn reserve(id: &str, sku: &str, quantity: i64) -> Value {
    json!({"reservation_id": id, "sku": sku, "quantity": quantity})
}

fn adjust(id: &str, delta: i64) -> Value {
    json!({"adjustment_id": id, "delta": delta})
}

fn assert_problem(answer: &Answer, status: StatusCode, kind: &str, what: &str) {
    assert_eq!(answer.status, status, "{what}: {}", answer.body);
    assert_eq!(answer.body["type"], kind, "{what}: {}", answer.body);
}

async fn replica(dir: &Path, name: &str) -> TestReplica {
    let db = migrated_database(PARTITIONS).await;
    let auth = dir.join("auth");
    write_auth_file(
        &auth,
        &[
            ("acme", "reserve", ACME, "skus=acme:* max_quantity=2"),
            (
                "acme-ops",
                "reserve,admin",
                ACME_OPS,
                "skus=acme:*,beta:tee",
            ),
            ("ops", "reserve,admin", OPS, ""),
            ("router-1", "router", ROUTER, ""),
        ],
    );
    let mut config = fast_config(&db, name);
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    replica
}

#[tokio::test]
async fn a_namespaced_client_reaches_only_its_own_skus() {
    let dir = tempfile::tempdir().unwrap();
    let replica = replica(dir.path(), "tenants-ns").await;
    let base = replica.url.clone();
    adjustments_stay_in_their_namespaces(&base).await;
    reads_and_reservations_stay_in_their_namespaces(&base).await;
    another_namespaces_reservations_do_not_exist(&base).await;
    routed_namespaces_apply_and_cannot_be_loosened(&base).await;

    let series = "allocator_client_requests_total{client=\"acme\",outcome=\"namespace_forbidden\"}";
    assert!(metric(&base, series).await >= 2.0);
    replica.stop().await;
}

/// Adjustments: an admin confined to its namespaces cannot touch another SKU; exact and prefix
/// entries match as written.
async fn adjustments_stay_in_their_namespaces(base: &str) {
    let inventory = |sku: &str| format!("{base}/v1/inventory/{sku}");
    let adjustments = |sku: &str| format!("{base}/v1/inventory/{sku}/adjustments");
    let forbidden = problem_type::NAMESPACE_FORBIDDEN;

    for sku in ["acme:1", "other:1"] {
        let answer = send(
            Method::POST,
            &adjustments(sku),
            OPS,
            &[],
            Some(adjust(sku, 10)),
        )
        .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }
    let outside = send(
        Method::POST,
        &adjustments("other:1"),
        ACME_OPS,
        &[],
        Some(adjust("acme-shrinks-other", -5)),
    )
    .await;
    assert_problem(&outside, StatusCode::FORBIDDEN, forbidden, "adjust outside");
    // An exact SKU entry matches that SKU only, a prefix entry everything under it.
    for (sku, status) in [
        ("beta:tee", StatusCode::CREATED),
        ("beta:teeshirt", StatusCode::FORBIDDEN),
        ("acme:2", StatusCode::CREATED),
    ] {
        let answer = send(
            Method::POST,
            &adjustments(sku),
            ACME_OPS,
            &[],
            Some(adjust(&format!("acme-ops-{sku}"), 3)),
        )
        .await;
        assert_eq!(answer.status, status, "{sku}: {}", answer.body);
    }
    let other = send(Method::GET, &inventory("other:1"), OPS, &[], None).await;
    assert_eq!(
        other.body["on_hand"], 10,
        "nothing was applied: {}",
        other.body
    );
}

/// Reads and reservations of a SKU outside the client's namespaces are refused.
async fn reads_and_reservations_stay_in_their_namespaces(base: &str) {
    let inventory = |sku: &str| format!("{base}/v1/inventory/{sku}");
    let reservations = format!("{base}/v1/reservations");
    let forbidden = problem_type::NAMESPACE_FORBIDDEN;

    let read = send(Method::GET, &inventory("other:1"), ACME, &[], None).await;
    assert_problem(&read, StatusCode::FORBIDDEN, forbidden, "read outside");
    let read = send(Method::GET, &inventory("acme:1"), ACME, &[], None).await;
    assert_eq!(read.status, StatusCode::OK);
    let held = send(
        Method::POST,
        &reservations,
        ACME,
        &[],
        Some(reserve("acme-r1", "other:1", 1)),
    )
    .await;
    assert_problem(&held, StatusCode::FORBIDDEN, forbidden, "reserve outside");
    let held = send(
        Method::POST,
        &reservations,
        ACME,
        &[],
        Some(reserve("acme-r1", "acme:1", 1)),
    )
    .await;
    assert_eq!(held.status, StatusCode::CREATED, "{}", held.body);
}

/// Another client's reservation of another namespace is a 404 for this client, and unchanged.
async fn another_namespaces_reservations_do_not_exist(base: &str) {
    let reservations = format!("{base}/v1/reservations");

    let theirs = send(
        Method::POST,
        &reservations,
        OPS,
        &[],
        Some(reserve("ops-r1", "other:1", 2)),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CREATED);
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::POST, "/confirm"),
        (Method::POST, "/release"),
    ] {
        let url = format!("{reservations}/ops-r1{suffix}");
        let answer = send(method, &url, ACME, &[], None).await;
        assert_problem(
            &answer,
            StatusCode::NOT_FOUND,
            problem_type::NOT_FOUND,
            &url,
        );
    }
    let still = send(
        Method::GET,
        &format!("{reservations}/ops-r1"),
        OPS,
        &[],
        None,
    )
    .await;
    assert_eq!(still.body["status"], "held", "{}", still.body);
    // The client's own reservation is reachable by id.
    let own = send(
        Method::POST,
        &format!("{reservations}/acme-r1/confirm"),
        ACME,
        &[],
        None,
    )
    .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
}

/// A router's forwarded namespaces bind the request, and a direct caller cannot loosen its own.
async fn routed_namespaces_apply_and_cannot_be_loosened(base: &str) {
    let inventory = |sku: &str| format!("{base}/v1/inventory/{sku}");
    let reservations = format!("{base}/v1/reservations");
    let forbidden = problem_type::NAMESPACE_FORBIDDEN;

    // A router forwards its client's namespaces with the client's name; the replica applies
    // them to the body and to the stored reservation alike.
    let via_router = [
        (HEADER_CLIENT, "acme"),
        (HEADER_CLIENT_POLICY, "skus=acme:*"),
    ];
    let routed = send(
        Method::POST,
        &reservations,
        ROUTER,
        &via_router,
        Some(reserve("routed-r1", "other:1", 1)),
    )
    .await;
    assert_problem(&routed, StatusCode::FORBIDDEN, forbidden, "routed reserve");
    let routed = send(
        Method::POST,
        &format!("{reservations}/ops-r1/release"),
        ROUTER,
        &via_router,
        None,
    )
    .await;
    assert_eq!(routed.status, StatusCode::NOT_FOUND, "{}", routed.body);
    // Direct callers cannot loosen their own namespaces with the header.
    let loosened = send(
        Method::GET,
        &inventory("other:1"),
        ACME,
        &[(HEADER_CLIENT_POLICY, "skus=other:*")],
        None,
    )
    .await;
    assert_eq!(loosened.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_request_over_the_quantity_cap_is_refused_naming_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let replica = replica(dir.path(), "tenants-quota").await;
    let base = replica.url.clone();
    let reservations = format!("{base}/v1/reservations");
    let stocked = send(
        Method::POST,
        &format!("{base}/v1/inventory/acme:q/adjustments"),
        OPS,
        &[],
        Some(adjust("q-stock", 10)),
    )
    .await;
    assert_eq!(stocked.status, StatusCode::CREATED);

    let over = send(
        Method::POST,
        &reservations,
        ACME,
        &[],
        Some(reserve("q-1", "acme:q", 3)),
    )
    .await;
    assert_problem(
        &over,
        StatusCode::TOO_MANY_REQUESTS,
        problem_type::QUOTA_EXCEEDED,
        "over the cap",
    );
    assert_eq!(over.body["quota"], "max_quantity", "{}", over.body);
    assert_eq!(over.body["limit"], 2, "{}", over.body);
    // Nothing was held.
    let row = send(
        Method::GET,
        &format!("{base}/v1/inventory/acme:q"),
        OPS,
        &[],
        None,
    )
    .await;
    assert_eq!(row.body["held"], 0, "{}", row.body);
    // At the cap it is served; other clients have no cap.
    let at = send(
        Method::POST,
        &reservations,
        ACME,
        &[],
        Some(reserve("q-2", "acme:q", 2)),
    )
    .await;
    assert_eq!(at.status, StatusCode::CREATED, "{}", at.body);
    let free = send(
        Method::POST,
        &reservations,
        OPS,
        &[],
        Some(reserve("q-3", "acme:q", 5)),
    )
    .await;
    assert_eq!(free.status, StatusCode::CREATED, "{}", free.body);
    // A router's client carries its cap in the forwarded policy.
    let routed = send(
        Method::POST,
        &reservations,
        ROUTER,
        &[
            (HEADER_CLIENT, "acme"),
            (HEADER_CLIENT_POLICY, "max_quantity=1"),
        ],
        Some(reserve("q-4", "acme:q", 2)),
    )
    .await;
    assert_eq!(
        routed.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        routed.body
    );
    // A body the wire types refuse is answered by them, whoever sends it.
    let invalid = send(
        Method::POST,
        &reservations,
        ACME,
        &[],
        Some(json!({"reservation_id": "q-5", "sku": "acme:q", "quantity": 0})),
    )
    .await;
    assert_problem(
        &invalid,
        StatusCode::BAD_REQUEST,
        problem_type::INVALID_REQUEST,
        "invalid body",
    );

    let series = "allocator_quota_refusals_total{client=\"acme\",quota=\"max_quantity\"}";
    assert!(metric(&base, series).await >= 2.0);
    replica.stop().await;
}
