//! The startup steps of [`super::Application::build`], in the order it runs them. Each step is
//! a function of its own so that what it starts, and why it comes where it does, can be read
//! (and changed) without the rest of the wiring.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpServer};
use deadpool_postgres::Pool;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;
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
use access::tls::ServerTls;
use storage::StorageFence;

/// Everything that can refuse the start without touching the network: credentials, TLS
/// material, lease timing, and the bound listener (whose port decides the advertised URL).
/// It is gathered first so that a misconfigured replica never connects, campaigns or serves.
pub(super) struct Front {
    pub(super) access: Arc<access::Gate>,
    pub(super) tls: Option<Arc<ServerTls>>,
    pub(super) timing: LeaseTiming,
    pub(super) listener: TcpListener,
    pub(super) port: u16,
    pub(super) advertise_url: String,
}

impl Front {
    pub(super) fn prepare(config: &AllocatorConfig) -> anyhow::Result<Self> {
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
            Some(settings) => Some(Arc::new(ServerTls::load(settings)?)),
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
        Ok(Self {
            access,
            tls,
            timing,
            listener,
            port,
            advertise_url,
        })
    }
}

/// The replica's storage: the process's one fence, the request pool, the lease pool, and the
/// partition count read from the cluster. It is connected before any task starts, because the
/// ownership table is sized by the partition count and every task writes through these pools.
pub(super) struct Storage {
    pub(super) fence: Arc<StorageFence>,
    pub(super) pool: Pool,
    pub(super) lease_pool: Pool,
    /// The request pool's settings, from which each job's pool is derived.
    pub(super) pool_settings: PoolSettings,
    pub(super) partition_count: u32,
    /// The shard this replica serves, checked against the catalog's map.
    pub(super) shard: schema::shard::ShardRecord,
}

impl Storage {
    pub(super) async fn connect(
        config: &AllocatorConfig,
        timing: LeaseTiming,
    ) -> anyhow::Result<Self> {
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
        let fence = crate::sessions::remembering_fence(
            &config.database_url,
            &pool_settings.application_name,
            config.fence_memory.clone(),
        )?;
        fence.probe_all().await;
        edge::pg::require_session_pooling(&fence, &pool_settings.application_name).await?;
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
        let (partition_count, shard) = {
            let client = pool.get().await?;
            crate::negative_control::install(&client).await?;
            // Ledger partitions ahead of the clock before the first write (the retention job
            // keeps them ahead from then on); a failure here is retried on its first tick.
            if let Err(error) = crate::retention::partitions::upkeep(&**client).await {
                tracing::warn!(error = %crate::error::describe(&error), "ledger partition upkeep failed");
            }
            let shard =
                crate::shard::check_at_start(&client, config.catalog_url.as_deref()).await?;
            tracing::info!(shard = %shard.shard, partitions = ?shard.partitions, "serving shard");
            (schema::partition_count(&**client).await?, shard)
        };
        Ok(Self {
            fence,
            pool,
            lease_pool,
            pool_settings,
            partition_count,
            shard,
        })
    }

    /// A pool of its own for one singleton job (or `/readyz`'s check), so that it never takes a
    /// connection a request or a renewal waits for; its waits are bounded like the lease pool's.
    pub(super) fn job_pool(
        &self,
        config: &AllocatorConfig,
        timing: LeaseTiming,
        job: &str,
        size: usize,
    ) -> anyhow::Result<Pool> {
        build_fenced_pool(
            &self.fence,
            &PoolSettings {
                size,
                wait: timing.renew_interval / 2,
                lock_timeout: timing.renew_interval / 2,
                connect_timeout: crate::sessions::CONNECT_TIMEOUT,
                application_name: format!("allocator:{}:{job}", config.replica_id),
                ..self.pool_settings.clone()
            },
        )
    }
}

/// What the lease manager leaves running: its own task, the Redis hint publisher it announces
/// ownership changes through, and the readiness flag it raises after its first campaign round.
pub(super) struct Replica {
    pub(super) manager_task: JoinHandle<()>,
    pub(super) hint_task: Option<JoinHandle<()>>,
    pub(super) ready: watch::Receiver<bool>,
}

/// Start the commit lanes, the partition workers' context and the lease manager that campaigns
/// for partitions and hands them to workers. It starts before the singleton jobs and HTTP so that
/// ownership is being decided from the first moment a request can arrive.
pub(super) fn start_lease_manager(
    config: &AllocatorConfig,
    storage: &Storage,
    advertise_url: &str,
    ownership: &Arc<Ownership>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Replica> {
    let (committer, _lanes) = Committer::spawn(
        storage.pool.clone(),
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
    let (ready_tx, ready) = watch::channel(false);
    let manager = LeaseManager::new(
        ManagerSettings {
            replica_id: config.replica_id.clone(),
            advertise_url: advertise_url.to_owned(),
            campaign_interval: config.campaign_interval,
            handoff_listen: config.handoff_listen,
        },
        storage.fence.clone(),
        storage.lease_pool.clone(),
        ownership.clone(),
        workers,
        hints,
        ready_tx,
    );
    let manager_task = manager.start(shutdown.clone());
    Ok(Replica {
        manager_task,
        hint_task,
        ready,
    })
}

/// The cluster-wide singleton jobs this replica campaigns for.
pub(super) struct Jobs {
    pub(super) settlement_task: JoinHandle<()>,
    pub(super) retention_task: JoinHandle<()>,
}

/// Start settlement (with the change-event relay beside it, when configured) and retention,
/// each under a lease of its own so that exactly one replica of the cluster runs it. Each job has
/// a pool of its own: it never takes a connection a request or a renewal waits for.
/// Where a shard's ledger archives go: `--ledger-archive-dir` itself for the one-database
/// default shard, `DIR/<shard>` for a shard of several, whose archives of the same time range
/// would otherwise take the same file names as another shard's.
fn shard_archive_dir(
    dir: std::path::PathBuf,
    shard: &schema::shard::ShardName,
) -> std::path::PathBuf {
    if *shard == schema::shard::ShardName::default_shard() {
        dir
    } else {
        dir.join(shard.as_str())
    }
}

pub(super) fn start_jobs(
    config: &AllocatorConfig,
    storage: &Storage,
    timing: LeaseTiming,
    shutdown: &CancellationToken,
) -> anyhow::Result<Jobs> {
    // The change-event relay runs beside settlement under its lease (DESIGN.md §14). Its lag
    // is exported by every replica (0 unless it runs the relay), so the lag alert always has
    // a series to read.
    metrics::gauge!(crate::metrics::EVENTS_LAG_ENTRIES).set(0.0);
    metrics::gauge!(crate::metrics::EVENTS_LAG_SECONDS).set(0.0);
    let relay = config
        .events
        .as_ref()
        .zip(config.redis_url.as_ref())
        .map(|(events, redis_url)| RelaySettings {
            redis_url: redis_url.clone(),
            batch: events.batch.get(),
            max_len: events.max_len.get(),
            interval: events.interval,
            settlement: schema::events::Stream::settlement_of(&storage.shard),
        });
    let shard = storage.shard.shard.to_string();
    let job_settings = |poll_interval| JobSettings {
        holder_id: config.replica_id.clone(),
        shard: shard.clone(),
        poll_interval,
        campaign_interval: config.campaign_interval,
        timing,
    };
    // The relay takes a third connection of the settlement job's pool.
    let settlement_pool = storage.job_pool(
        config,
        timing,
        "settlement",
        if relay.is_some() { 3 } else { 2 },
    )?;
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
            shard: shard.clone(),
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
                dir: shard_archive_dir(dir, &storage.shard.shard),
                horizon: config.idempotency_horizon,
                require_relay: config.events.is_some(),
            }
        }),
        other_shards: config
            .shards
            .iter()
            .filter(|target| target.name != storage.shard.shard)
            .map(|target| target.url.clone())
            .collect(),
        shard: shard.clone(),
    };
    let retention_poll = retention.poll_interval();
    let retention_task = singleton::spawn(
        Retention::new(retention),
        job_settings(retention_poll),
        storage.job_pool(config, timing, "retention", 2)?,
        Arc::new(SystemClock),
        shutdown.clone(),
    );
    Ok(Jobs {
        settlement_task,
        retention_task,
    })
}

/// The replica's housekeeping tasks.
pub(super) struct Upkeep {
    pub(super) fence_task: JoinHandle<()>,
    pub(super) reload_task: JoinHandle<()>,
    pub(super) metrics_task: JoinHandle<()>,
}

/// Start the housekeeping that keeps the replica's view current while it runs: the fence's
/// prober (a promotion is learnt even while no connection is made), the SIGHUP reloader of
/// credentials and certificates, and the metrics recorder's upkeep.
pub(super) fn start_upkeep(
    fence: &Arc<StorageFence>,
    front: &Front,
    metrics: &PrometheusHandle,
    shutdown: &CancellationToken,
) -> anyhow::Result<Upkeep> {
    let fence_task = fence.spawn_prober(shutdown.clone().cancelled_owned());
    let reloadable: Vec<Arc<dyn access::tls::Reload>> = front
        .tls
        .iter()
        .map(|tls| tls.clone() as Arc<dyn access::tls::Reload>)
        .collect();
    let reload_task =
        access::spawn_sighup_reloader(front.access.clone(), None, reloadable, shutdown.clone())?;
    let metrics_task = tokio::spawn(edge::metrics::run_upkeep(metrics.clone(), shutdown.clone()));
    Ok(Upkeep {
        fence_task,
        reload_task,
        metrics_task,
    })
}

/// Serve the API on the listener bound at the start, over TLS when configured. actix's own
/// signal handling is disabled: the shutdown token is the replica's only stop signal, and
/// [`super::Application::run_until_stopped`] stops the server after the leases are released.
pub(super) fn serve_http(
    config: &AllocatorConfig,
    listener: TcpListener,
    tls: Option<&ServerTls>,
    state: web::Data<AppState>,
) -> anyhow::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || api::app(state.clone()))
        .workers(config.http_workers.get())
        .disable_signals()
        .shutdown_timeout(5);
    let server = match tls {
        Some(tls) => server.listen_rustls_0_23(listener, tls.server_config()?)?,
        None => server.listen(listener)?,
    }
    .run();
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::shard_archive_dir;
    use schema::shard::ShardName;
    use std::path::PathBuf;

    #[test]
    fn each_shard_of_several_archives_into_its_own_directory() {
        let dir = PathBuf::from("/archive");
        let main = ShardName::default_shard();
        assert_eq!(shard_archive_dir(dir.clone(), &main), dir);
        let s1: ShardName = "s1".parse().unwrap();
        assert_eq!(shard_archive_dir(dir.clone(), &s1), dir.join("s1"));
    }
}
