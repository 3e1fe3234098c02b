//! Moving a partition between shards under load (`allocator shards move`, DESIGN.md §12): while
//! a client reserves one unit after another of a SKU in the partition (each id retried on either
//! replica until one acknowledges it), the partition moves from shard s0 to s1, back, and to s1
//! again. Every acknowledged hold must then be on the final shard, the SKU's row must balance
//! its ledger there, and the shards' records must agree with the map.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::shard::{store, ShardName, ShardTarget};
use testkit::shared::fresh_database;
use testkit::ApiClient;

use crate::common::*;

const MOVED: u32 = 1;
const STOCK: i64 = 100_000;

/// Reserves one unit under `id` on whichever replica owns the partition now, retrying the same
/// id (idempotent) until one acknowledges it.
async fn reserve_anywhere(apis: &[ApiClient], id: &str, sku: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for api in apis {
            let answer = reserve(api, id, sku, 1).await;
            if answer.status == StatusCode::CREATED || answer.status == StatusCode::OK {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{id} never acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn targets(a: &str, b: &str) -> Vec<ShardTarget> {
    [("s0", a), ("s1", b)]
        .iter()
        .map(|(n, u)| format!("{n}={u}").parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_partition_moves_between_shards_under_load_and_loses_no_acknowledged_hold() {
    let (a, b) = (
        fresh_database("move-a").await.unwrap(),
        fresh_database("move-b").await.unwrap(),
    );
    let shards = targets(&a, &b);
    allocator::shard::migrate(&allocator::config::MigrateArgs {
        database_url: None,
        shards: shards.clone(),
        partitions: Some(PARTITIONS),
        ledger_partition_span_secs: None,
    })
    .await
    .expect("migrate");
    let r0 = TestReplica::start(fast_config(&a, "r0")).await;
    let r1 = TestReplica::start(fast_config_with(&b, "r1", &["--catalog-url", &a])).await;
    let sku = sku_in(MOVED, "moving");
    restock(&r0.url, &sku, STOCK).await;

    let apis = vec![r0.api.clone(), r1.api.clone()];
    let load = {
        let sku = sku.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let stop = Instant::now() + Duration::from_secs(6);
            while Instant::now() < stop {
                let id = format!("mv-{}", acked.len());
                reserve_anywhere(&apis, &id, &sku).await;
                acked.push(id);
            }
            acked
        })
    };
    let (s0, s1): (ShardName, ShardName) = ("s0".parse().unwrap(), "s1".parse().unwrap());
    let mut copied = Vec::new();
    for to in [&s1, &s0, &s1] {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let moved = allocator::shard::move_partition(&shards, MOVED, to)
            .await
            .expect("move");
        assert_eq!(&moved.to, to);
        copied.push(moved.ledger_rows);
    }
    let acked = load.await.unwrap();
    assert!(acked.len() > 20, "too little load: {} holds", acked.len());
    assert!(
        copied.iter().all(|n| *n > 0),
        "ledger rows copied: {copied:?}"
    );

    // Where the partition lives now: s1 holds its lease row, s0 none, and the map says s1.
    let (db0, db1) = (client(&a).await, client(&b).await);
    let map = store::read_map(&db0).await.unwrap().unwrap();
    assert_eq!(map.shard_index(MOVED), Some(1));
    for (db, shard) in [(&db0, 0), (&db1, 1)] {
        let record = store::read_record(db).await.unwrap().unwrap();
        map.check_record(&record).unwrap();
        assert_eq!(record.partitions.contains(&MOVED), shard == 1);
    }
    // Every acknowledged hold is on s1, held, and the row balances its ledger there.
    let held: Vec<String> = db1
        .query(
            "SELECT reservation_id FROM reservations WHERE sku = $1 AND status = 'held'",
            &[&sku],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing: Vec<&String> = acked.iter().filter(|id| !held.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged holds missing on s1: {missing:?}"
    );
    assert_eq!(held.len(), acked.len(), "holds nobody acknowledged");
    let (row, ledger) = ledger_balance(&db1, &sku).await;
    assert_eq!(row, ledger, "row against ledger on s1");
    assert_eq!(row.held, acked.len() as i64);
    assert_eq!(row.available, STOCK - acked.len() as i64);
    // The copied ranges are recorded, so the target does not settle them again.
    let moves_in: i64 = db1
        .query_one(
            "SELECT count(*) FROM partition_moves_in WHERE partition = $1",
            &[&(MOVED as i32)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(moves_in, 2, "two moves into s1");
    // s1's replica serves the partition again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r1.ownership.held().iter().any(|t| t.partition == MOVED) {
        assert!(
            Instant::now() < deadline,
            "r1 did not take the moved partition"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        reserve(&r1.api, "after-move", &sku, 1).await.status,
        StatusCode::CREATED
    );
    r0.stop().await;
    r1.stop().await;
}
