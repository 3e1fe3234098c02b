//! A Patroni cluster, as operators run PostgreSQL: three etcd members and two or three
//! PostgreSQL nodes, each under a Patroni agent, in synchronous mode, with `pg_rewind` rejoin.
//!
//! [`ReplicatedPg`](super::ReplicatedPg) plays the HA manager itself (the test decides when to
//! promote and what happens to the old primary). Here Patroni decides: it holds the leader key in
//! etcd, promotes the synchronous standby when the primary crashes or on a switchover, and brings
//! the old primary back as a standby of the new one, rewinding it with `pg_rewind` when its WAL
//! went past the point where the new primary's timeline forked. Tests inject the faults operators
//! meet (a killed postmaster, `patronictl switchover`, a frozen agent, a node cut off from etcd,
//! a lost etcd member; `faults.rs`) and read the outcome through Patroni's REST API
//! (`GET /cluster`) and the servers themselves (`status.rs`).
//!
//! Cutting one node off from etcd while the others keep it needs a network of its own per node:
//! with [`PatroniOptions::etcd_proxies`] each agent reaches each etcd member through a
//! [`TcpProxy`] of its own, and Patroni is told not to discover the members' real addresses
//! (`use_proxies`), so black-holing those proxies is a partition of that node alone.
//!
//! What is shared with the other servers of this harness: the PostgreSQL binaries and the user
//! to run them as when the test is root ([`pg_bin_dir`], [`server_user`] in `launch.rs`), free
//! ports, and [`ChildProcess`] for every agent and etcd member. Patroni itself runs `initdb`,
//! `pg_basebackup`, `pg_rewind` and the postmasters; it starts each postmaster in a session of
//! its own so that a crashed agent does not take the database down, which means a postmaster is
//! not a child of anything this harness spawned. Dropping the cluster therefore kills the agents
//! first (so none restarts its server), then every process whose command line names the cluster's
//! temporary directory together with all its descendants (postmasters with their backends, a
//! running `pg_rewind` or `pg_basebackup`), then etcd, and removes the directory last; while a
//! failing test unwinds, the agents' and etcd's logs are copied out first (the path is printed).
//!
//! Every wait has a deadline and its error carries the agents' log tails, so a hung Patroni
//! fails the test instead of hanging CI. The timings are in [`PatroniTimings`].

mod cleanup;
mod config;
mod etcd;
mod faults;
mod status;

pub use self::config::PatroniTimings;
pub use self::etcd::{EtcdCluster, EtcdMember};
pub use self::status::Member;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::unistd::{Gid, Uid};
use tempfile::TempDir;

use super::launch::{pg_bin_dir, server_user};
use crate::process::{free_port, ChildProcess};
use crate::procfs::{self, ProcId};
use crate::proxy::TcpProxy;

/// How long the first node may take to bootstrap (initdb) and become leader.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the other nodes may take to clone the leader and stream from it.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on one `patronictl` command.
const PATRONICTL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one REST or SQL request to a node.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

fn patroni_bin(name: &str) -> PathBuf {
    std::env::var_os("ALLOCATOR_PATRONI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin"))
        .join(name)
}

/// One PostgreSQL node and its Patroni agent.
#[derive(Debug)]
pub struct PatroniNode {
    name: String,
    pg_port: u16,
    api_port: u16,
    data_dir: PathBuf,
    config_path: PathBuf,
    dir: PathBuf,
    agent: Option<ChildProcess>,
    /// With [`PatroniOptions::etcd_proxies`]: the agent reaches etcd member `i` only through
    /// proxy `i`, so the node can be cut off from etcd alone.
    etcd_proxies: Vec<TcpProxy>,
}

impl PatroniNode {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PostgreSQL's TCP port on 127.0.0.1.
    pub fn pg_port(&self) -> u16 {
        self.pg_port
    }

    /// Patroni's REST API port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The node's Patroni configuration file (also what `patronictl -c` takes).
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// URL of database `db` on this node alone.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.pg_port,
            schema::path::encode_segment(db)
        )
    }

    /// The last `n` lines of the agent's log (Patroni's own lines and PostgreSQL's stderr).
    pub fn log_tail(&self, n: usize) -> String {
        procfs::tail_file(&self.dir.join("patroni.log"), n)
    }

    /// Whether the agent logged `needle`, e.g. `"running pg_rewind"`.
    pub fn log_contains(&self, needle: &str) -> bool {
        self.log_count(needle) > 0
    }

    /// How often the agent logged `needle` so far.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(self.dir.join("patroni.log"))
            .map_or(0, |log| log.matches(needle).count())
    }

    /// Pid of the running postmaster, from `postmaster.pid` in the data directory.
    pub fn postmaster_pid(&self) -> Option<i32> {
        self.postmaster().map(|p| p.pid)
    }

    fn postmaster(&self) -> Option<ProcId> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        procfs::proc_id(pid)
    }

    /// The Patroni agent's process, e.g. to freeze it (`SIGSTOP`).
    pub fn agent_mut(&mut self) -> Option<&mut ChildProcess> {
        self.agent.as_mut()
    }
}

/// What to start.
#[derive(Debug, Clone, Copy)]
pub struct PatroniOptions {
    /// PostgreSQL nodes, 2 to 5.
    pub nodes: usize,
    pub timings: PatroniTimings,
    /// Route each agent's etcd traffic through [`TcpProxy`]s of its own (Patroni's
    /// `use_proxies`: no discovery of the members' own addresses), for
    /// [`PatroniCluster::cut_from_etcd`]. The proxies run on the caller's tokio runtime.
    pub etcd_proxies: bool,
}

impl Default for PatroniOptions {
    fn default() -> Self {
        PatroniOptions {
            nodes: 2,
            timings: PatroniTimings::default(),
            etcd_proxies: false,
        }
    }
}

/// etcd plus Patroni nodes `pg0`, `pg1`, ...; see the module documentation.
#[derive(Debug)]
pub struct PatroniCluster {
    scope: String,
    nodes: Vec<PatroniNode>,
    etcd: EtcdCluster,
    http: reqwest::Client,
    /// Removed last, after `Drop::drop` killed every process.
    tmp: TempDir,
}

impl PatroniCluster {
    /// `size` nodes (2 or 3) with the test timings, returned once one is leader and every other
    /// one streams from it with a synchronous standby among them.
    pub async fn start(size: usize) -> Result<PatroniCluster> {
        PatroniCluster::start_with(PatroniOptions {
            nodes: size,
            ..PatroniOptions::default()
        })
        .await
    }

    pub async fn start_with(options: PatroniOptions) -> Result<PatroniCluster> {
        let PatroniOptions {
            nodes: size,
            timings,
            etcd_proxies,
        } = options;
        if !(2..=5).contains(&size) {
            bail!("a Patroni test cluster has 2 to 5 nodes, not {size}");
        }
        let patroni = patroni_bin("patroni");
        if !patroni.is_file() {
            bail!(
                "no Patroni at {} (apt-get install patroni, or set ALLOCATOR_PATRONI_DIR)",
                patroni.display()
            );
        }
        let bin_dir = pg_bin_dir()?;
        let run_as = server_user()?;
        let tmp = tempfile::Builder::new()
            .prefix("allocator-patroni-")
            .tempdir()
            .context("creating temporary directory for Patroni")?;
        give_to(tmp.path(), run_as)?;
        let etcd_dir = tmp.path().join("etcd");
        std::fs::create_dir(&etcd_dir)?;
        let etcd = EtcdCluster::start(&etcd_dir, 3).await?;
        let scope = tmp
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("allocator-patroni")
            .to_owned();
        let mut nodes = Vec::with_capacity(size);
        for i in 0..size {
            let name = format!("pg{i}");
            let dir = tmp.path().join(&name);
            let socket_dir = dir.join("sock");
            std::fs::create_dir_all(&socket_dir)?;
            give_to(&dir, run_as)?;
            give_to(&socket_dir, run_as)?;
            let (pg_port, api_port) = (free_port(), free_port());
            let proxies = match etcd_proxies {
                true => etcd
                    .endpoints()
                    .iter()
                    .map(|e| TcpProxy::start(e.parse()?))
                    .collect::<Result<Vec<_>>>()?,
                false => Vec::new(),
            };
            let etcd_hosts = match etcd_proxies {
                true => proxies.iter().map(|p| p.addr().to_string()).collect(),
                false => etcd.endpoints(),
            };
            let data_dir = dir.join("data");
            let config_path = dir.join("patroni.yml");
            let layout = config::NodeLayout {
                scope: &scope,
                name: &name,
                pg_port,
                api_port,
                data_dir: &data_dir,
                socket_dir: &socket_dir,
                pgpass: &dir.join("pgpass"),
                bin_dir: &bin_dir,
                etcd_hosts: &etcd_hosts,
                etcd_use_proxies: etcd_proxies,
                timings,
            };
            let text = serde_json::to_string_pretty(&config::node_config(&layout))?;
            std::fs::write(&config_path, text)
                .with_context(|| format!("writing {}", config_path.display()))?;
            nodes.push(PatroniNode {
                name,
                pg_port,
                api_port,
                data_dir,
                config_path,
                dir,
                agent: None,
                etcd_proxies: proxies,
            });
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()?;
        let mut cluster = PatroniCluster {
            scope,
            nodes,
            etcd,
            http,
            tmp,
        };
        // The first node alone, so that it is the one that bootstraps; then the others clone it.
        cluster.start_agent(0, run_as)?;
        cluster
            .wait_for(
                BOOTSTRAP_TIMEOUT,
                "pg0 to bootstrap and lead",
                |c| async move { c.primary_api(0).await },
            )
            .await?;
        for i in 1..size {
            cluster.start_agent(i, run_as)?;
        }
        cluster.wait_healthy(HEALTHY_TIMEOUT).await?;
        Ok(cluster)
    }

    fn start_agent(&mut self, i: usize, run_as: Option<(Uid, Gid)>) -> Result<()> {
        let node = &mut self.nodes[i];
        let envs = [
            ("HOME".to_owned(), node.dir.display().to_string()),
            (
                "PGPASSFILE".to_owned(),
                node.dir.join("pgpass").display().to_string(),
            ),
        ];
        node.agent = Some(ChildProcess::spawn_as(
            &patroni_bin("patroni"),
            [&node.config_path],
            &envs,
            &node.dir.join("patroni.log"),
            run_as,
        )?);
        Ok(())
    }

    pub fn nodes(&self) -> &[PatroniNode] {
        &self.nodes
    }

    pub fn nodes_mut(&mut self) -> &mut [PatroniNode] {
        &mut self.nodes
    }

    pub fn etcd_mut(&mut self) -> &mut EtcdCluster {
        &mut self.etcd
    }

    /// The temporary directory holding every node, etcd member and log.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// The Patroni scope (cluster name), as `patronictl list` takes it.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    fn node_mut(&mut self, name: &str) -> Result<&mut PatroniNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("no Patroni node {name:?}"))
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Result<&PatroniNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("no Patroni node {name:?}"))
    }

    /// A multi-host URL naming every node in order, for database `db`, with
    /// `target_session_attrs=read-write`, as a service is configured.
    pub fn url(&self, db: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        format!(
            "postgres://postgres@{}/{}?target_session_attrs=read-write",
            hosts.join(","),
            schema::path::encode_segment(db)
        )
    }

    /// Creates database `name` on the leader and returns the multi-host URL of it.
    pub async fn create_database(&self, name: &str) -> Result<String> {
        let leader = self.leader().await?;
        let client = connect(&self.node(&leader.name)?.url_for("postgres")).await?;
        client
            .batch_execute(&format!(
                "CREATE DATABASE \"{}\"",
                name.replace('"', "\"\"")
            ))
            .await
            .with_context(|| format!("creating database {name:?}"))?;
        Ok(self.url(name))
    }
}

/// Hands `dir` to the server user when the test runs as root.
fn give_to(dir: &Path, run_as: Option<(Uid, Gid)>) -> Result<()> {
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(dir, Some(uid.as_raw()), Some(gid.as_raw()))
            .with_context(|| format!("chown {} to postgres", dir.display()))?;
    }
    Ok(())
}

/// A client of `url`, bounded by [`REQUEST_TIMEOUT`], its connection driven by a task.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .map_err(|_| anyhow!("connecting to {url} timed out"))?
    .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}
