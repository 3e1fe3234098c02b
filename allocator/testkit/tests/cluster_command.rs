//! The `cluster` binary end to end: `up` leaves a private cluster running after it exits and
//! records it, `status` tells a dead process, and `down` stops everything — also after the
//! supervisor itself was killed, from what it left in its process group.
//!
//! Needs the allocator and router binaries (`cargo build -p allocator -p router`; a workspace
//! test run builds them).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn cluster(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cluster"));
    for (key, _) in std::env::vars() {
        if key.starts_with("CLUSTER_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .env("CLUSTER_DIR", dir)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the cluster binary")
}

fn show(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Pids recorded in `run/*.pid` (first line of each).
fn recorded_pids(dir: &Path) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir.join("run"))
        .expect("run dir")
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "pid") {
            let text = std::fs::read_to_string(&path).unwrap();
            let pid = text.lines().next().unwrap().trim().parse().unwrap();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, pid));
        }
    }
    out.sort();
    out
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(") ")
            .is_some_and(|(_, s)| s.starts_with('Z'))
    })
}

fn env_value(dir: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(dir.join("cluster.env")).expect("cluster.env");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("export {key}=")))
        .unwrap_or_else(|| panic!("{key} missing from {text}"))
        .trim_matches('\'')
        .to_owned()
}

#[tokio::test]
async fn up_leaves_a_recorded_cluster_running_and_down_stops_all_of_it_even_without_its_supervisor()
{
    let allocator = testkit::cargo_bin("allocator");
    let router = testkit::cargo_bin("router");
    for bin in [&allocator, &router] {
        assert!(
            bin.is_file(),
            "{} is missing: run `cargo build -p allocator -p router` first",
            bin.display()
        );
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let up = cluster(
        dir,
        &[
            "up",
            "--private",
            "--allocators",
            "2",
            "--routers",
            "1",
            "--partitions",
            "4",
            "--allocator-bin",
            allocator.to_str().unwrap(),
            "--router-bin",
            router.to_str().unwrap(),
            "--allocator-args",
            "--campaign-interval-ms 200",
        ],
    );
    assert!(up.status.success(), "up: {}", show(&up));

    // `up` has exited; the cluster runs and answers through the recorded router.
    let map: serde_json::Value =
        reqwest::get(format!("{}/v1/partitions", env_value(dir, "ROUTER_URL")))
            .await
            .expect("router answers")
            .json()
            .await
            .expect("map");
    let parts = map["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 4, "{map}");
    assert!(parts.iter().all(|p| p["owner_id"].is_string()), "{map}");
    let pids = recorded_pids(dir);
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["alloc-1", "alloc-2", "cluster", "postgres", "redis", "router-1"],
        "{}",
        show(&up)
    );
    assert!(pids.iter().all(|(_, pid)| alive(*pid)), "{pids:?}");
    let status = cluster(dir, &["status"]);
    assert!(status.status.success(), "status: {}", show(&status));

    // A dead allocator makes `status` fail and name it.
    let (_, victim) = pids[0];
    kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = cluster(dir, &["status"]);
    assert_eq!(status.status.code(), Some(1), "status: {}", show(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("alloc-1   dead"),
        "{}",
        show(&status)
    );

    // Without its supervisor, `down` still stops every process and server it had started, and
    // removes the servers' directories.
    let server_dirs = std::fs::read_to_string(dir.join("run/server-dirs")).expect("server-dirs");
    let server_dirs: Vec<&str> = server_dirs.lines().collect();
    assert_eq!(server_dirs.len(), 2, "{server_dirs:?}");
    assert!(
        server_dirs.iter().all(|d| Path::new(d).is_dir()),
        "{server_dirs:?}"
    );
    let (_, supervisor) = pids[2];
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let down = cluster(dir, &["down"]);
    assert!(down.status.success(), "down: {}", show(&down));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left: Vec<_> = pids.iter().filter(|(_, pid)| alive(*pid)).collect();
    assert!(left.is_empty(), "still running after down: {left:?}");
    assert!(!dir.join("cluster.env").exists());
    let kept: Vec<_> = server_dirs
        .iter()
        .filter(|d| Path::new(d).exists())
        .collect();
    assert!(kept.is_empty(), "server directories left behind: {kept:?}");
    let again = cluster(dir, &["down"]);
    assert!(again.status.success(), "down again: {}", show(&again));
}
