//! Tenant namespaces and the per-request quantity cap at the router: a client confined to SKU
//! prefixes reaches nothing else, orders included (every line is checked before any is reserved),
//! reservations of other namespaces are `404` by id (the owner checks the stored SKU against the
//! namespaces the router forwards), and requests over `max_quantity` are `429`.

use std::io::Write;
use std::path::Path;

use access::table::hash_hex;
use reqwest::{Method, StatusCode};
use schema::wire::{order_line_id, problem_type};
use serde_json::{json, Value};

use crate::common::{http, metric, serial, Cluster};

const ACME: &str = "acme-token-7e1f3a5c9b2d";
const ACME_OPS: &str = "acme-ops-token-4b6d8f0a2c1e";
const OPS: &str = "ops-token-2c4e6a8f0b1d";
const ROUTER: &str = "router-token-6f8a0c2e4b1d";

pub(crate) fn auth_file(path: &Path, clients: &[(&str, &str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token, options) in clients {
        writeln!(
            file,
            "{name} {scopes} {} {options}",
            hash_hex(token.as_bytes())
        )
        .unwrap();
    }
}

struct Answer {
    status: StatusCode,
    body: Value,
}

async fn send(method: Method, url: &str, token: &str, body: Option<Value>) -> Answer {
    let mut request = http().request(method, url).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer { status, body }
}

fn assert_problem(answer: &Answer, status: StatusCode, kind: &str, what: &str) {
    assert_eq!(answer.status, status, "{what}: {}", answer.body);
    assert_eq!(answer.body["type"], kind, "{what}: {}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_and_quantity_caps_hold_at_the_router() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER, "")]);
    let router_auth = dir.path().join("router-auth");
    auth_file(
        &router_auth,
        &[
            ("acme", "reserve", ACME, "skus=acme:* max_quantity=3"),
            ("acme-ops", "reserve,admin", ACME_OPS, "skus=acme:*"),
            ("ops", "reserve,admin", OPS, ""),
        ],
    );
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, ROUTER).unwrap();
    let cluster = Cluster::start_with_env(
        "tenants",
        1,
        4,
        vec![
            (
                "ALLOCATOR_AUTH_FILE".into(),
                allocator_auth.display().to_string(),
            ),
            ("ALLOCATOR_REQUIRE_ROUTER".into(), "true".into()),
        ],
    )
    .await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    let base = router.url.clone();
    let adjust = |sku: &str| format!("{base}/v1/inventory/{sku}/adjustments");
    for sku in ["acme:1", "other:1"] {
        let body = json!({"adjustment_id": format!("seed-{sku}"), "delta": 10});
        let answer = send(Method::POST, &adjust(sku), OPS, Some(body)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    }

    refused_outside_the_namespaces(&base).await;
    the_quantity_cap_holds_per_reservation_and_per_order(&base).await;

    // Inside the namespaces and the cap everything works, orders and ids included.
    let reservations = format!("{base}/v1/reservations");
    let order =
        json!({"lines": [{"sku": "acme:1", "quantity": 1}, {"sku": "acme:1", "quantity": 2}]});
    let answer = send(
        Method::POST,
        &format!("{base}/v1/orders/o-ok/reservations"),
        ACME,
        Some(order),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let answer = send(
        Method::POST,
        &format!("{reservations}/{}/release", order_line_id("o-ok", 0)),
        ACME,
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    let series = |outcome: &str| {
        format!("router_client_requests_total{{client=\"acme\",outcome=\"{outcome}\"}}")
    };
    assert!(metric(&base, &series("namespace_forbidden")).await >= 3.0);
    assert!(metric(&base, &series("quota_exceeded")).await >= 2.0);
    let quota = "router_quota_refusals_total{client=\"acme\",quota=\"max_quantity\"}";
    assert!(metric(&base, quota).await >= 2.0);
    router.stop().await;
}

/// Everything outside the client's namespaces is refused at the router: adjustments, reads, an
/// order with one line outside (refused whole, before any line is reserved), a reservation, and
/// another client's reservation by id, which stays as it was.
async fn refused_outside_the_namespaces(base: &str) {
    let forbidden = problem_type::NAMESPACE_FORBIDDEN;
    let adjust = |sku: &str| format!("{base}/v1/inventory/{sku}/adjustments");
    let reservations = format!("{base}/v1/reservations");
    // Adjustments and reads outside the namespaces.
    let body = json!({"adjustment_id": "acme-ops-other", "delta": -10});
    let answer = send(Method::POST, &adjust("other:1"), ACME_OPS, Some(body)).await;
    assert_problem(&answer, StatusCode::FORBIDDEN, forbidden, "adjust outside");
    let answer = send(
        Method::GET,
        &format!("{base}/v1/inventory/other:1"),
        ACME,
        None,
    )
    .await;
    assert_problem(&answer, StatusCode::FORBIDDEN, forbidden, "read outside");

    // An order with one line outside is refused whole, before any line is reserved.
    let order =
        json!({"lines": [{"sku": "acme:1", "quantity": 1}, {"sku": "other:1", "quantity": 1}]});
    let answer = send(
        Method::POST,
        &format!("{base}/v1/orders/o-mixed/reservations"),
        ACME,
        Some(order),
    )
    .await;
    assert_problem(&answer, StatusCode::FORBIDDEN, forbidden, "order outside");
    let acme = send(
        Method::GET,
        &format!("{base}/v1/inventory/acme:1"),
        OPS,
        None,
    )
    .await;
    assert_eq!(acme.body["held"], 0, "no line was reserved: {}", acme.body);

    // A plain reservation outside, then another client's reservation by id.
    let body = json!({"reservation_id": "acme-x", "sku": "other:1", "quantity": 1});
    let answer = send(Method::POST, &reservations, ACME, Some(body)).await;
    assert_problem(&answer, StatusCode::FORBIDDEN, forbidden, "reserve outside");
    let body = json!({"reservation_id": "ops-r", "sku": "other:1", "quantity": 1});
    let answer = send(Method::POST, &reservations, OPS, Some(body)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::POST, "/confirm"),
        (Method::POST, "/release"),
    ] {
        let url = format!("{reservations}/ops-r{suffix}");
        let answer = send(method, &url, ACME, None).await;
        assert_problem(
            &answer,
            StatusCode::NOT_FOUND,
            problem_type::NOT_FOUND,
            &url,
        );
    }
    let still = send(Method::GET, &format!("{reservations}/ops-r"), OPS, None).await;
    assert_eq!(still.body["status"], "held", "{}", still.body);
}

/// The quantity cap applies per reservation and over an order's lines together; a refused order
/// reserves nothing.
async fn the_quantity_cap_holds_per_reservation_and_per_order(base: &str) {
    let reservations = format!("{base}/v1/reservations");
    // The quantity cap: per reservation, and over an order's lines together.
    let body = json!({"reservation_id": "acme-big", "sku": "acme:1", "quantity": 4});
    let answer = send(Method::POST, &reservations, ACME, Some(body)).await;
    assert_problem(
        &answer,
        StatusCode::TOO_MANY_REQUESTS,
        problem_type::QUOTA_EXCEEDED,
        "reserve over the cap",
    );
    assert_eq!(answer.body["quota"], "max_quantity");
    let order =
        json!({"lines": [{"sku": "acme:1", "quantity": 2}, {"sku": "acme:1", "quantity": 2}]});
    let answer = send(
        Method::POST,
        &format!("{base}/v1/orders/o-big/reservations"),
        ACME,
        Some(order),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.body
    );
    let acme = send(
        Method::GET,
        &format!("{base}/v1/inventory/acme:1"),
        OPS,
        None,
    )
    .await;
    assert_eq!(acme.body["held"], 0, "nothing was reserved: {}", acme.body);
}
