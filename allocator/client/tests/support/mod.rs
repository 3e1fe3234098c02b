//! The processes the client's tests talk to: a migrated database on the test binary's private
//! PostgreSQL, a private Redis, real `allocator serve` processes (optionally behind a TCP proxy,
//! to delay or cut what routers send them) and a router run in-process, as the router's own
//! tests start them.
//!
//! The allocator binary must be built first (`cargo build -p allocator --bins`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use allocator_client::Client;
use router::{Application, RouterConfig};
use testkit::shared::fresh_database;
use testkit::{cargo_bin, free_port, ChildProcess, RedisServer, TcpProxy};

/// Lease TTL of the test allocators: a killed owner's partitions are taken over about this long
/// after its last renewal.
const LEASE_TTL_MS: u64 = 1500;
/// Request deadline of the test allocators (and the routers' view of it).
pub const ALLOCATOR_REQUEST_TIMEOUT: Duration = Duration::from_millis(750);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hold the returned guard for the whole test: each test starts several processes on a small
/// machine.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

pub struct Allocator {
    /// Where the allocator itself listens (not through its proxy).
    pub direct_url: String,
    pub process: ChildProcess,
    pub proxy: Option<TcpProxy>,
}

/// A database, a Redis and the allocators started on them.
pub struct Stack {
    pub db_url: String,
    pub redis: RedisServer,
    pub allocators: Vec<Allocator>,
    logs: tempfile::TempDir,
}

impl Stack {
    pub async fn start(name: &str, partitions: u32) -> Stack {
        let bin = allocator_bin();
        let db_url = fresh_database(name).await.expect("database");
        let status = std::process::Command::new(&bin)
            .args(["migrate", "--database-url", &db_url, "--partitions"])
            .arg(partitions.to_string())
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run allocator migrate");
        assert!(status.success(), "allocator migrate: {status}");
        Stack {
            db_url,
            redis: RedisServer::start().await.expect("redis"),
            allocators: Vec::new(),
            logs: tempfile::tempdir().expect("log dir"),
        }
    }

    /// Start allocator `id`; routers reach it through a proxy when `behind_proxy`.
    pub fn spawn_allocator(&mut self, id: &str, behind_proxy: bool) -> &mut Allocator {
        let port = free_port();
        let direct_url = format!("http://127.0.0.1:{port}");
        let proxy = behind_proxy
            .then(|| TcpProxy::start(([127, 0, 0, 1], port).into()).expect("start proxy"));
        let advertised = proxy
            .as_ref()
            .map_or(direct_url.clone(), |p| format!("http://{}", p.addr()));
        let ms = |d: Duration| d.as_millis().to_string();
        let args: Vec<String> = [
            "serve",
            "--database-url",
            &self.db_url,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--replica-id",
            id,
            "--advertise-url",
            &advertised,
            "--redis-url",
            &self.redis.url(),
            "--lease-ttl-ms",
            &LEASE_TTL_MS.to_string(),
            "--lease-margin-ms",
            "400",
            "--renew-interval-ms",
            "300",
            "--campaign-interval-ms",
            "200",
            "--expiry-interval-ms",
            "200",
            "--request-timeout-ms",
            &ms(ALLOCATOR_REQUEST_TIMEOUT),
            "--pool-size",
            "4",
            "--http-workers",
            "1",
        ]
        .map(str::to_owned)
        .to_vec();
        let log = self.logs.path().join(format!("{id}.log"));
        let process = ChildProcess::spawn(
            &allocator_bin(),
            args,
            &[("RUST_LOG".to_owned(), "warn".to_owned())],
            &log,
        )
        .expect("spawn allocator");
        self.allocators.push(Allocator {
            direct_url,
            process,
            proxy,
        });
        self.allocators.last_mut().expect("just pushed")
    }

    /// Wait until every partition is owned by one of `owners`, as the allocator at `url` reads
    /// the map.
    pub async fn wait_owned_by(&self, url: &str, owners: &[&str]) {
        let client = Client::builder(url)
            .deadline(Duration::from_secs(5))
            .build()
            .expect("client");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(map) = client.partitions().await {
                let owned = map.value.partitions.iter().all(|p| {
                    p.owner_id
                        .as_deref()
                        .is_some_and(|owner| owners.contains(&owner))
                });
                if owned {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "partitions not owned by {owners:?} in time; logs in {}",
                self.logs.path().display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A router in this process with quick polling, adjusted by `tweak`; its base URL.
    pub async fn router(&self, tweak: impl FnOnce(&mut RouterConfig)) -> String {
        let mut config = RouterConfig::new(self.db_url.clone());
        config.redis_url = Some(self.redis.url());
        config.listen = "127.0.0.1:0".to_owned();
        config.workers = Some(1);
        config.poll_interval = Duration::from_millis(200);
        config.allocator_request_timeout = ALLOCATOR_REQUEST_TIMEOUT;
        config.upstream_request_timeout =
            ALLOCATOR_REQUEST_TIMEOUT + router::config::ALLOCATOR_ANSWER_SLACK;
        config.retry_deadline = Duration::from_secs(5);
        tweak(&mut config);
        let app = Application::build(config).await.expect("build router");
        let url = format!("http://127.0.0.1:{}", app.port());
        tokio::spawn(app.run_until_stopped());
        url
    }
}

impl Drop for Stack {
    /// The allocators' logs are kept when the test failed.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.logs.disable_cleanup(true);
            eprintln!("allocator logs kept in {}", self.logs.path().display());
        }
    }
}

fn allocator_bin() -> PathBuf {
    let bin = cargo_bin("allocator");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p allocator --bins` before these tests",
        bin.display()
    );
    bin
}

/// Restock `sku` by `units` through `client` (retried until the cluster serves).
pub async fn restock(client: &Client, sku: &str, units: i64) {
    let adjustment = allocator_client::new_adjustment(units).expect("a valid delta");
    client
        .adjust(sku, &adjustment)
        .await
        .unwrap_or_else(|e| panic!("restock {sku}: {e}"));
}
