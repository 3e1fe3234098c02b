//! [`ClusterBuilder`]: what a cluster is made of, and the start-up sequence (servers, migration,
//! processes, readiness).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::shards::{shard_name, ExtraShard};
use super::template::Template;
use super::{Cluster, RedisHost, Storage};
use crate::{cargo_bin, PatroniCluster, PgServer, RedisServer, ReplicatedPg, Replication};

/// Where the cluster's database lives.
#[derive(Debug, Clone)]
pub enum Database {
    /// A fresh database on the test binary's shared server ([`crate::shared::fresh_database`]).
    Shared,
    /// A private [`PgServer`].
    Private,
    /// A private primary with a streaming standby; services get the multi-host URL of both.
    Replicated(Replication),
    /// A private [`PatroniCluster`] of this many nodes (etcd, synchronous mode, `pg_rewind`);
    /// services get the multi-host URL of every node. Extra server settings do not apply (the
    /// cluster's settings live in Patroni's configuration).
    Patroni(usize),
    /// An existing database on a server the cluster never touches: empty, or already migrated
    /// (a restored copy; `allocator migrate` applies only what it lacks).
    Url(String),
}

/// Which Redis the services use.
#[derive(Debug, Clone)]
pub enum Redis {
    /// A private [`RedisServer`].
    Private,
    /// Someone else's, e.g. the machine's.
    Url(String),
}

/// What to start; see [`Cluster::builder`]. Defaults: one allocator, no router, 16 partitions,
/// a private PostgreSQL and Redis, the workspace's `allocator` and `router` binaries, ids
/// `alloc-0…` and `router-0…`, logs in a temporary directory, 60 s to become ready.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    name: String,
    allocators: usize,
    routers: usize,
    partitions: u32,
    shards: usize,
    database: Database,
    db_name: Option<String>,
    pg_settings: Vec<(String, String)>,
    redis: Redis,
    template: Template,
    log_dir: Option<PathBuf>,
    first_id: usize,
    migrate: bool,
    migrate_args: Vec<String>,
    ready_timeout: Duration,
    map_timeout: Duration,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        ClusterBuilder {
            name: "cluster".to_owned(),
            allocators: 1,
            routers: 0,
            partitions: 16,
            shards: 1,
            database: Database::Private,
            db_name: None,
            pg_settings: Vec::new(),
            redis: Redis::Private,
            template: Template {
                allocator_bin: cargo_bin("allocator"),
                router_bin: cargo_bin("router"),
                allocator_args: Vec::new(),
                router_args: Vec::new(),
                allocator_env: Vec::new(),
                router_env: Vec::new(),
                proxies: false,
                libfaketime: None,
                rust_log: "info".to_owned(),
            },
            log_dir: None,
            first_id: 0,
            migrate: true,
            migrate_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
            map_timeout: Duration::from_secs(60),
        }
    }
}

impl ClusterBuilder {
    /// Names the database (a prefix on the shared server) and the temporary log directory.
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_owned();
        self
    }

    pub fn allocators(mut self, n: usize) -> Self {
        self.allocators = n;
        self
    }

    pub fn routers(mut self, n: usize) -> Self {
        self.routers = n;
        self
    }

    pub fn partitions(mut self, n: u32) -> Self {
        self.partitions = n;
        self
    }

    /// Spread the partitions over `n` shards: the cluster's database is shard `s0` (the
    /// catalog), and each further shard gets a private PostgreSQL of its own (see `shards`).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n.max(1);
        self
    }

    pub fn database(mut self, database: Database) -> Self {
        self.database = database;
        self
    }

    /// A private primary with a streaming standby ([`Database::Replicated`]).
    pub fn standby(self, mode: Replication) -> Self {
        self.database(Database::Replicated(mode))
    }

    /// The database's name on a private server (default: the cluster's name).
    pub fn db_name(mut self, name: &str) -> Self {
        self.db_name = Some(name.to_owned());
        self
    }

    /// Settings (`name=value`) for private servers, after the test defaults.
    pub fn pg_settings(mut self, settings: Vec<(String, String)>) -> Self {
        self.pg_settings = settings;
        self
    }

    pub fn redis(mut self, redis: Redis) -> Self {
        self.redis = redis;
        self
    }

    /// Every allocator reaches each database server through a [`TcpProxy`] of its own
    /// ([`Service::set_link`]); needs a private server.
    pub fn proxies(mut self, on: bool) -> Self {
        self.template.proxies = on;
        self
    }

    pub fn allocator_bin(mut self, bin: &Path) -> Self {
        self.template.allocator_bin = bin.to_path_buf();
        self
    }

    pub fn router_bin(mut self, bin: &Path) -> Self {
        self.template.router_bin = bin.to_path_buf();
        self
    }

    /// Arguments after every allocator's own (`serve`, database, port, id, URL, Redis).
    pub fn allocator_args(mut self, args: Vec<String>) -> Self {
        self.template.allocator_args = args;
        self
    }

    /// Arguments after every router's own (`serve`, database, Redis, port).
    pub fn router_args(mut self, args: Vec<String>) -> Self {
        self.template.router_args = args;
        self
    }

    pub fn allocator_env(mut self, env: Vec<(String, String)>) -> Self {
        self.template.allocator_env = env;
        self
    }

    pub fn router_env(mut self, env: Vec<(String, String)>) -> Self {
        self.template.router_env = env;
        self
    }

    /// The preload library for [`Service::skew`].
    pub fn libfaketime(mut self, lib: Option<PathBuf>) -> Self {
        self.template.libfaketime = lib;
        self
    }

    /// `RUST_LOG` of every service (default `info`).
    pub fn rust_log(mut self, filter: &str) -> Self {
        self.template.rust_log = filter.to_owned();
        self
    }

    /// Logs go here and stay; without it they go to a temporary directory.
    pub fn log_dir(mut self, dir: &Path) -> Self {
        self.log_dir = Some(dir.to_path_buf());
        self
    }

    /// Number of the first allocator and router (`alloc-1…` with 1).
    pub fn first_id(mut self, n: usize) -> Self {
        self.first_id = n;
        self
    }

    /// Flags of `allocator migrate` after the database and the partition count (e.g. the
    /// ledger's partition span).
    pub fn migrate_args(mut self, args: Vec<String>) -> Self {
        self.migrate_args = args;
        self
    }

    /// Whether to run `allocator migrate` (default); without it the cluster is only its
    /// servers unless the caller migrates before starting services.
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// How long processes may take to answer `/readyz`, and then every partition to have an
    /// owner.
    pub fn timeouts(mut self, ready: Duration, map: Duration) -> Self {
        self.ready_timeout = ready;
        self.map_timeout = map;
        self
    }

    /// Starts the servers, migrates, starts the processes and waits until every process is
    /// ready and (with allocators) every partition has a live owner.
    pub async fn start(self) -> Result<Cluster> {
        let (log_dir, temporary_logs) = match &self.log_dir {
            Some(dir) => (dir.clone(), false),
            None => (
                tempfile::Builder::new()
                    .prefix(&format!("{}-logs-", self.name))
                    .tempdir()?
                    .keep(),
                true,
            ),
        };
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let db_name = self.db_name.clone().unwrap_or_else(|| self.name.clone());
        let (pg, db_url) = match &self.database {
            Database::Shared => (
                Storage::External,
                crate::shared::fresh_database(&self.name).await?,
            ),
            Database::Url(url) => (Storage::External, url.clone()),
            Database::Private => {
                let server = PgServer::start_with(self.pg_settings.clone()).await?;
                let url = server.create_database(&db_name).await?;
                (Storage::Private(Box::new(server)), url)
            }
            Database::Replicated(mode) => {
                let pair = ReplicatedPg::start_with(*mode, self.pg_settings.clone()).await?;
                let url = pair.create_database(&db_name).await?;
                (Storage::Replicated(Box::new(pair)), url)
            }
            Database::Patroni(nodes) => {
                let cluster = PatroniCluster::start(*nodes).await?;
                let url = cluster.create_database(&db_name).await?;
                (Storage::Patroni(Box::new(cluster)), url)
            }
        };
        let db_name = match pg {
            Storage::External => database_name(&db_url),
            _ => db_name,
        };
        let mut extra_shards = Vec::new();
        for index in 1..self.shards {
            let server = PgServer::start_with(self.pg_settings.clone()).await?;
            let url = server.create_database(&db_name).await?;
            extra_shards.push(ExtraShard {
                name: shard_name(index),
                url,
                server,
            });
        }
        let redis = match &self.redis {
            Redis::Private => RedisHost::Private(RedisServer::start().await?),
            Redis::Url(url) => RedisHost::External(url.clone()),
        };
        let mut cluster = Cluster {
            partitions: self.partitions,
            db_url,
            db_name,
            pg,
            extra_shards,
            redis,
            allocators: Vec::new(),
            routers: Vec::new(),
            log_dir,
            allocator_env: Vec::new(),
            template: self.template,
            temporary_logs,
        };
        if self.migrate {
            let target = match cluster.shard_args() {
                none if none.is_empty() => {
                    vec!["--database-url".to_owned(), cluster.db_url.clone()]
                }
                shards => shards,
            };
            migrate(
                &cluster.template.allocator_bin,
                &target,
                self.partitions,
                &self.migrate_args,
                &cluster.log_dir,
            )?;
        }
        for i in 0..self.allocators {
            cluster.spawn_allocator(&format!("alloc-{}", self.first_id + i))?;
        }
        for i in 0..self.routers {
            cluster.spawn_router(&format!("router-{}", self.first_id + i))?;
        }
        cluster.wait_ready(self.ready_timeout, false).await?;
        if self.allocators > 0 {
            cluster.wait_ready(self.map_timeout, true).await?;
        }
        Ok(cluster)
    }
}

/// `allocator migrate`, its output appended to `migrate.log` in `log_dir`.
fn migrate(
    bin: &Path,
    target: &[String],
    partitions: u32,
    args: &[String],
    log_dir: &Path,
) -> Result<()> {
    let log_path = log_dir.join("migrate.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let status = Command::new(bin)
        .arg("migrate")
        .args(target)
        .arg("--partitions")
        .arg(partitions.to_string())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("running {} migrate", bin.display()))?;
    if !status.success() {
        bail!(
            "allocator migrate failed with {status}:\n{}",
            crate::procfs::tail_file(&log_path, 20)
        );
    }
    Ok(())
}

/// The database name of a `postgres://…/NAME?…` URL.
fn database_name(url: &str) -> String {
    let path = url.split('?').next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or_default().to_owned()
}
