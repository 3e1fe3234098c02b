//! `max_held_units` decided inside the fenced batch (`V22__hold_quota_units.sql`): the units one
//! client may hold over every SKU. Exact for holds in one partition under concurrent reserves
//! through two routers, and for reserves in sequence over any partitions; concurrent reserves
//! over several partitions stay within `max_held_units × T`, T being the fenced transactions
//! that can be open at once (here two allocators with one commit lane each). Refusals are `429
//! quota-exceeded` naming the quota, stored under the id (a replay answers it again); a release
//! frees room; an order with a line the quota refuses fails (`409`); another client is not held
//! to it.

use reqwest::StatusCode;
use schema::partition::partition_for;
use schema::wire::problem_type;
use serde_json::Value;

use crate::common::{http, serial};
use crate::hold_quota::{assert_order_fails, reserve_sku, restock, QuotaCluster, BUYER, OTHER};

/// The test clusters' partition count (`QuotaCluster`).
const PARTITIONS: u32 = 4;

/// `count` SKUs named `{prefix}{n}` whose partition `keep` accepts.
fn skus(prefix: &str, count: usize, keep: impl Fn(u32) -> bool) -> Vec<String> {
    (0..)
        .map(|n| format!("{prefix}{n}"))
        .filter(|sku| keep(partition_for(sku, PARTITIONS)))
        .take(count)
        .collect()
}

fn assert_units_refusal(status: StatusCode, body: &Value, limit: i64) {
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["type"], problem_type::QUOTA_EXCEEDED, "{body}");
    assert_eq!(body["quota"], "max_held_units", "{body}");
    assert_eq!(body["limit"], limit, "{body}");
}

/// What `buyer` holds and how many of its reserves are stored as refused by `max_held_units`.
async fn buyer_rows(quota: &QuotaCluster) -> (i64, usize) {
    let rows = quota
        .cluster
        .query_every_shard(
            "SELECT coalesce(sum(quantity) FILTER (WHERE status = 'held'), 0)::bigint,
                    count(*) FILTER (WHERE status = 'rejected'
                                       AND refused_quota_name = 'max_held_units')
               FROM reservations WHERE owner = 'buyer'",
            &[],
        )
        .await
        .unwrap();
    let held = rows.iter().map(|row| row.get::<_, i64>(0)).sum();
    let refused: i64 = rows.iter().map(|row| row.get::<_, i64>(1)).sum();
    (held, refused as usize)
}

/// Fire one single-unit reserve per id at once, over `skus` and alternating routers.
async fn at_once(
    quota: &QuotaCluster,
    ids: &[String],
    skus: &[String],
) -> Vec<(StatusCode, Value)> {
    let bases = quota.bases();
    let attempts = ids.iter().enumerate().map(|(i, id)| {
        let base = bases[i % 2].clone();
        let sku = skus[i % skus.len()].clone();
        async move { reserve_sku(&base, BUYER, id, &sku, 1).await }
    });
    futures::future::join_all(attempts).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_held_units_is_exact_for_holds_in_one_partition() {
    let _serial = serial().await;
    let quota = QuotaCluster::start("held-units-one", "max_held_units=5", Vec::new()).await;
    let bases = quota.bases();
    let skus = skus("one:", 6, |p| p == 1);
    for sku in &skus {
        restock(&bases[0], sku, 50).await;
    }

    // 24 single-unit reserves of six SKUs of one partition at once: exactly 5 held.
    let ids: Vec<String> = (0..24).map(|i| format!("one-{i}")).collect();
    let answers = at_once(&quota, &ids, &skus).await;
    let created = answers.iter().filter(|(s, _)| *s == StatusCode::CREATED);
    assert_eq!(created.count(), 5, "exactly the quota is held: {answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
        assert_units_refusal(*status, body, 5);
    }
    assert_eq!(buyer_rows(&quota).await, (5, 19), "each refusal stored");
    let mut refusals = 0.0;
    for allocator in &quota.cluster.allocators {
        let series = "allocator_quota_refusals_total{client=\"buyer\",quota=\"max_held_units\"}";
        refusals += crate::common::metric(&allocator.url, series).await;
    }
    assert_eq!(refusals, 19.0, "every refusal is counted");

    // A refused id replays its refusal; a release frees room for one new id.
    let refused = answers
        .iter()
        .position(|(s, _)| *s != StatusCode::CREATED)
        .unwrap();
    let sku = &skus[refused % skus.len()];
    let (status, body) = reserve_sku(&bases[1], BUYER, &ids[refused], sku, 1).await;
    assert_units_refusal(status, &body, 5);
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("was refused"),
        "the stored refusal, replayed: {body}"
    );
    let mine = answers
        .iter()
        .find(|(s, _)| *s == StatusCode::CREATED)
        .unwrap();
    let mine = mine.1["reservation_id"].as_str().unwrap();
    let released = http()
        .post(format!("{}/v1/reservations/{mine}/release", bases[0]))
        .bearer_auth(BUYER)
        .send()
        .await
        .expect("release");
    assert_eq!(released.status(), StatusCode::OK);
    let (status, body) = reserve_sku(&bases[1], BUYER, "one-after", &skus[0], 1).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = reserve_sku(&bases[0], BUYER, "one-more", &skus[1], 1).await;
    assert_units_refusal(status, &body, 5);
    let (status, body) = reserve_sku(&bases[0], OTHER, "other-big", &skus[2], 10).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "another client is not held to it: {body}"
    );

    // An order whose line the quota refuses fails as a whole, decided, holding nothing.
    assert_order_fails(&bases[0], "units-order", &[&skus[3], &skus[4]]).await;
    assert_eq!(buyer_rows(&quota).await.0, 5, "the order holds nothing");
    quota.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_held_units_over_partitions_is_exact_in_sequence_and_bounded_at_once() {
    let _serial = serial().await;
    // One commit lane per allocator: at most two fenced transactions open at once (T = 2).
    let env = vec![("ALLOCATOR_COMMIT_LANES".into(), "1".into())];
    let quota = QuotaCluster::start("held-units-many", "max_held_units=3", env).await;
    let bases = quota.bases();
    let skus = skus("many:", 8, |_| true);
    let partitions: std::collections::BTreeSet<u32> =
        skus.iter().map(|s| partition_for(s, PARTITIONS)).collect();
    assert!(partitions.len() > 1, "the SKUs span partitions: {skus:?}");
    for sku in &skus {
        restock(&bases[0], sku, 50).await;
    }

    // In sequence, over every partition: exactly the quota.
    let mut held = Vec::new();
    for (i, sku) in skus.iter().enumerate() {
        let id = format!("seq-{i}");
        let (status, body) = reserve_sku(&bases[i % 2], BUYER, &id, sku, 1).await;
        if i < 3 {
            assert_eq!(status, StatusCode::CREATED, "{sku}: {body}");
            held.push(id);
        } else {
            assert_units_refusal(status, &body, 3);
        }
    }
    assert_eq!(buyer_rows(&quota).await.0, 3);
    for id in &held {
        let released = http()
            .post(format!("{}/v1/reservations/{id}/release", bases[0]))
            .bearer_auth(BUYER)
            .send()
            .await
            .expect("release");
        assert_eq!(released.status(), StatusCode::OK);
    }

    // 48 at once over every partition: at least the quota, at most quota × T = 6.
    let ids: Vec<String> = (0..48).map(|i| format!("many-{i}")).collect();
    let answers = at_once(&quota, &ids, &skus).await;
    let created = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count() as i64;
    for (status, body) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
        assert_units_refusal(*status, body, 3);
    }
    let (held_now, _) = buyer_rows(&quota).await;
    eprintln!("held at once over partitions: {held_now} (max_held_units 3, T = 2)");
    assert_eq!(held_now, created, "what was acknowledged is what is held");
    assert!(
        (3..=6).contains(&held_now),
        "held {held_now}, outside [quota, quota × T] = [3, 6]: {answers:?}"
    );
    quota.stop().await;
}
