//! Routing correctness: every SKU reaches its partition's owner, and a stale map heals through
//! `421` → refresh → retry with the same id.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{balanced, http, metric, owner_of, serial, Cluster};
use futures::StreamExt;
use schema::partition::partition_for;
use schema::wire::{Adjustment, ReserveRequest};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_skus_route_to_their_owners() {
    const PARTITIONS: u32 = 64;
    const SKUS: usize = 10_000;
    let _serial = serial().await;
    let cluster = Cluster::start("routing_10k", 3, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let before = cluster.map().await;
    let client = http();
    let started = Instant::now();

    // The first adjustment of a SKU creates it: a fenced write only the owner may make.
    let results: Vec<(String, u16, Option<String>, Option<Adjustment>)> =
        futures::stream::iter((0..SKUS).map(|i| {
            let client = client.clone();
            let base = router.url.clone();
            async move {
                let sku = format!("sku-{i}");
                let response = client
                    .post(format!("{base}/v1/inventory/{sku}/adjustments"))
                    .json(&json!({"adjustment_id": format!("create-{sku}"), "delta": 10}))
                    .send()
                    .await
                    .expect("router answers");
                let status = response.status().as_u16();
                let served_by = response
                    .headers()
                    .get("x-served-by")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = response.json::<Adjustment>().await.ok();
                (sku, status, served_by, body)
            }
        }))
        .buffer_unordered(32)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let after = cluster.map().await;
    let owners = |m: &schema::wire::PartitionMap| -> Vec<(Option<String>, i64)> {
        m.partitions
            .iter()
            .map(|p| (p.owner_id.clone(), p.epoch))
            .collect()
    };
    assert_eq!(
        owners(&before),
        owners(&after),
        "ownership moved during the test"
    );

    let mut per_owner: HashMap<String, usize> = HashMap::new();
    for (sku, status, served_by, body) in &results {
        assert_eq!(*status, 201, "{sku}");
        let body = body.as_ref().expect("adjustment body");
        let partition = partition_for(sku, PARTITIONS);
        assert_eq!(body.partition, partition, "{sku}");
        let owner = owner_of(&before, partition).expect("owned");
        assert_eq!(served_by.as_deref(), Some(owner.as_str()), "{sku}");
        let epoch = before.partitions[partition as usize].epoch;
        assert_eq!(body.epoch, epoch, "{sku} written under the map's epoch");
        *per_owner.entry(owner).or_default() += 1;
    }

    // The database agrees: one row per SKU, on the partition the shared hash names.
    let rows = cluster
        .query_every_shard("SELECT sku, partition FROM inventory", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), SKUS);
    for row in rows {
        let sku: String = row.get(0);
        let partition: i32 = row.get(1);
        assert_eq!(partition as u32, partition_for(&sku, PARTITIONS));
    }
    // No request reached a replica that does not own its partition. (Read from the allocator
    // processes: the router's recorder is shared with the other tests of this binary.)
    let mut misdirected = 0.0;
    for allocator in &cluster.allocators {
        misdirected += metric(&allocator.url, "allocator_misdirected_requests_total").await;
    }
    assert_eq!(misdirected, 0.0);
    println!(
        "routed {SKUS} sku creations over {} allocators in {:.1} s ({:.0}/s); per owner {per_owner:?}",
        cluster.allocators.len(),
        elapsed.as_secs_f64(),
        SKUS as f64 / elapsed.as_secs_f64()
    );
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_map_is_refreshed_on_421_and_the_request_succeeds() {
    const PARTITIONS: u32 = 16;
    let _serial = serial().await;
    let mut cluster = Cluster::start("routing_stale", 1, PARTITIONS).await;
    // No Redis feed and a poll that never fires: only a 421 can refresh this router's map.
    let router = cluster
        .router(|c| {
            c.redis_url = None;
            c.poll_interval = Duration::from_secs(3600);
        })
        .await;
    let skus: Vec<String> = (0..48).map(|i| format!("stale-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100).await;
    }
    let stale_revision = router.revision().expect("map loaded");

    // Two more replicas join; alloc-0 hands partitions over (release, then they acquire).
    cluster.spawn_allocator("alloc-1");
    cluster.spawn_allocator("alloc-2");
    let map = cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &["alloc-0", "alloc-1", "alloc-2"], 6)
        })
        .await;
    assert_eq!(
        router.revision(),
        Some(stale_revision),
        "the router must still hold the stale map"
    );
    let misdirected_before =
        metric(&router.url, "router_retries_total{cause=\"misdirected\"}").await;
    let refreshes_before = metric(
        &router.url,
        "router_map_refreshes_total{cause=\"misdirected\"}",
    )
    .await;

    for (i, sku) in skus.iter().enumerate() {
        let response = router
            .api
            .reserve(&ReserveRequest {
                reservation_id: format!("stale-r-{i}").parse().expect("valid id"),
                sku: sku.parse().expect("valid sku"),
                quantity: 1.try_into().expect("valid quantity"),
                ttl_seconds: None,
            })
            .await;
        assert_eq!(response.status, 201, "{sku}");
        let served_by = response.header("x-served-by").unwrap().to_owned();
        let partition = partition_for(sku, PARTITIONS);
        assert_eq!(Some(served_by), owner_of(&map, partition), "{sku}");
    }
    let misdirected = metric(&router.url, "router_retries_total{cause=\"misdirected\"}").await
        - misdirected_before;
    let refreshes = metric(
        &router.url,
        "router_map_refreshes_total{cause=\"misdirected\"}",
    )
    .await
        - refreshes_before;
    assert!(misdirected >= 1.0, "expected at least one 421 retry");
    assert!(refreshes >= 1.0, "expected a refresh caused by a 421");
    assert!(router.revision().unwrap() > stale_revision);
    // Exactly one hold per request despite the retries.
    let held = cluster
        .sum_every_shard(
            "SELECT count(*) FROM reservations WHERE reservation_id LIKE 'stale-r-%'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(held, skus.len() as i64);
    println!("stale map healed: {misdirected} misdirected retries, {refreshes} refreshes");
    router.stop().await;
}

/// An owner that re-acquired its partitions (same replica, newer epoch) refuses requests
/// addressed to its old epoch with `421`; the router re-reads the map and retries at the new
/// epoch. The owner here is a stand-in that answers by `X-Expected-Epoch` alone, so the test
/// does not depend on when a real replica starts comparing epochs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_421_from_an_owner_at_a_newer_epoch_refreshes_and_retries() {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::{Arc, Mutex};

    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

    const PARTITIONS: u32 = 4;
    let _serial = serial().await;
    let cluster = Cluster::start("routing_epoch", 0, PARTITIONS).await;
    let epoch = Arc::new(AtomicI64::new(1));
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let (owner_epoch, owner_seen) = (epoch.clone(), seen.clone());
    let server = HttpServer::new(move || {
        let (epoch, seen) = (owner_epoch.clone(), owner_seen.clone());
        App::new().default_service(web::to(move |req: HttpRequest| {
            let (epoch, seen) = (epoch.clone(), seen.clone());
            async move {
                let expected: i64 = req
                    .headers()
                    .get("x-expected-epoch")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                seen.lock().unwrap().push(expected);
                let current = epoch.load(Ordering::SeqCst);
                if expected == current {
                    HttpResponse::Ok().json(json!({"sku": "epoch-sku", "partition": 0,
                        "on_hand": 1, "available": 1, "epoch": current}))
                } else {
                    HttpResponse::build(actix_web::http::StatusCode::MISDIRECTED_REQUEST)
                        .content_type("application/problem+json")
                        .json(json!({"type": "urn:allocator:problem:not-owner",
                            "title": "not owner", "status": 421, "epoch": current}))
                }
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let owner_url = format!("http://{}", server.addrs()[0]);
    let server = server.run();
    let server_handle = server.handle();
    tokio::spawn(server);

    let db = cluster.db().await;
    let own = "UPDATE leases SET holder_id = 'stand-in', holder_url = $1, epoch = $2, \
               revision = nextval('assignment_revision'), expires_at = now() + interval '1 hour' \
               WHERE partition IS NOT NULL";
    db.execute(own, &[&owner_url, &1i64]).await.unwrap();
    let router = cluster
        .router(|c| {
            c.redis_url = None;
            c.poll_interval = Duration::from_secs(3600);
        })
        .await;
    let before = router.revision().expect("map loaded");

    // The stand-in re-acquires at epoch 2; only a 421 can tell this router.
    db.execute(own, &[&owner_url, &2i64]).await.unwrap();
    epoch.store(2, Ordering::SeqCst);
    let response = http()
        .get(format!("{}/v1/inventory/epoch-sku", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(*seen.lock().unwrap(), [1, 2]);
    assert!(router.revision().unwrap() > before);
    router.stop().await;
    server_handle.stop(false).await;
}
