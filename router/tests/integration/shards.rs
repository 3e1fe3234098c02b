//! A cluster over two PostgreSQL primaries (DESIGN.md §12) through one router: every partition
//! serves, an order spanning both shards is placed and stored on the shard its id picks, a
//! reservation is found on whichever shard holds it; a stopped shard, and then a frozen
//! (black-holed) one, makes only its own partitions fail while the other shard keeps serving
//! (reserves of ids homed on the serving shard: an id's home shard is needed to claim it).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::shard::order_shard;
use schema::wire::{OrderRequest, ReserveRequest};
use serde_json::json;
use testkit::ApiClient;

use crate::common::{serial, Cluster};

pub(crate) const PARTITIONS: u32 = 8;

/// A SKU of `partition` (of [`PARTITIONS`]), distinct per `prefix`.
pub(crate) fn sku_in(partition: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| schema::partition::partition_for(s, PARTITIONS) == partition)
        .unwrap()
}

/// Shard 0 holds partitions 0–3, shard 1 partitions 4–7 (the catalog's contiguous plan).
pub(crate) fn shard_of(partition: u32) -> usize {
    (partition * 2 / PARTITIONS) as usize
}

pub(crate) fn hold(id: &str, sku: &str) -> ReserveRequest {
    ReserveRequest {
        reservation_id: id.parse().unwrap(),
        sku: sku.parse().unwrap(),
        quantity: 1.try_into().unwrap(),
        ttl_seconds: None,
    }
}

/// A fresh id `{prefix}…` homed on `shard` (its home partition there, DESIGN.md §12): a write
/// of it needs no other shard's id directory.
pub(crate) fn id_homed_on(shard: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|id| shard_of(schema::partition::partition_for(id, PARTITIONS)) == shard)
        .unwrap()
}

/// Reserves one unit of each SKU under a fresh id homed on the SKU's own shard (so that a
/// stopped shard stops only its own SKUs' reserves); the statuses in SKU order.
async fn reserve_each(api: &ApiClient, skus: &[String], round: &str) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for (i, sku) in skus.iter().enumerate() {
        let shard = shard_of(schema::partition::partition_for(sku, PARTITIONS));
        let id = id_homed_on(shard, &format!("{round}-{i}"));
        statuses.push(api.reserve(&hold(&id, sku)).await.status);
    }
    statuses
}

/// Waits until every SKU of shard `serving` is reserved (201) and every SKU of the other shard
/// fails (never 201) in one round, and returns after that round.
async fn wait_only_shard_serves(api: &ApiClient, skus: &[String], serving: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0.. {
        let statuses = reserve_each(api, skus, &format!("{what}-{round}")).await;
        let as_expected = statuses
            .iter()
            .enumerate()
            .all(|(p, status)| (*status == StatusCode::CREATED) == (shard_of(p as u32) == serving));
        if as_expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: only shard {serving} should serve, statuses by partition {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn two_shards_serve_through_a_router_and_a_failed_shard_stops_only_its_partitions() {
    let _serial = serial().await;
    let mut cluster = Cluster::start_sharded("shards", 2, 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let api = &router.api;
    let skus: Vec<String> = (0..PARTITIONS).map(|p| sku_in(p, "sh")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100).await;
    }
    // Every partition serves, and each SKU's row is on its own shard only.
    let statuses = reserve_each(api, &skus, "all").await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "{statuses:?}"
    );
    for (p, sku) in skus.iter().enumerate() {
        for shard in 0..2 {
            let rows = cluster
                .shard_db(shard)
                .await
                .unwrap()
                .query("SELECT 1 FROM inventory WHERE sku = $1", &[sku])
                .await
                .unwrap();
            assert_eq!(
                rows.len() == 1,
                shard_of(p as u32) == shard,
                "{sku} on shard {shard}"
            );
        }
    }
    // A reservation is found on whichever shard holds it.
    for (i, shard) in [(1, 0), (6, 1)] {
        let id = id_homed_on(shard, &format!("all-{i}"));
        assert_eq!(api.reservation(&id).await.status, StatusCode::OK, "{id}");
    }
    assert_eq!(
        api.reservation("nowhere").await.status,
        StatusCode::NOT_FOUND
    );

    // An order over both shards is placed, and stored on the shard its id picks.
    let order: OrderRequest = serde_json::from_value(json!({
        "lines": [{"sku": skus[0], "quantity": 1}, {"sku": skus[7], "quantity": 1}]
    }))
    .unwrap();
    for order_id in ["order-a", "order-b", "order-c"] {
        let placed = api.order(order_id, &order).await;
        assert_eq!(placed.status, StatusCode::CREATED, "{:?}", placed.body);
        let home = order_shard(order_id, 2);
        for shard in 0..2 {
            let stored = cluster
                .shard_db(shard)
                .await
                .unwrap()
                .query_opt(
                    "SELECT status FROM orders WHERE order_id = $1",
                    &[&order_id],
                )
                .await
                .unwrap();
            assert_eq!(
                stored.is_some(),
                shard == home,
                "{order_id} on shard {shard}"
            );
        }
    }

    // Shard 1 stopped: its partitions fail, shard 0's keep serving.
    cluster.shard_mut(1).unwrap().server.stop().await.unwrap();
    wait_only_shard_serves(api, &skus, 0, "s1-stopped").await;
    cluster
        .shard_mut(1)
        .unwrap()
        .server
        .restart()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for round in 0.. {
        let statuses = reserve_each(api, &skus, &format!("back-{round}")).await;
        if statuses.iter().all(|s| *s == StatusCode::CREATED) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shard 1 did not come back: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Shard 0 (the catalog) frozen: it accepts connections and never answers. Shard 1's
    // partitions keep serving through the router's last shard map.
    cluster.pg.primary().unwrap().pause().unwrap();
    wait_only_shard_serves(api, &skus, 1, "s0-frozen").await;
    cluster.pg.primary().unwrap().resume().unwrap();
    router.stop().await;
}

/// Reserves one unit of `sku` under `id` through the router, retrying the same id (idempotent)
/// while the answer is not a decision (a move in flight answers 503 for a moment).
async fn reserve_decided(api: &ApiClient, id: &str, sku: &str) -> StatusCode {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = api.reserve(&hold(id, sku)).await.status;
        if status == StatusCode::CREATED || status == StatusCode::OK || status.is_client_error() {
            return status;
        }
        assert!(Instant::now() < deadline, "{id} undecided: {status}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `allocator shards move` with every shard of `cluster`.
pub(crate) fn move_partition(cluster: &Cluster, partition: u32, to: &str) {
    let mut command = std::process::Command::new(crate::common::allocator_bin());
    command.args([
        "shards",
        "move",
        "--partition",
        &partition.to_string(),
        "--to",
        to,
    ]);
    command.args(cluster.shard_args());
    let out = command
        .env("RUST_LOG", "warn")
        .output()
        .expect("run allocator shards move");
    assert!(
        out.status.success(),
        "move of {partition} to {to} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn partitions_move_back_and_forth_under_skewed_load_through_a_router() {
    let _serial = serial().await;
    let cluster = Cluster::start_sharded("moves", 2, 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    // Two SKUs per partition; the load picks the first SKUs far more often (skewed).
    let skus: Vec<String> = (0..2 * PARTITIONS)
        .map(|i| sku_in(i % PARTITIONS, &format!("mv{}", i / PARTITIONS)))
        .collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100_000).await;
    }
    let mut workers = Vec::new();
    for w in 0..4usize {
        let (api, skus) = (router.api.clone(), skus.clone());
        workers.push(tokio::spawn(async move {
            let mut acked: Vec<(String, String)> = Vec::new();
            let stop = Instant::now() + Duration::from_secs(8);
            let mut i = 0usize;
            while Instant::now() < stop {
                // Index i*i mod n: small indexes come up more often.
                let sku = &skus[(i * i + w) % skus.len()];
                let id = format!("w{w}-{i}");
                let status = reserve_decided(&api, &id, sku).await;
                assert!(status.is_success(), "{id} on {sku}: {status}");
                acked.push((id, sku.clone()));
                i += 1;
            }
            acked
        }));
    }
    // Partition 1 (s0) and partition 6 (s1) cross over, back, and over again.
    for (partition_1, partition_6) in [("s1", "s0"), ("s0", "s1"), ("s1", "s0")] {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        move_partition(&cluster, 1, partition_1);
        move_partition(&cluster, 6, partition_6);
    }
    let mut acked = Vec::new();
    for worker in workers {
        acked.extend(worker.await.unwrap());
    }
    assert!(acked.len() > 50, "too little load: {}", acked.len());
    // Partition 1 now on s1, 6 on s0: every acknowledged hold is held on its SKU's shard, once,
    // and every SKU's row balances its ledger there.
    let home = |p: u32| match p {
        1 => 1,
        6 => 0,
        p => shard_of(p),
    };
    for (p, sku) in skus.iter().enumerate() {
        let partition = p as u32 % PARTITIONS;
        let db = cluster.shard_db(home(partition)).await.unwrap();
        let held: Vec<String> = db
            .query(
                "SELECT reservation_id FROM reservations WHERE sku = $1 AND status = 'held'",
                &[sku],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mine: Vec<&String> = acked
            .iter()
            .filter(|(_, s)| s == sku)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            held.len(),
            mine.len(),
            "{sku}: holds on its shard against acknowledged"
        );
        assert!(
            mine.iter().all(|id| held.contains(id)),
            "{sku}: an acknowledged hold is missing"
        );
        let balance = db
            .query_one(
                "SELECT i.on_hand, i.available, i.held,
                        (SELECT sum(d_on_hand) FROM ledger WHERE sku = $1)::bigint,
                        (SELECT sum(d_available) FROM ledger WHERE sku = $1)::bigint,
                        (SELECT sum(d_held) FROM ledger WHERE sku = $1)::bigint
                   FROM inventory AS i WHERE i.sku = $1",
                &[sku],
            )
            .await
            .unwrap();
        let (row, ledger): ((i64, i64, i64), (i64, i64, i64)) = (
            (balance.get(0), balance.get(1), balance.get(2)),
            (balance.get(3), balance.get(4), balance.get(5)),
        );
        assert_eq!(row, ledger, "{sku}: row against ledger");
        assert_eq!(row.2, mine.len() as i64, "{sku}: held units");
    }
    router.stop().await;
}
