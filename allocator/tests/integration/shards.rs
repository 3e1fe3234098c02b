//! Shards (DESIGN.md §12): `allocator migrate` over two databases gives each its partitions and
//! the catalog the map; it refuses a shard list or a database that disagrees with the map; a
//! replica serves only its shard's partitions and refuses to start on a map that disagrees with
//! its shard's own record.

use std::time::{Duration, Instant};

use allocator::config::MigrateArgs;
use reqwest::StatusCode;
use schema::shard::{store, ShardName, ShardRecord};
use testkit::shared::fresh_database;

use crate::common::*;

/// Two fresh databases on the shared server, as shards `s0` (the catalog) and `s1`.
async fn two_databases() -> (String, String) {
    (
        fresh_database("shard-a").await.expect("database a"),
        fresh_database("shard-b").await.expect("database b"),
    )
}

fn args(shards: &[(&str, &str)], partitions: Option<u32>) -> MigrateArgs {
    MigrateArgs {
        database_url: None,
        shards: shards
            .iter()
            .map(|(name, url)| format!("{name}={url}").parse().expect("shard target"))
            .collect(),
        partitions,
        ledger_partition_span_secs: None,
    }
}

async fn record(url: &str) -> ShardRecord {
    store::read_record(&client(url).await)
        .await
        .expect("read record")
        .expect("a record")
}

fn name(s: &str) -> ShardName {
    s.parse().unwrap()
}

async fn migrated_two_shards() -> (String, String) {
    let (a, b) = two_databases().await;
    allocator::shard::migrate(&args(&[("s0", &a), ("s1", &b)], Some(PARTITIONS)))
        .await
        .expect("migrate two shards");
    (a, b)
}

#[tokio::test]
async fn migrate_over_two_shards_gives_each_its_partitions_and_the_catalog_the_map() {
    let (a, b) = migrated_two_shards().await;
    let (ra, rb) = (record(&a).await, record(&b).await);
    assert_eq!((ra.shard.as_str(), ra.catalog), ("s0", true));
    assert_eq!(ra.partitions, vec![0, 1, 2, 3]);
    assert_eq!((rb.shard.as_str(), rb.catalog), ("s1", false));
    assert_eq!(rb.partitions, vec![4, 5, 6, 7]);
    let map = store::read_map(&client(&a).await).await.unwrap().unwrap();
    assert_eq!(map.shards(), &[name("s0"), name("s1")]);
    assert_eq!(map.shard_index(5), Some(1));
    assert!(store::read_map(&client(&b).await).await.unwrap().is_none());
    // Both know the cluster's partition count (SKUs hash over all partitions).
    assert_eq!(
        schema::partition_count(&client(&b).await).await.unwrap(),
        PARTITIONS
    );
    // The map read through the second shard holds its partitions only, with the whole count.
    let part = schema::assignment::read_map(&client(&b).await)
        .await
        .unwrap();
    assert_eq!(part.partition_count, PARTITIONS);
    assert_eq!(part.partitions.len(), 4);

    // Again: nothing changes.
    allocator::shard::migrate(&args(&[("s0", &a), ("s1", &b)], None))
        .await
        .expect("migrate again");
    assert_eq!(record(&b).await.partitions, vec![4, 5, 6, 7]);
    // One shard migrated on its own keeps its record.
    let alone = MigrateArgs {
        database_url: Some(b.clone()),
        ..args(&[], None)
    };
    allocator::shard::migrate(&alone)
        .await
        .expect("shard alone");
    assert_eq!(record(&b).await, rb);

    // Shards in another order, one fewer, or a database named otherwise: refused.
    let c = fresh_database("shard-c").await.unwrap();
    for (shards, why) in [
        (
            vec![("s1", b.as_str()), ("s0", a.as_str())],
            "not the catalog",
        ),
        (vec![("s0", a.as_str())], "catalog's shards"),
        (vec![("s0", &a), ("s2", &b)], "catalog's shards"),
        (vec![("s0", &a), ("s2", &c), ("s1", &b)], "catalog's shards"),
    ] {
        let error = allocator::shard::migrate(&args(&shards, None))
            .await
            .expect_err("a disagreeing shard list is refused");
        assert!(error.to_string().contains(why), "{error}");
    }
    assert!(store::read_record(&client(&c).await).await.is_err());
    // One more after the catalog's: added, empty, for moves to fill.
    allocator::shard::migrate(&args(&[("s0", &a), ("s1", &b), ("s2", &c)], None))
        .await
        .expect("a shard added");
    let map = store::read_map(&client(&a).await).await.unwrap().unwrap();
    assert_eq!(map.shards(), &[name("s0"), name("s1"), name("s2")]);
    assert!(map.partitions_of(&name("s2")).is_empty());
    let rc = record(&c).await;
    assert_eq!(
        (rc.shard.as_str(), rc.catalog, rc.partitions.len()),
        ("s2", false, 0)
    );
}

#[tokio::test]
async fn a_one_database_cluster_grows_by_an_empty_shard_and_is_never_split() {
    let (a, b) = two_databases().await;
    migrate(&a, PARTITIONS).await;
    let before = record(&a).await;
    assert_eq!((before.shard.as_str(), before.catalog), ("main", true));
    assert_eq!(before.partitions, (0..PARTITIONS).collect::<Vec<_>>());
    // The catalog names shard `main`: a list that does not start with it is refused.
    let error = allocator::shard::migrate(&args(&[("s0", &a), ("s1", &b)], None))
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("catalog's shards"), "{error}");
    assert_eq!(record(&a).await, before);
    // `main` and then s1: s1 is added, holding nothing; `main` keeps every partition.
    allocator::shard::migrate(&args(&[("main", &a), ("s1", &b)], None))
        .await
        .expect("grown by a shard");
    assert_eq!(record(&a).await, before);
    assert!(record(&b).await.partitions.is_empty());
}

/// Waits until `replica` holds exactly `partitions` by its own ownership table.
async fn wait_holds(replica: &TestReplica, partitions: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut held: Vec<u32> = replica
            .ownership
            .held()
            .iter()
            .map(|t| t.partition)
            .collect();
        held.sort_unstable();
        if held == partitions {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} holds {held:?}, not {partitions:?}",
            replica.replica_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replica_serves_its_shard_and_refuses_a_map_that_disagrees() {
    let (a, b) = migrated_two_shards().await;
    let r0 = TestReplica::start(fast_config(&a, "r0")).await;
    let r1 = TestReplica::start(fast_config_with(&b, "r1", &["--catalog-url", &a])).await;
    wait_holds(&r0, &[0, 1, 2, 3]).await;
    wait_holds(&r1, &[4, 5, 6, 7]).await;

    // Each says which shard it serves.
    let metrics = metrics_text(&r1.url).await;
    assert!(
        metrics.contains("allocator_shard_partitions{shard=\"s1\"} 4"),
        "{metrics}"
    );
    // Each serves a SKU of its shard, writing that shard's database only.
    let (sku_a, sku_b) = (sku_in(1, "sa"), sku_in(6, "sb"));
    restock(&r0.url, &sku_a, 5).await;
    restock(&r1.url, &sku_b, 5).await;
    assert_eq!(
        reserve(&r0.api, "ra", &sku_a, 2).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        reserve(&r1.api, "rb", &sku_b, 3).await.status,
        StatusCode::CREATED
    );
    let on = |url: String, sku: String| async move {
        client(&url)
            .await
            .query_opt("SELECT available FROM inventory WHERE sku = $1", &[&sku])
            .await
            .unwrap()
            .map(|r| r.get::<_, i64>(0))
    };
    assert_eq!(on(a.clone(), sku_a.clone()).await, Some(3));
    assert_eq!(on(b.clone(), sku_b.clone()).await, Some(2));
    assert_eq!(on(a.clone(), sku_b.clone()).await, None);
    // A replica never serves a partition of another shard.
    let other = reserve(&r0.api, "rc", &sku_b, 1).await;
    assert!(other.status.is_server_error() || other.status == StatusCode::MISDIRECTED_REQUEST);

    // A replica of a shard that is not the catalog needs the catalog.
    let Err(error) = allocator::app::Application::build(fast_config(&b, "r2")).await else {
        panic!("a replica of shard s1 started without the catalog")
    };
    assert!(error.to_string().contains("--catalog-url"), "{error}");
    // The catalog moves partition 4 to s0 behind the shard's back: s1's record disagrees.
    client(&a)
        .await
        .execute("UPDATE shard_map SET shard = 's0' WHERE partition = 4", &[])
        .await
        .unwrap();
    let config = fast_config_with(&b, "r3", &["--catalog-url", &a]);
    let Err(error) = allocator::app::Application::build(config).await else {
        panic!("a replica started on a map that disagrees with its shard")
    };
    assert!(error.to_string().contains("disagrees"), "{error}");
    r0.stop().await;
    r1.stop().await;
}
