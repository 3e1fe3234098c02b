//! What replicas say about partitions and about themselves over real HTTP: the partition map of
//! a replica that owns every partition, its open health, readiness and metrics endpoints, and
//! the `421` a replica answers for a partition another replica owns, naming that owner (with
//! nothing recorded, so the owner serves the same id fresh).

use std::time::Duration;

use crate::common::*;
use reqwest::StatusCode;
use schema::wire::problem_type;

#[tokio::test]
async fn partitions_health_ready_and_metrics() {
    let (replica, _db) = single_replica().await;
    let base = &replica.url;
    let map = replica.api.partitions().await.ok();
    assert_eq!(map.partition_count, PARTITIONS);
    assert_eq!(map.partitions.len(), PARTITIONS as usize);
    for (i, entry) in map.partitions.iter().enumerate() {
        assert_eq!(entry.partition, i as u32);
        assert_eq!(entry.owner_id.as_deref(), Some("solo"));
        assert_eq!(entry.owner_url.as_deref(), Some(base.as_str()));
        assert!(entry.epoch >= 1 && entry.revision >= 1);
        assert!(entry.lease_remaining_ms.unwrap() > 0);
    }
    assert_eq!(
        http()
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        http()
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    restock(base, "m-sku", 1).await;
    let metrics = metrics_text(base).await;
    for name in [
        "allocator_leases_held",
        "allocator_lease_acquisitions_total",
        "allocator_reservation_outcomes_total",
        "allocator_http_request_duration_seconds_bucket",
        "allocator_batch_size_bucket",
        "allocator_db_transaction_duration_seconds_bucket",
        "allocator_live_replicas",
        "allocator_partition_epoch",
    ] {
        assert!(metrics.contains(name), "metric {name} missing:\n{metrics}");
    }
    replica.stop().await;
}

#[tokio::test]
async fn a_partition_owned_elsewhere_is_421_naming_the_owner() {
    let db = migrated_database(PARTITIONS).await;
    let a = TestReplica::start(fast_config(&db, "own-a")).await;
    let b = TestReplica::start(fast_config(&db, "own-b")).await;
    let map = wait_for_map(&a.url, Duration::from_secs(15), |m| {
        all_owned_by_one_of(m, &["own-a", "own-b"])
            && m.partitions
                .iter()
                .any(|p| p.owner_id.as_deref() == Some("own-a"))
            && m.partitions
                .iter()
                .any(|p| p.owner_id.as_deref() == Some("own-b"))
    })
    .await;
    let theirs = map
        .partitions
        .iter()
        .find(|p| p.owner_id.as_deref() == Some("own-b"))
        .unwrap();
    let sku = (0..)
        .map(|i| format!("elsewhere-{i}"))
        .find(|s| schema::partition::partition_for(s, PARTITIONS) == theirs.partition)
        .unwrap();

    let misdirected = reserve(&a.api, "m-1", &sku, 1).await;
    assert_eq!(misdirected.status, StatusCode::MISDIRECTED_REQUEST);
    let p = misdirected.problem();
    assert_eq!(p.kind, problem_type::NOT_OWNER);
    assert_eq!(p.partition, Some(theirs.partition));
    assert_eq!(p.owner_id.as_deref(), Some("own-b"));
    assert_eq!(p.owner_url.as_deref(), Some(b.url.as_str()));
    assert_eq!(p.epoch, Some(theirs.epoch));
    // Nothing was recorded for the misdirected id: the owner serves it fresh.
    restock(&b.url, &sku, 1).await;
    assert_eq!(
        reserve(&b.api, "m-1", &sku, 1).await.status,
        StatusCode::CREATED
    );
    a.stop().await;
    b.stop().await;
}

/// A written request records every stage it passed (DESIGN.md §10): its `Server-Timing` header
/// names the six stages in order, and the stage histograms count it; a read records none.
#[tokio::test]
async fn a_reserve_records_its_stages() {
    let (replica, _db) = single_replica().await;
    let base = &replica.url;
    restock(base, "st-sku", 5).await;
    let response = http()
        .post(format!("{base}/v1/reservations"))
        .json(&serde_json::json!({"reservation_id": "st-1", "sku": "st-sku", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let timing = response
        .headers()
        .get("server-timing")
        .expect("a Server-Timing header")
        .to_str()
        .unwrap()
        .to_owned();
    let names: Vec<&str> = timing
        .split(", ")
        .map(|entry| entry.split(";dur=").next().unwrap())
        .collect();
    assert_eq!(
        names,
        ["admission", "queue", "batch", "lane", "statement", "answer"],
        "{timing}"
    );
    let read = http()
        .get(format!("{base}/v1/inventory/st-sku"))
        .send()
        .await
        .unwrap();
    assert!(read.headers().get("server-timing").is_none());
    // Histogram samples are folded into the rendered output on a timer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = metrics_text(base).await;
        let counted = metrics.lines().any(|line| {
            line.starts_with("allocator_stage_duration_seconds_count{")
                && line.contains("stage=\"statement\"")
                && line.split(' ').nth(1).and_then(|n| n.parse::<f64>().ok()) >= Some(1.0)
        });
        if counted {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no statement stage counted:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    replica.stop().await;
}
