//! A percent-encoded character in a fixed path segment changes nothing: every route, asked with
//! each character of its fixed segments encoded in turn, is answered as its canonical path for
//! every kind of caller (none, `reserve`, a client confined to other SKUs, `admin`). Before the
//! services' edge put paths into canonical form, `POST /v1/%69nventory/…/adjustments` with a
//! `reserve` token was applied (`201`) where the canonical path is `403`.

use crate::auth::{write_auth_file, OPS, SHOP};
use crate::common::*;
use schema::routes::Service;

const FENCED: &str = "fenced-token-4a7c9e1b3d5f";

#[tokio::test]
async fn every_route_answers_an_encoded_path_as_its_canonical_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = migrated_database(PARTITIONS).await;
    let auth = dir.path().join("auth");
    write_auth_file(
        &auth,
        &[
            ("shop", "reserve", SHOP, ""),
            ("ops", "reserve,admin", OPS, ""),
            ("fenced", "reserve", FENCED, "skus=other:*"),
        ],
    );
    let mut config = fast_config(&db, "encoded-paths");
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    restock_with(
        &testkit::ApiClient::new(&replica.url).with_token(OPS),
        testkit::encoded_paths::SKU,
        100,
    )
    .await;
    let compared = testkit::encoded_paths::every_route_answers_as_its_canonical_path(
        &replica.url,
        Service::Allocator,
        &[
            ("no token", None),
            ("shop (reserve)", Some(SHOP)),
            ("fenced (skus=other:*)", Some(FENCED)),
            ("ops (admin)", Some(OPS)),
        ],
    )
    .await;
    assert!(compared > 500, "only {compared} variants compared");
}
