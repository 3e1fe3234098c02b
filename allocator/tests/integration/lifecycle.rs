//! Replica lifecycle beyond the happy path: a partition worker that panics, a restart under the
//! same replica id, a process stall shorter than the lease, and memory when nobody scrapes
//! `/metrics`. Real processes where the fault is a process fault (SIGKILL, SIGSTOP, RSS).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use allocator::faults::PANIC_PREFIX;
use reqwest::StatusCode;
use schema::wire::PartitionMap;
use serde_json::json;
use testkit::{free_port, resident_set_kib, ChildProcess};

struct Replica {
    id: String,
    url: String,
    process: ChildProcess,
    _logs: tempfile::TempDir,
}

/// A replica process with `ttl_ms` leases (margin and renew interval ttl/4) campaigning every
/// `campaign_ms`.
fn spawn_replica(db: &str, id: &str, ttl_ms: u64, campaign_ms: u64) -> Replica {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let logs = tempfile::tempdir().unwrap();
    let envs: Vec<(String, String)> = [
        ("ALLOCATOR_LEASE_TTL_MS", ttl_ms.to_string()),
        ("ALLOCATOR_LEASE_MARGIN_MS", (ttl_ms / 4).to_string()),
        ("ALLOCATOR_RENEW_INTERVAL_MS", (ttl_ms / 4).to_string()),
        ("ALLOCATOR_CAMPAIGN_INTERVAL_MS", campaign_ms.to_string()),
        ("ALLOCATOR_IDLE_IN_TX_TIMEOUT_MS", "1000".to_string()),
        ("ALLOCATOR_STATEMENT_TIMEOUT_MS", "1000".to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "serve",
        "--database-url",
        db,
        "--listen",
        &listen,
        "--replica-id",
        id,
        "--advertise-url",
        &url,
    ];
    let process = ChildProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_allocator")),
        args,
        &envs,
        &logs.path().join(format!("{id}.log")),
    )
    .expect("spawn allocator");
    Replica {
        id: id.to_string(),
        url,
        process,
        _logs: logs,
    }
}

async fn read_map(db: &str) -> PartitionMap {
    schema::assignment::read_map(&client(db).await)
        .await
        .unwrap()
}

/// Poll the database until `pred` holds; returns how long it took.
async fn time_until(db: &str, timeout: Duration, pred: impl Fn(&PartitionMap) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let map = read_map(db).await;
        if pred(&map) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "condition not reached in {timeout:?}: {map:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// (partition, epoch) of every lease the database names `owner` for.
fn held_by(map: &PartitionMap, owner: &str) -> Vec<(u32, i64)> {
    map.partitions
        .iter()
        .filter(|p| p.owner_id.as_deref() == Some(owner))
        .map(|p| (p.partition, p.epoch))
        .collect()
}

async fn reserve(base: &str, id: &str, sku: &str) -> StatusCode {
    http()
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": id, "sku": sku, "quantity": 1}))
        .send()
        .await
        .map(|r| r.status())
        .unwrap_or(StatusCode::BAD_GATEWAY)
}

#[tokio::test]
async fn a_panicking_worker_gives_its_lease_up_and_the_partition_serves_again() {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "panic-a")).await;
    wait_owns_all(&replica).await;
    let partition = 3;
    let sku = sku_in(partition, "panic");
    restock(&replica.url, &sku, 100).await;
    assert_eq!(
        reserve(&replica.url, "before-panic", &sku).await,
        StatusCode::CREATED
    );
    let epoch = read_map(&db).await.partitions[partition as usize].epoch;

    let poisoned = format!("{PANIC_PREFIX}1");
    let answer = reserve(&replica.url, &poisoned, &sku).await;
    assert_ne!(answer, StatusCode::CREATED, "the fault hook did not fire");

    // Without supervision the partition answers 503 forever while its lease is renewed.
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let status = reserve(&replica.url, &format!("after-panic-{attempt}"), &sku).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "partition {partition} never served again after its worker panicked: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "partition served again {} ms after its worker panicked",
        started.elapsed().as_millis()
    );
    let now = read_map(&db).await.partitions[partition as usize].clone();
    assert!(now.epoch > epoch, "new epoch after the panic: {now:?}");
    assert_eq!(now.owner_id.as_deref(), Some("panic-a"));
    let metrics = metrics_text(&replica.url).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("allocator_worker_failures_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    replica.stop().await;
}

#[tokio::test]
async fn a_replica_restarted_under_its_id_takes_its_unexpired_leases_back_at_once() {
    const TTL_MS: u64 = 30_000;
    const CAMPAIGN_MS: u64 = 200;
    let db = migrated_database(PARTITIONS).await;
    let mut a = spawn_replica(&db, "restart-a", TTL_MS, CAMPAIGN_MS);
    let b = spawn_replica(&db, "restart-b", TTL_MS, CAMPAIGN_MS);
    time_until(&db, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &[&a.id, &b.id]) && held_by(m, &a.id).len() == 4
    })
    .await;
    let before = held_by(&read_map(&db).await, &a.id);

    a.process.sigkill().unwrap();
    a.process.wait_exit(Duration::from_secs(5)).await.unwrap();
    let restarted = spawn_replica(&db, "restart-a", TTL_MS, CAMPAIGN_MS);
    // Far below the 30 s TTL: process start, one jittered campaign period, slack for 2 cores.
    let took = time_until(&db, Duration::from_secs(6), |m| {
        before.iter().all(|(p, e)| {
            let now = &m.partitions[*p as usize];
            now.owner_id.as_deref() == Some("restart-a") && now.epoch > *e
        })
    })
    .await;
    println!(
        "restart under the same id re-took {} partitions in {} ms (ttl {TTL_MS} ms)",
        before.len(),
        took.as_millis()
    );
    let sku = sku_in(before[0].0, "restart");
    restock(&restarted.url, &sku, 5).await;
    assert_eq!(
        reserve(&restarted.url, "after-restart", &sku).await,
        StatusCode::CREATED
    );
    drop(b);
}

#[tokio::test]
async fn a_stalled_replica_releases_the_leases_it_dropped() {
    // The stall (2.5 s) is longer than the margin (2 s) and shorter than the TTL (8 s). The
    // campaign period (7 s ± 20 %) is long enough that no campaign runs between the stall and
    // the check, so only a release can have changed what the database says.
    const TTL_MS: u64 = 8000;
    const CAMPAIGN_MS: u64 = 7000;
    let db = migrated_database(PARTITIONS).await;
    let mut a = spawn_replica(&db, "stall-a", TTL_MS, CAMPAIGN_MS);
    time_until(&db, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &[&a.id])
    })
    .await;

    // Stop right after a campaign round (its heartbeat), so the next one is >= 5.6 s away.
    let pg = client(&db).await;
    let heartbeat = || async {
        pg.query_one(
            "SELECT heartbeat_at FROM replicas WHERE replica_id = 'stall-a'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, chrono::DateTime<chrono::Utc>>(0)
    };
    let last = heartbeat().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while heartbeat().await == last {
        assert!(Instant::now() < deadline, "no campaign round observed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.process.sigstop().unwrap();
    let before = held_by(&read_map(&db).await, &a.id);
    assert_eq!(before.len(), PARTITIONS as usize);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.process.sigcont().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;

    let after = read_map(&db).await;
    for (partition, epoch) in &before {
        let now = &after.partitions[*partition as usize];
        assert!(
            now.owner_id.as_deref() != Some("stall-a") || now.epoch > *epoch,
            "partition {partition} still names the stalled replica at epoch {epoch}: {now:?}\n{}",
            a.process.log_tail(40)
        );
    }
    let log = a.process.log_tail(400);
    assert!(log.contains("process stall detected"), "{log}");
    // And it takes its share back with new epochs within a campaign period.
    time_until(&db, Duration::from_secs(12), |m| {
        before.iter().all(|(p, e)| {
            let now = &m.partitions[*p as usize];
            now.owner_id.as_deref() == Some("stall-a") && now.epoch > *e
        })
    })
    .await;
    restock(&a.url, &sku_in(0, "stall"), 1).await;
}

/// Peak RSS (KiB) over the samples taken in `[from, to)`.
fn peak(samples: &[(Duration, u64, u64)], from: Duration, to: Duration) -> u64 {
    samples
        .iter()
        .filter(|(at, _, _)| *at >= from && *at < to)
        .map(|(_, _, rss)| *rss)
        .max()
        .expect("samples in the window")
}

#[tokio::test]
async fn an_unscraped_replica_keeps_its_memory_bounded() {
    const WARMUP: Duration = Duration::from_secs(5);
    /// Two upkeep periods, so each window's peak includes a whole buffering cycle.
    const WINDOW: Duration = Duration::from_secs(10);
    /// Samples recorded after the early window: ~4 MB if nothing ever drained them, above the
    /// 3–4 MB the resident set moves by on its own under this load (allocator arenas).
    const LATER_REQUESTS: u64 = 500_000;
    /// What a buffered histogram sample costs at least (64 f64 slots per ~536-byte block).
    const BYTES_PER_SAMPLE: u64 = 8;
    const CONNECTIONS: usize = 8;
    let db = migrated_database(PARTITIONS).await;
    let replica = spawn_replica(&db, "rss", 5000, 1000);
    let pid = replica.process.pid();
    let deadline = Instant::now() + Duration::from_secs(20);
    while http()
        .get(format!("{}/healthz", replica.url))
        .send()
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "replica did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every request records a latency sample; nothing renders /metrics.
    let requests = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let client = http();
    let url = format!("{}/healthz", replica.url);
    let load: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let (client, url, requests, stop) =
                (client.clone(), url.clone(), requests.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if client.get(&url).send().await.is_ok() {
                        requests.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    let early_end = WARMUP + WINDOW;
    let mut samples: Vec<(Duration, u64, u64)> = Vec::new();
    let mut early_count = None;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let at = started.elapsed();
        let count = requests.load(Ordering::Relaxed);
        samples.push((at, count, resident_set_kib(pid).expect("replica alive")));
        if at >= early_end && early_count.is_none() {
            early_count = Some(count);
        }
        if let Some(early) = early_count {
            if count >= early + LATER_REQUESTS && at >= early_end + 2 * WINDOW {
                break;
            }
        }
        assert!(
            at < Duration::from_secs(200),
            "load too light to tell: {count} requests in {at:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let (end, end_count, _) = *samples.last().unwrap();
    for (at, count, rss) in samples.iter().step_by(4) {
        println!(
            "t={:>5.1}s requests={count:>8} rss={rss} KiB",
            at.as_secs_f64()
        );
    }
    let early = peak(&samples, WARMUP, early_end);
    let late = peak(&samples, end - WINDOW, end + WINDOW);
    let later = end_count - early_count.unwrap();
    let unbounded_kib = later * BYTES_PER_SAMPLE / 1024;
    println!(
        "peak rss {early} KiB early, {late} KiB late; {later} requests in between would buffer >= {unbounded_kib} KiB"
    );
    // Buffered samples would grow the set by at least `unbounded_kib` (8 bytes is the least a
    // sample costs); bounded buffering stays within the arenas' own movement.
    assert!(
        late.saturating_sub(early) < unbounded_kib,
        "rss grew from {early} to {late} KiB over {later} unscraped requests"
    );
}
