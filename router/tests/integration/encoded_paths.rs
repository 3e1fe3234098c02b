//! A percent-encoded character in a fixed path segment changes nothing at the router: every
//! route, asked with each character of its fixed segments encoded in turn, is answered as its
//! canonical path for every kind of caller. Before the services' edge put paths into canonical
//! form, a `reserve` token restocked through `POST /v1/%69nventory/…/adjustments` (`201`, the
//! router forwarding the canonical path under its own token) and read every tenant's movements
//! through `GET /v1/%65vents`.

use std::time::{Duration, Instant};

use reqwest::Method;
use schema::routes::Service;
use serde_json::json;

use crate::auth::{auth_file, send, OPS, ROUTER, SHOP};
use crate::common::{serial, Cluster};

const FENCED: &str = "fenced-token-9d1f3b5a7c2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_an_encoded_path_as_its_canonical_one() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER)]);
    let router_auth = dir.path().join("router-auth");
    std::fs::write(
        &router_auth,
        format!(
            "shop reserve {}\nops reserve,admin {}\nfenced reserve {} skus=other:*\n",
            access::table::hash_hex(SHOP.as_bytes()),
            access::table::hash_hex(OPS.as_bytes()),
            access::table::hash_hex(FENCED.as_bytes()),
        ),
    )
    .unwrap();
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, format!("{ROUTER}\n")).unwrap();
    let cluster = Cluster::start_with_env(
        "encoded",
        1,
        4,
        vec![(
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        )],
    )
    .await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    let sku = testkit::encoded_paths::SKU;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, ..) = send(
            Method::POST,
            &format!("{}/v1/inventory/{sku}/adjustments", router.url),
            Some(OPS),
            Some(json!({"adjustment_id": "enc-seed", "delta": 100})),
        )
        .await;
        if status.is_success() {
            break;
        }
        assert!(Instant::now() < deadline, "restock kept failing: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let compared = testkit::encoded_paths::every_route_answers_as_its_canonical_path(
        &router.url,
        Service::Router,
        &[
            ("no token", None),
            ("shop (reserve)", Some(SHOP)),
            ("fenced (skus=other:*)", Some(FENCED)),
            ("ops (admin)", Some(OPS)),
        ],
    )
    .await;
    assert!(compared > 500, "only {compared} variants compared");
    router.stop().await;
}
