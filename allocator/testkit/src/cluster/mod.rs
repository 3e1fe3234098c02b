//! A whole local cluster as real processes: PostgreSQL (a private [`PgServer`], a
//! [`ReplicatedPg`] pair, a [`PatroniCluster`], or a database on a server someone else runs), Redis, a migrated schema,
//! N allocator replicas (each optionally behind [`TcpProxy`]s of its own, one per database host)
//! and M routers. The router's tests, the chaos harness and the local demo (`cluster up`) all
//! start their clusters here.
//!
//! Built with [`Cluster::builder`]; [`ClusterBuilder::start`] returns once every process answers
//! `/readyz` and every partition has a live owner. Each process is a [`Service`] that can be
//! killed, frozen, stopped and restarted under the same id, port and log file. Dropping the
//! cluster kills everything it started; [`Cluster::shutdown`] stops it gracefully instead
//! (routers, then allocators, which release their leases, then the servers).
//!
//! The servers come from `postgres`, `redis` and `proxy`, the processes from `process`: this
//! module only puts them together.

mod builder;
mod prometheus;
mod ready;
mod service;
mod shards;
mod template;
mod timings;

pub use self::builder::{ClusterBuilder, Database, Redis};
pub use self::prometheus::Prometheus;
pub use self::service::{Role, Service};
pub use self::shards::{shard_name, shards_from_env, ExtraShard, SHARDS_ENV};
pub use self::timings::ShortTimings;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::{PatroniCluster, PgServer, RedisServer, ReplicatedPg, TcpProxy};

/// The PostgreSQL a cluster runs on.
#[derive(Debug)]
pub enum Storage {
    /// A database on a server the cluster does not own (the test binary's shared server, the
    /// machine's, or one the caller started).
    External,
    Private(Box<PgServer>),
    Replicated(Box<ReplicatedPg>),
    /// Patroni decides which node is primary; the harness knows none of them as a [`PgServer`],
    /// so `primary` and `servers` are empty (and proxies unavailable).
    Patroni(Box<PatroniCluster>),
}

impl Storage {
    /// The server that is primary now, when the cluster owns it.
    pub fn primary(&self) -> Option<&PgServer> {
        match self {
            Storage::External => None,
            Storage::Private(server) => Some(server.as_ref()),
            Storage::Replicated(pair) => Some(pair.primary()),
            Storage::Patroni(_) => None,
        }
    }

    /// The replicated pair, for failover faults.
    pub fn replicated_mut(&mut self) -> Option<&mut ReplicatedPg> {
        match self {
            Storage::Replicated(pair) => Some(pair.as_mut()),
            _ => None,
        }
    }

    /// The TCP port of every server the cluster owns, in the order of the services'
    /// multi-host URL (a Patroni cluster's nodes too).
    pub fn ports(&self) -> Vec<u16> {
        match self {
            Storage::Patroni(cluster) => cluster.nodes().iter().map(|n| n.pg_port()).collect(),
            _ => self.servers().iter().map(|s| s.port()).collect(),
        }
    }

    /// The Patroni cluster, for its faults (`patronictl`, killed postmasters).
    pub fn patroni_mut(&mut self) -> Option<&mut PatroniCluster> {
        match self {
            Storage::Patroni(cluster) => Some(cluster.as_mut()),
            _ => None,
        }
    }

    /// Every server, in the order of the services' multi-host URL.
    pub fn servers(&self) -> Vec<&PgServer> {
        match self {
            Storage::External => Vec::new(),
            Storage::Private(server) => vec![server.as_ref()],
            Storage::Replicated(pair) => pair.nodes().iter().collect(),
            Storage::Patroni(_) => Vec::new(),
        }
    }
}

/// The Redis a cluster uses: its own server, which can fail on demand, or someone else's.
#[derive(Debug)]
pub enum RedisHost {
    Private(RedisServer),
    External(String),
}

impl RedisHost {
    pub fn url(&self) -> String {
        match self {
            RedisHost::Private(server) => server.url(),
            RedisHost::External(url) => url.clone(),
        }
    }

    /// The cluster's own server, or an error for one it may not touch.
    pub fn server(&mut self) -> Result<&mut RedisServer> {
        match self {
            RedisHost::Private(server) => Ok(server),
            RedisHost::External(url) => Err(anyhow!("Redis at {url} is not the cluster's own")),
        }
    }

    /// Crashes the private server (it comes back empty); see [`RedisServer::stop`].
    pub fn stop(&mut self) -> Result<()> {
        self.server()?.stop()
    }

    /// See [`RedisServer::start_again`].
    pub async fn start_again(&mut self) -> Result<()> {
        self.server()?.start_again().await
    }

    /// See [`RedisServer::pause`].
    pub fn pause(&self) -> Result<()> {
        self.own()?.pause()
    }

    /// See [`RedisServer::resume`].
    pub fn resume(&self) -> Result<()> {
        self.own()?.resume()
    }

    fn own(&self) -> Result<&RedisServer> {
        match self {
            RedisHost::Private(server) => Ok(server),
            RedisHost::External(url) => Err(anyhow!("Redis at {url} is not the cluster's own")),
        }
    }

    /// Pid of the private server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        match self {
            RedisHost::Private(server) => server.pid(),
            RedisHost::External(_) => None,
        }
    }
}

/// A client of the database at `url`, its connection driven by a task of its own.
async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(url, tokio_postgres::NoTls),
    )
    .await
    .map_err(|_| anyhow!("connecting to {url} timed out"))?
    .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}

/// A running cluster; see the module documentation.
pub struct Cluster {
    pub partitions: u32,
    /// The database as the routers reach it (directly; a multi-host URL on a replicated pair).
    pub db_url: String,
    /// The database's name on its server(s).
    pub db_name: String,
    pub pg: Storage,
    /// Shards beyond `pg` (shard `s0`, the catalog), each on a private server; empty for a
    /// one-database cluster ([`ClusterBuilder::shards`]).
    pub extra_shards: Vec<ExtraShard>,
    pub redis: RedisHost,
    pub allocators: Vec<Service>,
    pub routers: Vec<Service>,
    /// Process logs (`<id>.log`, `migrate.log`).
    pub log_dir: PathBuf,
    /// Extra environment for allocators spawned from now on by [`Cluster::spawn_allocator`].
    pub allocator_env: Vec<(String, String)>,
    /// How allocators and routers are started; see [`ClusterBuilder`].
    template: template::Template,
    /// Whether `log_dir` is a temporary directory of the cluster's (removed after a passing
    /// test, kept with a message after a failing one).
    temporary_logs: bool,
}

impl Cluster {
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// Starts allocator `id` on a free port (a new one, or the same id again after a kill: it
    /// then replaces the old entry).
    pub fn spawn_allocator(&mut self, id: &str) -> Result<usize> {
        let port = crate::free_port();
        self.spawn_allocator_at(id, port, format!("http://127.0.0.1:{port}"))
    }

    /// Starts allocator `id` behind a TCP proxy that it advertises, so routers reach it through
    /// the proxy (to delay or cut requests between routers and this owner).
    pub fn spawn_allocator_behind_proxy(&mut self, id: &str) -> Result<TcpProxy> {
        let port = crate::free_port();
        let proxy = TcpProxy::start(([127, 0, 0, 1], port).into())?;
        self.spawn_allocator_at(id, port, format!("http://{}", proxy.addr()))?;
        Ok(proxy)
    }

    /// Starts allocator `id` listening on `port` and advertising `url` (HTTPS, a proxy, ...).
    pub fn spawn_allocator_at(&mut self, id: &str, port: u16, url: String) -> Result<usize> {
        let mut service = self.template.allocator(self, id, port, url)?;
        service.env.extend(self.allocator_env.iter().cloned());
        service.spawn()?;
        Ok(match self.allocators.iter().position(|a| a.id == id) {
            Some(i) => {
                service.restarts = self.allocators[i].restarts + 1;
                self.allocators[i] = service;
                i
            }
            None => {
                self.allocators.push(service);
                self.allocators.len() - 1
            }
        })
    }

    /// Starts router `id` on a free port.
    pub fn spawn_router(&mut self, id: &str) -> Result<usize> {
        let mut service = self.template.router(self, id, crate::free_port())?;
        service.spawn()?;
        self.routers.push(service);
        Ok(self.routers.len() - 1)
    }

    /// The allocator with replica id `id`.
    pub fn allocator(&mut self, id: &str) -> &mut Service {
        self.allocators
            .iter_mut()
            .find(|a| a.id == id)
            .unwrap_or_else(|| panic!("no allocator {id}"))
    }

    /// A client of the database: on the server that is primary now (directly, never through a
    /// proxy), else on `db_url`.
    pub async fn db(&self) -> Result<tokio_postgres::Client> {
        let url = match self.pg.primary() {
            Some(server) => server.url_for(&self.db_name),
            None => self.db_url.clone(),
        };
        connect(&url).await
    }

    /// `(host:port, id)` of every running allocator, e.g. for Prometheus targets.
    pub fn allocator_targets(&mut self) -> Vec<(String, String)> {
        self.allocators
            .iter_mut()
            .filter_map(|a| {
                a.is_running()
                    .then(|| (format!("127.0.0.1:{}", a.port), a.id.clone()))
            })
            .collect()
    }

    /// Every service, allocators first.
    pub fn services(&mut self) -> impl Iterator<Item = &mut Service> {
        self.allocators.iter_mut().chain(self.routers.iter_mut())
    }

    /// Graceful stop of everything: routers, then allocators (they release their leases), each
    /// `SIGTERM` with `timeout` before `SIGKILL`, then the private servers.
    pub async fn shutdown(mut self, timeout: Duration) -> Result<()> {
        for group in [&mut self.routers, &mut self.allocators] {
            let mut stopping = Vec::new();
            for service in group.iter_mut().filter_map(|s| s.is_running().then_some(s)) {
                service.terminate()?;
                stopping.push(service);
            }
            for service in stopping {
                service.reap(timeout).await?;
            }
        }
        if let Storage::Private(server) = &mut self.pg {
            server.stop().await?;
        }
        Ok(())
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.temporary_logs {
            return;
        }
        if std::thread::panicking() {
            eprintln!("cluster logs kept in {}", self.log_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.log_dir);
        }
    }
}
