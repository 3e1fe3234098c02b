//! Wiring of one allocator replica: pools, ownership, lease manager, workers, HTTP server, the
//! metrics upkeep timer, and one shutdown signal that every task watches.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpServer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::clock::SystemClock;
use crate::commit::{CommitSettings, Committer};
use crate::config::AllocatorConfig;
use crate::events::{self, RelaySettings};
use crate::hint_publisher::HintPublisher;
use crate::lease::state::LeaseTiming;
use crate::replica::manager::{LeaseManager, ManagerSettings};
use crate::replica::ownership::Ownership;
use crate::retention::{Retention, RetentionSettings};
use crate::sessions::{build_fenced_pool, PoolSettings};
use crate::settlement::{Settlement, SettlementSettings};
use crate::singleton::{self, JobSettings};
use crate::worker::WorkerContext;
use storage::StorageFence;

pub struct Application {
    port: u16,
    advertise_url: String,
    server: actix_web::dev::Server,
    shutdown: CancellationToken,
    manager_task: JoinHandle<()>,
    settlement_task: JoinHandle<()>,
    retention_task: JoinHandle<()>,
    hint_task: Option<JoinHandle<()>>,
    metrics_task: JoinHandle<()>,
    reload_task: JoinHandle<()>,
    fence_task: JoinHandle<()>,
    ownership: Arc<Ownership>,
}

impl Application {
    /// Bind, connect and start the lease manager. The cluster must be initialised
    /// (`allocator migrate`). An invalid configuration is refused before anything starts.
    pub async fn build(config: AllocatorConfig) -> anyhow::Result<Self> {
        config.validate()?;
        // Before anything starts: an unreadable auth file refuses the start, naming file:line.
        crate::metrics::install();
        let access = Arc::new(
            access::Gate::new(
                access::Role::Allocator,
                config.access.clone(),
                crate::metrics::ACCESS_METRICS,
            )
            .map_err(|e| anyhow::anyhow!("{}: {e}", crate::config::ACCESS_FLAGS.auth_file))?,
        );
        // TLS material too: a certificate that does not parse refuses the start, naming its flag.
        let tls = match config.tls.clone() {
            Some(settings) => Some(Arc::new(access::tls::ServerTls::load(settings)?)),
            None => None,
        };
        let timing = LeaseTiming::new(config.lease_ttl, config.lease_margin, config.renew_interval)
            .map_err(anyhow::Error::msg)?;
        let listener = TcpListener::bind(config.listen)?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let advertise_url = config
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{}:{port}", config.listen.ip()));

        let pool_settings = PoolSettings {
            size: config.pool_size.get(),
            wait: config.pool_wait,
            statement_timeout: config.statement_timeout,
            idle_in_transaction_timeout: config.idle_in_transaction_timeout,
            lock_timeout: config.lock_timeout,
            connect_timeout: crate::sessions::CONNECT_TIMEOUT,
            application_name: format!("allocator:{}", config.replica_id),
        };
        // Before any pool connects: read every configured host, so that the first connection
        // already knows the newest primary (DESIGN.md §13).
        let fence: std::sync::Arc<StorageFence> =
            crate::sessions::fence(&config.database_url, &pool_settings.application_name)?;
        fence.probe_all().await;
        let pool = build_fenced_pool(&fence, &pool_settings)?;
        // Lease statements must never wait long for a lock held by a paused peer's transaction:
        // a short lock timeout turns that wait into a failed (retried) campaign step.
        let lease_pool = build_fenced_pool(
            &fence,
            &PoolSettings {
                size: 4,
                wait: timing.renew_interval / 2,
                lock_timeout: timing.renew_interval / 2,
                connect_timeout: crate::sessions::CONNECT_TIMEOUT,
                application_name: format!("allocator:{}:leases", config.replica_id),
                ..pool_settings.clone()
            },
        )?;
        let partition_count = {
            let client = pool.get().await?;
            crate::negative_control::install(&client).await?;
            // Ledger partitions ahead of the clock before the first write (the retention job
            // keeps them ahead from then on); a failure here is retried on its first tick.
            if let Err(error) = crate::retention::partitions::upkeep(&**client).await {
                tracing::warn!(error = %crate::error::describe(&error), "ledger partition upkeep failed");
            }
            schema::partition_count(&client).await?
        };

        // Before any task starts: values set while no recorder is installed are dropped, and
        // gauges that are set once at start (the settlement window, a replica's job leader = 0)
        // would then never be exported.
        let metrics = crate::metrics::install();
        let shutdown = CancellationToken::new();
        let ownership = Arc::new(Ownership::new(
            partition_count,
            Arc::new(SystemClock),
            timing,
        ));
        let (committer, _lanes) = Committer::spawn(
            pool.clone(),
            CommitSettings {
                lanes: config.commit_lanes,
                min_lanes: config.min_commit_lanes,
                max_partitions: config.group_max_partitions.get(),
                max_commands: config.batch_max.get().saturating_mul(4),
                pool_wait: config.pool_wait,
                set_based_reserves: config.set_based_reserves,
            },
        );
        let workers = Arc::new(WorkerContext {
            committer,
            replica_id: config.replica_id.clone(),
            batch_max: config.batch_max.get(),
            queue_capacity: config.queue_capacity.get(),
            expiry_interval: config.expiry_interval,
            expiry_batch: config.expiry_batch.get() as i64,
        });
        let (hints, hint_task) = match &config.redis_url {
            Some(url) => {
                let (publisher, task) = HintPublisher::spawn(url, shutdown.clone())?;
                (publisher, Some(task))
            }
            None => (HintPublisher::disabled(), None),
        };
        let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
        let manager = LeaseManager::new(
            ManagerSettings {
                replica_id: config.replica_id.clone(),
                advertise_url: advertise_url.clone(),
                campaign_interval: config.campaign_interval,
                handoff_listen: config.handoff_listen,
            },
            config.database_url.clone(),
            lease_pool,
            ownership.clone(),
            workers,
            hints,
            ready_tx,
        );
        let manager_task = manager.start(shutdown.clone());
        // Each job has a pool of its own: it never takes a connection a request or a renewal
        // waits for.
        // The change-event relay runs beside settlement under its lease (DESIGN.md §14). Its lag
        // is exported by every replica (0 unless it runs the relay), so the lag alert always has
        // a series to read.
        metrics::gauge!(crate::metrics::EVENTS_LAG_ENTRIES).set(0.0);
        metrics::gauge!(crate::metrics::EVENTS_LAG_SECONDS).set(0.0);
        let relay =
            config
                .events
                .as_ref()
                .zip(config.redis_url.as_ref())
                .map(|(events, redis_url)| RelaySettings {
                    redis_url: redis_url.clone(),
                    batch: events.batch.get(),
                    max_len: events.max_len.get(),
                    interval: events.interval,
                });
        let job_pool = |job: &str, size: usize| {
            build_fenced_pool(
                &fence,
                &PoolSettings {
                    size,
                    wait: timing.renew_interval / 2,
                    lock_timeout: timing.renew_interval / 2,
                    connect_timeout: crate::sessions::CONNECT_TIMEOUT,
                    application_name: format!("allocator:{}:{job}", config.replica_id),
                    ..pool_settings.clone()
                },
            )
        };
        let job_settings = |poll_interval| JobSettings {
            holder_id: config.replica_id.clone(),
            poll_interval,
            campaign_interval: config.campaign_interval,
            timing,
        };
        // The relay takes a third connection of the settlement job's pool.
        let settlement_pool = job_pool("settlement", if relay.is_some() { 3 } else { 2 })?;
        let companion = relay.map(|relay| -> singleton::Companion {
            Box::new(
                move |term, pool, stop| match events::spawn(relay, pool, term, stop) {
                    Ok(task) => Some(task),
                    Err(error) => {
                        tracing::error!(%error, "event relay not started");
                        None
                    }
                },
            )
        });
        let settlement_task = singleton::spawn_with(
            Settlement::new(SettlementSettings {
                holder_id: config.replica_id.clone(),
                window: config.settlement_window,
                grace: config.settlement_grace,
            }),
            job_settings(config.settlement_window.min(Duration::from_secs(1))),
            settlement_pool,
            Arc::new(SystemClock),
            companion,
            shutdown.clone(),
        );
        let retention = RetentionSettings {
            holder_id: config.replica_id.clone(),
            horizon: config.idempotency_horizon,
            batch: config.retention_batch.get(),
            archive: config.ledger_archive_dir.clone().map(|dir| {
                crate::retention::archive::ArchiveSettings {
                    dir,
                    horizon: config.idempotency_horizon,
                    require_relay: config.events.is_some(),
                }
            }),
        };
        let retention_poll = retention.poll_interval();
        let retention_task = singleton::spawn(
            Retention::new(retention),
            job_settings(retention_poll),
            job_pool("retention", 2)?,
            Arc::new(SystemClock),
            shutdown.clone(),
        );

        let fence_task = fence.spawn_prober(shutdown.clone().cancelled_owned());
        let reloadable: Vec<Arc<dyn access::tls::Reload>> = tls
            .iter()
            .map(|tls| tls.clone() as Arc<dyn access::tls::Reload>)
            .collect();
        let reload_task =
            access::spawn_sighup_reloader(access.clone(), None, reloadable, shutdown.clone())?;
        let metrics_task = tokio::spawn(crate::metrics::run_upkeep(
            metrics.clone(),
            shutdown.clone(),
        ));
        let state = web::Data::new(AppState {
            pool,
            ownership: ownership.clone(),
            partition_count,
            request_timeout: config.request_timeout,
            metrics,
            ready: ready_rx,
            shutdown: shutdown.clone(),
            access,
        });
        let server = HttpServer::new(move || api::app(state.clone()))
            .workers(config.http_workers.get())
            .disable_signals()
            .shutdown_timeout(5);
        let server = match &tls {
            Some(tls) => server.listen_rustls_0_23(listener, tls.server_config()?)?,
            None => server.listen(listener)?,
        }
        .run();
        tracing::info!(
            replica_id = %config.replica_id,
            port,
            advertise_url = %advertise_url,
            tls = tls.is_some(),
            client_certificates = tls.as_ref().is_some_and(|t| t.requires_client_certificates()),
            partition_count,
            lease_ttl_ms = timing.ttl.as_millis() as u64,
            "allocator replica started"
        );
        Ok(Self {
            port,
            advertise_url,
            server,
            shutdown,
            manager_task,
            settlement_task,
            retention_task,
            hint_task,
            metrics_task,
            reload_task,
            fence_task,
            ownership,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn advertise_url(&self) -> &str {
        &self.advertise_url
    }

    /// Cancel this to stop the replica gracefully (leases are released first).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub fn ownership(&self) -> Arc<Ownership> {
        self.ownership.clone()
    }

    /// Serve until the shutdown token fires, then release every lease, then stop HTTP.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let handle = self.server.handle();
        let server = tokio::spawn(self.server);
        self.shutdown.cancelled().await;
        tracing::info!("shutdown requested");
        let _ = tokio::join!(self.manager_task, self.settlement_task, self.retention_task);
        if let Some(task) = self.hint_task {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        handle.stop(true).await;
        let _ = server.await;
        let _ = self.metrics_task.await;
        let _ = self.reload_task.await;
        let _ = self.fence_task.await;
        tracing::info!("allocator replica stopped");
        Ok(())
    }
}
