//! A real Prometheus server scraping a real cluster, configured like
//! `ops/prometheus/prometheus.yml` and loading `ops/prometheus/alerts.yml`:
//!
//! * every metric name the Grafana dashboards and the alert rules use exists in Prometheus after
//!   the cluster has served traffic and been through a stall, or is on a short, explained list
//!   of counters that only a fault creates (those must still be declared in `metrics.rs`);
//! * every dashboard panel's query (template variables substituted, both "All" and a concrete
//!   value) evaluates without error to a non-empty result, or is on that list;
//! * the partitions-without-owner alert fires once the only allocator that owns partitions is
//!   SIGKILLed, and clears when an allocator takes the partitions again.
//!
//! The Prometheus server comes from `ALLOCATOR_PROMETHEUS_BIN` (`ops/test.sh` exports it from
//! Debian's `prometheus` package). Without it the test skips with a message, except under
//! `CI=true`, where it fails: CI must not pass without running it.

mod dashboards;
mod rules;
mod server;
mod unowned;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{balanced, http, serial, Cluster, LEASE_TTL_MS};

/// `allocator:expected_partitions` and `allocator:expected_replicas` in alerts.yml: the test
/// cluster has the shape the rules expect, so the rules are loaded unchanged.
const PARTITIONS: u32 = 16;
const REPLICAS: usize = 3;
/// Grafana's `$__rate_interval` for the 5 s scrape interval of prometheus.yml:
/// max(4 × scrape interval, query step + scrape interval).
const RATE_INTERVAL: &str = "20s";
/// `for:` of the alert copies in the test rule file (the real ones wait a minute or more).
const SHORT_FOR: &str = "3s";
/// Label that marks the short-`for:` copies, so their alerts are told from the originals'.
const COPY_LABEL: &str = "rules_copy";

/// Counters that exist only once their fault has happened. The scenario below creates most
/// faults that a test can create cheaply (a SIGSTOP past the lease, graceful hand-offs, a
/// SIGKILL); these need a fencing race, a panicking worker or a paused job holder, which other
/// tests provoke on purpose (fencing.rs, lifecycle.rs, the settlement tests). For them the test
/// still checks that the name is one the services declare in their metrics.rs.
const FAULT_ONLY: &[(&str, &str)] = &[
    (
        "allocator_stale_epoch_rejections_total",
        "only when a write with a superseded epoch reaches PostgreSQL (a race with a paused owner)",
    ),
    (
        "allocator_worker_failures_total",
        "only when a partition worker panics (a fault hook not built into the service binary)",
    ),
    (
        "allocator_job_stale_term_rejections_total",
        "only when a paused former settlement holder writes after a takeover",
    ),
    (
        "allocator_storage_refusals_total",
        "only when a configured database server is behind, foreign or not serving \
         (storage_failover.rs revives an old primary)",
    ),
    (
        "router_storage_refusals_total",
        "only when a configured database server is behind, foreign or not serving",
    ),
    (
        "allocator_storage_read_only_connects_total",
        "only when a connection attempt meets a standby (a replicated database)",
    ),
    (
        "router_storage_read_only_connects_total",
        "only when a connection attempt meets a standby (a replicated database)",
    ),
    (
        "allocator_lease_renew_failures_total",
        "only when a renewal fails or is ambiguous (database errors); a SIGSTOP makes the \
         replica skip renewals rather than fail them",
    ),
    (
        "router_quota_refusals_total",
        "only when a client's auth-file line sets a quota and a request exceeds it \
         (tenants.rs); this cluster runs without authentication",
    ),
    (
        "allocator_quota_refusals_total",
        "only when a client's quota refuses a request at an allocator (allocator tenants tests)",
    ),
    (
        "router_upstream_auth_failures_total",
        "only when allocators refuse the router's own token (auth_upstream.rs); this cluster \
         runs without authentication",
    ),
    (
        "router_auth_reloads_total",
        "only after a SIGHUP with an auth file (the allocator's auth tests)",
    ),
    (
        "allocator_auth_reloads_total",
        "only after a SIGHUP with an auth file (the allocator's auth tests)",
    ),
    (
        "router_tls_reloads_total",
        "only after a SIGHUP with TLS configured (tls.rs)",
    ),
    (
        "allocator_tls_reloads_total",
        "only after a SIGHUP with TLS configured (tls.rs)",
    ),
];

/// Client traffic through the router until `stop`: reservations that are confirmed, released,
/// left to expire (1 s holds), and refused for lack of stock, so every outcome counter and the
/// latency histograms have samples.
async fn traffic(base: String, skus: Vec<String>, stop: Arc<AtomicBool>) -> u64 {
    let client = http();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let sku = &skus[n as usize % skus.len()];
        let id = format!("prom-{n}");
        let (quantity, ttl) = match n % 4 {
            3 => (1_000_000, 60), // more than the stock: 409 insufficient-stock
            2 => (1, 1),          // left to expire
            _ => (1, 60),
        };
        let answer = client
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": id, "sku": sku, "quantity": quantity, "ttl_seconds": ttl}))
            .send()
            .await;
        if matches!(&answer, Ok(r) if r.status().is_success()) {
            let action = match n % 4 {
                0 => Some("confirm"),
                1 => Some("release"),
                _ => None,
            };
            if let Some(action) = action {
                let _ = client
                    .post(format!("{base}/v1/reservations/{id}/{action}"))
                    .send()
                    .await;
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_cluster_dashboard_queries_answer_and_unowned_partitions_alert() {
    let Some(bin) = server::prometheus_bin() else {
        return;
    };
    let _serial = serial().await;
    let started = Instant::now();

    // Settlement windows of 2 s instead of a minute, so the job's run counter and lag gauges
    // exist within the test.
    // One shard whatever `TESTKIT_SHARDS` says: the unowned-partitions part stops every
    // allocator but one, which must then own every partition.
    let mut cluster = Cluster::start_sharded_with_env(
        "prometheus",
        1,
        REPLICAS,
        PARTITIONS,
        vec![("ALLOCATOR_SETTLEMENT_WINDOW_SECS".into(), "2".into())],
    )
    .await;
    let router = cluster.router(|_| {}).await;
    let skus: Vec<String> = (0..16).map(|i| format!("prom-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100_000).await;
    }
    let (prometheus, _keep_on_failure) = server::start(&bin, &cluster, &router.url).await;
    let rules = rules::load_short_for_copies(&prometheus).await;

    // Traffic while Prometheus collects enough scrapes for rate() over RATE_INTERVAL.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(traffic(router.url.clone(), skus.clone(), stop.clone()));
    prometheus
        .wait_for(
            "targets up",
            Duration::from_secs(30),
            "count(up == 1)",
            (REPLICAS + 1) as f64,
        )
        .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    rules.assert_no_critical_alert(&prometheus).await;

    // A stall longer than the lease under traffic: the replica drops its leases (lease losses,
    // process stalls, dropped-lease releases), peers take them over, the router retries.
    let victim = cluster.allocators[2].id.clone();
    {
        let process = cluster.allocator(&victim).process.as_mut().unwrap();
        process.sigstop().expect("sigstop");
        tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS * 2)).await;
        process.sigcont().expect("sigcont");
    }
    let ids: Vec<String> = cluster.allocators.iter().map(|a| a.id.clone()).collect();
    let fair = PARTITIONS.div_ceil(REPLICAS as u32) as usize;
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &ids.iter().map(String::as_str).collect::<Vec<_>>(), fair)
        })
        .await;
    // Two more scrapes after the recovery, and rate() windows that include it.
    tokio::time::sleep(Duration::from_secs(12)).await;

    // 1. Every metric name used by the dashboards and the rules exists.
    dashboards::assert_used_metrics_exist(&prometheus, &rules.exprs).await;
    // 2. Every panel query answers, for "All" and for one value of each variable.
    dashboards::assert_panel_queries_answer(&prometheus, &victim).await;
    // 3. Unowned partitions alert.
    stop.store(true, Ordering::Relaxed);
    let requests = load.await.expect("traffic task");
    let (fired, cleared) = unowned::alert_fires_and_clears(&mut cluster, &prometheus).await;

    eprintln!(
        "prometheus test: {requests} requests; {} fired {:.1} s after the SIGKILL \
         and cleared {:.1} s after the restart; {:.0} s in all",
        unowned::ALERT,
        fired.as_secs_f64(),
        cleared.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    router.stop().await;
    drop(prometheus);
}
