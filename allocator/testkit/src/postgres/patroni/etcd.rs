//! Patroni's distributed configuration store: a three-member etcd 3.4 cluster on loopback.
//!
//! Three members, because that is what an operator runs: the leader key survives the loss of
//! any one member, and a Patroni node that is cut off from the majority demotes itself. Each
//! member listens on two free ports (clients, peers) and keeps its data under the cluster's
//! temporary directory. etcd does not mind running as root, so it runs as whoever runs the test.
//!
//! Members are started together (a new cluster has no quorum until two of them run) and waited
//! for through `GET /health` on each, with an explicit deadline. Every member is a
//! [`ChildProcess`], killed and reaped when the cluster is dropped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::{free_port, ChildProcess};

/// How long the members may take to elect a leader and answer `/health`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary: `$ALLOCATOR_ETCD_BIN`, else `etcd` from Debian's `etcd-server`.
fn etcd_bin() -> PathBuf {
    std::env::var_os("ALLOCATOR_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// One member of the cluster.
#[derive(Debug)]
pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    process: Option<ChildProcess>,
}

impl EtcdMember {
    /// The member's process, e.g. to freeze it; `None` after [`EtcdCluster::kill`].
    pub fn process_mut(&mut self) -> Option<&mut ChildProcess> {
        self.process.as_mut()
    }
}

/// Three etcd members forming one cluster; dropping it kills them.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// Starts `size` members with data and logs under `dir` and waits until every one answers
    /// healthy (at most 30 s; the error carries the logs' tails).
    pub async fn start(dir: &Path, size: usize) -> Result<EtcdCluster> {
        let bin = etcd_bin();
        if !bin.is_file() {
            bail!(
                "no etcd at {} (apt-get install etcd-server, or set ALLOCATOR_ETCD_BIN)",
                bin.display()
            );
        }
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("etcd{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        // Unique per cluster (the temporary directory's name), so that members of two test
        // clusters could never join each other.
        let token = dir
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("allocator-etcd")
            .to_owned();
        let mut members = Vec::with_capacity(size);
        for (i, &(client_port, peer_port)) in ports.iter().enumerate() {
            let name = format!("etcd{i}");
            let data_dir = dir.join(format!("{name}.data"));
            let client = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let args: Vec<String> = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--listen-client-urls".into(),
                client.clone(),
                "--advertise-client-urls".into(),
                client,
                "--listen-peer-urls".into(),
                peer.clone(),
                "--initial-advertise-peer-urls".into(),
                peer,
                "--initial-cluster".into(),
                initial_cluster.clone(),
                "--initial-cluster-token".into(),
                token.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--logger".into(),
                "zap".into(),
            ];
            let process = ChildProcess::spawn(&bin, &args, &[], &dir.join(format!("{name}.log")))?;
            members.push(EtcdMember {
                name,
                client_port,
                peer_port,
                process: Some(process),
            });
        }
        let cluster = EtcdCluster { members };
        cluster.wait_healthy(READY_TIMEOUT).await?;
        Ok(cluster)
    }

    /// `host:port` of every member's client listener, as Patroni's `etcd3.hosts` wants them.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    pub fn members_mut(&mut self) -> &mut [EtcdMember] {
        &mut self.members
    }

    /// Waits until every member answers `GET /health` with `"health":"true"`.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + timeout;
        for member in &self.members {
            let url = format!("http://127.0.0.1:{}/health", member.client_port);
            loop {
                let last = match http.get(&url).send().await {
                    Ok(response) => response.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                if last.contains("\"health\":\"true\"") {
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "etcd member {} not healthy within {timeout:?} (last answer: {last}); \
                         logs:\n{}",
                        member.name,
                        self.log_tails(15)
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The last `n` log lines of every member.
    pub fn log_tails(&self, n: usize) -> String {
        self.members
            .iter()
            .filter_map(|m| {
                m.process
                    .as_ref()
                    .map(|p| format!("--- {} ---\n{}\n", m.name, p.log_tail(n)))
            })
            .collect()
    }

    /// Crashes member `i` (`SIGKILL`).
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let member = self.members.get_mut(i).context("no such etcd member")?;
        if let Some(mut process) = member.process.take() {
            process.sigkill()?;
        }
        Ok(())
    }
}
