//! A primary with one streaming standby, for tests of storage failure: the primary can be killed,
//! the standby promoted, the old primary revived *writable* (as happens when nothing fences it)
//! and a new standby rebuilt from whichever server is primary now.
//!
//! Both servers are [`PgServer`]s started by the one launcher (`launch.rs`), with settings that a
//! replicated pair needs on top of the test defaults: durable commit acknowledgement
//! (`synchronous_commit=on`, which is what makes a synchronous standby's copy count), WAL senders,
//! and the same `max_connections` (a standby refuses to start with fewer than its primary). A
//! standby is made with `pg_basebackup -R` as the server user, so it also works when tests run as
//! root.
//!
//! Synchronous replication is switched on at the primary with `ALTER SYSTEM` once its standby
//! streams (before that, every commit would wait for a standby that does not exist), and off on
//! a promoted standby until a new standby streams from it: an HA manager in its non-strict mode
//! does the same, trading the replication guarantee for availability while it has no standby.
//! The nodes keep their ports for the whole test, so a multi-host URL (see [`ReplicatedPg::url`])
//! names the same two addresses before and after a failover, like DNS names in production.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::Signal;

use super::PgServer;
use crate::procfs::{self, ProcId};

/// How long a standby may take to stream or to replay up to the primary's position.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the primary waits for its standby before acknowledging a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'`: a commit is acknowledged only once the standby has
    /// flushed it, so a promoted standby has every acknowledged write.
    Synchronous,
    /// The standby follows as fast as it can; what it had not received when the primary died is
    /// lost by a promotion.
    Asynchronous,
}

/// Settings every server of a replicated pair runs with (after the test defaults).
fn replication_settings() -> Vec<(String, String)> {
    [
        ("synchronous_commit", "on"),
        ("wal_level", "replica"),
        ("max_wal_senders", "10"),
        ("hot_standby", "on"),
        ("wal_keep_size", "256MB"),
        ("wal_receiver_status_interval", "1s"),
        ("wal_sender_timeout", "10s"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}

/// Two PostgreSQL servers, one primary and one streaming standby (or, after a failover, a dead or
/// revived old primary waiting to be rebuilt).
#[derive(Debug)]
pub struct ReplicatedPg {
    nodes: [PgServer; 2],
    primary: usize,
    mode: Replication,
}

impl ReplicatedPg {
    /// A primary and a standby streaming from it, on free ports.
    pub async fn start(mode: Replication) -> Result<ReplicatedPg> {
        ReplicatedPg::start_with(mode, Vec::new()).await
    }

    /// [`ReplicatedPg::start`] with extra server settings for both servers, after the pair's own.
    pub async fn start_with(
        mode: Replication,
        settings: Vec<(String, String)>,
    ) -> Result<ReplicatedPg> {
        let settings: Vec<_> = replication_settings().into_iter().chain(settings).collect();
        let mut primary = PgServer::create(settings.clone()).await?;
        primary.initdb().await?;
        primary.launch_on_free_port().await?;
        let mut standby = PgServer::create(settings).await?;
        standby.base_backup_from(&primary).await?;
        standby.launch_on_free_port().await?;
        let mut pair = ReplicatedPg {
            nodes: [primary, standby],
            primary: 0,
            mode,
        };
        pair.attach_standby().await?;
        Ok(pair)
    }

    /// The server that is primary now.
    pub fn primary(&self) -> &PgServer {
        &self.nodes[self.primary]
    }

    /// Mutable access to the primary, e.g. to restart it.
    pub fn primary_mut(&mut self) -> &mut PgServer {
        &mut self.nodes[self.primary]
    }

    /// The other server: a standby, or a dead or revived old primary after a failover.
    pub fn standby(&self) -> &PgServer {
        &self.nodes[1 - self.primary]
    }

    /// Mutable access to the other server, e.g. to pause it.
    pub fn standby_mut(&mut self) -> &mut PgServer {
        &mut self.nodes[1 - self.primary]
    }

    /// Both servers in their fixed order (the order of [`ReplicatedPg::url`]).
    pub fn nodes(&self) -> &[PgServer; 2] {
        &self.nodes
    }

    pub fn mode(&self) -> Replication {
        self.mode
    }

    /// A multi-host URL naming both servers in their fixed order, for database `db`, asking
    /// for a server that accepts writes (`target_session_attrs=read-write`), as a user would
    /// configure a service. The first node is the original primary, so a client that takes "the
    /// first host that accepts writes" reaches a revived old primary first.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
            self.nodes[0].port(),
            self.nodes[1].port(),
            schema::path::encode_segment(db)
        )
    }

    /// Creates database `name` on the primary, waits until the standby has it, and returns the
    /// multi-host URL of it.
    pub async fn create_database(&self, name: &str) -> Result<String> {
        self.primary().create_database(name).await?;
        self.wait_replayed().await?;
        Ok(self.url(name))
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn wait_replayed(&self) -> Result<()> {
        let primary = self.primary().client().await?;
        let lsn: String = primary
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0);
        let standby = self.standby().client().await?;
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        loop {
            let replayed: bool = standby
                .query_one(
                    "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                    &[&lsn],
                )
                .await?
                .get(0);
            if replayed {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("standby did not replay up to {lsn} within {REPLICATION_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Freezes the primary's WAL senders (`SIGSTOP`): the standby receives nothing more while
    /// the primary goes on committing. With an asynchronous standby those commits are still
    /// acknowledged, and a failover now loses them; with a synchronous one they wait. Stopping
    /// the sender rather than the standby matters: WAL already sent would sit in the standby's
    /// socket buffer and still arrive.
    pub fn stall_replication(&self) -> Result<()> {
        let senders = self.primary().wal_senders()?;
        if senders.is_empty() {
            bail!("the primary has no WAL sender to stall");
        }
        for sender in senders {
            procfs::signal(&sender, Signal::SIGSTOP);
        }
        Ok(())
    }

    /// Undoes [`ReplicatedPg::stall_replication`].
    pub fn resume_replication(&self) -> Result<()> {
        for sender in self.primary().wal_senders()? {
            procfs::signal(&sender, Signal::SIGCONT);
        }
        Ok(())
    }

    /// Crashes the primary (`SIGKILL` of every process), like a lost host.
    pub fn kill_primary(&mut self) -> Result<()> {
        let primary = self.primary;
        self.nodes[primary].kill()
    }

    /// Promotes the standby and makes it the primary; commits on it do not wait for a standby
    /// until [`ReplicatedPg::rebuild_standby`] gives it one. The old primary is left as it is
    /// (dead, or running on its own if it was never killed).
    pub async fn promote_standby(&mut self) -> Result<()> {
        let standby = 1 - self.primary;
        let client = self.nodes[standby].client().await?;
        let promoted: bool = client
            .query_one("SELECT pg_promote(true, 60)", &[])
            .await
            .context("promoting the standby")?
            .get(0);
        if !promoted {
            bail!("pg_promote did not finish within 60 s");
        }
        self.primary = standby;
        self.nodes[standby].set_sync_standbys(Some("")).await
    }

    /// Starts the old primary again on its old address as a writable primary of its own, with
    /// no standby to wait for: what happens when the failed host comes back and nothing fences
    /// it. It carries the old timeline and whatever it had committed before it died.
    pub async fn revive_old_primary_writable(&mut self) -> Result<()> {
        let old = 1 - self.primary;
        self.nodes[old].kill()?;
        self.nodes[old].set_sync_standbys(None).await?;
        self.nodes[old].restart().await
    }

    /// Replaces the non-primary server (dead, revived or a standby) by a fresh standby of the
    /// primary on the same port, and waits until it streams.
    pub async fn rebuild_standby(&mut self) -> Result<()> {
        let other = 1 - self.primary;
        let (left, right) = self.nodes.split_at_mut(1);
        let (primary, target) = if other == 1 {
            (&left[0], &mut right[0])
        } else {
            (&right[0], &mut left[0])
        };
        target.kill()?;
        std::fs::remove_dir_all(&target.data_dir)
            .with_context(|| format!("removing {}", target.data_dir.display()))?;
        target.base_backup_from(primary).await?;
        target.restart().await?;
        self.attach_standby().await
    }

    /// Waits until the primary has a streaming standby, then turns synchronous replication on
    /// when the pair is synchronous.
    async fn attach_standby(&mut self) -> Result<()> {
        let client = self.primary().client().await?;
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        loop {
            let streaming: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                    &[],
                )
                .await?
                .get(0);
            if streaming > 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "standby on port {} not streaming within {REPLICATION_TIMEOUT:?}; its log:\n{}",
                    self.standby().port(),
                    self.standby().log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.mode == Replication::Synchronous {
            let primary = self.primary;
            self.nodes[primary].set_sync_standbys(Some("*")).await?;
        }
        Ok(())
    }
}

impl PgServer {
    /// The server's WAL sender processes (`postgres: walsender ...`).
    fn wal_senders(&self) -> Result<Vec<ProcId>> {
        let pm = self.running_id()?;
        Ok(procfs::descendants(pm.pid)
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{}/cmdline", p.pid))
                    .is_ok_and(|cmd| cmd.starts_with(b"postgres: walsender"))
            })
            .collect())
    }

    /// Fills the (absent or empty) data directory with a base backup of `primary`, configured to
    /// stream from it (`-R`: `standby.signal` and `primary_conninfo`).
    async fn base_backup_from(&self, primary: &PgServer) -> Result<()> {
        let tool = self.bin_dir.join("pg_basebackup");
        let mut cmd = tokio::process::Command::new(&tool);
        cmd.args(["-h", "127.0.0.1", "-p"])
            .arg(primary.port().to_string())
            .args(["-U", "postgres", "-D"])
            .arg(&self.data_dir)
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
        self.run_setup_tool(cmd, &tool).await
    }

    /// Sets `synchronous_standby_names`: `Some` on a running server (`ALTER SYSTEM` and a
    /// reload), `None` to clear it in the configuration of a stopped one, read at its next
    /// start. The setting lives in `postgresql.auto.conf`, never on the command line, because
    /// a command-line setting cannot be changed without a restart.
    async fn set_sync_standbys(&self, names: Option<&str>) -> Result<()> {
        match names {
            Some(names) => {
                let client = self.client().await?;
                // Two statements: ALTER SYSTEM refuses to run in the implicit transaction of a
                // multi-statement query.
                client
                    .batch_execute(&format!(
                        "ALTER SYSTEM SET synchronous_standby_names = '{}'",
                        names.replace('\'', "''")
                    ))
                    .await
                    .context("setting synchronous_standby_names")?;
                client.batch_execute("SELECT pg_reload_conf()").await?;
            }
            None => {
                use std::io::Write as _;
                let path = self.data_dir.join("postgresql.auto.conf");
                // Appending keeps the file's owner (the server user); the last line wins.
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                writeln!(file, "synchronous_standby_names = ''")?;
            }
        }
        Ok(())
    }
}
