//! Tearing a cluster down: Patroni starts each postmaster in a session of its own, so the
//! processes to kill are found by the cluster's directory in their command lines, not as
//! children of the agents (see the module documentation of [`super`]).

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::PatroniCluster;
use crate::procfs;

impl Drop for PatroniCluster {
    fn drop(&mut self) {
        // Agents first, so that none restarts or promotes its server while it is being killed.
        for node in &mut self.nodes {
            drop(node.agent.take());
        }
        let needle = format!("{}/", self.tmp.path().display());
        let roots = procfs::with_cmdline(&needle);
        let mut all = Vec::new();
        for root in &roots {
            all.push(*root);
            all.extend(procfs::descendants(root.pid));
        }
        for p in &all {
            procfs::signal(p, Signal::SIGCONT);
            procfs::signal(p, Signal::SIGKILL);
        }
        procfs::wait_gone(&all, Duration::from_secs(5));
        if std::thread::panicking() {
            keep_logs(self.tmp.path());
        }
    }
}

/// Copies every agent's and etcd member's log out of the cluster's directory (which is removed
/// next) into a directory that stays, and says where: a failed test leaves what Patroni did.
fn keep_logs(dir: &Path) {
    let Ok(kept) = tempfile::Builder::new()
        .prefix("allocator-patroni-logs-")
        .tempdir()
        .map(TempDir::keep)
    else {
        return;
    };
    let nodes = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for sub in nodes.filter(|e| e.path().is_dir()) {
        let logs = std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten();
        for log in logs.filter(|e| e.path().extension().is_some_and(|x| x == "log")) {
            let name = format!(
                "{}-{}",
                sub.file_name().to_string_lossy(),
                log.file_name().to_string_lossy()
            );
            let _ = std::fs::copy(log.path(), kept.join(name));
        }
    }
    eprintln!("Patroni and etcd logs kept in {}", kept.display());
}
