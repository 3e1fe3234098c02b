//! Harness for the router's end-to-end tests: a migrated database on the test binary's private
//! PostgreSQL, a private Redis, N real `allocator serve` processes with short lease timings, and
//! routers run in-process through `Application::build` on port 0.
//!
//! The allocator binary must be built first (`cargo build -p allocator`): cargo only builds the
//! binaries of the package under test. [`allocator_bin`] fails with that advice if it is missing.
//!
//! Tests in one binary are serialised with [`serial`]: each starts several processes on a
//! two-core machine, and the Prometheus recorder (hence `/metrics`) is process-global, so metric
//! deltas are only meaningful when one test runs at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use router::assignment_cache::AssignmentCache;
use router::{Application, RouterConfig};
use schema::wire::PartitionMap;
use testkit::shared::fresh_database;
use testkit::{cargo_bin, free_port, ApiClient, ChildProcess, RedisServer, TcpProxy};
use tokio_util::sync::CancellationToken;

/// Lease TTL of the test allocators; failover takes about this plus one campaign period.
pub const LEASE_TTL_MS: u64 = 1500;
/// Request deadline of the test allocators; the test routers' attempt timeout covers it.
pub const ALLOCATOR_REQUEST_TIMEOUT_MS: u64 = 2000;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hold the returned guard for the whole test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().await;
    if std::env::var_os("ROUTER_TEST_LOG").is_some() {
        let _ = edge::telemetry::try_init();
    }
    guard
}

pub fn allocator_bin() -> PathBuf {
    let bin = cargo_bin("allocator");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p allocator` before the router's tests",
        bin.display()
    );
    bin
}

pub struct AllocatorProc {
    pub id: String,
    pub port: u16,
    pub url: String,
    pub process: Option<ChildProcess>,
}

pub struct Cluster {
    pub db_url: String,
    pub partitions: u32,
    pub redis: RedisServer,
    pub allocators: Vec<AllocatorProc>,
    /// Allocator logs; kept (not deleted) when a test fails so they can be read.
    pub log_dir: PathBuf,
    /// Extra environment for allocators spawned from now on.
    pub allocator_env: Vec<(String, String)>,
}

impl Cluster {
    /// A migrated database with `partitions` partitions, a Redis, and `replicas` allocators that
    /// between them own every partition.
    pub async fn start(name: &str, replicas: usize, partitions: u32) -> Cluster {
        Self::start_with_env(name, replicas, partitions, Vec::new()).await
    }

    /// Like [`Cluster::start`], with extra environment for every allocator.
    pub async fn start_with_env(
        name: &str,
        replicas: usize,
        partitions: u32,
        allocator_env: Vec<(String, String)>,
    ) -> Cluster {
        let db_url = fresh_database(name).await.expect("create database");
        Self::start_on(name, db_url, replicas, partitions, allocator_env).await
    }

    /// Like [`Cluster::start_with_env`], on an existing empty database (for example one on a
    /// replicated pair, reached through a multi-host URL).
    pub async fn start_on(
        name: &str,
        db_url: String,
        replicas: usize,
        partitions: u32,
        allocator_env: Vec<(String, String)>,
    ) -> Cluster {
        let status = std::process::Command::new(allocator_bin())
            .args([
                "migrate",
                "--database-url",
                &db_url,
                "--partitions",
                &partitions.to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run allocator migrate");
        assert!(status.success(), "allocator migrate failed: {status}");
        let redis = RedisServer::start().await.expect("start redis");
        let log_dir = std::env::temp_dir().join(format!(
            "router-test-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&log_dir).expect("log dir");
        let mut cluster = Cluster {
            db_url,
            partitions,
            redis,
            allocators: Vec::new(),
            log_dir,
            allocator_env,
        };
        for i in 0..replicas {
            cluster.spawn_allocator(&format!("alloc-{i}"));
        }
        if replicas > 0 {
            let ids: Vec<String> = cluster.allocators.iter().map(|a| a.id.clone()).collect();
            let fair = partitions.div_ceil(replicas as u32) as usize;
            cluster
                .wait_map(Duration::from_secs(30), |m| {
                    balanced(m, &ids.iter().map(String::as_str).collect::<Vec<_>>(), fair)
                })
                .await;
        }
        cluster
    }

    /// Start an allocator process (a new one, or the same id again after a kill).
    pub fn spawn_allocator(&mut self, id: &str) -> usize {
        let port = free_port();
        self.spawn_allocator_at(id, port, format!("http://127.0.0.1:{port}"))
    }

    /// Start an allocator that advertises a TCP proxy in front of it, so every router reaches
    /// it through the proxy (to delay or cut requests between routers and this owner).
    pub fn spawn_allocator_behind_proxy(&mut self, id: &str) -> TcpProxy {
        let port = free_port();
        let proxy = TcpProxy::start(([127, 0, 0, 1], port).into()).expect("start proxy");
        self.spawn_allocator_at(id, port, format!("http://{}", proxy.addr()));
        proxy
    }

    /// Start an allocator listening on `port` that advertises `url` (for HTTPS, a proxy, ...).
    pub fn spawn_allocator_at(&mut self, id: &str, port: u16, url: String) -> usize {
        let ttl = LEASE_TTL_MS.to_string();
        let args = vec![
            "serve".to_owned(),
            "--database-url".into(),
            self.db_url.clone(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--replica-id".into(),
            id.to_owned(),
            "--advertise-url".into(),
            url.clone(),
            "--redis-url".into(),
            self.redis.url(),
            "--lease-ttl-ms".into(),
            ttl,
            "--lease-margin-ms".into(),
            "400".into(),
            "--renew-interval-ms".into(),
            "300".into(),
            "--campaign-interval-ms".into(),
            "200".into(),
            "--expiry-interval-ms".into(),
            "200".into(),
            "--statement-timeout-ms".into(),
            "1000".into(),
            "--idle-in-transaction-timeout-ms".into(),
            "1000".into(),
            "--request-timeout-ms".into(),
            ALLOCATOR_REQUEST_TIMEOUT_MS.to_string(),
            "--pool-size".into(),
            "6".into(),
            "--http-workers".into(),
            "2".into(),
        ];
        let log = self.log_dir.join(format!("{id}.log"));
        let process = ChildProcess::spawn(
            &allocator_bin(),
            args,
            &std::iter::once(("RUST_LOG".to_owned(), "info".to_owned()))
                .chain(self.allocator_env.iter().cloned())
                .collect::<Vec<_>>(),
            &log,
        )
        .expect("spawn allocator");
        let proc = AllocatorProc {
            id: id.to_owned(),
            port,
            url,
            process: Some(process),
        };
        if let Some(i) = self.allocators.iter().position(|a| a.id == id) {
            self.allocators[i] = proc;
            i
        } else {
            self.allocators.push(proc);
            self.allocators.len() - 1
        }
    }

    pub fn allocator(&mut self, id: &str) -> &mut AllocatorProc {
        self.allocators
            .iter_mut()
            .find(|a| a.id == id)
            .expect("known allocator")
    }

    pub async fn db(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.db_url, tokio_postgres::NoTls)
            .await
            .expect("connect to test database");
        tokio::spawn(connection);
        client
    }

    /// The map as PostgreSQL has it now.
    pub async fn map(&self) -> PartitionMap {
        schema::assignment::read_map(&self.db().await)
            .await
            .expect("read map")
    }

    /// Wait until `pred` holds for the database's map.
    pub async fn wait_map(
        &self,
        timeout: Duration,
        pred: impl Fn(&PartitionMap) -> bool,
    ) -> PartitionMap {
        let deadline = Instant::now() + timeout;
        let client = self.db().await;
        loop {
            let map = schema::assignment::read_map(&client)
                .await
                .expect("read map");
            if pred(&map) {
                return map;
            }
            if Instant::now() > deadline {
                panic!(
                    "map condition not reached within {timeout:?}: {:?}; logs in {}",
                    owner_counts(&map),
                    self.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A router with test-friendly defaults (short deadline, fast poll), adjusted by `tweak`.
    pub async fn router(&self, tweak: impl FnOnce(&mut RouterConfig)) -> TestRouter {
        let mut config = RouterConfig::new(self.db_url.clone());
        config.redis_url = Some(self.redis.url());
        config.listen = "127.0.0.1:0".to_owned();
        config.workers = Some(2);
        config.poll_interval = Duration::from_millis(1000);
        config.retry_deadline = Duration::from_secs(5);
        config.allocator_request_timeout = Duration::from_millis(ALLOCATOR_REQUEST_TIMEOUT_MS);
        config.upstream_request_timeout =
            config.allocator_request_timeout + router::config::ALLOCATOR_ANSWER_SLACK;
        config.hints_reconnect_max = Duration::from_millis(500);
        config.hints_ping_interval = Duration::from_millis(500);
        tweak(&mut config);
        TestRouter::start(config).await
    }

    /// Create `sku` with `stock` units through `base` (an idempotent adjustment).
    pub async fn restock(&self, base: &str, sku: &str, stock: i64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let response = http()
                .post(format!("{base}/v1/inventory/{sku}/adjustments"))
                .json(&serde_json::json!({"adjustment_id": format!("seed-{sku}"), "delta": stock}))
                .send()
                .await;
            match response {
                Ok(r) if r.status().is_success() => return,
                other => {
                    assert!(
                        Instant::now() < deadline,
                        "restock of {sku} kept failing: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("allocator logs kept in {}", self.log_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.log_dir);
        }
    }
}

/// Every partition owned by one of `owners`, none with more than `fair` partitions.
pub fn balanced(map: &PartitionMap, owners: &[&str], fair: usize) -> bool {
    let counts = owner_counts(map);
    map.partitions
        .iter()
        .all(|p| p.owner_id.as_deref().is_some_and(|o| owners.contains(&o)))
        && counts.values().all(|&c| c <= fair)
}

pub fn owner_counts(map: &PartitionMap) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for p in &map.partitions {
        *counts
            .entry(p.owner_id.clone().unwrap_or_else(|| "<none>".into()))
            .or_insert(0) += 1;
    }
    counts
}

pub fn owner_of(map: &PartitionMap, partition: u32) -> Option<String> {
    map.partitions
        .iter()
        .find(|p| p.partition == partition)
        .and_then(|p| p.owner_id.clone())
}

pub struct TestRouter {
    pub url: String,
    /// Typed client of this router's API.
    pub api: ApiClient,
    pub cache: Arc<AssignmentCache>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestRouter {
    pub async fn start(config: RouterConfig) -> TestRouter {
        let app = Application::build(config).await.expect("build router");
        let url = format!("http://127.0.0.1:{}", app.port());
        let cache = app.cache();
        let shutdown = app.shutdown_token();
        let task = tokio::spawn(app.run_until_stopped());
        TestRouter {
            api: ApiClient::new(url.clone()),
            url,
            cache,
            shutdown,
            task,
        }
    }

    pub fn revision(&self) -> Option<i64> {
        self.cache.current().map(|m| m.revision())
    }

    /// Graceful stop; every background task has ended when this returns.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("router stops in time")
            .expect("router task")
            .expect("router result");
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

/// Value of one Prometheus series (`name{labels}`) in `/metrics` text, 0 when absent.
pub async fn metric(base: &str, series: &str) -> f64 {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}
