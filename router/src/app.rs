//! Wiring: build every component once, start the background tasks, serve HTTP, stop cleanly.
//!
//! [`Application::build`] binds the listener (port 0 in tests; [`Application::port`] tells which
//! port was bound), creates the database pools (per shard), the upstream HTTP client and the
//! assignment cache *outside* actix's per-worker factory so all workers share them, loads the map
//! once (`startup`), and spawns the background tasks: the periodic poll, the Redis hint
//! subscription and metrics upkeep. Each startup step is a function of its own, and `build` runs them in a
//! fixed order: credentials, storage (and the first map read), the forwarder, the background
//! tasks, then the listener and the HTTP server.
//!
//! **Shutdown.** One [`CancellationToken`] is the only shutdown signal. Cancelling it (SIGTERM or
//! Ctrl-C in `main`, or a test calling [`Application::shutdown_token`]) stops the HTTP server
//! gracefully (in-flight requests finish) and ends every background task;
//! [`Application::run_until_stopped`] returns after all of them have finished. actix's own signal
//! handling is disabled so there is exactly one path.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::assignment_cache::AssignmentCache;
use crate::config::RouterConfig;
use crate::forward::{Forwarder, RetryPolicy};
use crate::hints::{self, HintsConfig};
use crate::metrics::{self, RefreshCause};
use crate::orders::store::OrderStore;
use crate::state::AppState;
use crate::upstream::UpstreamClient;
use crate::{db, poll, routes, settlement};
use access::tls::{ClientTls, ServerTls};
use edge::Backoff;

/// How long in-flight requests may take to finish after shutdown is requested.
const SHUTDOWN_GRACE_SECONDS: u64 = 10;
/// Idle upstream connections are closed after this; below the allocator's 5 s keep-alive.
const UPSTREAM_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Idle upstream connections kept per allocator.
const UPSTREAM_POOL_MAX_IDLE: usize = 64;

pub struct Application {
    port: u16,
    server: Server,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    cache: Arc<AssignmentCache>,
}

impl Application {
    /// Build the router and bind its listener. Must be called inside a tokio runtime.
    ///
    /// PostgreSQL being down at startup is not fatal: the router starts unready (`/readyz` 503)
    /// and the poll loads the map as soon as it can.
    pub async fn build(config: RouterConfig) -> anyhow::Result<Application> {
        config.validate()?;
        let metrics_handle = metrics::install();
        let credentials = Credentials::load(&config)?;
        let storage = Storage::connect(&config).await?;
        let forwarder = build_forwarder(&config, &credentials, &storage.cache)?;

        let shutdown = CancellationToken::new();
        let mut tasks =
            start_background_tasks(&config, &credentials, &storage, &metrics_handle, &shutdown)?;

        let listener = TcpListener::bind(&config.listen)
            .with_context(|| format!("binding {}", config.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState {
            forwarder,
            cache: storage.cache.clone(),
            pools: storage.shards.iter().map(|s| s.pool.clone()).collect(),
            shard_names: storage.shards.iter().map(|s| s.name.clone()).collect(),
            orders: storage.orders,
            db_timeout: config.db_timeout,
            metrics: metrics_handle,
        });
        let server = serve_http(
            &config,
            listener,
            credentials.tls.as_deref(),
            &credentials.access,
            state,
        )?;
        tasks.push(stop_http_on_shutdown(&server, &shutdown));
        tracing::info!(
            port,
            listen = %config.listen,
            tls = credentials.tls.is_some(),
            "router listening"
        );
        Ok(Application {
            port,
            server,
            shutdown,
            tasks,
            cache: storage.cache,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cancel it to stop the router gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The router's assignment cache (for tests and diagnostics).
    pub fn cache(&self) -> Arc<AssignmentCache> {
        self.cache.clone()
    }

    /// Serve until shutdown is requested (or the server fails), then stop every background task
    /// and wait for them.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let result = self.server.await;
        self.shutdown.cancel();
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "background task failed");
            }
        }
        tracing::info!("router stopped");
        result.context("http server failed")
    }
}

/// The router's credentials and TLS material, all read before anything connects: a bad auth
/// file, upstream token file or certificate refuses the start, naming its flag, before the
/// router touches PostgreSQL or serves a request.
struct Credentials {
    access: Arc<access::Gate>,
    /// Presented to allocators on every forwarded request, when configured.
    upstream_token: Option<Arc<access::UpstreamToken>>,
    /// This router's own HTTPS listener.
    tls: Option<Arc<ServerTls>>,
    /// How allocators reached over HTTPS are verified (and this router's client certificate).
    upstream_tls: Option<Arc<ClientTls>>,
}

impl Credentials {
    fn load(config: &RouterConfig) -> anyhow::Result<Self> {
        // Credentials first: a bad auth or token file refuses the start before anything runs.
        let access = Arc::new(
            access::Gate::new(
                access::Role::Router,
                config.access.clone(),
                metrics::ACCESS_METRICS,
            )
            .map_err(|e| anyhow::anyhow!("{}: {e}", crate::config::ACCESS_FLAGS.auth_file))?,
        );
        let upstream_token = match &config.upstream_token_file {
            Some(path) => Some(Arc::new(access::UpstreamToken::load(
                crate::config::UPSTREAM_TOKEN_FLAG,
                path,
            )?)),
            None => None,
        };
        let tls = match config.tls.clone() {
            Some(settings) => Some(Arc::new(ServerTls::load(settings)?)),
            None => None,
        };
        let upstream_tls = match config.upstream_tls.clone() {
            Some(settings) => Some(Arc::new(ClientTls::load(settings)?)),
            None => None,
        };
        Ok(Self {
            access,
            upstream_token,
            tls,
            upstream_tls,
        })
    }
}

/// The router's storage: per shard a fence, a map-lookup pool and an orders pool
/// ([`db::ShardDb`]); the order store over the shards' orders pools; and the assignment cache
/// with a first attempt at loading the map. It is connected before the forwarder and the
/// background tasks exist, because both read through the cache.
struct Storage {
    shards: Vec<db::ShardDb>,
    orders: Arc<OrderStore>,
    cache: Arc<AssignmentCache>,
}

impl Storage {
    async fn connect(config: &RouterConfig) -> anyhow::Result<Self> {
        let shards = config
            .shards
            .iter()
            .map(|shard| db::ShardDb::new(config, shard))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // Every configured host of every shard is read before the first map read, so a router
        // that starts while a revived old primary is reachable again reads the newest one
        // (DESIGN.md §13). The shards are probed concurrently: one that does not answer delays
        // the others by at most its probe timeout.
        futures::future::join_all(shards.iter().map(|s| s.fence.probe_all())).await;
        for shard in &shards {
            edge::pg::require_session_pooling(&shard.fence, "router").await?;
        }
        let orders = Arc::new(OrderStore::new(
            shards.iter().map(|s| s.orders_pool.clone()).collect(),
            config.db_timeout,
            config.order_lock_wait(),
        ));
        let cache = Arc::new(AssignmentCache::with_shards(
            shards
                .iter()
                .map(|s| (s.name.clone(), s.pool.clone()))
                .collect(),
            config.db_timeout,
        ));
        match cache.refresh(RefreshCause::Startup, Instant::now()).await {
            Ok(Some(map)) => tracing::info!(
                revision = map.revision(),
                partition_count = map.partition_count(),
                shards = map.shard_count(),
                "assignment map loaded"
            ),
            Ok(None) => {
                if let Some(problem) = cache.placement().problem() {
                    tracing::warn!(problem, "starting unready")
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "starting without a complete assignment map; polling for it"
            ),
        }
        Ok(Self {
            shards,
            orders,
            cache,
        })
    }
}

/// The forwarder every worker shares: one upstream client (one connection pool) and the retry
/// policy that decides how long a request may look for the partition's owner.
fn build_forwarder(
    config: &RouterConfig,
    credentials: &Credentials,
    cache: &Arc<AssignmentCache>,
) -> anyhow::Result<Arc<Forwarder>> {
    // One client for all workers: one connection pool, explicit timeouts (the per-attempt
    // one is the forwarder's). Idle connections are dropped before the allocator's
    // keep-alive (actix's default, 5 s) would close them, so a request is rarely written into
    // a connection the server is just closing — a reset there is indistinguishable from a
    // crash and would count as "may have been applied".
    let mut http = UpstreamClient::new(
        config.upstream_connect_timeout,
        UPSTREAM_POOL_IDLE_TIMEOUT,
        UPSTREAM_POOL_MAX_IDLE,
    );
    // Allocators over HTTPS: verified against the configured CA, with this router's client
    // certificate when they require one. Plain-HTTP allocators are reached as before.
    if let Some(tls) = &credentials.upstream_tls {
        http = http.with_tls(tls.client_config()?);
    }
    Ok(Arc::new(
        Forwarder::new(
            http,
            cache.clone(),
            RetryPolicy {
                deadline: config.retry_deadline,
                backoff: Backoff {
                    base: config.backoff_base,
                    max: config.backoff_max,
                },
                attempt_timeout: config.upstream_request_timeout,
            },
        )
        .with_credential(credentials.upstream_token.clone()),
    ))
}

/// Start what keeps the router's view current while it serves, each watching `shutdown`: the
/// fences' probers (one per shard), the periodic map poll, the shards' settlement lag (on the
/// poll's interval), the Redis hint subscription (when
/// configured), the SIGHUP reloader of credentials and certificates, and the metrics upkeep.
fn start_background_tasks(
    config: &RouterConfig,
    credentials: &Credentials,
    storage: &Storage,
    metrics_handle: &PrometheusHandle,
    shutdown: &CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks: Vec<JoinHandle<()>> = storage
        .shards
        .iter()
        .map(|s| s.fence.spawn_prober(shutdown.clone().cancelled_owned()))
        .collect();
    tasks.push(tokio::spawn(poll::run(
        storage.cache.clone(),
        config.poll_interval,
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(settlement::watch(
        storage
            .shards
            .iter()
            .map(|s| (s.name.clone(), s.pool.clone()))
            .collect(),
        config.poll_interval,
        config.db_timeout,
        shutdown.clone(),
    )));
    match &config.redis_url {
        Some(url) => tasks.push(tokio::spawn(hints::run(
            HintsConfig {
                redis_url: url.clone(),
                reconnect_max: config.hints_reconnect_max,
                ping_interval: config.hints_ping_interval,
            },
            storage.cache.clone(),
            shutdown.clone(),
        ))),
        None => tracing::warn!("no redis url; routing by polling only"),
    }
    let mut reloadable: Vec<Arc<dyn access::tls::Reload>> = Vec::new();
    if let Some(tls) = &credentials.tls {
        reloadable.push(tls.clone());
    }
    if let Some(tls) = &credentials.upstream_tls {
        reloadable.push(tls.clone());
    }
    tasks.push(access::spawn_sighup_reloader(
        credentials.access.clone(),
        credentials.upstream_token.clone(),
        reloadable,
        shutdown.clone(),
    )?);
    tasks.push(tokio::spawn(edge::metrics::run_upkeep(
        metrics_handle.clone(),
        shutdown.clone(),
    )));
    Ok(tasks)
}

/// The HTTP server on the listener bound by [`Application::build`]: access control inside the
/// request id (so refusals carry and log it), the routes, the operations console, and a problem
/// document for anything else. actix's own signal handling is disabled (one shutdown path).
fn serve_http(
    config: &RouterConfig,
    listener: TcpListener,
    tls: Option<&ServerTls>,
    access: &Arc<access::Gate>,
    state: web::Data<AppState>,
) -> anyhow::Result<Server> {
    let access = access.clone();
    let console = crate::console::Console::new();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            // Inside the request id, so refusals carry and log it.
            .wrap(access::AccessControl::new(access.clone()))
            // Stages from the access gate on, logged in the request's span.
            .wrap_fn(crate::forward::stages::middleware)
            .wrap_fn(edge::request_id::middleware)
            .wrap_fn(crate::console::record)
            // Outermost: everything above takes its decisions on the path the handler will see.
            .wrap_fn(edge::canonical::middleware)
            .configure(routes::configure)
            .configure(|cfg| console.configure(cfg))
            .default_service(web::to(edge::problem::not_found))
    })
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_GRACE_SECONDS);
    let mut server = match tls {
        Some(tls) => server.listen_rustls_0_23(listener, tls.server_config()?)?,
        None => server.listen(listener)?,
    };
    if let Some(workers) = config.workers {
        server = server.workers(workers);
    }
    Ok(server.run())
}

/// The task that turns the shutdown token into a graceful HTTP stop (in-flight requests
/// finish), so that cancelling the token is the one way to stop the server.
fn stop_http_on_shutdown(server: &Server, shutdown: &CancellationToken) -> JoinHandle<()> {
    let handle = server.handle();
    let stop_signal = shutdown.clone();
    tokio::spawn(async move {
        stop_signal.cancelled().await;
        tracing::info!("shutdown requested; draining http requests");
        handle.stop(true).await;
    })
}
