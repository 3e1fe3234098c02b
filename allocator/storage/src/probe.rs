//! The prober: every configured host read once per interval over a session of its own.
//!
//! Connection attempts only learn about the hosts they try, in order, and stop at the first
//! writable one; the prober reads all of them, so a promotion is learnt even while every pooled
//! connection still leads to the old primary, and a revived old primary is reported
//! (`stale_writable_servers`) even when nothing tries to connect to it. From the primary it also
//! reads the standbys' state for the replication gauges.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

use crate::fence::StorageFence;
use crate::identity::{self, Refusal, ServerIdentity, Verdict};

const REPLICATION_SQL: &str = "
SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')),
       coalesce(max(extract(epoch FROM replay_lag)), 0)::float8
  FROM pg_stat_replication";

/// A host's last verdict, to log changes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Unreachable,
    Is(Verdict),
}

impl StorageFence {
    /// Probes every host each `probe_interval` until `stop` resolves, keeping one session per
    /// host; sets the stale-server and replication gauges and logs each host's verdict when it
    /// changes.
    pub fn spawn_prober(
        self: &Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        let fence = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = run(fence) => {}
            }
        })
    }
}

async fn run(fence: Arc<StorageFence>) {
    let hosts = fence.host_list().to_vec();
    let settings = fence.settings().clone();
    let mut sessions: Vec<Option<Client>> = hosts.iter().map(|_| None).collect();
    let mut seen: Vec<Option<Seen>> = hosts.iter().map(|_| None).collect();
    let mut ticker = tokio::time::interval(settings.probe_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut stale_writable = 0;
        for (i, (label, config)) in hosts.iter().enumerate() {
            let read = tokio::time::timeout(settings.probe_timeout, async {
                if sessions[i].as_ref().is_none_or(Client::is_closed) {
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(connection);
                    sessions[i] = Some(client);
                }
                let client = sessions[i].as_ref().expect("connected above");
                let server = identity::read(client).await?;
                let replication = if server.read_only {
                    None
                } else {
                    let row = client.query_one(REPLICATION_SQL, &[]).await?;
                    Some((row.get::<_, i64>(0), row.get::<_, f64>(1)))
                };
                Ok::<_, tokio_postgres::Error>((server, replication))
            })
            .await;
            let now = match read {
                Ok(Ok((server, replication))) => {
                    let verdict = fence.judge(&server, label, false);
                    if verdict == Verdict::Refused(Refusal::Behind) && !server.read_only {
                        stale_writable += 1;
                    }
                    if let (Verdict::Writable, Some((sync, lag))) = (verdict, replication) {
                        let labels = settings.labels(&[]);
                        metrics::gauge!(settings.metrics.sync_standbys, labels.iter())
                            .set(sync as f64);
                        metrics::gauge!(settings.metrics.replication_lag, labels.iter()).set(lag);
                    }
                    report_change(label, &server, verdict, seen[i]);
                    Seen::Is(verdict)
                }
                _ => {
                    sessions[i] = None;
                    if seen[i].is_some_and(|s| s != Seen::Unreachable) {
                        tracing::info!(host = %label, "storage prober: host unreachable");
                    }
                    Seen::Unreachable
                }
            };
            seen[i] = Some(now);
        }
        let labels = settings.labels(&[]);
        metrics::gauge!(settings.metrics.stale_writable_servers, labels.iter())
            .set(stale_writable as f64);
    }
}

fn report_change(label: &str, server: &ServerIdentity, verdict: Verdict, before: Option<Seen>) {
    if before == Some(Seen::Is(verdict)) {
        return;
    }
    let (timeline, generation) = server.position();
    match verdict {
        Verdict::Refused(cause) => tracing::warn!(
            host = %label,
            cause = cause.label(),
            timeline,
            generation,
            writable = !server.read_only,
            "storage prober: host refused: {cause}"
        ),
        Verdict::ReadOnly => {
            tracing::info!(host = %label, timeline, generation, "storage prober: host is a standby")
        }
        Verdict::Writable => {
            tracing::info!(host = %label, timeline, generation, "storage prober: host is the primary")
        }
    }
}
