//! `max_held_per_sku` decided inside the fenced batch (`V19__hold_quota_per_sku.sql`): concurrent
//! reserves of one client through two routers get exactly its quota of one SKU held, the rest
//! `429 quota-exceeded` naming the quota, each stored as refused (a replay answers it again); a
//! release frees room for a new id; an order with a line the quota refuses fails (`409`);
//! another client is not held to it.

use std::io::Write;
use std::path::Path;

use access::table::hash_hex;
use reqwest::StatusCode;
use schema::wire::problem_type;
use serde_json::{json, Value};

use crate::common::{http, serial, Cluster, TestRouter};

pub(crate) const BUYER: &str = "buyer-token-4a6c8e0b2d1f";
pub(crate) const OTHER: &str = "other-token-9d1b3f5a7c2e";
pub(crate) const OPS: &str = "ops-token-6e8a0c2b4d1f";
const ROUTER: &str = "router-token-1f3b5d7a9c2e";

fn auth_file(path: &Path, clients: &[(&str, &str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token, options) in clients {
        let hash = hash_hex(token.as_bytes());
        writeln!(file, "{name} {scopes} {hash} {options}").unwrap();
    }
}

async fn reserve(base: &str, token: &str, id: &str, quantity: i64) -> (StatusCode, Value) {
    reserve_sku(base, token, id, "hot:1", quantity).await
}

/// Reserve `quantity` of `sku` under `id` as the client of `token`: the status and the body.
pub(crate) async fn reserve_sku(
    base: &str,
    token: &str,
    id: &str,
    sku: &str,
    quantity: i64,
) -> (StatusCode, Value) {
    let body = json!({"reservation_id": id, "sku": sku, "quantity": quantity});
    let response = http()
        .post(format!("{base}/v1/reservations"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("reserve");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A cluster whose allocators believe only their router's token, and two routers whose auth
/// file names `buyer` (with `buyer_options`), `other` (no quotas) and `ops` (admin).
pub(crate) struct QuotaCluster {
    pub cluster: Cluster,
    pub first: TestRouter,
    pub second: TestRouter,
    _dir: tempfile::TempDir,
}

impl QuotaCluster {
    pub(crate) async fn start(
        name: &str,
        buyer_options: &str,
        env: Vec<(String, String)>,
    ) -> QuotaCluster {
        Self::start_on_shards(name, buyer_options, env, 1).await
    }

    /// [`QuotaCluster::start`] over `shards` private PostgreSQL servers (one: the tests' shared
    /// server), 8 partitions for more than one.
    pub(crate) async fn start_on_shards(
        name: &str,
        buyer_options: &str,
        mut env: Vec<(String, String)>,
        shards: usize,
    ) -> QuotaCluster {
        let dir = tempfile::tempdir().unwrap();
        let allocator_auth = dir.path().join("allocator-auth");
        auth_file(&allocator_auth, &[("router-1", "router", ROUTER, "")]);
        let router_auth = dir.path().join("router-auth");
        auth_file(
            &router_auth,
            &[
                ("buyer", "reserve", BUYER, buyer_options),
                ("other", "reserve", OTHER, ""),
                ("ops", "reserve,admin", OPS, ""),
            ],
        );
        let token_file = dir.path().join("router-token");
        std::fs::write(&token_file, ROUTER).unwrap();
        env.push((
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        ));
        env.push(("ALLOCATOR_REQUIRE_ROUTER".into(), "true".into()));
        let cluster = if shards > 1 {
            Cluster::start_sharded_with_env(name, shards, 2, 8, env).await
        } else {
            Cluster::start_with_env(name, 2, 4, env).await
        };
        let tweak = |c: &mut router::RouterConfig| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        };
        let first = cluster.router(tweak).await;
        let second = cluster.router(tweak).await;
        QuotaCluster {
            cluster,
            first,
            second,
            _dir: dir,
        }
    }

    pub(crate) fn bases(&self) -> [String; 2] {
        [self.first.url.clone(), self.second.url.clone()]
    }

    pub(crate) async fn stop(self) {
        self.first.stop().await;
        self.second.stop().await;
    }
}

/// Stock `units` of `sku` through the router at `base`, as `ops`.
pub(crate) async fn restock(base: &str, sku: &str, units: i64) {
    let stock = json!({"adjustment_id": format!("{sku}-seed"), "delta": units});
    let stocked = http()
        .post(format!("{base}/v1/inventory/{sku}/adjustments"))
        .bearer_auth(OPS)
        .json(&stock)
        .send()
        .await
        .expect("restock");
    assert_eq!(stocked.status(), StatusCode::CREATED, "restock {sku}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserves_through_two_routers_hold_exactly_the_quota() {
    let _serial = serial().await;
    let quota = QuotaCluster::start("hold-quota", "max_held_per_sku=3", Vec::new()).await;
    let cluster = &quota.cluster;
    restock(&quota.first.url, "hot:1", 100).await;

    // 24 single-unit reserves at once, alternating between the routers.
    let bases = quota.bases();
    let attempts = (0..24).map(|i| {
        let base = bases[i % 2].clone();
        async move { reserve(&base, BUYER, &format!("hot-{i}"), 1).await }
    });
    let answers = futures::future::join_all(attempts).await;
    let held = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(held, 3, "exactly the quota is held: {answers:?}");
    for (status, body) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
        assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(body["type"], problem_type::QUOTA_EXCEEDED, "{body}");
        assert_eq!(body["quota"], "max_held_per_sku", "{body}");
        assert_eq!(body["limit"], 3, "{body}");
    }
    let db = cluster.db().await;
    let rows: Vec<(String, Option<i64>)> = db
        .query(
            "SELECT status, refused_quota FROM reservations WHERE owner = 'buyer'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let held = rows.iter().filter(|(s, _)| s == "held").count();
    let stored = rows.iter().filter(|r| r.0 == "rejected" && r.1 == Some(3));
    assert_eq!(
        (held, stored.count()),
        (3, 21),
        "each refusal stored: {rows:?}"
    );
    let mut refusals = 0.0;
    for allocator in &cluster.allocators {
        let series = "allocator_quota_refusals_total{client=\"buyer\",quota=\"max_held_per_sku\"}";
        refusals += crate::common::metric(&allocator.url, series).await;
    }
    assert_eq!(refusals, 21.0, "every refusal is counted");

    // Two more at once is over; a release makes room for one; others are not limited.
    let (status, _) = reserve(&bases[1], BUYER, "hot-big", 2).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let mine = answers
        .iter()
        .find(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, b)| b["reservation_id"].as_str().unwrap().to_owned())
        .unwrap();
    let released = http()
        .post(format!("{}/v1/reservations/{mine}/release", bases[0]))
        .bearer_auth(BUYER)
        .send()
        .await
        .expect("release");
    assert_eq!(released.status(), StatusCode::OK);
    let (status, body) = reserve(&bases[1], BUYER, "hot-after", 1).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = reserve(&bases[0], BUYER, "hot-more", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let (status, body) = reserve(&bases[0], OTHER, "other-big", 10).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // A refused id stays refused, and an order whose line the quota refuses fails, decided.
    let (status, body) = reserve(&bases[1], BUYER, "hot-more", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "replayed: {body}");
    assert_order_with_a_quota_refused_line_fails(&bases[0]).await;
    quota.stop().await;
}

/// The buyer's order `order_id` of one unit of each of `skus` is refused as a whole and decided
/// (`409 order-failed`, `outcome_unknown: false`).
pub(crate) async fn assert_order_fails(base: &str, order_id: &str, skus: &[&str]) {
    let lines: Vec<Value> = skus
        .iter()
        .map(|sku| json!({"sku": sku, "quantity": 1}))
        .collect();
    let answer = http()
        .post(format!("{base}/v1/orders/{order_id}/reservations"))
        .bearer_auth(BUYER)
        .json(&json!({ "lines": lines }))
        .send()
        .await
        .expect("order");
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["type"], problem_type::ORDER_FAILED, "{body}");
    assert_eq!(body["outcome_unknown"], false, "{body}");
}

/// The buyer holds its quota of `hot:1`: an order of one more `hot:1` and one `hot:2` is refused
/// as a whole (`409 order-failed`, not an undecided `503`), and its `hot:2` line is not held.
async fn assert_order_with_a_quota_refused_line_fails(base: &str) {
    restock(base, "hot:2", 10).await;
    assert_order_fails(base, "quota-order", &["hot:2", "hot:1"]).await;
    let inventory: Value = http()
        .get(format!("{base}/v1/inventory/hot:2"))
        .bearer_auth(OPS)
        .send()
        .await
        .expect("inventory")
        .json()
        .await
        .unwrap();
    assert_eq!(inventory["held"], 0, "{inventory}");
}
