//! Failover with real processes and real faults of the replicas: SIGKILL, SIGTERM, SIGSTOP, and
//! wall clocks skewed by hours. Takeovers stay within lease TTL plus one campaign and never let
//! two replicas hold one partition. Every takeover time measured here is printed
//! (`cargo test -- --nocapture` shows them). Faults of the database itself are in
//! [`crate::failover_database`].

use std::collections::HashMap;

use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::{faked_clock_env, spawn_replica, spawn_replica_with};
use reqwest::StatusCode;
use schema::partition::partition_for;
use schema::wire::{PartitionMap, ReserveRequest};
use serde_json::json;
use testkit::ApiClient;

const TTL_MS: u64 = 2000;
use crate::processes::CAMPAIGN_MS;
/// Observation slack on top of TTL + campaign: the test polls the map every 25 ms, and a loaded
/// 2-core CI machine delays every process a little.
const POLL_SLACK_MS: u64 = 1500;

async fn read_map(db: &str) -> PartitionMap {
    let pg = client(db).await;
    schema::assignment::read_map(&pg).await.unwrap()
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

fn owners(map: &PartitionMap) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for p in &map.partitions {
        if let Some(o) = &p.owner_id {
            *counts.entry(o.clone()).or_default() += 1;
        }
    }
    counts
}

fn split_between(map: &PartitionMap, a: &str, b: &str) -> bool {
    let counts = owners(map);
    all_owned_by_one_of(map, &[a, b])
        && counts.get(a).is_some_and(|c| *c > 0)
        && counts.get(b).is_some_and(|c| *c > 0)
}

#[tokio::test]
async fn sigkilled_owner_is_taken_over_within_ttl_plus_one_campaign() {
    let db = migrated_database(PARTITIONS).await;
    let mut a = spawn_replica(&db, "kill-a", TTL_MS);
    let b = spawn_replica(&db, "kill-b", TTL_MS);
    time_until(&db, Duration::from_secs(20), |m| {
        split_between(m, &a.id, &b.id)
    })
    .await;
    let before = read_map(&db).await;

    a.process.sigkill().unwrap();
    let took = time_until(&db, Duration::from_secs(10), |m| {
        all_owned_by_one_of(m, &[&b.id])
    })
    .await;
    println!(
        "takeover after SIGKILL: {} ms (ttl {TTL_MS} ms, campaign {CAMPAIGN_MS} ms)",
        took.as_millis()
    );
    // I6: within TTL + one campaign period (+20 % jitter), plus observation slack.
    assert!(
        took <= Duration::from_millis(TTL_MS + CAMPAIGN_MS * 12 / 10 + POLL_SLACK_MS),
        "took {took:?}"
    );

    let after = read_map(&db).await;
    for (old, new) in before.partitions.iter().zip(&after.partitions) {
        if old.owner_id.as_deref() == Some("kill-a") {
            assert!(
                new.epoch > old.epoch,
                "takeover bumps the epoch of partition {}",
                old.partition
            );
            assert!(new.revision > old.revision);
        }
    }
    // The survivor serves the dead replica's partitions.
    restock(&b.url, "after-kill", 3).await;
    drop(b);
}

#[tokio::test]
async fn sigterm_releases_leases_so_takeover_is_immediate() {
    let db = migrated_database(PARTITIONS).await;
    // A long lease makes a release and an expiry easy to tell apart.
    let ttl = 8000;
    let mut a = spawn_replica(&db, "term-a", ttl);
    let b = spawn_replica(&db, "term-b", ttl);
    time_until(&db, Duration::from_secs(20), |m| {
        split_between(m, &a.id, &b.id)
    })
    .await;

    let stopped = Instant::now();
    a.process.sigterm().unwrap();
    let status = a.process.wait_exit(Duration::from_secs(10)).await.unwrap();
    assert!(
        status.success(),
        "graceful exit: {status:?}\n{}",
        a.process.log_tail(20)
    );
    let exited = stopped.elapsed();
    let took = time_until(&db, Duration::from_secs(10), |m| {
        all_owned_by_one_of(m, &[&b.id])
    })
    .await
        + exited;
    println!(
        "takeover after SIGTERM: {} ms (process exited after {} ms; ttl {ttl} ms)",
        took.as_millis(),
        exited.as_millis()
    );
    assert!(
        took < Duration::from_millis(ttl / 2),
        "took {took:?}: leases were not released"
    );
    let log = a.process.log_tail(200);
    assert!(log.contains("lease released"), "{log}");
    drop(b);
}

#[tokio::test]
async fn paused_owner_cannot_write_after_a_takeover() {
    let db = migrated_database(PARTITIONS).await;
    let mut a = spawn_replica(&db, "pause-a", TTL_MS);
    let b = spawn_replica(&db, "pause-b", TTL_MS);
    time_until(&db, Duration::from_secs(20), |m| {
        split_between(m, &a.id, &b.id)
    })
    .await;
    let map = read_map(&db).await;
    let owned_by_a = map
        .partitions
        .iter()
        .find(|p| p.owner_id.as_deref() == Some("pause-a"))
        .unwrap();
    let partition = owned_by_a.partition;
    let old_epoch = owned_by_a.epoch;
    let sku = (0..)
        .map(|i| format!("paused-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap();
    restock(&a.url, &sku, 10).await;

    a.process.sigstop().unwrap();
    let took = time_until(&db, Duration::from_secs(10), |m| {
        m.partitions[partition as usize].owner_id.as_deref() == Some("pause-b")
    })
    .await;
    println!(
        "takeover of a SIGSTOPped owner's partition: {} ms",
        took.as_millis()
    );
    let new_epoch = read_map(&db).await.partitions[partition as usize].epoch;
    assert!(new_epoch > old_epoch);

    // The old owner wakes up believing nothing happened; the first thing it sees is a request.
    a.process.sigcont().unwrap();
    let woke = http()
        .post(format!("{}/v1/reservations", a.url))
        .json(&json!({"reservation_id": "stale-1", "sku": sku, "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert!(
        matches!(
            woke.status(),
            StatusCode::MISDIRECTED_REQUEST | StatusCode::SERVICE_UNAVAILABLE
        ),
        "a paused owner must not serve after waking: {}",
        woke.status()
    );
    // And nothing in the partition was written under the old epoch after the takeover.
    let pg = client(&db).await;
    let stale: i64 = pg
        .query_one(
            "SELECT count(*) FROM ledger WHERE partition = $1 AND epoch < $2 AND kind = 'reserve'",
            &[&(partition as i32), &new_epoch],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale, 0);
    // The new owner serves the SKU.
    let served = ApiClient::new(&b.url)
        .reserve(&ReserveRequest {
            reservation_id: "fresh-1".parse().expect("valid id"),
            sku: sku.parse().expect("valid sku"),
            quantity: 1.try_into().expect("valid quantity"),
            ttl_seconds: None,
        })
        .await;
    assert_eq!(served.status, StatusCode::CREATED);
    let log = a.process.log_tail(400);
    assert!(
        log.contains("process stall detected") || log.contains("lease lost"),
        "{log}"
    );
}

#[tokio::test]
async fn replicas_never_hold_one_partition_at_the_same_time() {
    let db = migrated_database(PARTITIONS).await;
    let mut replicas = vec![
        TestReplica::start(fast_config(&db, "x-1")).await,
        TestReplica::start(fast_config(&db, "x-2")).await,
    ];
    let sample = |replicas: &[TestReplica]| {
        for partition in 0..PARTITIONS {
            let holders: Vec<&str> = replicas
                .iter()
                .filter(|r| r.ownership.authority_any(partition).is_some())
                .map(|r| r.replica_id.as_str())
                .collect();
            assert!(
                holders.len() <= 1,
                "partition {partition} held by {holders:?}"
            );
        }
    };
    let churn_at = [Duration::from_secs(2), Duration::from_secs(4)];
    let start = Instant::now();
    let mut step = 0;
    let mut samples = 0;
    while start.elapsed() < Duration::from_secs(7) {
        sample(&replicas);
        samples += 1;
        if step < churn_at.len() && start.elapsed() >= churn_at[step] {
            if step == 0 {
                replicas.push(TestReplica::start(fast_config(&db, "x-3")).await);
            } else {
                let leaving = replicas.remove(0);
                leaving.stop().await;
            }
            step += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(samples > 200, "sampled {samples} times");
    // After the churn the two remaining replicas share every partition.
    let ids: Vec<String> = replicas.iter().map(|r| r.replica_id.clone()).collect();
    time_until(&db, Duration::from_secs(10), |m| {
        split_between(m, &ids[0], &ids[1])
    })
    .await;
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test]
async fn skewed_wall_clocks_change_nothing_because_the_database_clock_judges_expiry() {
    let db = migrated_database(PARTITIONS).await;
    // One replica lives two hours in the future, the other an hour in the past.
    let mut ahead = spawn_replica_with(&db, "ahead", TTL_MS, faked_clock_env("+2h"));
    let behind = spawn_replica_with(&db, "behind", TTL_MS, faked_clock_env("-1h"));
    time_until(&db, Duration::from_secs(20), |m| {
        split_between(m, &ahead.id, &behind.id)
    })
    .await;
    // The fault is real: the replica's own log timestamps come from its shifted clock.
    let log = ahead.process.log_tail(50);
    let first: serde_json::Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    let logged: chrono::DateTime<chrono::Utc> =
        first["timestamp"].as_str().unwrap().parse().unwrap();
    assert!(
        logged > chrono::Utc::now() + chrono::Duration::minutes(90),
        "clock not shifted: {logged}"
    );

    // Neither steals the other's unexpired leases, whatever its own clock says: the split holds
    // for several lease periods.
    let settled = read_map(&db).await;
    tokio::time::sleep(Duration::from_millis(TTL_MS * 2)).await;
    let later = read_map(&db).await;
    for (a, b) in settled.partitions.iter().zip(&later.partitions) {
        assert_eq!(
            a.owner_id, b.owner_id,
            "partition {} changed hands",
            a.partition
        );
        assert_eq!(
            a.epoch, b.epoch,
            "partition {} was re-acquired",
            a.partition
        );
    }
    // Both serve their partitions, and a crash is detected by the database clock as usual.
    let partition = later
        .partitions
        .iter()
        .find(|p| p.owner_id.as_deref() == Some("behind"))
        .unwrap()
        .partition;
    let sku = (0..)
        .map(|i| format!("skew-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap();
    restock(&behind.url, &sku, 2).await;
    ahead.process.sigkill().unwrap();
    let took = time_until(&db, Duration::from_secs(10), |m| {
        all_owned_by_one_of(m, &[&behind.id])
    })
    .await;
    println!(
        "takeover by a replica whose clock is 1 h behind: {} ms",
        took.as_millis()
    );
    assert!(
        took <= Duration::from_millis(TTL_MS + CAMPAIGN_MS * 12 / 10 + POLL_SLACK_MS),
        "took {took:?}"
    );
}
