//! The auth file over a replica process's life: SIGHUP reloads it, so a rotated token takes
//! effect and the old one stops working, while a broken file is refused (counted, its line
//! named in the log) and the table in force stays; a bad file at start refuses the start,
//! naming the file and the line.

use std::time::{Duration, Instant};

use crate::auth::{call, metric, write_auth_file};
use crate::common::*;
use crate::processes::spawn_replica_with;
use access::table::hash_hex;
use reqwest::StatusCode;

async fn status_with(url: &str, token: &str) -> StatusCode {
    call(reqwest::Method::GET, url, Some(token), &[], None)
        .await
        .status
}

#[tokio::test]
async fn sighup_reloads_the_auth_file_and_keeps_it_on_a_bad_one() {
    let db = migrated_database(PARTITIONS).await;
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth");
    write_auth_file(&auth, &[("old", "reserve", "old-token-1234", "")]);
    let mut replica = spawn_replica_with(
        &db,
        "auth-sighup",
        2000,
        vec![("ALLOCATOR_AUTH_FILE".into(), auth.display().to_string())],
    );
    let url = format!("{}/v1/inventory/hup-sku", replica.url);
    let deadline = Instant::now() + Duration::from_secs(20);
    while http()
        .get(format!("{}/healthz", replica.url))
        .send()
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "replica did not start: {}",
            replica.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status_with(&url, "old-token-1234").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        status_with(&url, "new-token-5678").await,
        StatusCode::UNAUTHORIZED
    );

    // Rotate: the new token in, the old one out, then SIGHUP.
    write_auth_file(&auth, &[("new", "reserve", "new-token-5678", "")]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(replica.process.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_with(&url, "new-token-5678").await != StatusCode::NOT_FOUND {
        assert!(
            Instant::now() < deadline,
            "reload not applied: {}",
            replica.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status_with(&url, "old-token-1234").await,
        StatusCode::UNAUTHORIZED
    );

    // A broken file is refused and the table in force stays; the process keeps running.
    std::fs::write(&auth, "new reserve not-a-hash\n").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(replica.process.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed = "allocator_auth_reloads_total{outcome=\"failed\"}";
    while metric(&replica.url, failed).await < 1.0 {
        assert!(Instant::now() < deadline, "failed reload not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status_with(&url, "new-token-5678").await,
        StatusCode::NOT_FOUND
    );
    assert!(replica.process.try_exit_status().unwrap().is_none());
    assert!(
        replica.process.log_tail(50).contains(":1:"),
        "the refusal names the line: {}",
        replica.process.log_tail(20)
    );
    replica.process.sigterm().unwrap();
    replica
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bad_auth_file_refuses_the_start_naming_file_and_line() {
    let db = migrated_database(PARTITIONS).await;
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth");
    std::fs::write(
        &auth,
        format!(
            "# clients\nshop reserve {}\nshop admin {}\n",
            hash_hex(b"a"),
            hash_hex(b"b")
        ),
    )
    .unwrap();
    let mut replica = spawn_replica_with(
        &db,
        "auth-bad-file",
        2000,
        vec![("ALLOCATOR_AUTH_FILE".into(), auth.display().to_string())],
    );
    let status = replica
        .process
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1));
    // The whole log: with RUST_BACKTRACE set, a backtrace follows the message.
    let log = replica.process.log_tail(usize::MAX);
    assert!(
        log.contains(&format!("{}:3:", auth.display())) && log.contains("ALLOCATOR_AUTH_FILE"),
        "{log}"
    );
}
