//! Moving a partition between shards under load (`allocator shards move`, DESIGN.md §12): while
//! a client reserves one unit after another of a SKU in the partition and confirms every other
//! one (each call retried on either replica until one answers it), the partition moves from
//! shard s0 to s1, back, and to s1 again. Every acknowledged hold and confirmation must then be
//! on the final shard, the SKU's row must balance its ledger there, the shards' records must
//! agree with the map, and the two shards' one-second settlement windows must have settled
//! every confirmed unit exactly once between them.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::shard::{store, ShardName, ShardTarget};
use testkit::shared::fresh_database;
use testkit::ApiClient;

use crate::common::*;

const MOVED: u32 = 1;
const STOCK: i64 = 100_000;

/// Reserves one unit under `id` (or confirms it) on whichever replica owns the partition now,
/// retrying the same call (idempotent) until one acknowledges it.
async fn anywhere(apis: &[ApiClient], id: &str, sku: &str, confirm: bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for api in apis {
            let status = match confirm {
                false => reserve(api, id, sku, 1).await.status,
                true => api.confirm(id).await.status,
            };
            if status == StatusCode::CREATED || status == StatusCode::OK {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{id} never acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One-second settlement windows (the grace outlasts the tests' 1 s statement timeout).
const WINDOWS: [&str; 4] = [
    "--settlement-window-secs",
    "1",
    "--settlement-grace-ms",
    "1500",
];

/// The end of the last window `db` has settled (database clock), as epoch seconds.
async fn settled_through(db: &tokio_postgres::Client) -> f64 {
    db.query_one(
        "SELECT coalesce(extract(epoch FROM max(window_end)), 0)::float8
           FROM settlement_runs WHERE status = 'settled'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

fn targets(a: &str, b: &str) -> Vec<ShardTarget> {
    [("s0", a), ("s1", b)]
        .iter()
        .map(|(n, u)| format!("{n}={u}").parse().unwrap())
        .collect()
}

/// Two fresh databases `{name}-a` (shard `s0`, the catalog) and `{name}-b` (`s1`), migrated as
/// one cluster of [`PARTITIONS`] over both, with `span_secs` ledger partitions when given.
pub(crate) async fn two_shards(
    name: &str,
    span_secs: Option<u64>,
) -> (String, String, Vec<ShardTarget>) {
    let (a, b) = (
        fresh_database(&format!("{name}-a")).await.unwrap(),
        fresh_database(&format!("{name}-b")).await.unwrap(),
    );
    let shards = targets(&a, &b);
    allocator::shard::migrate(&allocator::config::MigrateArgs {
        database_url: None,
        shards: shards.clone(),
        partitions: Some(PARTITIONS),
        ledger_partition_span_secs: span_secs,
    })
    .await
    .expect("migrate");
    (a, b, shards)
}

#[tokio::test]
async fn a_partition_moves_between_shards_under_load_and_loses_no_acknowledged_hold() {
    let (a, b, shards) = two_shards("move", None).await;
    let r0 = TestReplica::start(fast_config_with(&a, "r0", &WINDOWS)).await;
    let on_b: Vec<&str> = WINDOWS
        .iter()
        .copied()
        .chain(["--catalog-url", &a])
        .collect();
    let r1 = TestReplica::start(fast_config_with(&b, "r1", &on_b)).await;
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
                anywhere(&apis, &id, &sku, false).await;
                if acked.len() % 2 == 1 {
                    anywhere(&apis, &id, &sku, true).await;
                }
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
    // Every acknowledged hold is on s1, held or confirmed as acknowledged, and the row balances
    // its ledger there.
    let on_s1: Vec<(String, String)> = db1
        .query(
            "SELECT reservation_id, status FROM reservations WHERE sku = $1",
            &[&sku],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let confirmed = acked.len() / 2;
    for (i, id) in acked.iter().enumerate() {
        let want = if i % 2 == 1 { "confirmed" } else { "held" };
        assert!(
            on_s1.iter().any(|(r, status)| r == id && status == want),
            "{id} is not {want} on s1"
        );
    }
    assert_eq!(on_s1.len(), acked.len(), "reservations nobody acknowledged");
    let (row, ledger) = ledger_balance(&db1, &sku).await;
    assert_eq!(row, ledger, "row against ledger on s1");
    assert_eq!(row.held, (acked.len() - confirmed) as i64);
    assert_eq!(row.confirmed, confirmed as i64);
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
    // Both shards settle past the end of the load; between them, every confirmed unit once.
    let end: f64 = db0
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await
        .unwrap()
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while settled_through(&db0).await <= end || settled_through(&db1).await <= end {
        assert!(
            Instant::now() < deadline,
            "settlement did not pass the load's end"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut settled = 0;
    for db in [&db0, &db1] {
        let q: i64 = db
            .query_one(
                "SELECT coalesce(sum(quantity), 0)::bigint FROM settlements WHERE sku = $1",
                &[&sku],
            )
            .await
            .unwrap()
            .get(0);
        settled += q;
    }
    assert_eq!(settled, confirmed as i64, "settled units over both shards");
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
