//! The system under test as real processes, started by testkit's [`testkit::Cluster`]: a private
//! PostgreSQL primary with a synchronous streaming standby and a private Redis, three allocator
//! replicas that each reach both PostgreSQL servers through fault-injecting TCP proxies of their
//! own, and two routers that reach them directly. Every service is given the multi-host URL of
//! both servers, so after a failover it can reach the promoted standby — and a revived old
//! primary, which it must refuse.
//!
//! Every process can be killed, frozen, restarted (under the same id, port and log file) or
//! restarted with a shifted wall clock. Lease timings are short (2 s TTL) so that every fault
//! outlasts a lease within a short run. This module holds what is particular to the chaos run:
//! the services' flags, the fault counters and the resident-memory figures.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use testkit::cluster::{Database, ShortTimings};
use testkit::{resident_set_kib, PatroniCluster, ProxyMode, ReplicatedPg, Replication};

/// Lease TTL of the replicas; pauses and partitions are drawn longer than this.
pub const LEASE_TTL_MS: u64 = 2000;
/// Request deadline inside a replica; the routers' attempt timeout is longer.
const ALLOCATOR_REQUEST_TIMEOUT_MS: u64 = 2000;
/// Partitions of the cluster: few, so the three replicas share hot partitions' fate.
pub const PARTITIONS: u32 = 16;
/// Settlement window of the replicas until a `window-change` fault restarts one with another.
pub const SETTLEMENT_WINDOW_SECS: u64 = 5;
/// Idempotency horizon of the replicas: short, so the retention job removes and archives
/// during a run and the checker judges a history of which only the recent part is left.
pub const RETENTION_HORIZON_SECS: u64 = 20;
/// Span of the ledger's time partitions; the retention job archives them into the run's
/// `ledger-archive` directory once past the horizon and settled.
const LEDGER_PARTITION_SPAN_SECS: u64 = 10;

/// What the cluster is built from.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub allocator_bin: PathBuf,
    pub router_bin: PathBuf,
    /// Arms the negative control in every replica (the binary must have the feature).
    pub negative_control: bool,
    /// libfaketime, for the clock-skew fault; `None` disables that fault.
    pub libfaketime: Option<PathBuf>,
    /// Where process logs go.
    pub log_dir: PathBuf,
    /// The routers' auth file (`--auth-file`), if authentication is on.
    pub auth_file: Option<PathBuf>,
    /// PostgreSQL shards: 1 is the replicated pair alone; with more, shard `s0` (the catalog)
    /// is the pair and every further shard a private server of its own (`--shards`).
    pub shards: usize,
    /// The catalog shard is a two-node Patroni cluster instead of the replicated pair
    /// (`--ha patroni`): Patroni, not the run, promotes and rejoins.
    pub patroni: bool,
}

impl ClusterSpec {
    /// Replicas: three on one database; two per shard on several, so that every shard keeps a
    /// live owner while one of its replicas is killed, paused or cut off.
    pub fn replicas(&self) -> usize {
        if self.shards > 1 {
            2 * self.shards
        } else {
            3
        }
    }
}

/// Flags of every replica after testkit's own (database, port, id, URL, Redis).
fn allocator_args(spec: &ClusterSpec) -> Vec<String> {
    let mut args = ShortTimings {
        lease_ttl_ms: LEASE_TTL_MS,
        lease_margin_ms: 500,
        renew_interval_ms: 500,
        campaign_interval_ms: 250,
        statement_timeout_ms: 1000,
        request_timeout_ms: ALLOCATOR_REQUEST_TIMEOUT_MS,
        pool_size: 6,
        http_workers: 2,
    }
    .args();
    args.extend([
        "--settlement-window-secs".to_owned(),
        SETTLEMENT_WINDOW_SECS.to_string(),
        "--idempotency-horizon-secs".to_owned(),
        RETENTION_HORIZON_SECS.to_string(),
        "--ledger-archive-dir".to_owned(),
        spec.log_dir
            .with_file_name("ledger-archive")
            .display()
            .to_string(),
    ]);
    args.extend([
        // The change-event relay, consumed by the run's consumer (crate::consumer).
        "--events".to_owned(),
        "true".to_owned(),
        "--events-interval-ms".to_owned(),
        "100".to_owned(),
    ]);
    args
}

/// Flags of every router after testkit's own (database, Redis, port).
fn router_args(spec: &ClusterSpec) -> Vec<String> {
    let mut args: Vec<String> = [
        "--poll-interval-ms",
        "500",
        "--retry-deadline-ms",
        "6000",
        "--upstream-request-timeout-ms",
        "2500",
        "--allocator-request-timeout-ms",
        &ALLOCATOR_REQUEST_TIMEOUT_MS.to_string(),
        "--db-pool-size",
        "4",
        "--orders-db-pool-size",
        "6",
        "--workers",
        "2",
    ]
    .map(str::to_owned)
    .into();
    if let Some(file) = &spec.auth_file {
        args.extend(["--auth-file".to_owned(), file.display().to_string()]);
    }
    args
}

/// The chaos run's cluster: testkit's, with the fault counters and memory figures.
pub struct ChaosCluster {
    pub spec: ClusterSpec,
    inner: testkit::Cluster,
    pub pg_restarts: u64,
    pub redis_restarts: u64,
    /// Stops, crashes and restarts of shards beyond the catalog, all together.
    pub shard_restarts: u64,
    /// Resident memory (KiB) of each process at the start of the load, by name.
    rss_start: HashMap<String, Option<u64>>,
}

/// The name the harness's modules use.
pub use self::ChaosCluster as Cluster;

impl std::ops::Deref for ChaosCluster {
    type Target = testkit::Cluster;
    fn deref(&self) -> &testkit::Cluster {
        &self.inner
    }
}

impl std::ops::DerefMut for ChaosCluster {
    fn deref_mut(&mut self) -> &mut testkit::Cluster {
        &mut self.inner
    }
}

impl ChaosCluster {
    /// Starts everything and waits until every partition has an owner and both routers answer.
    pub async fn start(spec: ClusterSpec, routers: usize) -> Result<Cluster> {
        let mut allocator_env = Vec::new();
        if spec.negative_control {
            allocator_env.push(("ALLOCATOR_UNSAFE_DISABLE_FENCE".into(), "1".into()));
        }
        let database = match spec.patroni {
            true => Database::Patroni(2),
            false => Database::Replicated(Replication::Synchronous),
        };
        let inner = testkit::Cluster::builder()
            .name("chaos")
            .database(database)
            // Every shard commits durably, as in production: a `shard-crash` must not take
            // back a commit that was acknowledged (the test servers default to
            // `synchronous_commit=off`, which loses the last commits on SIGKILL).
            .pg_settings(vec![("synchronous_commit".into(), "on".into())])
            .proxies(true)
            .partitions(PARTITIONS)
            .shards(spec.shards)
            .allocators(spec.replicas())
            .routers(routers)
            .allocator_bin(&spec.allocator_bin)
            .router_bin(&spec.router_bin)
            .migrate_args(vec![
                "--ledger-partition-span-secs".to_owned(),
                LEDGER_PARTITION_SPAN_SECS.to_string(),
            ])
            .allocator_args(allocator_args(&spec))
            .allocator_env(allocator_env)
            .router_args(router_args(&spec))
            .libfaketime(spec.libfaketime.clone())
            .log_dir(&spec.log_dir)
            .start()
            .await
            .context("starting the cluster")?;
        Ok(ChaosCluster {
            spec,
            inner,
            pg_restarts: 0,
            redis_restarts: 0,
            shard_restarts: 0,
            rss_start: HashMap::new(),
        })
    }

    /// The replicated pair.
    pub fn pg(&mut self) -> &mut ReplicatedPg {
        self.inner
            .pg
            .replicated_mut()
            .expect("the chaos cluster runs on a replicated pair")
    }

    /// The Patroni cluster of a `--ha patroni` run.
    pub fn patroni(&mut self) -> Result<&mut PatroniCluster> {
        self.inner
            .pg
            .patroni_mut()
            .context("the patroni-failover fault needs --ha patroni")
    }

    /// (Re)starts replica `i` under its id and port, with `skew` as its `FAKETIME` offset.
    pub fn spawn_allocator(&mut self, i: usize, skew: Option<String>) -> Result<()> {
        let a = &mut self.inner.allocators[i];
        a.skew = skew;
        a.spawn()
    }

    /// (Re)starts router `i` on its port.
    pub fn spawn_router(&mut self, i: usize) -> Result<()> {
        self.inner.routers[i].spawn()
    }

    /// [`testkit::Cluster::wait_ready`] with the whole map; with `any_owners` only the processes
    /// are waited for. A negative control run ends that way: its replicas keep partitions the
    /// database gave to others and so leave some partitions without a live owner, which is not
    /// what the run is checking.
    pub async fn wait_ready_with(&mut self, timeout: Duration, any_owners: bool) -> Result<()> {
        self.inner.wait_ready(timeout, !any_owners).await
    }

    /// Puts every proxy back to passing traffic and resumes anything frozen: the end of a run
    /// (or an interrupted fault) leaves a healthy cluster behind for the final dump.
    pub fn heal(&mut self) -> Result<()> {
        for a in &mut self.inner.allocators {
            a.set_link(ProxyMode::Pass);
            if a.is_running() {
                a.thaw()?;
            }
        }
        for shard in &self.inner.extra_shards {
            if shard.server.is_paused() {
                shard.server.resume()?;
            }
        }
        Ok(())
    }

    /// Records every process's resident memory as the start figure.
    pub fn record_rss_start(&mut self) {
        let mut start = HashMap::new();
        for s in self.inner.services() {
            start.insert(s.id.clone(), s.pid().and_then(resident_set_kib));
        }
        let primary = self.inner.pg.primary().map(|p| p.pid());
        start.insert("postgres".into(), primary.and_then(resident_set_kib));
        for shard in &self.inner.extra_shards {
            let pid = shard.server.is_running().then(|| shard.server.pid());
            start.insert(
                format!("postgres-{}", shard.name),
                pid.and_then(resident_set_kib),
            );
        }
        start.insert(
            "redis".into(),
            self.inner.redis.pid().and_then(resident_set_kib),
        );
        self.rss_start = start;
    }

    /// Resident memory per process now, with the start figure and restart count.
    pub fn rss_report(&mut self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for s in self.inner.services() {
            out.push(serde_json::json!({
                "name": s.id,
                "start": self.rss_start.get(&s.id).copied().flatten(),
                "end": s.pid().and_then(resident_set_kib),
                "restarts": s.restarts,
            }));
        }
        let primary = self.inner.pg.primary().map(|p| p.pid());
        out.push(serde_json::json!({
            "name": "postgres",
            "note": "the primary's postmaster process only (a failover changes which one)",
            "start": self.rss_start.get("postgres").copied().flatten(),
            "end": primary.and_then(resident_set_kib),
            "restarts": self.pg_restarts,
        }));
        for shard in &self.inner.extra_shards {
            let name = format!("postgres-{}", shard.name);
            let pid = shard.server.is_running().then(|| shard.server.pid());
            out.push(serde_json::json!({
                "name": name,
                "note": "the shard's postmaster process only",
                "start": self.rss_start.get(&name).copied().flatten(),
                "end": pid.and_then(resident_set_kib),
                "restarts": self.shard_restarts,
            }));
        }
        out.push(serde_json::json!({
            "name": "redis",
            "start": self.rss_start.get("redis").copied().flatten(),
            "end": self.inner.redis.pid().and_then(resident_set_kib),
            "restarts": self.redis_restarts,
        }));
        out
    }

    /// The catalog's shard map now: (partition, shard name), by partition.
    pub async fn shard_map(&self) -> Result<Vec<(u32, String)>> {
        let rows = self
            .inner
            .db()
            .await?
            .query(
                "SELECT partition, shard FROM shard_map ORDER BY partition",
                &[],
            )
            .await
            .context("reading the shard map")?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as u32, r.get(1)))
            .collect())
    }

    /// The moves the catalog records in flight: (partition, target shard).
    pub async fn moves_in_flight(&self) -> Result<Vec<(u32, String)>> {
        let rows = self
            .inner
            .db()
            .await?
            .query(
                "SELECT partition, to_shard FROM shard_moves
                  WHERE state NOT IN ('released', 'aborted') ORDER BY partition",
                &[],
            )
            .await
            .context("reading the moves in flight")?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as u32, r.get(1)))
            .collect())
    }

    /// A client of every shard, the catalog first, with the partitions the catalog's map gives
    /// it; for a one-database cluster, its database as shard `main` with every partition.
    pub async fn shard_dbs(&self) -> Result<Vec<chaos::shards::ShardDb>> {
        let map = self.shard_map().await?;
        let names: Vec<String> = match self.inner.shard_urls() {
            urls if urls.is_empty() => vec!["main".to_owned()],
            urls => urls.into_iter().map(|(name, _)| name).collect(),
        };
        let mut out = Vec::new();
        for (index, name) in names.into_iter().enumerate() {
            let partitions = map
                .iter()
                .filter(|(_, s)| *s == name)
                .map(|(p, _)| *p as i32)
                .collect();
            out.push(chaos::shards::ShardDb {
                client: self.inner.shard_db(index).await?,
                catalog: index == 0,
                name,
                partitions,
            });
        }
        Ok(out)
    }

    pub fn log_dir(&self) -> &Path {
        &self.spec.log_dir
    }
}
