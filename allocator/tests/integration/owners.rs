//! Reservations owned by their client (DESIGN.md §9, `V18__owners.sql`), over real HTTP and at
//! the fenced batch itself: another client's reservation is answered exactly as an unknown id
//! (read, confirm, release, and a reserve replaying its id) and its hold stays held; `admin` may
//! act on any; the owner's replay is unchanged; with authentication off everyone is the one
//! anonymous client.

use std::path::Path;

use crate::auth::{write_auth_file, ROUTER};
use crate::common::*;
use reqwest::{Method, StatusCode};
use schema::wire::{problem_type, HEADER_CLIENT, HEADER_REPLAYED};
use serde_json::{json, Value};

const ALICE: &str = "alice-token-3e5a7c9b1d2f";
const BOB: &str = "bob-token-8f6d4b2a0c1e";
const OPS: &str = "ops-token-1a3c5e7f9b0d";
/// `schema::wire::HEADER_CLIENT_ADMIN`, spelled out so that this test also builds against a
/// tree without it.
const HEADER_CLIENT_ADMIN: &str = "x-allocator-client-admin";

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

async fn send(
    method: Method,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = http().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
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

fn reserve(id: &str, sku: &str, quantity: i64) -> Value {
    json!({"reservation_id": id, "sku": sku, "quantity": quantity, "ttl_seconds": 600})
}

/// `answer` is exactly what `unknown` (the answer for id `unknown_id`) would be for `id`.
fn assert_as_unknown(answer: &Answer, id: &str, unknown: &Answer, unknown_id: &str, what: &str) {
    assert_eq!(
        answer.status,
        StatusCode::NOT_FOUND,
        "{what}: {}",
        answer.body
    );
    assert_eq!(answer.body["type"], problem_type::NOT_FOUND, "{what}");
    let expected = unknown.body.to_string().replace(unknown_id, id);
    assert_eq!(answer.body.to_string(), expected, "{what}");
}

async fn replica(dir: &Path, db: &str, name: &str) -> TestReplica {
    let auth = dir.join("auth");
    write_auth_file(
        &auth,
        &[
            ("alice", "reserve", ALICE, ""),
            ("bob", "reserve", BOB, ""),
            ("ops", "reserve,admin", OPS, ""),
            ("router-1", "router", ROUTER, ""),
        ],
    );
    let mut config = fast_config(db, name);
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    replica
}

pub async fn stored_owner(pg: &tokio_postgres::Client, id: &str) -> Option<String> {
    pg.query_one(
        "SELECT owner FROM reservations WHERE reservation_id = $1",
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn another_clients_reservation_is_an_unknown_id_and_admin_may_act_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_database(PARTITIONS).await;
    let pg = client(&db).await;
    let replica = replica(dir.path(), &db, "owners-http").await;
    let base = replica.url.clone();
    let reservations = format!("{base}/v1/reservations");
    let adjust = json!({"adjustment_id": "own-stock", "delta": 10});
    let stocked = send(
        Method::POST,
        &format!("{base}/v1/inventory/own:1/adjustments"),
        Some(OPS),
        &[],
        Some(adjust),
    )
    .await;
    assert_eq!(stocked.status, StatusCode::CREATED, "{}", stocked.body);

    let made = send(
        Method::POST,
        &reservations,
        Some(ALICE),
        &[],
        Some(reserve("a-1", "own:1", 3)),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);

    // Bob, directly and through a router, finds it as he finds an id nobody used.
    let bob_direct: &[(&str, &str)] = &[(HEADER_CLIENT_ADMIN, "true")];
    let bob_routed: &[(&str, &str)] = &[(HEADER_CLIENT, "bob")];
    for (token, headers) in [(BOB, bob_direct), (ROUTER, bob_routed)] {
        for (method, suffix) in [
            (Method::GET, ""),
            (Method::POST, "/confirm"),
            (Method::POST, "/release"),
        ] {
            let url = |id: &str| format!("{reservations}/{id}{suffix}");
            let unknown = send(method.clone(), &url("nobody-1"), Some(token), headers, None).await;
            let theirs = send(method, &url("a-1"), Some(token), headers, None).await;
            assert_as_unknown(&theirs, "a-1", &unknown, "nobody-1", &url("a-1"));
        }
        // A reserve replaying Alice's id, with her very body, is not her reservation either.
        let replay = send(
            Method::POST,
            &reservations,
            Some(token),
            headers,
            Some(reserve("a-1", "own:1", 3)),
        )
        .await;
        assert_eq!(replay.status, StatusCode::NOT_FOUND, "{}", replay.body);
        assert_eq!(replay.body["detail"], "reservation a-1 does not exist");
    }
    // Alice's hold is still held, and her replay is unchanged.
    let inventory = send(
        Method::GET,
        &format!("{base}/v1/inventory/own:1"),
        Some(ALICE),
        &[],
        None,
    )
    .await;
    assert_eq!(inventory.body["held"], 3, "{}", inventory.body);
    let again = send(
        Method::POST,
        &reservations,
        Some(ALICE),
        &[],
        Some(reserve("a-1", "own:1", 3)),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert!(again.replayed);
    assert_eq!(again.body, made.body);

    // An admin, directly or named by a router, may read and change it.
    let read = send(
        Method::GET,
        &format!("{reservations}/a-1"),
        Some(OPS),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["status"], "held", "{}", read.body);
    let as_admin = [(HEADER_CLIENT, "ops"), (HEADER_CLIENT_ADMIN, "true")];
    let confirmed = send(
        Method::POST,
        &format!("{reservations}/a-1/confirm"),
        Some(ROUTER),
        &as_admin,
        None,
    )
    .await;
    assert_eq!(confirmed.status, StatusCode::OK, "{}", confirmed.body);
    assert_eq!(confirmed.body["status"], "confirmed");

    // A row without an owner (made before V18, or with authentication off) is anyone's.
    let legacy = send(
        Method::POST,
        &reservations,
        Some(ALICE),
        &[],
        Some(reserve("legacy-1", "own:1", 1)),
    )
    .await;
    assert_eq!(legacy.status, StatusCode::CREATED);
    pg.execute(
        "UPDATE reservations SET owner = NULL WHERE reservation_id = 'legacy-1'",
        &[],
    )
    .await
    .unwrap();
    let released = send(
        Method::POST,
        &format!("{reservations}/legacy-1/release"),
        Some(BOB),
        &[],
        None,
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert_eq!(stored_owner(&pg, "a-1").await.as_deref(), Some("alice"));
    replica.stop().await;
}

#[tokio::test]
async fn with_authentication_off_everyone_is_the_anonymous_owner() {
    let db = migrated_database(PARTITIONS).await;
    let pg = client(&db).await;
    let replica = TestReplica::start(fast_config(&db, "owners-anon")).await;
    wait_owns_all_locally(&replica).await;
    let base = replica.url.clone();
    restock(&base, "anon:1", 5).await;
    let reservations = format!("{base}/v1/reservations");
    let made = send(
        Method::POST,
        &reservations,
        None,
        &[],
        Some(reserve("anon-1", "anon:1", 2)),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    // A client name in the header changes nothing without authentication.
    let named = [(HEADER_CLIENT, "somebody")];
    let read = send(
        Method::GET,
        &format!("{reservations}/anon-1"),
        None,
        &named,
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let replay = send(
        Method::POST,
        &reservations,
        None,
        &named,
        Some(reserve("anon-1", "anon:1", 2)),
    )
    .await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
    let confirmed = send(
        Method::POST,
        &format!("{reservations}/anon-1/confirm"),
        None,
        &[],
        None,
    )
    .await;
    assert_eq!(confirmed.status, StatusCode::OK, "{}", confirmed.body);
    assert_eq!(stored_owner(&pg, "anon-1").await, None);
    replica.stop().await;
}
