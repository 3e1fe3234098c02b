//! Allocator replicas as real child processes (the `allocator` binary), so faults are real:
//! SIGKILL, SIGSTOP, SIGTERM, a shifted wall clock.

use std::path::PathBuf;

use testkit::{free_port, ChildProcess};

/// Campaign period of spawned replicas: short, so takeovers are quick to observe.
pub const CAMPAIGN_MS: u64 = 200;

pub struct Replica {
    pub id: String,
    pub url: String,
    pub process: ChildProcess,
    _logs: tempfile::TempDir,
}

pub fn spawn_replica(db: &str, id: &str, ttl_ms: u64) -> Replica {
    spawn_replica_with(db, id, ttl_ms, Vec::new())
}

/// libfaketime shifts the replica's wall clock; monotonic time stays real, or tokio's timers
/// would hang.
pub fn faked_clock_env(offset: &str) -> Vec<(String, String)> {
    let lib = std::env::var("ALLOCATOR_LIBFAKETIME")
        .unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1".into());
    assert!(
        std::path::Path::new(&lib).exists(),
        "libfaketime is missing at {lib}: install the `faketime` package (ops/test.sh does) or set ALLOCATOR_LIBFAKETIME"
    );
    vec![
        ("LD_PRELOAD".into(), lib),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]
}

pub fn spawn_replica_with(
    db: &str,
    id: &str,
    ttl_ms: u64,
    extra_env: Vec<(String, String)>,
) -> Replica {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let logs = tempfile::tempdir().unwrap();
    let log: PathBuf = logs.path().join(format!("{id}.log"));
    let envs: Vec<(String, String)> = [
        ("ALLOCATOR_LEASE_TTL_MS", ttl_ms.to_string()),
        ("ALLOCATOR_LEASE_MARGIN_MS", (ttl_ms / 4).to_string()),
        ("ALLOCATOR_RENEW_INTERVAL_MS", (ttl_ms / 4).to_string()),
        ("ALLOCATOR_CAMPAIGN_INTERVAL_MS", CAMPAIGN_MS.to_string()),
        ("ALLOCATOR_IDLE_IN_TX_TIMEOUT_MS", "1000".to_string()),
        ("ALLOCATOR_STATEMENT_TIMEOUT_MS", "1000".to_string()),
        ("RUST_LOG", "info".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain(extra_env)
    .collect();
    let process = ChildProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_allocator")),
        [
            "serve",
            "--database-url",
            db,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--replica-id",
            id,
            "--advertise-url",
            &url,
        ],
        &envs,
        &log,
    )
    .expect("spawn allocator");
    Replica {
        id: id.to_string(),
        url,
        process,
        _logs: logs,
    }
}
