//! Order retention over two shards (DESIGN.md §8a, §12): an order stored on one shard with a
//! line on the other is removed only once its lines on every shard are gone, not when its own
//! shard's lines are.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::shard::order_shard;
use schema::wire::OrderRequest;
use serde_json::json;

use crate::common::{serial, Cluster};
use crate::shards::{sku_in, PARTITIONS};

async fn count(cluster: &Cluster, shard: usize, sql: &str, id: &str) -> i64 {
    cluster
        .shard_db(shard)
        .await
        .unwrap()
        .query_one(sql, &[&id])
        .await
        .unwrap()
        .get(0)
}

async fn wait_until_gone(cluster: &Cluster, shard: usize, sql: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(cluster, shard, sql, id).await > 0 {
        assert!(Instant::now() < deadline, "{id} still on shard {shard}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const ORDER: &str = "SELECT count(*) FROM orders WHERE order_id = $1";
const LINE: &str = "SELECT count(*) FROM reservations WHERE reservation_id = $1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_waits_for_its_lines_on_every_shard() {
    let _serial = serial().await;
    let env = vec![(
        "ALLOCATOR_IDEMPOTENCY_HORIZON_SECS".to_owned(),
        "1".to_owned(),
    )];
    let cluster = Cluster::start_sharded_with_env("shard-orders", 2, 2, PARTITIONS, env).await;
    let router = cluster.router(|_| {}).await;
    let api = &router.api;
    // An order stored on s0, one line on s0 (partition 0) and one on s1 (partition 5).
    let order_id = (0..)
        .map(|i| format!("keep-{i}"))
        .find(|id| order_shard(id, 2) == 0)
        .unwrap();
    let (here, there) = (sku_in(0, "ord"), sku_in(5, "ord"));
    cluster.restock(&router.url, &here, 10).await;
    cluster.restock(&router.url, &there, 10).await;
    let order: OrderRequest = serde_json::from_value(json!({
        "lines": [{"sku": here, "quantity": 1}, {"sku": there, "quantity": 1}]
    }))
    .unwrap();
    let placed = api.order(&order_id, &order).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{:?}", placed.body);
    let (line_here, line_there) = (format!("order:{order_id}:0"), format!("order:{order_id}:1"));
    assert_eq!(count(&cluster, 1, LINE, &line_there).await, 1);

    // Its line on s0 ends and is removed past the one-second horizon; the line on s1 is held.
    assert_eq!(api.release(&line_here).await.status, StatusCode::OK);
    wait_until_gone(&cluster, 0, LINE, &line_here).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        count(&cluster, 0, ORDER, &order_id).await,
        1,
        "the order is kept while its line on s1 is"
    );

    // Once the line on s1 is gone too, the order goes.
    assert_eq!(api.release(&line_there).await.status, StatusCode::OK);
    wait_until_gone(&cluster, 1, LINE, &line_there).await;
    wait_until_gone(&cluster, 0, ORDER, &order_id).await;
    router.stop().await;
}
