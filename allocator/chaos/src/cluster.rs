//! The system under test as real processes: a private PostgreSQL primary with a synchronous
//! streaming standby and a private Redis (testkit), three allocator replicas that each reach both
//! PostgreSQL servers through fault-injecting TCP proxies of their own, and two routers that reach
//! them directly. Every service is given the multi-host URL of both servers, so after a failover
//! it can reach the promoted standby — and a revived old primary, which it must refuse.
//!
//! Every process can be killed, frozen, restarted (under the same id, port and log file) or
//! restarted with a shifted wall clock. Lease timings are short (2 s TTL) so that every fault
//! outlasts a lease within a short run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use testkit::{
    free_port, resident_set_kib, ChildProcess, ProxyMode, RedisServer, ReplicatedPg, Replication,
    TcpProxy,
};

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
}

/// One allocator replica and the proxies between it and the two PostgreSQL servers.
pub struct Allocator {
    pub id: String,
    pub port: u16,
    /// One per PostgreSQL server, in the servers' order.
    pub proxies: Vec<TcpProxy>,
    pub process: Option<ChildProcess>,
    /// `FAKETIME` offset of the running incarnation, if any.
    pub skew: Option<String>,
    pub restarts: u64,
    pub rss_start: Option<u64>,
    /// `--settlement-window-secs` of the next (re)start.
    pub settlement_window_secs: u64,
}

impl Allocator {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sets every proxy of this replica's database link to `mode`.
    pub fn set_link(&self, mode: ProxyMode) {
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }
}

/// One router.
pub struct Router {
    pub id: String,
    pub port: u16,
    pub process: Option<ChildProcess>,
    pub restarts: u64,
    pub rss_start: Option<u64>,
}

impl Router {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

pub struct Cluster {
    pub spec: ClusterSpec,
    pub pg: ReplicatedPg,
    pub redis: RedisServer,
    /// The database on both servers, reached directly (routers; the harness's own reads go to
    /// whichever server is primary, see [`Cluster::db`]).
    pub db_url: String,
    /// Database name on the server, for building the proxied URLs.
    db_name: String,
    pub allocators: Vec<Allocator>,
    pub routers: Vec<Router>,
    pub pg_restarts: u64,
    pub redis_restarts: u64,
    pub rss_pg_start: Option<u64>,
    pub rss_redis_start: Option<u64>,
}

impl Cluster {
    /// Starts everything and waits until every partition has an owner and both routers answer.
    pub async fn start(spec: ClusterSpec, replicas: usize, routers: usize) -> Result<Cluster> {
        std::fs::create_dir_all(&spec.log_dir)
            .with_context(|| format!("creating {}", spec.log_dir.display()))?;
        let pg = ReplicatedPg::start(Replication::Synchronous)
            .await
            .context("starting PostgreSQL with a standby")?;
        let db_name = "chaos".to_owned();
        let db_url = pg.create_database(&db_name).await?;
        let migrate = std::process::Command::new(&spec.allocator_bin)
            .args(["migrate", "--database-url", &db_url, "--partitions"])
            .arg(PARTITIONS.to_string())
            .arg("--ledger-partition-span-secs")
            .arg(LEDGER_PARTITION_SPAN_SECS.to_string())
            .env("RUST_LOG", "warn")
            .output()
            .with_context(|| format!("running {} migrate", spec.allocator_bin.display()))?;
        if !migrate.status.success() {
            bail!(
                "allocator migrate failed: {}",
                String::from_utf8_lossy(&migrate.stderr)
            );
        }
        let redis = RedisServer::start().await.context("starting Redis")?;
        let mut cluster = Cluster {
            spec,
            pg,
            redis,
            db_url,
            db_name,
            allocators: Vec::new(),
            routers: Vec::new(),
            pg_restarts: 0,
            redis_restarts: 0,
            rss_pg_start: None,
            rss_redis_start: None,
        };
        for i in 0..replicas {
            let proxies = cluster
                .pg
                .nodes()
                .iter()
                .map(|node| TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], node.port()))))
                .collect::<Result<Vec<_>>>()?;
            cluster.allocators.push(Allocator {
                id: format!("alloc-{i}"),
                port: free_port(),
                proxies,
                process: None,
                skew: None,
                restarts: 0,
                rss_start: None,
                settlement_window_secs: SETTLEMENT_WINDOW_SECS,
            });
            cluster.spawn_allocator(i, None)?;
        }
        for i in 0..routers {
            cluster.routers.push(Router {
                id: format!("router-{i}"),
                port: free_port(),
                process: None,
                restarts: 0,
                rss_start: None,
            });
            cluster.spawn_router(i)?;
        }
        cluster.wait_ready(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    fn log(&self, name: &str) -> PathBuf {
        self.spec.log_dir.join(format!("{name}.log"))
    }

    /// (Re)starts replica `i` under its id and port, with `skew` as its `FAKETIME` offset.
    pub fn spawn_allocator(&mut self, i: usize, skew: Option<String>) -> Result<()> {
        let hosts: Vec<String> = self.allocators[i]
            .proxies
            .iter()
            .map(|p| p.addr().to_string())
            .collect();
        let proxied = format!(
            "postgres://postgres@{}/{}?target_session_attrs=read-write",
            hosts.join(","),
            self.db_name
        );
        let a = &self.allocators[i];
        let port = a.port.to_string();
        let args: Vec<String> = [
            "serve",
            "--database-url",
            &proxied,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--replica-id",
            &a.id,
            "--advertise-url",
            &a.url(),
            "--redis-url",
            &self.redis.url(),
            "--lease-ttl-ms",
            &LEASE_TTL_MS.to_string(),
            "--lease-margin-ms",
            "500",
            "--renew-interval-ms",
            "500",
            "--campaign-interval-ms",
            "250",
            "--expiry-interval-ms",
            "250",
            "--statement-timeout-ms",
            "1000",
            "--idle-in-transaction-timeout-ms",
            "1000",
            "--request-timeout-ms",
            &ALLOCATOR_REQUEST_TIMEOUT_MS.to_string(),
            "--pool-size",
            "6",
            "--http-workers",
            "2",
            "--settlement-window-secs",
            &a.settlement_window_secs.to_string(),
            "--idempotency-horizon-secs",
            &RETENTION_HORIZON_SECS.to_string(),
            "--ledger-archive-dir",
            &self
                .spec
                .log_dir
                .with_file_name("ledger-archive")
                .display()
                .to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut env = vec![("RUST_LOG".to_owned(), "info".to_owned())];
        if self.spec.negative_control {
            env.push(("ALLOCATOR_UNSAFE_DISABLE_FENCE".into(), "1".into()));
        }
        if let Some(offset) = &skew {
            let lib = self
                .spec
                .libfaketime
                .as_ref()
                .context("clock skew needs libfaketime")?;
            env.push(("LD_PRELOAD".into(), lib.display().to_string()));
            env.push(("FAKETIME".into(), offset.clone()));
            // Monotonic time stays real, or the replica's timers would misbehave.
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
        }
        let log = self.log(&a.id);
        let process = ChildProcess::spawn(&self.spec.allocator_bin, args, &env, &log)?;
        let a = &mut self.allocators[i];
        if a.process.is_some() {
            a.restarts += 1;
        }
        a.process = Some(process);
        a.skew = skew;
        Ok(())
    }

    /// (Re)starts router `i` on its port.
    pub fn spawn_router(&mut self, i: usize) -> Result<()> {
        let r = &self.routers[i];
        let args: Vec<String> = [
            "serve",
            "--database-url",
            &self.db_url,
            "--redis-url",
            &self.redis.url(),
            "--listen",
            &format!("127.0.0.1:{}", r.port),
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
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut args = args;
        if let Some(file) = &self.spec.auth_file {
            args.extend(["--auth-file".to_owned(), file.display().to_string()]);
        }
        let env = vec![("RUST_LOG".to_owned(), "info".to_owned())];
        let log = self.log(&r.id);
        let process = ChildProcess::spawn(&self.spec.router_bin, args, &env, &log)?;
        let r = &mut self.routers[i];
        if r.process.is_some() {
            r.restarts += 1;
        }
        r.process = Some(process);
        Ok(())
    }

    /// A database client on the direct (unproxied) link to the server that is primary now.
    pub async fn db(&self) -> Result<tokio_postgres::Client> {
        let primary = self.pg.primary();
        primary.connect_url(&primary.url_for(&self.db_name)).await
    }

    /// Number of partitions whose lease is held and unexpired.
    pub async fn owned_partitions(&self) -> Result<i64> {
        let client = self.db().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM leases WHERE partition IS NOT NULL
                   AND holder_id IS NOT NULL AND expires_at > now()",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Waits until every partition has an owner (unless `any_owners`) and every router answers
    /// `/readyz`.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        self.wait_ready_with(timeout, false).await
    }

    /// [`Cluster::wait_ready`]; with `any_owners` only the routers are waited for. A negative
    /// control run ends that way: its replicas keep partitions the database gave to others and
    /// so leave some partitions without a live owner, which is not what the run is checking.
    pub async fn wait_ready_with(&mut self, timeout: Duration, any_owners: bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        loop {
            let owned = self.owned_partitions().await.unwrap_or(0);
            let mut routers_ready = true;
            for r in &self.routers {
                let ok = http
                    .get(format!("{}/readyz", r.url()))
                    .send()
                    .await
                    .is_ok_and(|resp| resp.status().is_success());
                routers_ready &= ok;
            }
            if (any_owners || owned == PARTITIONS as i64) && routers_ready {
                return Ok(());
            }
            for (name, p) in self
                .allocators
                .iter_mut()
                .map(|a| (a.id.clone(), a.process.as_mut()))
                .chain(
                    self.routers
                        .iter_mut()
                        .map(|r| (r.id.clone(), r.process.as_mut())),
                )
            {
                if let Some(p) = p {
                    if let Some(status) = p.try_exit_status()? {
                        bail!(
                            "{name} exited with {status} during start-up:\n{}",
                            p.log_tail(20)
                        );
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!("cluster not ready within {timeout:?}: {owned}/{PARTITIONS} partitions owned, routers ready: {routers_ready}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Puts every proxy back to passing traffic and resumes anything frozen: the end of a run
    /// (or an interrupted fault) leaves a healthy cluster behind for the final dump.
    pub fn heal(&mut self) -> Result<()> {
        for a in &mut self.allocators {
            a.set_link(ProxyMode::Pass);
            if let Some(p) = a.process.as_mut() {
                if p.try_exit_status()?.is_none() {
                    p.sigcont()?;
                }
            }
        }
        Ok(())
    }

    /// Records every process's resident memory as the start figure.
    pub fn record_rss_start(&mut self) {
        for a in &mut self.allocators {
            a.rss_start = a.process.as_ref().and_then(|p| resident_set_kib(p.pid()));
        }
        for r in &mut self.routers {
            r.rss_start = r.process.as_ref().and_then(|p| resident_set_kib(p.pid()));
        }
        self.rss_pg_start = resident_set_kib(self.pg.primary().pid());
        self.rss_redis_start = self.redis.pid().and_then(resident_set_kib);
    }

    /// Resident memory per process now, with the start figure and restart count.
    pub fn rss_report(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for a in &self.allocators {
            out.push(serde_json::json!({
                "name": a.id,
                "start": a.rss_start,
                "end": a.process.as_ref().and_then(|p| resident_set_kib(p.pid())),
                "restarts": a.restarts,
            }));
        }
        for r in &self.routers {
            out.push(serde_json::json!({
                "name": r.id,
                "start": r.rss_start,
                "end": r.process.as_ref().and_then(|p| resident_set_kib(p.pid())),
                "restarts": r.restarts,
            }));
        }
        out.push(serde_json::json!({
            "name": "postgres",
            "note": "the primary's postmaster process only (a failover changes which one)",
            "start": self.rss_pg_start,
            "end": resident_set_kib(self.pg.primary().pid()),
            "restarts": self.pg_restarts,
        }));
        out.push(serde_json::json!({
            "name": "redis",
            "start": self.rss_redis_start,
            "end": self.redis.pid().and_then(resident_set_kib),
            "restarts": self.redis_restarts,
        }));
        out
    }

    pub fn log_dir(&self) -> &Path {
        &self.spec.log_dir
    }
}
