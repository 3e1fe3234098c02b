//! Shared helpers for the allocator's integration tests: a fresh, migrated database per test and
//! in-process replicas with short lease timings, talked to over real HTTP.

use std::time::{Duration, Instant};

use allocator::app::Application;
use allocator::config::{AllocatorConfig, Cli, Command};
use allocator::fenced::StockDelta;
use clap::Parser as _;
use reqwest::StatusCode;
use schema::wire::{AdjustmentRequest, PartitionMap, Problem, Reservation, ReserveRequest};
use serde_json::json;
use testkit::shared::fresh_database;
use testkit::{Answer, ApiClient};
use tokio_util::sync::CancellationToken;

pub const PARTITIONS: u32 = 8;

/// A migrated database with `partitions` partitions on the shared test server.
pub async fn migrated_database(partitions: u32) -> String {
    let url = fresh_database("alloc").await.expect("create database");
    migrate(&url, partitions).await;
    url
}

pub async fn migrate(url: &str, partitions: u32) {
    let mut client = allocator::sessions::connect(url).await.expect("connect");
    schema::initialise(&mut client, Some(partitions))
        .await
        .expect("migrate");
}

/// [`migrated_database`] whose ledger is partitioned by `span_secs` from the start (V17).
pub async fn migrated_database_with_span(partitions: u32, span_secs: u64) -> String {
    let url = fresh_database("alloc").await.expect("create database");
    let mut client = allocator::sessions::connect(&url).await.expect("connect");
    let options = schema::InitOptions {
        partitions: Some(partitions),
        ledger_partition_span: Some(Duration::from_secs(span_secs)),
        ..Default::default()
    };
    schema::initialise_with(&mut client, options)
        .await
        .expect("migrate");
    url
}

pub async fn client(url: &str) -> tokio_postgres::Client {
    allocator::sessions::connect(url).await.expect("connect")
}

/// A small pool for tests that drive the fenced statements and the lease store directly. Its
/// short lock timeout makes a statement that waits on another transaction's lock fail within
/// the test instead of hanging it.
pub fn fencing_pool(url: &str) -> deadpool_postgres::Pool {
    allocator::sessions::build_pool(
        url,
        &allocator::sessions::PoolSettings {
            size: 4,
            wait: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(300),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: "fencing-test".into(),
        },
    )
    .expect("pool")
}

/// A SKU that lands in `partition` of [`PARTITIONS`], distinct per `prefix`.
pub fn sku_in(partition: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| schema::partition::partition_for(s, PARTITIONS) == partition)
        .unwrap()
}

/// Lapse `partition`'s lease in the database at once, as if its holder had stopped renewing.
pub async fn expire_lease_now(pg: &tokio_postgres::Client, partition: u32) {
    pg.execute(
        "UPDATE leases SET expires_at = now() - interval '1 millisecond' WHERE partition = $1",
        &[&(partition as i32)],
    )
    .await
    .unwrap();
}

/// The problem document of `response`, which must come as `application/problem+json`.
pub async fn problem_of(response: reqwest::Response) -> Problem {
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "errors are problem+json"
    );
    response.json().await.expect("problem body")
}

/// Send `request` and assert that it is refused with `status` and a problem document; `why`
/// names the case in a failure.
pub async fn refused(request: reqwest::RequestBuilder, status: StatusCode, why: &str) -> Problem {
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), status, "{why}");
    problem_of(response).await
}

/// Reservation bodies that each break one rule of a reservation request, with the rule's name;
/// everything else in them is valid for a stocked SKU `ok-sku`.
pub fn invalid_reservation_bodies() -> Vec<(serde_json::Value, &'static str)> {
    let long_id = "x".repeat(256);
    let long_sku = "s".repeat(65);
    vec![
        (
            json!({"reservation_id": "a", "sku": "bad sku!", "quantity": 1}),
            "sku charset",
        ),
        (
            json!({"reservation_id": "a", "sku": long_sku, "quantity": 1}),
            "sku length",
        ),
        (
            json!({"reservation_id": "a", "sku": "", "quantity": 1}),
            "empty sku",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 0}),
            "zero quantity",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": -3}),
            "negative quantity",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 10_000_000}),
            "huge quantity",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 1.5}),
            "fractional quantity",
        ),
        (
            json!({"reservation_id": long_id, "sku": "ok-sku", "quantity": 1}),
            "id length",
        ),
        (
            json!({"reservation_id": "", "sku": "ok-sku", "quantity": 1}),
            "empty id",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 1, "quantiy": 2}),
            "unknown field",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku"}),
            "missing field",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 1, "ttl_seconds": 0}),
            "ttl too small",
        ),
        (
            json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 1, "ttl_seconds": 999999}),
            "ttl too large",
        ),
        (json!(["not", "an", "object"]), "wrong shape"),
    ]
}

/// Short timings so failover tests run in seconds, built through the command line so the
/// validation a replica runs at start applies to tests too.
pub fn fast_config(database_url: &str, replica_id: &str) -> AllocatorConfig {
    fast_config_with(database_url, replica_id, &[])
}

/// [`fast_config`] with more arguments (later ones win).
pub fn fast_config_with(database_url: &str, replica_id: &str, extra: &[&str]) -> AllocatorConfig {
    let base = [
        "allocator",
        "serve",
        "--database-url",
        database_url,
        "--listen",
        "127.0.0.1:0",
        "--replica-id",
        replica_id,
        "--lease-ttl-ms",
        "2000",
        "--lease-margin-ms",
        "500",
        "--renew-interval-ms",
        "500",
        "--campaign-interval-ms",
        "200",
        "--expiry-interval-ms",
        "200",
        "--idle-in-transaction-timeout-ms",
        "1000",
        "--statement-timeout-ms",
        "1000",
        "--request-timeout-ms",
        "3000",
        "--pool-size",
        "8",
    ];
    let cli = Cli::try_parse_from(base.iter().chain(extra)).expect("static arguments parse");
    let Command::Serve(args) = cli.command else {
        unreachable!("serve was given")
    };
    AllocatorConfig::try_from(*args).expect("test configuration is valid")
}

pub struct TestReplica {
    pub url: String,
    /// Typed client of this replica's API.
    pub api: ApiClient,
    pub replica_id: String,
    pub shutdown: CancellationToken,
    pub ownership: std::sync::Arc<allocator::replica::ownership::Ownership>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestReplica {
    pub async fn start(config: AllocatorConfig) -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            edge::telemetry::init();
        }
        let replica_id = config.replica_id.clone();
        let app = Application::build(config).await.expect("build replica");
        let url = format!("http://127.0.0.1:{}", app.port());
        let shutdown = app.shutdown_token();
        let ownership = app.ownership();
        let task = tokio::spawn(app.run_until_stopped());
        Self {
            api: ApiClient::new(url.clone()),
            url,
            replica_id,
            shutdown,
            ownership,
            task,
        }
    }

    /// Graceful stop: leases are released before this returns.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

/// The Prometheus text `base` serves at `/metrics`.
pub async fn metrics_text(base: &str) -> String {
    http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

pub async fn partition_map(base: &str) -> PartitionMap {
    ApiClient::new(base).partitions().await.ok()
}

/// Wait until every partition has a live owner and `pred` holds for the map.
pub async fn wait_for_map(
    base: &str,
    timeout: Duration,
    pred: impl Fn(&PartitionMap) -> bool,
) -> PartitionMap {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(response) = http().get(format!("{base}/v1/partitions")).send().await {
            if let Ok(map) = response.json::<PartitionMap>().await {
                if pred(&map) {
                    return map;
                }
                if Instant::now() > deadline {
                    panic!("map condition not reached in {timeout:?}: {map:?}");
                }
            }
        }
        if Instant::now() > deadline {
            panic!("map not readable in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn all_owned_by_one_of(map: &PartitionMap, owners: &[&str]) -> bool {
    map.partitions
        .iter()
        .all(|p| p.owner_id.as_deref().is_some_and(|o| owners.contains(&o)))
}

/// Restock `sku` by `delta` through `base`, retrying while ownership settles.
pub async fn restock(base: &str, sku: &str, delta: i64) {
    restock_with(&ApiClient::new(base), sku, delta).await
}

/// [`restock`] through `api` (a client holding a token with `admin`, where authentication is on).
pub async fn restock_with(api: &ApiClient, sku: &str, delta: i64) {
    let request = AdjustmentRequest {
        adjustment_id: format!("seed-{sku}-{delta}")
            .parse()
            .expect("valid adjustment id"),
        delta: delta.try_into().expect("valid delta"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = api.adjust(sku, &request).await;
        if answer.status.is_success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "restock kept failing: {} {:?}",
            answer.status,
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `base` owns every partition (single-replica tests).
pub async fn wait_owns_all(replica: &TestReplica) {
    let id = replica.replica_id.clone();
    wait_for_map(&replica.url, Duration::from_secs(10), |m| {
        all_owned_by_one_of(m, &[&id])
    })
    .await;
    // The local view follows the database within one round trip.
    let deadline = Instant::now() + Duration::from_secs(5);
    while replica.ownership.held().len() < replica.ownership.partition_count() as usize {
        assert!(Instant::now() < deadline, "local ownership lagging");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until `replica` holds every partition by its own ownership table, without asking its
/// API (which may require a token).
pub async fn wait_owns_all_locally(replica: &TestReplica) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while replica.ownership.held().len() < replica.ownership.partition_count() as usize {
        assert!(
            Instant::now() < deadline,
            "replica does not own every partition"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One replica, `solo`, owning every partition of a fresh database; and that database's URL.
pub async fn single_replica() -> (TestReplica, String) {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "solo")).await;
    wait_owns_all(&replica).await;
    (replica, db)
}

/// Reserve `quantity` of `sku` as `id` through `api`, with the default TTL.
pub async fn reserve(api: &ApiClient, id: &str, sku: &str, quantity: i64) -> Answer<Reservation> {
    api.reserve(&ReserveRequest {
        reservation_id: id.parse().expect("valid id"),
        sku: sku.parse().expect("valid sku"),
        quantity: quantity.try_into().expect("valid quantity"),
        ttl_seconds: None,
    })
    .await
}

/// Sum of ledger deltas per column vs the inventory row; (row, ledger) for assertions. The
/// ledger's sums include its archived partitions' (`ledger_archived_totals`, V17).
pub async fn ledger_balance(
    client: &tokio_postgres::Client,
    sku: &str,
) -> (StockDelta, StockDelta) {
    let row = client
        .query_one(
            "SELECT on_hand, available, held, confirmed FROM inventory WHERE sku = $1",
            &[&sku],
        )
        .await
        .expect("inventory row");
    let sums = client
        .query_one(
            "SELECT coalesce(sum(d_on_hand),0)::bigint, coalesce(sum(d_available),0)::bigint,
                    coalesce(sum(d_held),0)::bigint, coalesce(sum(d_confirmed),0)::bigint
               FROM (SELECT d_on_hand, d_available, d_held, d_confirmed
                       FROM ledger WHERE sku = $1
                      UNION ALL
                     SELECT d_on_hand, d_available, d_held, d_confirmed
                       FROM ledger_archived_totals WHERE sku = $1) AS l",
            &[&sku],
        )
        .await
        .expect("ledger sums");
    (
        StockDelta {
            on_hand: row.get(0),
            available: row.get(1),
            held: row.get(2),
            confirmed: row.get(3),
        },
        StockDelta {
            on_hand: sums.get(0),
            available: sums.get(1),
            held: sums.get(2),
            confirmed: sums.get(3),
        },
    )
}
