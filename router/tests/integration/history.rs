//! A SKU's history through a router (`GET /v1/inventory/{sku}/history`): forwarded to the SKU's
//! owner, it lists every movement in commit order with the client the router named to the
//! allocator (reservations and, since `V20__adjustment_owner.sql`, adjustments), pages by
//! `after`/`limit`, and is refused at the router to clients without `admin`, for SKUs outside a
//! client's namespaces, for unknown SKUs and for bad pages.

use reqwest::StatusCode;
use schema::wire::{problem_type, AdjustmentRequest};
use testkit::history::{check_history, check_refusals, two_clients_and_an_admin, Clients};

use crate::common::{serial, Cluster};
use crate::tenants::auth_file;

const ALICE: &str = "alice-token-9d1f3b5a7c0e";
const BOB: &str = "bob-token-4a6c8e0b2d1f";
const OPS: &str = "ops-token-1e3a5c7f9b0d";
const ACME_OPS: &str = "acme-ops-token-8b0d2f4a6c1e";
const ROUTER: &str = "router-token-5f7b9d1c3a0e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_names_each_client_through_the_router() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER, "")]);
    let router_auth = dir.path().join("router-auth");
    auth_file(
        &router_auth,
        &[
            ("alice", "reserve", ALICE, ""),
            ("bob", "reserve", BOB, ""),
            ("ops", "reserve,admin", OPS, ""),
            ("acme-ops", "reserve,admin", ACME_OPS, "skus=acme:*"),
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
    let cluster = Cluster::start_with_env("history", 2, 4, env).await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    let api = &router.api;
    let clients = Clients {
        first: ("alice", api.with_token(ALICE)),
        second: ("bob", api.with_token(BOB)),
        admin: ("ops", api.with_token(OPS)),
    };
    let expected = two_clients_and_an_admin(&clients, "hist:1", "rh").await;
    let entries = check_history(&clients.admin.1, "hist:1", &expected, 4).await;
    assert_eq!(entries.len(), 6);
    let db = cluster.db().await;
    let owners: Vec<Option<String>> = db
        .query(
            "SELECT owner FROM adjustments WHERE adjustment_id IN ('rh-stock', 'rh-shrink')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(owners, [Some("ops".to_owned()), Some("ops".to_owned())]);

    check_refusals(api, &clients.first.1, &clients.admin.1, "hist:1").await;
    // An admin confined to `acme:*` is refused other SKUs at the router, and reads its own.
    let acme_ops = api.with_token(ACME_OPS);
    let outside = acme_ops.history("hist:1", "").await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN);
    assert_eq!(outside.problem().kind, problem_type::NAMESPACE_FORBIDDEN);
    assert_eq!(
        acme_ops.history("acme:1", "").await.status,
        StatusCode::NOT_FOUND
    );
    let stock = AdjustmentRequest {
        adjustment_id: "rh-acme".parse().unwrap(),
        delta: 3.try_into().unwrap(),
    };
    let stocked = acme_ops.adjust("acme:1", &stock).await;
    assert_eq!(stocked.status, StatusCode::CREATED);
    let own = acme_ops.history("acme:1", "limit=1").await.ok();
    assert_eq!(own.entries.len(), 1);
    assert_eq!(own.next_after, None);
    router.stop().await;
}
