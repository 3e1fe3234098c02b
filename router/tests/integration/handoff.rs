//! Planned hand-off: a rolling restart of three allocators (SIGTERM, restart, next) under load
//! through a router. A stopping replica deregisters and releases its leases with an announcement
//! (`NOTIFY`), so peers acquire at once; a restarted replica takes its share back one partition
//! at a time through the same announced hand-off.
//!
//! The gap is measured where it happens: every acquisition reports how long the partition had no
//! live owner by the database clock (`vacant_ms` in the allocators' `lease acquired` log lines,
//! also the `allocator_lease_vacancy_seconds` histogram). The client must see no failed answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{balanced, http, serial, Cluster};
use serde_json::json;

const PARTITIONS: u32 = 16;
const SKUS: usize = 32;
const CLIENTS: usize = 4;

/// Client-side record of one request.
struct Answer {
    status: u16,
    latency: Duration,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `vacant_ms` of every `lease acquired` line logged at or after `since` (RFC 3339, UTC).
fn vacancies_since(cluster: &Cluster, since: &str) -> Vec<u64> {
    let mut gaps = Vec::new();
    for entry in std::fs::read_dir(&cluster.log_dir).expect("log dir") {
        let text = std::fs::read_to_string(entry.expect("log entry").path()).unwrap_or_default();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let fields = &record["fields"];
            if fields["message"] != "lease acquired" {
                continue;
            }
            let at = record["timestamp"].as_str().unwrap_or_default();
            if at < since {
                continue;
            }
            if let Some(ms) = fields["vacant_ms"].as_u64() {
                gaps.push(ms);
            }
        }
    }
    gaps.sort_unstable();
    gaps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load_hands_partitions_over_without_a_gap() {
    let _serial = serial().await;
    let mut cluster = Cluster::start("handoff", 3, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    for i in 0..SKUS {
        cluster
            .restock(&router.url, &format!("handoff-{i}"), 1_000_000)
            .await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stop, answers, url) = (stop.clone(), answers.clone(), router.url.clone());
            tokio::spawn(async move {
                let http = http();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let status = http
                        .post(format!("{url}/v1/reservations"))
                        .json(&json!({
                            "reservation_id": format!("handoff-{c}-{n}"),
                            "sku": format!("handoff-{}", (c * 7 + n) % SKUS),
                            "quantity": 1,
                        }))
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    answers.lock().unwrap().push(Answer {
                        status,
                        latency: started.elapsed(),
                    });
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let restart_started = Instant::now();
    let ids = ["alloc-0", "alloc-1", "alloc-2"];
    let fair = PARTITIONS.div_ceil(3) as usize;
    for id in ids {
        let process = cluster.allocator(id).process.as_mut().unwrap();
        process.sigterm().unwrap();
        process.wait_exit(Duration::from_secs(15)).await.unwrap();
        cluster.spawn_allocator(id);
        cluster
            .wait_map(Duration::from_secs(30), |m| balanced(m, &ids, fair))
            .await;
    }
    let restart_took = restart_started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let failed: Vec<u16> = answers
        .iter()
        // 200 is a replay: the router retried an ambiguous attempt with the same id and the
        // client got its hold.
        .filter(|a| a.status != 201 && a.status != 200)
        .map(|a| a.status)
        .collect();
    let mut latencies: Vec<u64> = answers
        .iter()
        .map(|a| a.latency.as_millis() as u64)
        .collect();
    latencies.sort_unstable();
    let gaps = vacancies_since(&cluster, &since);
    println!(
        "rolling restart of 3 allocators in {} ms under load: {} requests, {} failed; client \
         latency p50 {} ms, p99 {} ms, max {} ms; {} hand-offs, vacancy p50 {} ms, p99 {} ms, \
         max {} ms",
        restart_took.as_millis(),
        answers.len(),
        failed.len(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(0),
        gaps.len(),
        percentile(&gaps, 50.0),
        percentile(&gaps, 99.0),
        gaps.last().copied().unwrap_or(0),
    );
    assert!(
        answers.len() > 100,
        "the load ran: {} answers",
        answers.len()
    );
    assert!(
        failed.is_empty(),
        "failed answers at the client: {failed:?}"
    );
    // Each stop hands over about a third of the partitions and each restart takes a share back.
    assert!(
        gaps.len() >= PARTITIONS as usize,
        "every hand-off was measured: {gaps:?}"
    );
    assert!(
        percentile(&gaps, 99.0) <= 200,
        "announced hand-offs leave partitions unowned for milliseconds: {gaps:?}"
    );
    router.stop().await;
}
