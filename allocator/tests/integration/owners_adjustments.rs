//! Adjustment ids scoped like reservation ids (`V26__adjustment_ids_scoped.sql`): an id another
//! client's adjustment took is answered `404`, as reservations answer another client's id, with
//! nothing of its SKU or delta, whether the caller names it directly or through a router; the
//! client that made it replays it as before; an adjustment without an owner is anyone's, and a
//! reused id with another SKU or delta names neither.

use std::path::Path;

use crate::auth::{write_auth_file, ROUTER};
use crate::common::*;
use reqwest::StatusCode;
use schema::wire::{problem_type, HEADER_CLIENT, HEADER_REPLAYED};
use serde_json::{json, Value};

const ACME_OPS: &str = "acme-ops-token-5d7f9b1a3c0e";
const BETA_OPS: &str = "beta-ops-token-2c4e6a8b0d1f";
const OPS: &str = "ops-token-adjust-9f1b3d5a7c0e";

struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Value,
}

async fn adjust(
    base: &str,
    token: &str,
    headers: &[(&str, &str)],
    (sku, id, delta): (&str, &str, i64),
) -> Answer {
    let mut request = http()
        .post(format!("{base}/v1/inventory/{sku}/adjustments"))
        .bearer_auth(token)
        .json(&json!({"adjustment_id": id, "delta": delta}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("adjust");
    let status = response.status();
    let replayed = response.headers().contains_key(HEADER_REPLAYED);
    Answer {
        status,
        replayed,
        body: response.json().await.unwrap_or(Value::Null),
    }
}

async fn replica(dir: &Path, db: &str) -> TestReplica {
    let auth = dir.join("auth");
    write_auth_file(
        &auth,
        &[
            ("acme-ops", "reserve,admin", ACME_OPS, "skus=acme:*"),
            ("beta-ops", "reserve,admin", BETA_OPS, "skus=beta:*"),
            ("ops", "reserve,admin", OPS, ""),
            ("router-1", "router", ROUTER, ""),
        ],
    );
    let mut config = fast_config(db, "owners-adjust");
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    replica
}

#[tokio::test]
async fn another_clients_adjustment_id_is_answered_as_not_found_and_names_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_database(PARTITIONS).await;
    let pg = client(&db).await;
    let replica = replica(dir.path(), &db).await;
    let base = replica.url.clone();
    let beta = ("beta:tee", "adj-shared", 500);
    let made = adjust(&base, BETA_OPS, &[], beta).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);

    // Directly, for another SKU, for the very same request, and named by a router (as admin).
    let routed_admin: &[(&str, &str)] =
        &[(HEADER_CLIENT, "ops"), ("x-allocator-client-admin", "true")];
    let attempts = [
        (ACME_OPS, &[][..], ("acme:1", "adj-shared", 100)),
        (OPS, &[][..], beta),
        (ROUTER, routed_admin, beta),
    ];
    for (token, headers, request) in attempts {
        let answer = adjust(&base, token, headers, request).await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "{request:?}: {}",
            answer.body
        );
        assert_eq!(answer.body["type"], problem_type::NOT_FOUND);
        assert_eq!(
            answer.body["detail"],
            "adjustment adj-shared does not exist"
        );
        let text = answer.body.to_string();
        assert!(!text.contains("beta") && !text.contains("500"), "{text}");
    }
    let unstocked = http()
        .get(format!("{base}/v1/inventory/acme:1"))
        .bearer_auth(ACME_OPS)
        .send()
        .await
        .unwrap();
    assert_eq!(unstocked.status(), StatusCode::NOT_FOUND, "nothing applied");

    // The client that made it replays it; its own id reused otherwise is a mismatch.
    let again = adjust(&base, BETA_OPS, &[], beta).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert!(again.replayed);
    assert_eq!(again.body, made.body);
    let changed = adjust(&base, BETA_OPS, &[], ("beta:tee", "adj-shared", 7)).await;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        changed.body
    );

    // An adjustment without an owner (before V20, or authentication off) is anyone's; a reuse
    // with another SKU or delta does not tell what it was.
    pg.execute(
        "UPDATE adjustments SET owner = NULL WHERE adjustment_id = 'adj-shared'",
        &[],
    )
    .await
    .unwrap();
    let anyones = adjust(&base, OPS, &[], beta).await;
    assert_eq!(anyones.status, StatusCode::OK, "{}", anyones.body);
    assert!(anyones.replayed);
    let reused = adjust(&base, ACME_OPS, &[], ("acme:1", "adj-shared", 100)).await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reused.body
    );
    assert_eq!(reused.body["type"], problem_type::IDEMPOTENCY_MISMATCH);
    let text = reused.body.to_string();
    assert!(!text.contains("beta") && !text.contains("500"), "{text}");

    let on_hand: i64 = pg
        .query_one("SELECT on_hand FROM inventory WHERE sku = 'beta:tee'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_hand, 500);
    replica.stop().await;
}
