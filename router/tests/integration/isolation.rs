//! Tenants kept apart through a router with authentication on (issue 33): another client's
//! adjustment id is answered as not found, naming none of its data; a retried order never takes
//! another client's reservation for one of its lines; a client listed with two tokens (a
//! rotation) is one client: one owner, one quota, one rate bucket.

use std::io::Write;
use std::path::Path;

use access::table::hash_hex;
use reqwest::{Method, StatusCode};
use schema::wire::{problem_type, HEADER_REPLAYED};
use serde_json::{json, Value};

use crate::common::{http, metric, serial, Cluster};

const ACME_OPS: &str = "acme-ops-token-4b6d8f0a2c1e";
const BETA_OPS: &str = "beta-ops-token-9e7c5a3b1d0f";
const OPS: &str = "ops-token-2f4a6c8e0b1d";
const ALICE: &str = "alice-token-6d8f0b2a4c1e";
const BOB: &str = "bob-token-1c3e5a7b9d0f";
const SHOP_OLD: &str = "shop-old-token-8a0c2e4b6d1f";
const SHOP_NEW: &str = "shop-new-token-3b5d7f9a1c0e";
const PACED_A: &str = "paced-a-token-7c9e1a3b5d0f";
const PACED_B: &str = "paced-b-token-0d2f4b6a8c1e";
const ROUTER: &str = "router-token-5e7a9c1b3d0f";

/// `(name, scopes, token, options)` lines.
fn auth_file(path: &Path, clients: &[(&str, &str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token, options) in clients {
        let hash = hash_hex(token.as_bytes());
        writeln!(file, "{name} {scopes} {hash} {options}").unwrap();
    }
}

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

async fn send(method: Method, url: &str, token: &str, body: Option<Value>) -> Answer {
    let mut request = http().request(method, url).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let replayed = response.headers().contains_key(HEADER_REPLAYED);
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        replayed,
        body,
    }
}

/// A router with an auth file in front of allocators that answer its token only.
async fn secured(name: &str, clients: &[(&str, &str, &str, &str)]) -> (Cluster, TestRouterDir) {
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER, "")]);
    let router_auth = dir.path().join("router-auth");
    auth_file(&router_auth, clients);
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, ROUTER).unwrap();
    let env = vec![
        (
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        ),
        ("ALLOCATOR_REQUIRE_ROUTER".into(), "true".into()),
    ];
    let cluster = Cluster::start_with_env(name, 1, 4, env).await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    (cluster, TestRouterDir { router, _dir: dir })
}

struct TestRouterDir {
    router: crate::common::TestRouter,
    _dir: tempfile::TempDir,
}

async fn adjust(base: &str, token: &str, sku: &str, id: &str, delta: i64) -> Answer {
    let url = format!("{base}/v1/inventory/{sku}/adjustments");
    let body = json!({"adjustment_id": id, "delta": delta});
    send(Method::POST, &url, token, Some(body)).await
}

async fn order(base: &str, token: &str, order_id: &str, lines: &Value) -> Answer {
    let url = format!("{base}/v1/orders/{order_id}/reservations");
    send(Method::POST, &url, token, Some(json!({ "lines": lines }))).await
}

/// `adjust` until it is applied (the partitions' owners may still be settling).
async fn seed(base: &str, token: &str, sku: &str, id: &str, delta: i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let stocked = adjust(base, token, sku, id, delta).await;
        if stocked.status == StatusCode::CREATED {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{}", stocked.body);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_neither_see_nor_take_each_others_ids() {
    let _serial = serial().await;
    let (cluster, secured) = secured(
        "isolation",
        &[
            ("acme-ops", "reserve,admin", ACME_OPS, "skus=acme:*"),
            ("beta-ops", "reserve,admin", BETA_OPS, "skus=beta:*"),
            ("ops", "reserve,admin", OPS, ""),
            ("alice", "reserve", ALICE, ""),
            ("bob", "reserve", BOB, ""),
        ],
    )
    .await;
    let base = secured.router.url.clone();

    // 1. Adjustment ids: beta's restock is not acme's business, nor any other admin's.
    seed(&base, BETA_OPS, "beta:tee", "adj-shared", 500).await;
    let taken = adjust(&base, ACME_OPS, "acme:1", "adj-shared", 100).await;
    assert_eq!(taken.status, StatusCode::NOT_FOUND, "{}", taken.body);
    assert_eq!(taken.body["type"], problem_type::NOT_FOUND);
    assert_eq!(taken.body["detail"], "adjustment adj-shared does not exist");
    let text = taken.body.to_string();
    assert!(!text.contains("beta") && !text.contains("500"), "{text}");
    // Even the very same request, from an admin of every SKU, is not replayed to it.
    let copied = adjust(&base, OPS, "beta:tee", "adj-shared", 500).await;
    assert_eq!(copied.status, StatusCode::NOT_FOUND, "{}", copied.body);
    assert_eq!(copied.body, taken.body);
    let own = adjust(&base, BETA_OPS, "beta:tee", "adj-shared", 500).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert!(own.replayed);
    let stock = send(
        Method::GET,
        &format!("{base}/v1/inventory/beta:tee"),
        OPS,
        None,
    )
    .await;
    assert_eq!(stock.body["on_hand"], 500, "{}", stock.body);

    // 3. A retried order keeps to its own lines. An undecided earlier attempt of alice's order
    // (and one of an order from before owners were recorded) is retried after bob has
    // reserved under the id its line had in the earlier line-id form.
    seed(&base, OPS, "fruit:1", "fruit-seed", 10).await;
    let lines = json!([{"sku": "fruit:1", "quantity": 2}]);
    let db = cluster.db().await;
    for (order_id, owner) in [("o-alice", Some("alice")), ("o-old", None)] {
        db.execute(
            "INSERT INTO orders (order_id, request, attempts, owner) \
             VALUES ($1, $2::text::jsonb, 1, $3)",
            &[&order_id, &json!({ "lines": lines }).to_string(), &owner],
        )
        .await
        .unwrap();
        let legacy = format!("{order_id}:0");
        let theirs = json!({"reservation_id": legacy, "sku": "fruit:1", "quantity": 1});
        let url = format!("{base}/v1/reservations");
        let held = send(Method::POST, &url, BOB, Some(theirs)).await;
        assert_eq!(held.status, StatusCode::CREATED, "{}", held.body);

        let placed = order(&base, ALICE, order_id, &lines).await;
        assert_eq!(
            placed.status,
            StatusCode::CREATED,
            "{order_id}: {}",
            placed.body
        );
        assert_eq!(
            placed.body["reservations"][0]["reservation_id"],
            format!("order:{order_id}:0")
        );
        let bobs = send(Method::GET, &format!("{url}/{legacy}"), BOB, None).await;
        assert_eq!(bobs.body["status"], "held", "{order_id}: {}", bobs.body);
    }

    secured.router.stop().await;
}

/// 6. Two tokens, one client: one owner, one quota, one rate bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_rotating_its_token_stays_one_client() {
    let _serial = serial().await;
    let (_cluster, secured) = secured(
        "rotation",
        &[
            ("ops", "reserve,admin", OPS, ""),
            ("shop", "reserve", SHOP_OLD, "max_held_per_sku=2"),
            ("paced", "reserve", PACED_A, "rate=0.01 burst=1"),
            ("shop", "reserve", SHOP_NEW, "max_held_per_sku=2"),
            ("paced", "reserve", PACED_B, "rate=0.01 burst=1"),
        ],
    )
    .await;
    let base = secured.router.url.clone();
    seed(&base, OPS, "fruit:1", "fruit-seed", 10).await;
    let url = format!("{base}/v1/reservations");
    let reserve = |id: &str, quantity: i64| {
        Some(json!({"reservation_id": id, "sku": "fruit:1", "quantity": quantity}))
    };
    let made = send(Method::POST, &url, SHOP_OLD, reserve("rot-1", 2)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let read = send(Method::GET, &format!("{url}/rot-1"), SHOP_NEW, None).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let over = send(Method::POST, &url, SHOP_NEW, reserve("rot-2", 1)).await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.body);
    assert_eq!(over.body["quota"], "max_held_per_sku", "{}", over.body);
    let released = send(
        Method::POST,
        &format!("{url}/rot-1/release"),
        SHOP_NEW,
        None,
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    let inventory = format!("{base}/v1/inventory/fruit:1");
    let first = send(Method::GET, &inventory, PACED_A, None).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let second = send(Method::GET, &inventory, PACED_B, None).await;
    assert_eq!(
        second.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        second.body
    );
    assert_eq!(second.body["type"], problem_type::RATE_LIMITED);
    assert_eq!(metric(&base, "router_auth_clients").await, 3.0);
    secured.router.stop().await;
}
