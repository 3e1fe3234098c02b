//! Wiring of one allocator replica: pools, ownership, lease manager, workers, HTTP server, the
//! metrics upkeep timer, and one shutdown signal that every task watches.
//!
//! [`Application::build`] runs the startup steps of `startup` in a fixed order, each a function
//! of its own: what can refuse the start is checked before anything connects, storage is
//! connected before any task starts, the lease manager starts before the singleton jobs, and
//! HTTP is served last.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::clock::SystemClock;
use crate::config::AllocatorConfig;
use crate::replica::ownership::Ownership;

mod startup;

use startup::{serve_http, start_jobs, start_lease_manager, start_upkeep, Front, Storage};

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
        let front = Front::prepare(&config)?;
        let storage = Storage::connect(&config, front.timing).await?;

        // Before any task starts: values set while no recorder is installed are dropped, and
        // gauges that are set once at start (the settlement window, a replica's job leader = 0)
        // would then never be exported.
        let metrics = crate::metrics::install();
        metrics::gauge!(crate::metrics::SHARD_PARTITIONS, "shard" => storage.shard.shard.to_string())
            .set(storage.shard.partitions.len() as f64);
        let shutdown = CancellationToken::new();
        let ownership = Arc::new(Ownership::new(
            storage.partition_count,
            Arc::new(SystemClock),
            front.timing,
        ));
        let replica = start_lease_manager(
            &config,
            &storage,
            &front.advertise_url,
            &ownership,
            &shutdown,
        )?;
        let jobs = start_jobs(&config, &storage, front.timing, &shutdown)?;
        let upkeep = start_upkeep(&storage.fence, &front, &metrics, &shutdown)?;
        let readiness = storage.job_pool(&config, front.timing, "readyz", 1)?;
        let state = web::Data::new(AppState {
            pool: storage.pool,
            ownership: ownership.clone(),
            partition_count: storage.partition_count,
            request_timeout: config.request_timeout,
            metrics,
            ready: replica.ready,
            shutdown: shutdown.clone(),
            access: front.access,
            readiness: crate::api::readiness::Readiness::new(readiness),
        });
        let Front {
            tls,
            timing,
            listener,
            port,
            advertise_url,
            ..
        } = front;
        let server = serve_http(&config, listener, tls.as_deref(), state)?;
        tracing::info!(
            replica_id = %config.replica_id,
            port,
            advertise_url = %advertise_url,
            tls = tls.is_some(),
            client_certificates = tls.as_ref().is_some_and(|t| t.requires_client_certificates()),
            partition_count = storage.partition_count,
            lease_ttl_ms = timing.ttl.as_millis() as u64,
            "allocator replica started"
        );
        Ok(Self {
            port,
            advertise_url,
            server,
            shutdown,
            manager_task: replica.manager_task,
            settlement_task: jobs.settlement_task,
            retention_task: jobs.retention_task,
            hint_task: replica.hint_task,
            metrics_task: upkeep.metrics_task,
            reload_task: upkeep.reload_task,
            fence_task: upkeep.fence_task,
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
