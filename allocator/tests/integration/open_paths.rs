//! What anyone may send without a token costs the replica little: a flood of unauthenticated
//! requests writes a capped number of audit lines, each with a bounded path, and counts every
//! refusal; a burst of `/readyz` is answered from one recent check on a connection of its own,
//! taking none of the request pool's.

use std::time::{Duration, Instant};

use crate::auth::write_auth_file;
use crate::common::*;
use crate::processes::{spawn_replica_with, Replica};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

const OPS: &str = "ops-token-open-paths-3c5e7a9b";

/// A replica process with authentication on, once it is ready.
async fn secured_replica(db: &str, id: &str) -> (Replica, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth");
    write_auth_file(&auth, &[("ops", "reserve,admin", OPS, "")]);
    let replica = spawn_replica_with(
        db,
        id,
        2000,
        vec![("ALLOCATOR_AUTH_FILE".into(), auth.display().to_string())],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = http().get(format!("{}/readyz", replica.url)).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            return (replica, dir);
        }
        assert!(
            Instant::now() < deadline,
            "replica not ready: {}",
            replica.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of one series in `/metrics`, 0 when absent.
async fn series(base: &str, name: &str) -> f64 {
    metrics_text(base)
        .await
        .lines()
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_flood_of_unauthenticated_requests_writes_few_and_short_audit_lines() {
    let db = migrated_database(PARTITIONS).await;
    let (mut replica, _dir) = secured_replica(&db, "audit-flood").await;
    let base = replica.url.clone();
    let long = format!("{base}/v1/inventory/{}/history", "x".repeat(4000));
    let sent = 300;
    let started = Instant::now();
    let statuses: Vec<StatusCode> = futures::stream::iter(0..sent)
        .map(|_| {
            let url = long.clone();
            async move { http().get(url).send().await.expect("request").status() }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    assert!(statuses.iter().all(|s| *s == StatusCode::UNAUTHORIZED));

    let refused = |log: &str| -> Vec<Value> {
        log.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["target"] == "audit")
            .filter(|line| line["fields"]["outcome"] == "unauthenticated")
            .collect()
    };
    // Lines are written as the answers go out; give the writer a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines = refused(&replica.process.log_tail(usize::MAX));
    // Ten a second at most: the seconds the flood took, and the one it started in.
    let cap = 10 * (seconds.ceil() as usize + 1);
    assert!(
        !lines.is_empty() && lines.len() <= cap,
        "{} audit lines for {sent} refusals in {seconds:.1} s (at most {cap})",
        lines.len()
    );
    for line in &lines {
        let path = line["fields"]["path"].as_str().unwrap();
        assert!(path.len() <= 256 + '…'.len_utf8(), "{} bytes", path.len());
    }
    let counted = series(
        &base,
        "allocator_unauthenticated_requests_total{reason=\"missing_token\"}",
    )
    .await;
    assert_eq!(counted, sent as f64);
    let suppressed = series(&base, "allocator_audit_lines_suppressed_total").await;
    assert_eq!(suppressed as usize, sent - lines.len());
    replica.process.sigterm().unwrap();
    let _ = replica.process.wait_exit(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_burst_of_readyz_takes_no_request_pool_connection() {
    let db = migrated_database(PARTITIONS).await;
    let (mut replica, _dir) = secured_replica(&db, "readyz-burst").await;
    let base = replica.url.clone();
    let pg = client(&db).await;
    let checks = "allocator_readiness_checks_total{outcome=\"ok\"}";
    let before = series(&base, checks).await;
    let started = Instant::now();
    let statuses: Vec<StatusCode> = futures::stream::iter(0..400)
        .map(|_| {
            let url = format!("{base}/readyz");
            async move { http().get(url).send().await.expect("readyz").status() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let seconds = started.elapsed().as_secs_f64();
    assert!(statuses.iter().all(|s| *s == StatusCode::OK));

    // The request pool's sessions (application_name `allocator:<id>`) never ran the probe's
    // query; the probe's own pool has one session.
    let sessions = |name: &str| {
        let pg = &pg;
        let name = name.to_owned();
        async move {
            pg.query(
                "SELECT query FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>()
        }
    };
    let api = sessions("allocator:readyz-burst").await;
    assert!(
        api.iter().all(|query| query != "SELECT 1"),
        "request pool sessions ran the readiness check: {api:?}"
    );
    assert!(sessions("allocator:readyz-burst:readyz").await.len() <= 1);
    // One check a second at most, however many probes.
    let ran = series(&base, checks).await - before;
    assert!(
        ran <= seconds.ceil() + 1.0,
        "{ran} checks for 400 probes in {seconds:.1} s"
    );
    replica.process.sigterm().unwrap();
    let _ = replica.process.wait_exit(Duration::from_secs(10)).await;
}
