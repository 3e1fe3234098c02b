//! Pools whose every connection leads to the newest primary the fence knows.
//!
//! - **Connect** (a deadpool-postgres [`Connect`]): tries the configured hosts in order, reads
//!   each one's identity and takes the first the fence judges writable. tokio-postgres' own
//!   multi-host handling (`target_session_attrs=read-write`) would take the first host that
//!   accepts writes, which after a failover can be the revived old primary.
//! - **post_create**: reads the new connection's identity again and refuses it (the pool answers
//!   an error; the services answer `503`) unless it is the newest writable primary. When no host
//!   is acceptable, Connect hands over a connection to a refused one so that this refusal is
//!   what the caller sees.
//! - **pre_recycle**: a connection made before the known position last rose is dropped, not
//!   reused: it may lead to the server that was just superseded. Checking costs no round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{
    Connect, Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
};
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

use crate::fence::StorageFence;
use crate::identity::{self, Verdict};

/// Sizes and timeouts of one pool; deadpool waits forever unless told otherwise.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    pub size: usize,
    pub wait: Duration,
    pub create: Duration,
    pub recycle: Duration,
}

/// A pool of connections to the newest primary among `config`'s hosts. `config` carries the
/// pool's client-side session settings (application name, timeouts); its hosts must be the
/// fence's. `setup` (SQL, e.g. `SET` statements) runs once on every new connection before it
/// is judged: server-side settings go there rather than in the startup packet's `options`,
/// which PgBouncer refuses ("unsupported startup parameter").
pub fn build_pool(
    fence: &Arc<StorageFence>,
    config: Config,
    limits: &PoolLimits,
    setup: String,
) -> anyhow::Result<Pool> {
    let manager = Manager::from_connect(
        config,
        FencedConnect {
            fence: fence.clone(),
        },
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let on_create = fence.clone();
    let recycle = fence.clone();
    Ok(Pool::builder(manager)
        .max_size(limits.size)
        .wait_timeout(Some(limits.wait))
        .create_timeout(Some(limits.create))
        .recycle_timeout(Some(limits.recycle))
        .runtime(Runtime::Tokio1)
        .post_create(Hook::async_fn(move |client, _| {
            let fence = on_create.clone();
            let setup = setup.clone();
            Box::pin(async move {
                if !setup.is_empty() {
                    client
                        .batch_execute(&setup)
                        .await
                        .map_err(HookError::Backend)?;
                }
                validate(&fence, client).await
            })
        }))
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if recycle.superseded(metrics.created) {
                Err(HookError::message(
                    "storage fence: connection predates the newest primary",
                ))
            } else {
                Ok(())
            }
        }))
        .build()?)
}

/// Connects once, outside any pool, to the newest writable primary among `config`'s hosts (the
/// fence's), for `migrate` and sessions that must stay connected, such as `LISTEN`. Every host
/// is read first, so a revived old primary listed first is not taken.
pub async fn connect(fence: &Arc<StorageFence>, config: &Config) -> anyhow::Result<Client> {
    fence.probe_all().await;
    let (client, _connection_task) = FencedConnect {
        fence: fence.clone(),
    }
    .open(config)
    .await?;
    validate(fence, &client)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(client)
}

/// The post-create check: the connection's server must be the newest writable primary.
async fn validate(fence: &StorageFence, client: &Client) -> Result<(), HookError> {
    let server = identity::read(client).await.map_err(HookError::Backend)?;
    match fence.judge(&server, "new connection", false) {
        Verdict::Writable if fence.settings().stamp && server.needs_stamp() => {
            client
                .execute("SELECT storage_stamp(false)", &[])
                .await
                .map_err(HookError::Backend)?;
            let stamped = identity::read(client).await.map_err(HookError::Backend)?;
            fence.judge(&stamped, "new connection", false);
            Ok(())
        }
        Verdict::Writable => Ok(()),
        Verdict::ReadOnly => Err(HookError::message(
            "storage fence: no configured server is a writable primary (only standbys answered)",
        )),
        Verdict::Refused(cause) => Err(HookError::message(format!(
            "storage fence: no configured server is the newest writable primary (refused: {cause})"
        ))),
    }
}

struct FencedConnect {
    fence: Arc<StorageFence>,
}

impl FencedConnect {
    async fn open(
        &self,
        config: &Config,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        let mut fallback = None;
        let mut last_error = None;
        for (label, host) in StorageFence::hosts_of(config) {
            let (client, connection) = match host.connect(NoTls).await {
                Ok(pair) => pair,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            match identity::read(&client).await {
                Ok(server) => {
                    if self.fence.judge(&server, &label, true) == Verdict::Writable {
                        return Ok((client, task));
                    }
                    fallback.get_or_insert((client, task));
                }
                Err(e) => last_error = Some(e),
            }
        }
        match (fallback, last_error) {
            (Some(refused), _) => Ok(refused),
            (None, Some(error)) => Err(error),
            (None, None) => unreachable!("a fence has at least one host"),
        }
    }
}

impl Connect for FencedConnect {
    fn connect(
        &self,
        pg_config: &Config,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<(Client, JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        let config = pg_config.clone();
        Box::pin(async move { self.open(&config).await })
    }
}

/// A session outside any pool that must see the server's notifications (`LISTEN`), made and
/// judged like a pooled one: the hosts are read first, and the session goes to the first host
/// the fence judges the newest writable primary, never to a revived old one. Its notifications
/// arrive on the returned channel, which closes when the session ends; the returned instant is
/// when it was made, for [`StorageFence::superseded`] (a session made before the known position
/// rose should be ended and made again).
pub async fn connect_listening(
    fence: &Arc<StorageFence>,
    config: &Config,
) -> anyhow::Result<(Client, UnboundedReceiver<Notification>, Instant)> {
    use futures::StreamExt;

    fence.probe_all().await;
    let mut refusals = Vec::new();
    for (label, host) in StorageFence::hosts_of(config) {
        let created = Instant::now();
        let (client, mut connection) = match host.connect(NoTls).await {
            Ok(pair) => pair,
            Err(e) => {
                refusals.push(format!("{label}: {e}"));
                continue;
            }
        };
        let (tx, rx) = mpsc::unbounded_channel();
        // Notifications are delivered only while the connection is polled, including while the
        // identity is read and `LISTEN` runs: a task of its own polls it from the start.
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(notification) = message {
                    let _ = tx.send(notification);
                }
            }
        });
        match identity::read(&client).await {
            Ok(server) => match fence.judge(&server, &label, true) {
                Verdict::Writable => return Ok((client, rx, created)),
                other => refusals.push(format!("{label}: {other:?}")),
            },
            Err(e) => refusals.push(format!("{label}: {e}")),
        }
    }
    anyhow::bail!(
        "storage fence: no configured server is the newest writable primary for a listening \
         session ({})",
        refusals.join("; ")
    )
}
