//! Harness for the router's end-to-end tests: testkit's [`testkit::Cluster`] (a migrated
//! database on the test binary's private PostgreSQL, a private Redis, N real `allocator serve`
//! processes) with short lease timings, and routers run in-process through `Application::build`
//! on port 0, so that a test can look at a router's state (its assignment cache).
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
use testkit::cluster::{Database, ShortTimings};
use testkit::{cargo_bin, ApiClient, TcpProxy};
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

/// One allocator process of a [`Cluster`].
pub type AllocatorProc = testkit::cluster::Service;

/// testkit's cluster with the tests' lease timings, in-process routers and panicking helpers.
pub struct TestCluster(testkit::Cluster);

/// The name the test files use.
pub use self::TestCluster as Cluster;

impl std::ops::Deref for TestCluster {
    type Target = testkit::Cluster;
    fn deref(&self) -> &testkit::Cluster {
        &self.0
    }
}

impl std::ops::DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut testkit::Cluster {
        &mut self.0
    }
}

/// Flags of every test allocator after its own: short leases and small pools.
fn allocator_args() -> Vec<String> {
    ShortTimings {
        lease_ttl_ms: LEASE_TTL_MS,
        lease_margin_ms: 400,
        renew_interval_ms: 300,
        campaign_interval_ms: 200,
        statement_timeout_ms: 1000,
        request_timeout_ms: ALLOCATOR_REQUEST_TIMEOUT_MS,
        pool_size: 6,
        http_workers: 2,
    }
    .args()
}

impl TestCluster {
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
        Self::start_in(Database::Shared, name, replicas, partitions, allocator_env).await
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
        Self::start_in(
            Database::Url(db_url),
            name,
            replicas,
            partitions,
            allocator_env,
        )
        .await
    }

    /// Like [`Cluster::start_sharded`], with extra environment for every allocator.
    pub async fn start_sharded_with_env(
        name: &str,
        shards: usize,
        replicas: usize,
        partitions: u32,
        allocator_env: Vec<(String, String)>,
    ) -> Cluster {
        Self::start_in_shards(
            Database::Private,
            shards,
            name,
            replicas,
            partitions,
            allocator_env,
        )
        .await
    }

    /// `replicas` allocators over `shards` private PostgreSQL servers (allocator `i` on shard
    /// `i mod shards`), so that a test may stop or freeze any of them.
    pub async fn start_sharded(
        name: &str,
        shards: usize,
        replicas: usize,
        partitions: u32,
    ) -> Cluster {
        Self::start_in_shards(
            Database::Private,
            shards,
            name,
            replicas,
            partitions,
            Vec::new(),
        )
        .await
    }

    async fn start_in(
        database: Database,
        name: &str,
        replicas: usize,
        partitions: u32,
        allocator_env: Vec<(String, String)>,
    ) -> Cluster {
        // `TESTKIT_SHARDS=N` (`ops/test.sh --shards N`) spreads the suite's clusters over N shards
        // where each shard gets an allocator and a partition, on the tests' server or a private one
        // (not on a given URL: that test is about that database).
        let env_shards = testkit::cluster::shards_from_env();
        let shards = match &database {
            Database::Shared | Database::Private
                if env_shards <= replicas && env_shards as u32 <= partitions =>
            {
                env_shards
            }
            _ => 1,
        };
        Self::start_in_shards(database, shards, name, replicas, partitions, allocator_env).await
    }

    async fn start_in_shards(
        database: Database,
        shards: usize,
        name: &str,
        replicas: usize,
        partitions: u32,
        allocator_env: Vec<(String, String)>,
    ) -> Cluster {
        let inner = testkit::Cluster::builder()
            .name(name)
            .database(database)
            .shards(shards)
            .partitions(partitions)
            .allocators(0)
            .allocator_bin(&allocator_bin())
            .allocator_args(allocator_args())
            .start()
            .await
            .expect("start cluster");
        let mut cluster = TestCluster(inner);
        cluster.allocator_env = allocator_env;
        for i in 0..replicas {
            cluster.spawn_allocator(&format!("alloc-{i}"));
        }
        if replicas > 0 {
            let ids: Vec<String> = cluster.allocators.iter().map(|a| a.id.clone()).collect();
            let fair = fair_share(shards, partitions, replicas);
            cluster
                .wait_map(Duration::from_secs(30), |m| {
                    balanced(m, &ids.iter().map(String::as_str).collect::<Vec<_>>(), fair)
                })
                .await;
        }
        cluster
    }

    /// The most partitions one of `replicas` allocators holds once balanced
    /// ([`fair_share`] over this cluster's shards).
    pub fn fair_share(&self, partitions: u32, replicas: usize) -> usize {
        fair_share(self.shard_count(), partitions, replicas)
    }

    /// Start an allocator process (a new one, or the same id again after a kill).
    pub fn spawn_allocator(&mut self, id: &str) -> usize {
        self.0.spawn_allocator(id).expect("spawn allocator")
    }

    /// Start an allocator that advertises a TCP proxy in front of it, so every router reaches
    /// it through the proxy (to delay or cut requests between routers and this owner).
    pub fn spawn_allocator_behind_proxy(&mut self, id: &str) -> TcpProxy {
        self.0
            .spawn_allocator_behind_proxy(id)
            .expect("spawn allocator behind a proxy")
    }

    /// Start an allocator listening on `port` that advertises `url` (for HTTPS, a proxy, ...).
    pub fn spawn_allocator_at(&mut self, id: &str, port: u16, url: String) -> usize {
        self.0
            .spawn_allocator_at(id, port, url)
            .expect("spawn allocator")
    }

    pub async fn db(&self) -> tokio_postgres::Client {
        self.0.db().await.expect("connect to test database")
    }

    /// The map as PostgreSQL has it now.
    pub async fn map(&self) -> PartitionMap {
        self.0.map().await.expect("read map")
    }

    /// Wait until `pred` holds for the database's map.
    pub async fn wait_map(
        &self,
        timeout: Duration,
        pred: impl Fn(&PartitionMap) -> bool,
    ) -> PartitionMap {
        self.0
            .wait_map_until(timeout, pred)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }
    /// A router with test-friendly defaults (short deadline, fast poll), adjusted by `tweak`.
    pub async fn router(&self, tweak: impl FnOnce(&mut RouterConfig)) -> TestRouter {
        let mut config = RouterConfig::new(self.db_url.clone());
        let shards = self.shard_urls();
        if !shards.is_empty() {
            config.shards = shards
                .iter()
                .map(|(name, url)| format!("{name}={url}").parse().expect("shard target"))
                .collect();
        }
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

/// Request bodies (with their path) that each break one input rule of a route, with the rule's
/// name: reservations, adjustments and orders, malformed JSON included.
pub fn invalid_request_bodies() -> Vec<(&'static str, String, reqwest::Body)> {
    vec![
        ("malformed json", "/v1/reservations".into(), "{".into()),
        (
            "unknown field",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"s","quantity":1,"quantiy":2}"#.into(),
        ),
        (
            "missing field",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"s"}"#.into(),
        ),
        (
            "bad sku",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"no spaces","quantity":1}"#.into(),
        ),
        (
            "zero quantity",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"s","quantity":0}"#.into(),
        ),
        (
            "huge quantity",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"s","quantity":99999999999999999999}"#.into(),
        ),
        (
            "ttl out of range",
            "/v1/reservations".into(),
            r#"{"reservation_id":"a","sku":"s","quantity":1,"ttl_seconds":0}"#.into(),
        ),
        (
            "empty id",
            "/v1/reservations".into(),
            r#"{"reservation_id":"","sku":"s","quantity":1}"#.into(),
        ),
        (
            "zero delta",
            "/v1/inventory/s/adjustments".into(),
            r#"{"adjustment_id":"a","delta":0}"#.into(),
        ),
        (
            "bad sku in path",
            "/v1/inventory/bad%20sku/adjustments".into(),
            r#"{"adjustment_id":"a","delta":1}"#.into(),
        ),
        (
            "order without lines",
            "/v1/orders/o-1/reservations".into(),
            r#"{"lines":[]}"#.into(),
        ),
        (
            "order with unknown field",
            "/v1/orders/o-1/reservations".into(),
            r#"{"lines":[{"sku":"s","quantity":1}],"x":1}"#.into(),
        ),
        (
            "order id too long",
            format!("/v1/orders/{}/reservations", "o".repeat(201)),
            r#"{"lines":[{"sku":"s","quantity":1}]}"#.into(),
        ),
        (
            "too many lines",
            "/v1/orders/o-1/reservations".into(),
            serde_json::to_string(&serde_json::json!({"lines": vec![serde_json::json!({"sku":"s","quantity":1}); 101]}))
                .unwrap()
                .into(),
        ),
    ]
}

/// The fair share of the fullest shard, when `replicas` allocators (allocator `i` on shard
/// `i mod shards`) share `partitions` spread evenly over `shards`: each shard's replicas share its
/// partitions, so one allocator alone on a shard holds all of that shard's.
pub fn fair_share(shards: usize, partitions: u32, replicas: usize) -> usize {
    (0..shards)
        .map(|shard| {
            let held = (0..partitions)
                .filter(|p| (*p as usize * shards) / partitions as usize == shard)
                .count();
            let serving = (0..replicas).filter(|i| i % shards == shard).count();
            held.div_ceil(serving.max(1))
        })
        .max()
        .unwrap_or(0)
}
