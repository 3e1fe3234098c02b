//! A SKU's history over real HTTP (`GET /v1/inventory/{sku}/history`) and the client recorded on
//! adjustments (`V20__adjustment_owner.sql`), at a replica and at the fenced batch: each movement
//! is listed in commit order with the client that made it, pages follow `after`/`limit`, only
//! `admin` reads it, and an earlier build's call of the batch function records no owner.

use std::path::Path;

use crate::auth::{write_auth_file, ROUTER};
use crate::common::*;
use crate::owners_fenced::partition_owned;
use access::Owner;
use allocator::fenced::{fenced_transaction, Command, Outcome};
use reqwest::StatusCode;
use schema::wire::{problem_type, HEADER_CLIENT};
use serde_json::json;
use testkit::history::{check_history, check_refusals, two_clients_and_an_admin, Clients};

const ALICE: &str = "alice-token-6b2d8f0a4c1e";
const BOB: &str = "bob-token-2f9a1c7e5d3b";
const OPS: &str = "ops-token-4d6f8a0c2e1b";
const ACME_OPS: &str = "acme-ops-token-7e9c1a3b5d0f";

async fn replica(dir: &Path, db: &str, name: &str) -> TestReplica {
    let auth = dir.join("auth");
    write_auth_file(
        &auth,
        &[
            ("alice", "reserve", ALICE, ""),
            ("bob", "reserve", BOB, ""),
            ("ops", "reserve,admin", OPS, ""),
            ("acme-ops", "reserve,admin", ACME_OPS, "skus=acme:*"),
            ("router-1", "router", ROUTER, ""),
        ],
    );
    let mut config = fast_config(db, name);
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    replica
}

pub async fn adjustment_owner(pg: &tokio_postgres::Client, id: &str) -> Option<String> {
    pg.query_one(
        "SELECT owner FROM adjustments WHERE adjustment_id = $1",
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn the_history_lists_every_movement_with_its_client_in_order_and_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_database(PARTITIONS).await;
    let pg = client(&db).await;
    let replica = replica(dir.path(), &db, "history-http").await;
    let api = &replica.api;
    let clients = Clients {
        first: ("alice", api.with_token(ALICE)),
        second: ("bob", api.with_token(BOB)),
        admin: ("ops", api.with_token(OPS)),
    };
    let mut expected = two_clients_and_an_admin(&clients, "hist:1", "h").await;
    // A restock a router forwards records the client it names.
    let routed = http()
        .post(format!("{}/v1/inventory/hist:1/adjustments", replica.url))
        .bearer_auth(ROUTER)
        .header(HEADER_CLIENT, "ops-tool")
        .json(&json!({"adjustment_id": "h-routed", "delta": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(routed.status(), StatusCode::CREATED);
    expected.push(testkit::history::Expected {
        kind: "restock",
        id: "h-routed".into(),
        client: "ops-tool".into(),
    });

    let entries = check_history(&clients.admin.1, "hist:1", &expected, 3).await;
    assert_eq!(entries.len(), 7);
    assert_eq!(entries[6].change.on_hand, 4);
    assert_eq!(
        adjustment_owner(&pg, "h-stock").await.as_deref(),
        Some("ops")
    );
    assert_eq!(
        adjustment_owner(&pg, "h-routed").await.as_deref(),
        Some("ops-tool")
    );
    // Another SKU's movements are not in it, and a page of one starts where asked.
    restock_with(&clients.admin.1, "hist:2", 1).await;
    let one = clients
        .admin
        .1
        .history("hist:1", "after=0&limit=1")
        .await
        .ok();
    assert_eq!(one.entries, entries[..1]);
    assert_eq!(one.next_after, Some(entries[0].position));
    let from = entries[4].position;
    let rest = clients
        .admin
        .1
        .history("hist:1", &format!("after={from}"))
        .await
        .ok();
    assert_eq!(rest.entries, entries[5..]);
    replica.stop().await;
}

#[tokio::test]
async fn only_admin_reads_the_history_and_bad_pages_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_database(PARTITIONS).await;
    let replica = replica(dir.path(), &db, "history-refusals").await;
    let api = &replica.api;
    let ops = api.with_token(OPS);
    restock_with(&ops, "hist:3", 5).await;
    check_refusals(api, &api.with_token(ALICE), &ops, "hist:3").await;

    // An admin confined to `acme:*` reads its own SKUs only.
    let acme_ops = api.with_token(ACME_OPS);
    let outside = acme_ops.history("hist:3", "").await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    assert_eq!(outside.problem().kind, problem_type::NAMESPACE_FORBIDDEN);
    assert_eq!(
        acme_ops.history("acme:1", "").await.status,
        StatusCode::NOT_FOUND
    );
    restock_with(&ops, "acme:1", 2).await;
    let own = acme_ops.history("acme:1", "").await.ok();
    assert_eq!(own.entries.len(), 1);
    // A router's client is refused the same way (the router checked its scope; the named
    // client's namespaces come with it).
    let routed = http()
        .get(format!("{}/v1/inventory/hist:3/history", replica.url))
        .bearer_auth(ROUTER)
        .header(HEADER_CLIENT, "acme-ops")
        .header(schema::wire::HEADER_CLIENT_POLICY, "skus=acme:*")
        .send()
        .await
        .unwrap();
    assert_eq!(routed.status(), StatusCode::FORBIDDEN);
    replica.stop().await;
}

/// At the fenced batch: an adjustment for a client records it (applied or a refused shrink), one
/// for no client records none, only its own client replays it (another client, even an admin, is
/// answered as for an unknown id, V26) and it keeps the first owner, and an earlier build's
/// nine-argument call of the function still works and records no owner.
#[tokio::test]
async fn the_fenced_batch_records_the_adjusting_client() {
    let (db, pool, fence, sku) = partition_owned("adjusted").await;
    let conn = pool.get().await.unwrap();
    let pg = client(&db).await;
    let adjust = |id: &str, delta: i64, owner: &Owner| Command::Adjust {
        adjustment_id: id.into(),
        sku: sku.clone(),
        delta,
        owner: owner.clone(),
    };
    let ops = Owner::client("ops", true);
    let other = Owner::client("other-ops", true);
    let outcomes = fenced_transaction(
        &conn,
        &fence,
        &[
            adjust("o-stock", 5, &ops),
            Command::Adjust {
                adjustment_id: "o-plain".into(),
                sku: sku.clone(),
                delta: 1,
                owner: access::Owner::ANYONE,
            },
            adjust("o-shrink", -50, &other),
            adjust("o-stock", 5, &other),
            adjust("o-stock", 5, &ops),
        ],
    )
    .await
    .unwrap();
    assert!(matches!(
        outcomes[0],
        Outcome::Adjusted {
            replayed: false,
            ..
        }
    ));
    assert!(matches!(outcomes[2], Outcome::ShrinkRefused { .. }));
    assert!(
        matches!(&outcomes[3], Outcome::NotFound { detail } if detail == "adjustment o-stock does not exist"),
        "{:?}",
        outcomes[3]
    );
    assert!(matches!(
        outcomes[4],
        Outcome::Adjusted { replayed: true, .. }
    ));
    assert_eq!(
        adjustment_owner(&pg, "o-stock").await.as_deref(),
        Some("ops")
    );
    assert_eq!(adjustment_owner(&pg, "o-plain").await, None);
    assert_eq!(
        adjustment_owner(&pg, "o-shrink").await.as_deref(),
        Some("other-ops")
    );

    let result: String = pg
        .query_one(
            "SELECT o_result FROM apply_fenced_batch($1, ARRAY[$2::integer], ARRAY[$3::bigint],
                    ARRAY[$2::integer], ARRAY['adjust'], ARRAY['o-old'], ARRAY[$4::text],
                    ARRAY[2::bigint], ARRAY[0])",
            &[
                &fence.replica_id,
                &(fence.token.partition as i32),
                &fence.token.epoch,
                &sku,
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(result, "adjusted");
    assert_eq!(adjustment_owner(&pg, "o-old").await, None);
}
