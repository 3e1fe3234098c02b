//! An allocator SIGKILLed under steady traffic through the router: the takeover fits in the
//! router's retry deadline, so no client sees an error, every request ends with exactly one hold
//! and the stock moved exactly that much. How well the crash was masked (latencies, replays,
//! retries by cause) is printed. Redis faults and the Redis feed are in [`crate::failover_redis`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{balanced, http, metric, serial, Cluster, LEASE_TTL_MS};
use schema::partition::partition_for;
use serde_json::json;

const PARTITIONS: u32 = 16;

/// One client request as the order service would make it: retried with the same id on 503/504
/// and transport errors until a definitive answer.
#[derive(Debug, Clone)]
struct Record {
    id: String,
    sku: String,
    sent_at: Instant,
    /// First answer's status (`None`: transport error) and latency.
    first_status: Option<u16>,
    first_latency: Duration,
    first_outcome_unknown: Option<bool>,
    final_status: Option<u16>,
    attempts: u32,
}

async fn client_request(client: &reqwest::Client, base: &str, id: String, sku: String) -> Record {
    let sent_at = Instant::now();
    let mut record = Record {
        id: id.clone(),
        sku: sku.clone(),
        sent_at,
        first_status: None,
        first_latency: Duration::ZERO,
        first_outcome_unknown: None,
        final_status: None,
        attempts: 0,
    };
    loop {
        record.attempts += 1;
        let answer = client
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": id, "sku": sku, "quantity": 1}))
            .send()
            .await;
        let (status, outcome_unknown) = match answer {
            Ok(response) => {
                let status = response.status().as_u16();
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                (Some(status), body["outcome_unknown"].as_bool())
            }
            Err(_) => (None, None),
        };
        if record.attempts == 1 {
            record.first_status = status;
            record.first_latency = sent_at.elapsed();
            record.first_outcome_unknown = outcome_unknown;
        }
        match status {
            Some(503 | 504) | None if sent_at.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => {
                record.final_status = status;
                return record;
            }
        }
    }
}

/// `workers` clients sending [`client_request`]s over `skus` through the router at `base` until
/// `stop` is set; each task returns its clients' records.
fn spawn_traffic(
    workers: usize,
    base: &str,
    skus: Vec<String>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Record>>> {
    let skus = Arc::new(skus);
    (0..workers)
        .map(|w| {
            let stop = stop.clone();
            let skus = skus.clone();
            let base = base.to_owned();
            tokio::spawn(async move {
                let client = http();
                let mut records = Vec::new();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let sku = skus[(w * 7919 + n * 31) % skus.len()].clone();
                    records
                        .push(client_request(&client, &base, format!("kill-{w}-{n}"), sku).await);
                    n += 1;
                }
                records
            })
        })
        .collect()
}

/// The database (every shard of it) has exactly one hold per request, and the stock moved
/// exactly that much.
async fn assert_one_hold_per_request(cluster: &Cluster, records: &[Record]) {
    let rows = cluster
        .query_every_shard(
            "SELECT reservation_id, status, quantity FROM reservations \
             WHERE reservation_id LIKE 'kill-%'",
            &[],
        )
        .await
        .unwrap();
    let in_db: HashMap<String, (String, i64)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(rows.len(), records.len(), "one row per request");
    assert_eq!(in_db.len(), records.len(), "one row per request");
    for r in records {
        let (status, quantity) = in_db.get(&r.id).expect("request has its row");
        assert_eq!((status.as_str(), *quantity), ("held", 1), "{}", r.id);
    }
    let held = cluster
        .sum_every_shard(
            "SELECT coalesce(sum(held), 0)::bigint FROM inventory WHERE sku LIKE 'kill-%'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(held, records.len() as i64, "one decrement per hold");
    let unbalanced = cluster
        .sum_every_shard(
            "SELECT count(*) FROM inventory WHERE on_hand <> available + held + confirmed",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(unbalanced, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_an_owner_under_traffic_is_masked_without_duplicate_holds() {
    const WORKERS: usize = 8;
    let _serial = serial().await;
    let mut cluster = Cluster::start("failover_kill", 3, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let skus: Vec<String> = (0..64).map(|i| format!("kill-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 1_000_000).await;
    }
    let map_before = cluster.map().await;
    let victim = "alloc-0";
    let victim_partitions: HashSet<u32> = map_before
        .partitions
        .iter()
        .filter(|p| p.owner_id.as_deref() == Some(victim))
        .map(|p| p.partition)
        .collect();
    assert!(!victim_partitions.is_empty());

    let retries_before = retry_counts(&router.url).await;
    let unknown_before = metric(
        &router.url,
        "router_forwards_total{outcome=\"outcome_unknown\"}",
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let workers = spawn_traffic(WORKERS, &router.url, skus, &stop);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = Instant::now();
    cluster
        .allocator(victim)
        .process
        .as_mut()
        .unwrap()
        .sigkill()
        .unwrap();
    // Traffic continues through the lease expiry and takeover.
    let map_after = cluster
        .wait_map(Duration::from_secs(20), |m| {
            balanced(m, &["alloc-1", "alloc-2"], PARTITIONS as usize / 2)
        })
        .await;
    let takeover = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut records = Vec::new();
    for w in workers {
        records.extend(w.await.unwrap());
    }

    // Every request settled with exactly one definitive outcome: held (new or replayed).
    for r in &records {
        assert!(
            matches!(r.final_status, Some(200 | 201)),
            "{} did not settle: {r:?}",
            r.id
        );
    }
    assert_one_hold_per_request(&cluster, &records).await;

    // How well the router masked the crash.
    let on_victim: Vec<&Record> = records
        .iter()
        .filter(|r| {
            victim_partitions.contains(&partition_for(&r.sku, PARTITIONS))
                && r.sent_at + r.first_latency >= killed_at
                && r.sent_at <= killed_at + takeover + Duration::from_secs(1)
        })
        .collect();
    let client_errors: Vec<&Record> = records
        .iter()
        .filter(|r| !matches!(r.first_status, Some(200 | 201)))
        .collect();
    let max_latency = on_victim
        .iter()
        .map(|r| r.first_latency)
        .max()
        .unwrap_or_default();
    let replays = records
        .iter()
        .filter(|r| r.first_status == Some(200))
        .count();
    let masked_until = records
        .iter()
        .filter(|r| victim_partitions.contains(&partition_for(&r.sku, PARTITIONS)))
        .filter(|r| r.sent_at <= killed_at + takeover && r.first_status == Some(201))
        .map(|r| r.sent_at + r.first_latency)
        .max()
        .map(|t| t.saturating_duration_since(killed_at))
        .unwrap_or_default();
    let unknown = metric(
        &router.url,
        "router_forwards_total{outcome=\"outcome_unknown\"}",
    )
    .await
        - unknown_before;
    let retries: Vec<(&str, f64)> = retry_counts(&router.url)
        .await
        .into_iter()
        .zip(retries_before)
        .map(|((cause, after), (_, before))| (cause, after - before))
        .collect();
    println!(
        "sigkill of {victim} (lease ttl {LEASE_TTL_MS} ms, {} partitions): takeover visible in \
         postgres after {} ms; router masked it until {} ms after the kill; {} requests touched \
         the dead owner's partitions during failover, max first-answer latency {} ms; {} of {} \
         requests needed a client retry (first answers {:?}), {} replays; router retries by cause \
         {retries:?}; gave up with outcome unknown {unknown}",
        victim_partitions.len(),
        takeover.as_millis(),
        masked_until.as_millis(),
        on_victim.len(),
        max_latency.as_millis(),
        client_errors.len(),
        records.len(),
        client_errors
            .iter()
            .map(|r| (r.first_status, r.first_outcome_unknown))
            .collect::<Vec<_>>(),
        replays,
    );
    // Failover (ttl + campaign) fits in the router's 5 s retry deadline: no client saw an error.
    assert!(
        client_errors.is_empty(),
        "router did not mask the crash: {client_errors:?}"
    );
    for (sku_partition, owner) in map_after
        .partitions
        .iter()
        .map(|p| (p.partition, p.owner_id.clone()))
    {
        assert_ne!(owner.as_deref(), Some(victim), "partition {sku_partition}");
    }
    router.stop().await;
}

async fn retry_counts(base: &str) -> Vec<(&'static str, f64)> {
    let mut counts = Vec::new();
    for cause in ["misdirected", "unavailable", "connect", "timeout"] {
        let series = format!("router_retries_total{{cause=\"{cause}\"}}");
        counts.push((cause, metric(base, &series).await));
    }
    counts
}
