//! The process-wide fence: what this process knows of the cluster, applied to every server it
//! connects to, kept fresh by a prober that reads every configured host once per interval.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;
use tokio_postgres::{Config, NoTls};

use crate::identity::{self, Known, ServerIdentity, Verdict};

/// Metric names, declared in each service's `metrics.rs` (they are a contract with the alerts).
/// What each counts is the same in both services.
#[derive(Debug, Clone, Copy)]
pub struct MetricNames {
    /// Counter: connection attempts that reached a server the fence refused, by `cause`:
    /// `behind` (an old primary superseded by a promotion), `foreign` (another cluster, e.g. a
    /// restored copy), `not_serving` (a copy being restored).
    pub refusals: &'static str,
    /// Counter: connection attempts that reached a read-only server (a standby) while looking
    /// for the primary.
    pub read_only_connects: &'static str,
    /// Gauge: configured servers that accept writes but are behind the newest primary — a
    /// revived old primary clients can reach. Above 0 the HA manager failed to fence it.
    pub stale_writable_servers: &'static str,
    /// Gauge: the newest WAL timeline and generation this process knows.
    pub timeline: &'static str,
    pub generation: &'static str,
    /// Gauge: the primary's largest standby replay lag, seconds
    /// (`pg_stat_replication.replay_lag`).
    pub replication_lag: &'static str,
    /// Gauge: the primary's synchronous standbys; 0 means an acknowledged commit may exist on
    /// the primary alone.
    pub sync_standbys: &'static str,
}

/// How the fence behaves in one service.
#[derive(Debug, Clone)]
pub struct FenceSettings {
    pub metrics: MetricNames,
    /// How often every configured host is read.
    pub probe_interval: Duration,
    /// Bound on connecting to and reading one host.
    pub probe_timeout: Duration,
    /// Stamp a new generation on a primary found on a newer timeline than its stamp (the
    /// allocator does; the router only reads).
    pub stamp: bool,
    /// `application_name` of the prober's sessions.
    pub application_name: String,
    /// A `shard` label on every series this fence records (a router keeps a fence per shard,
    /// whose series would otherwise collide); `None` records them unlabelled.
    pub shard: Option<String>,
    /// A file that keeps what the fence knows across restarts: read at start (so a process
    /// restarted while only a superseded old primary answers refuses it), rewritten whenever the
    /// known cluster or position changes. `None`: knowledge lives in memory only.
    pub memory: Option<PathBuf>,
}

impl FenceSettings {
    /// The labels every series of this fence carries, after `first` (a series' own labels).
    pub(crate) fn labels(&self, first: &[(&'static str, &'static str)]) -> Vec<metrics::Label> {
        let own = first
            .iter()
            .map(|&(key, value)| metrics::Label::new(key, value));
        let shard = self
            .shard
            .iter()
            .map(|name| metrics::Label::new("shard", name.clone()));
        own.chain(shard).collect()
    }
}

/// What one process knows of its database cluster. Shared by all its pools.
pub struct StorageFence {
    base: Config,
    hosts: Vec<(String, Config)>,
    known: Mutex<Known>,
    /// When the known position last rose: a pooled connection made before may lead to a
    /// superseded server and is not used again.
    raised_at: Mutex<Option<Instant>>,
    settings: FenceSettings,
}

impl std::fmt::Debug for StorageFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageFence")
            .field(
                "hosts",
                &self.hosts.iter().map(|h| &h.0).collect::<Vec<_>>(),
            )
            .field("known", &self.known)
            .finish()
    }
}

/// What `path` remembers; nothing when it does not exist yet.
fn recall(path: &Path) -> anyhow::Result<Known> {
    match std::fs::read_to_string(path) {
        Ok(text) => Known::from_line(&text).ok_or_else(|| {
            anyhow::anyhow!(
                "the storage fence's memory {} is unreadable ({text:?}); remove it only if the \
                 service is meant to use another database cluster",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Known::default()),
        Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
    }
}

/// Replaces `path`'s content atomically (a new file renamed over it, flushed first).
fn remember(path: &Path, line: &str) -> std::io::Result<()> {
    use std::io::Write;
    let fresh = path.with_extension("new");
    let mut file = std::fs::File::create(&fresh)?;
    file.write_all(line.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&fresh, path)
}

impl StorageFence {
    /// A fence for the servers `database_url` names (one or several hosts).
    pub fn new(database_url: &str, settings: FenceSettings) -> anyhow::Result<Arc<StorageFence>> {
        let base: Config = database_url
            .parse()
            .map_err(|e| anyhow::anyhow!("parsing the database url: {e}"))?;
        let hosts = single_host_configs(&base);
        if hosts.is_empty() {
            anyhow::bail!("the database url names no host");
        }
        let known = match &settings.memory {
            Some(path) => recall(path)?,
            None => Known::default(),
        };
        let mut probe_base = base.clone();
        probe_base.application_name(&settings.application_name);
        probe_base.connect_timeout(settings.probe_timeout);
        Ok(Arc::new(StorageFence {
            hosts: single_host_configs(&probe_base),
            base,
            known: Mutex::new(known),
            raised_at: Mutex::new(None),
            settings,
        }))
    }

    /// The parsed URL, for pools to add their own session settings to.
    pub fn config(&self) -> &Config {
        &self.base
    }

    pub(crate) fn settings(&self) -> &FenceSettings {
        &self.settings
    }

    /// Judges `server` (reached as `host`) and learns from it; `report` counts and logs a
    /// refusal or a read-only server (connection attempts do, the prober reports changes only).
    pub(crate) fn judge(&self, server: &ServerIdentity, host: &str, report: bool) -> Verdict {
        let (verdict, raised, position) = {
            let mut known = self.known.lock().expect("fence lock");
            let before = known.to_line();
            let (verdict, raised) = known.judge(server);
            if let Some(path) = &self.settings.memory {
                // Rare (the first server seen, a promotion), so written in place, under the
                // lock: a later change is never overwritten by an earlier one.
                if let Some(line) = known.to_line().filter(|line| Some(line) != before.as_ref()) {
                    if let Err(e) = remember(path, &line) {
                        tracing::error!(path = %path.display(), error = %e,
                            "storage fence: could not write its memory");
                    }
                }
            }
            (verdict, raised, known.position())
        };
        let names = &self.settings.metrics;
        if raised {
            *self.raised_at.lock().expect("fence lock") = Some(Instant::now());
            let labels = self.settings.labels(&[]);
            metrics::gauge!(names.timeline, labels.iter()).set(position.0 as f64);
            metrics::gauge!(names.generation, labels.iter()).set(position.1 as f64);
            tracing::info!(
                host,
                timeline = position.0,
                generation = position.1,
                "storage fence: newest cluster position"
            );
        }
        if report {
            match verdict {
                Verdict::Refused(cause) => {
                    let labels = self.settings.labels(&[("cause", cause.label())]);
                    metrics::counter!(names.refusals, labels.iter()).increment(1);
                    tracing::warn!(
                        host,
                        cause = cause.label(),
                        server_timeline = server.timeline,
                        server_generation = server.position().1,
                        known_timeline = position.0,
                        known_generation = position.1,
                        "storage fence refused a server: {cause}"
                    );
                }
                Verdict::ReadOnly => {
                    let labels = self.settings.labels(&[]);
                    metrics::counter!(names.read_only_connects, labels.iter()).increment(1)
                }
                Verdict::Writable => {}
            }
        }
        verdict
    }

    /// Whether a connection made at `created` predates the newest known position.
    pub fn superseded(&self, created: Instant) -> bool {
        self.raised_at
            .lock()
            .expect("fence lock")
            .is_some_and(|raised| created < raised)
    }

    /// The configured hosts as single-host configurations with `config`'s session settings.
    pub(crate) fn hosts_of(config: &Config) -> Vec<(String, Config)> {
        single_host_configs(config)
    }

    /// Reads every configured host once, all at once (at start, before any pool connects, so a
    /// process that comes up while an old primary is reachable again still learns the newest
    /// position from the other hosts).
    pub async fn probe_all(&self) -> Vec<Option<(ServerIdentity, Verdict)>> {
        let rounds = self.hosts.iter().map(|(label, config)| async move {
            let read = tokio::time::timeout(self.settings.probe_timeout, async {
                let (client, connection) = config.connect(NoTls).await?;
                let driver = tokio::spawn(connection);
                let identity = identity::read(&client).await;
                drop(client);
                let _ = driver.await;
                identity
            })
            .await;
            match read {
                Ok(Ok(server)) => {
                    let verdict = self.judge(&server, label, false);
                    Some((server, verdict))
                }
                _ => None,
            }
        });
        futures::future::join_all(rounds).await
    }

    pub(crate) fn host_list(&self) -> &[(String, Config)] {
        &self.hosts
    }
}

/// One configuration per host of `config`, each with the host's port and every session setting
/// of `config`, and no `target_session_attrs`: the fence reads each server's role itself.
fn single_host_configs(config: &Config) -> Vec<(String, Config)> {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = match ports.len() {
                0 => 5432,
                1 => ports[0],
                _ => ports.get(i).copied().unwrap_or(5432),
            };
            let mut one = Config::new();
            let label = match host {
                Host::Tcp(name) => {
                    one.host(name);
                    format!("{name}:{port}")
                }
                Host::Unix(path) => {
                    one.host_path(path);
                    format!("{}:{port}", path.display())
                }
            };
            one.port(port);
            if let Some(user) = config.get_user() {
                one.user(user);
            }
            if let Some(password) = config.get_password() {
                one.password(password);
            }
            if let Some(db) = config.get_dbname() {
                one.dbname(db);
            }
            if let Some(options) = config.get_options() {
                one.options(options);
            }
            if let Some(name) = config.get_application_name() {
                one.application_name(name);
            }
            if let Some(timeout) = config.get_connect_timeout() {
                one.connect_timeout(*timeout);
            }
            one.ssl_mode(config.get_ssl_mode());
            one.keepalives(config.get_keepalives());
            one.keepalives_idle(config.get_keepalives_idle());
            (label, one)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(shard: Option<&str>) -> FenceSettings {
        FenceSettings {
            metrics: MetricNames {
                refusals: "r",
                read_only_connects: "o",
                stale_writable_servers: "s",
                timeline: "t",
                generation: "g",
                replication_lag: "l",
                sync_standbys: "y",
            },
            probe_interval: Duration::from_millis(500),
            probe_timeout: Duration::from_secs(1),
            stamp: false,
            application_name: "test".to_owned(),
            shard: shard.map(str::to_owned),
            memory: None,
        }
    }

    fn pairs(labels: Vec<metrics::Label>) -> Vec<(String, String)> {
        labels
            .iter()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect()
    }

    #[test]
    fn a_shard_label_follows_a_series_own_labels_and_none_adds_nothing() {
        let cause = [("cause", "behind")];
        assert_eq!(pairs(settings(None).labels(&[])), vec![]);
        assert_eq!(
            pairs(settings(None).labels(&cause)),
            vec![("cause".to_owned(), "behind".to_owned())]
        );
        assert_eq!(
            pairs(settings(Some("s1")).labels(&cause)),
            vec![
                ("cause".to_owned(), "behind".to_owned()),
                ("shard".to_owned(), "s1".to_owned())
            ]
        );
    }
}
