//! Reads answered only by the shard that holds the partition (DESIGN.md §12): after a move, a
//! replica of the shard the partition left answers `421` for the reservation, the SKU, its
//! history and the partition's events (its database keeps a frozen copy), and a router reads the
//! live copy on the shard the catalog's map names, the partition's positions from before the move
//! included.

use reqwest::StatusCode;
use serde_json::Value;
use testkit::ApiClient;

use crate::common::{http, serial, Cluster};
use crate::shards::{hold, move_partition, sku_in, PARTITIONS};

async fn events(base: &str, partition: u32) -> (StatusCode, Value) {
    let answer = http()
        .get(format!("{base}/v1/events?partition={partition}&limit=1000"))
        .send()
        .await
        .expect("events request");
    let status = answer.status();
    (status, answer.json().await.unwrap_or_default())
}

fn positions(page: &Value) -> Vec<i64> {
    page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn after_a_move_only_the_shard_holding_the_partition_answers_its_reads() {
    let _serial = serial().await;
    let mut cluster = Cluster::start_sharded("shard-reads", 2, 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let api = &router.api;
    // Partition 1 is on s0 (allocator alloc-0) and moves to s1.
    let sku = sku_in(1, "rd");
    cluster.restock(&router.url, &sku, 10).await;
    assert_eq!(
        api.reserve(&hold("rd-1", &sku)).await.status,
        StatusCode::CREATED
    );
    let (status, before) = events(&router.url, 1).await;
    assert_eq!(status, StatusCode::OK, "{before}");
    let before = positions(&before);
    assert!(!before.is_empty(), "the restock and the hold are events");

    move_partition(&cluster, 1, "s1");
    // Confirmed on s1 through the router (retried while the target takes the partition).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let status = api.confirm("rd-1").await.status;
        if status == StatusCode::OK {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "confirm: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let port = cluster.allocator("alloc-0").port;
    let old_shard = ApiClient::new(format!("http://127.0.0.1:{port}"));
    // s0 keeps a frozen copy (still `held`), which none of its replicas may serve.
    let frozen: String = cluster
        .shard_db(0)
        .await
        .unwrap()
        .query_one(
            "SELECT status FROM reservations WHERE reservation_id = 'rd-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(frozen, "held");
    let misdirected = StatusCode::MISDIRECTED_REQUEST;
    assert_eq!(old_shard.reservation("rd-1").await.status, misdirected);
    assert_eq!(old_shard.inventory(&sku).await.status, misdirected);
    assert_eq!(old_shard.history(&sku, "").await.status, misdirected);
    assert_eq!(events(old_shard.base(), 1).await.0, misdirected);

    // The router reads the live copy, every time.
    for _ in 0..10 {
        let read = api.reservation("rd-1").await.ok();
        assert_eq!(serde_json::to_value(read.status).unwrap(), "confirmed");
    }
    let inventory = api.inventory(&sku).await.ok();
    assert_eq!((inventory.held, inventory.confirmed), (0, 1));
    // The partition's positions from before the move are served by s1, which holds it now.
    let (status, after) = events(&router.url, 1).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    let after = positions(&after);
    assert!(after.starts_with(&before), "{before:?} then {after:?}");
    assert!(after.len() > before.len(), "the confirmation is an event");
    router.stop().await;
}
