//! Reservations and orders owned by their client, through a router (`V18__owners.sql`): another
//! client's reservation is answered exactly as an unknown id and its hold stays held, another
//! client's order is `404` and nothing is reserved for it, `admin` may act on any, the owner's
//! replays are unchanged; with authentication off everyone is the one anonymous client.

use std::io::Write;
use std::path::Path;

use access::table::hash_hex;
use reqwest::{Method, StatusCode};
use schema::wire::{problem_type, HEADER_REPLAYED};
use serde_json::{json, Value};

use crate::common::{http, serial, Cluster};

const ALICE: &str = "alice-token-5c7e9a1b3d2f";
const BOB: &str = "bob-token-0e2c4a6f8b1d";
const OPS: &str = "ops-token-7b9d1f3a5c0e";
const ROUTER: &str = "router-token-3d5f7b9a1c2e";

fn auth_file(path: &Path, clients: &[(&str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token) in clients {
        writeln!(file, "{name} {scopes} {}", hash_hex(token.as_bytes())).unwrap();
    }
}

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

async fn send(method: Method, url: &str, token: Option<&str>, body: Option<Value>) -> Answer {
    let mut request = http().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
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

fn reserve(id: &str, quantity: i64) -> Value {
    json!({"reservation_id": id, "sku": "own:1", "quantity": quantity})
}

fn order() -> Value {
    json!({"lines": [{"sku": "own:1", "quantity": 2}]})
}

async fn held(base: &str, token: Option<&str>) -> Value {
    let url = format!("{base}/v1/inventory/own:1");
    send(Method::GET, &url, token, None).await.body["held"].clone()
}

async fn owners(db: &tokio_postgres::Client, sql: &str) -> Vec<Option<String>> {
    let rows = db.query(sql, &[]).await.expect("owners");
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_neither_sees_nor_changes_the_firsts_reservations_and_orders() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER)]);
    let router_auth = dir.path().join("router-auth");
    auth_file(
        &router_auth,
        &[
            ("alice", "reserve", ALICE),
            ("bob", "reserve", BOB),
            ("ops", "reserve,admin", OPS),
        ],
    );
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, ROUTER).unwrap();
    let env = vec![
        (
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        ),
        ("ALLOCATOR_REQUIRE_ROUTER".into(), "true".into()),
    ];
    let cluster = Cluster::start_with_env("owners", 1, 4, env).await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    let base = router.url.clone();
    let stock = json!({"adjustment_id": "own-seed", "delta": 10});
    let url = format!("{base}/v1/inventory/own:1/adjustments");
    let stocked = send(Method::POST, &url, Some(OPS), Some(stock)).await;
    assert_eq!(stocked.status, StatusCode::CREATED, "{}", stocked.body);
    let reservations = format!("{base}/v1/reservations");
    let made = send(
        Method::POST,
        &reservations,
        Some(ALICE),
        Some(reserve("r-a", 3)),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);

    // Bob finds Alice's reservation exactly as an id nobody used.
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::POST, "/confirm"),
        (Method::POST, "/release"),
    ] {
        let url = |id: &str| format!("{reservations}/{id}{suffix}");
        let unknown = send(method.clone(), &url("nobody"), Some(BOB), None).await;
        let theirs = send(method, &url("r-a"), Some(BOB), None).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.body);
        assert_eq!(theirs.body["type"], problem_type::NOT_FOUND);
        let expected = unknown.body.to_string().replace("nobody", "r-a");
        assert_eq!(theirs.body.to_string(), expected, "{}", url("r-a"));
    }
    let replay = send(
        Method::POST,
        &reservations,
        Some(BOB),
        Some(reserve("r-a", 3)),
    )
    .await;
    assert_eq!(replay.status, StatusCode::NOT_FOUND, "{}", replay.body);
    assert_eq!(held(&base, Some(ALICE)).await, 3, "Alice's hold stays held");
    let again = send(
        Method::POST,
        &reservations,
        Some(ALICE),
        Some(reserve("r-a", 3)),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert!(again.replayed);
    assert_eq!(again.body, made.body);

    // Orders: Bob's submission of Alice's order id is 404 and reserves nothing.
    let orders = format!("{base}/v1/orders/o-a/reservations");
    let placed = send(Method::POST, &orders, Some(ALICE), Some(order())).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
    for body in [order(), json!({"lines": [{"sku": "own:1", "quantity": 1}]})] {
        let theirs = send(Method::POST, &orders, Some(BOB), Some(body)).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.body);
        assert_eq!(theirs.body["type"], problem_type::NOT_FOUND);
        assert_eq!(theirs.body["detail"], "no order \"o-a\"");
    }
    assert_eq!(held(&base, Some(ALICE)).await, 5);
    let replayed = send(Method::POST, &orders, Some(ALICE), Some(order())).await;
    assert_eq!(replayed.status, StatusCode::OK, "{}", replayed.body);
    assert!(replayed.replayed);
    assert_eq!(replayed.body, placed.body);

    // An admin may act on any.
    let as_admin = send(Method::POST, &orders, Some(OPS), Some(order())).await;
    assert_eq!(as_admin.status, StatusCode::OK, "{}", as_admin.body);
    let read = send(Method::GET, &format!("{reservations}/r-a"), Some(OPS), None).await;
    assert_eq!(read.body["status"], "held", "{}", read.body);
    let url = format!("{reservations}/r-a/release");
    let released = send(Method::POST, &url, Some(OPS), None).await;
    assert_eq!(released.body["status"], "released", "{}", released.body);

    let db = cluster.db().await;
    let alice = vec![Some("alice".to_owned())];
    let sql = "SELECT owner FROM orders WHERE order_id = 'o-a'";
    assert_eq!(owners(&db, sql).await, alice);
    let sql = "SELECT DISTINCT owner FROM reservations";
    assert_eq!(owners(&db, sql).await, alice, "the order's lines too");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_off_everyone_is_the_anonymous_client() {
    let _serial = serial().await;
    let cluster = Cluster::start("owners-anon", 1, 4).await;
    let router = cluster.router(|_| {}).await;
    let base = router.url.clone();
    cluster.restock(&base, "own:1", 10).await;
    let reservations = format!("{base}/v1/reservations");
    let made = send(
        Method::POST,
        &reservations,
        None,
        Some(reserve("anon-r", 1)),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let read = send(Method::GET, &format!("{reservations}/anon-r"), None, None).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let url = format!("{reservations}/anon-r/confirm");
    let confirmed = send(Method::POST, &url, None, None).await;
    assert_eq!(confirmed.status, StatusCode::OK, "{}", confirmed.body);
    let orders = format!("{base}/v1/orders/anon-o/reservations");
    let placed = send(Method::POST, &orders, None, Some(order())).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{}", placed.body);
    let replayed = send(Method::POST, &orders, None, Some(order())).await;
    assert_eq!(replayed.status, StatusCode::OK, "{}", replayed.body);
    assert!(replayed.replayed);

    let db = cluster.db().await;
    let sql = "SELECT owner FROM orders UNION ALL SELECT owner FROM reservations";
    let stored = owners(&db, sql).await;
    assert!(stored.iter().all(Option::is_none), "{stored:?}");
    router.stop().await;
}
