//! One id, one command in the whole cluster (DESIGN.md §12, I3 across shards), and hold quotas
//! over every shard, through routers over two shards: an id used on a SKU of one shard and then
//! on a SKU of the other is refused (`422`) and the second SKU's stock is untouched; of parallel
//! uses of one id on SKUs of both shards exactly one is created; adjustment ids likewise; a
//! client that holds its whole `max_held_units` on one shard is refused on the other.

use reqwest::StatusCode;
use schema::wire::problem_type;
use serde_json::{json, Value};

use crate::common::{http, serial, Cluster};
use crate::hold_quota::{reserve_sku, restock, QuotaCluster, BUYER};
use crate::shards::{hold, shard_of, sku_in, PARTITIONS};

async fn adjust(base: &str, sku: &str, id: &str, delta: i64) -> (StatusCode, Value) {
    let response = http()
        .post(format!("{base}/v1/inventory/{sku}/adjustments"))
        .json(&json!({"adjustment_id": id, "delta": delta}))
        .send()
        .await
        .expect("adjust");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_names_one_command_in_a_cluster_of_two_shards() {
    let _serial = serial().await;
    let cluster = Cluster::start_sharded("shard-ids", 2, 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let api = &router.api;
    // One SKU per partition: 0–3 on s0, 4–7 on s1.
    let skus: Vec<String> = (0..PARTITIONS).map(|p| sku_in(p, "id")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100).await;
    }
    let (a, b) = (&skus[0], &skus[5]);
    assert_ne!(shard_of(0), shard_of(5));

    // dup-x on A (s0), then on B (s1): the one-database answer, and B untouched.
    assert_eq!(
        api.reserve(&hold("dup-x", a)).await.status,
        StatusCode::CREATED
    );
    let again = api.reserve(&hold("dup-x", b)).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(again.problem().kind, problem_type::IDEMPOTENCY_MISMATCH);
    assert_eq!(api.inventory(b).await.ok().held, 0, "B is untouched");
    // Its replay on A is still a replay, and every read names A.
    let replay = api.reserve(&hold("dup-x", a)).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    for _ in 0..10 {
        assert_eq!(&api.reservation("dup-x").await.ok().sku, a);
    }

    // N parallel reserves of one id over SKUs of both shards: exactly one is created, the
    // others are refused as reuses, and only its SKU holds a unit.
    for round in 0..4 {
        let id = format!("race-{round}");
        let attempts = skus.iter().map(|sku| {
            let (api, id) = (api.clone(), id.clone());
            async move { api.reserve(&hold(&id, sku)).await.status }
        });
        let statuses = futures::future::join_all(attempts).await;
        let created = statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count();
        assert_eq!(created, 1, "{id}: {statuses:?}");
        assert!(
            statuses
                .iter()
                .all(|s| *s == StatusCode::CREATED || *s == StatusCode::UNPROCESSABLE_ENTITY),
            "{id}: {statuses:?}"
        );
        let winner = api.reservation(&id).await.ok().sku;
        let index = statuses
            .iter()
            .position(|s| *s == StatusCode::CREATED)
            .unwrap();
        assert_eq!(winner, skus[index], "{id}");
    }
    let held: i64 = {
        let mut total = 0;
        for sku in &skus {
            total += api.inventory(sku).await.ok().held;
        }
        total
    };
    assert_eq!(held, 1 + 4, "dup-x and one hold per race");

    // Adjustments likewise: in sequence, then in parallel.
    assert_eq!(
        adjust(&router.url, a, "adj-x", 5).await.0,
        StatusCode::CREATED
    );
    let (status, body) = adjust(&router.url, b, "adj-x", 5).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        api.inventory(b).await.ok().on_hand,
        100,
        "B's stock untouched"
    );
    let attempts = skus.iter().map(|sku| {
        let url = router.url.clone();
        async move { adjust(&url, sku, "adj-race", 1).await.0 }
    });
    let statuses = futures::future::join_all(attempts).await;
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "adj-race: {statuses:?}");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_held_units_counts_every_shard() {
    let _serial = serial().await;
    let quota =
        QuotaCluster::start_on_shards("shard-quota", "max_held_units=3", Vec::new(), 2).await;
    let bases = quota.bases();
    let base = &bases[0];
    let s0 = sku_in(1, "q");
    let s1 = sku_in(6, "q");
    restock(base, &s0, 10).await;
    restock(base, &s1, 10).await;
    // The whole quota on s0, then one more unit on s1: refused.
    let (status, body) = reserve_sku(base, BUYER, "q-0", &s0, 3).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = reserve_sku(base, BUYER, "q-1", &s1, 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["quota"], "max_held_units", "{body}");
    assert_eq!(body["limit"], 3, "{body}");
    // Stored like any refusal: its replay answers it again.
    let (status, _) = reserve_sku(&bases[1], BUYER, "q-1", &s1, 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    quota.stop().await;
}
