//! The partitions-without-owner alert, end to end. After a single SIGKILL the surviving
//! replicas take the partitions over within TTL + one campaign period (about 1.7 s here), which
//! is shorter than one 5 s scrape interval, so "without owner" would be observed by luck or not
//! at all. Instead two replicas stop gracefully (their leases move to the third at once), then
//! the only owner left is SIGKILLed: nothing can take its partitions until an allocator returns.

use std::time::{Duration, Instant};

use super::server::{allocator_targets, AlertCopies, Prometheus};
use super::{COPY_LABEL, PARTITIONS};
use crate::common::{balanced, Cluster};

/// The alert under test.
pub(super) const ALERT: &str = "AllocatorPartitionsWithoutOwner";

/// Leave one owner, SIGKILL it, wait for the alert's copy to fire with every partition unowned,
/// start the allocator again and wait for the alert to clear; returns how long each took.
pub(super) async fn alert_fires_and_clears(
    cluster: &mut Cluster,
    prometheus: &Prometheus,
) -> (Duration, Duration) {
    let keep = cluster.allocators[0].id.clone();
    for other in [
        cluster.allocators[1].id.clone(),
        cluster.allocators[2].id.clone(),
    ] {
        let process = cluster.allocator(&other).process.as_mut().unwrap();
        process.sigterm().expect("sigterm");
        process
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("graceful exit");
        cluster.allocator(&other).process = None;
    }
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &[keep.as_str()], PARTITIONS as usize)
        })
        .await;
    prometheus.set_targets("allocator", &allocator_targets(cluster));
    prometheus
        .wait_for(
            "sole owner scraped",
            Duration::from_secs(30),
            "allocator:partitions_owned",
            PARTITIONS as f64,
        )
        .await;
    assert_eq!(prometheus.copy_state(ALERT).await, "inactive");

    cluster
        .allocator(&keep)
        .process
        .as_mut()
        .unwrap()
        .sigkill()
        .expect("sigkill");
    let fired = prometheus
        .wait_alert(ALERT, "firing", Duration::from_secs(60))
        .await;
    let unowned = prometheus
        .value(&format!(
            "ALERTS{{alertname=\"{ALERT}\", alertstate=\"firing\", {COPY_LABEL}=\"true\"}}"
        ))
        .await;
    assert_eq!(unowned, Some(1.0), "ALERTS series of the firing copy");
    // The alert's value is the latest evaluation; right after the kill it can still count a few
    // partitions as owned (scrapes and the 5 s recording rule lag), so wait for all of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alerts = prometheus.api("/api/v1/alerts").await.unwrap();
        let value: Option<f64> = alerts["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["labels"]["alertname"] == ALERT && a["labels"][COPY_LABEL] == "true")
            .and_then(|a| a["value"].as_str()?.parse().ok());
        if value == Some(PARTITIONS as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ALERT}: value {value:?}, wanted every partition ({PARTITIONS}) unowned"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // An allocator back (same id; its old leases have expired): the alert clears.
    cluster.spawn_allocator(&keep);
    prometheus.set_targets("allocator", &allocator_targets(cluster));
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &[keep.as_str()], PARTITIONS as usize)
        })
        .await;
    let cleared = prometheus
        .wait_alert(ALERT, "inactive", Duration::from_secs(60))
        .await;
    (fired, cleared)
}
