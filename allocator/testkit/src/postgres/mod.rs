//! A private, throw-away PostgreSQL server per test.
//!
//! The allocator's correctness rests on what PostgreSQL does under failure: leases and fencing
//! tokens must stay safe when the database stalls, crashes or restarts. Tests therefore need a
//! real server they can freeze, kill and restart, and it must not be the shared instance on port
//! 5432 (other tests and engineers use it, and faults injected there would leak between tests).
//! [`PgServer`] runs `initdb` into a temporary directory and starts a postmaster on a free port,
//! tuned for speed rather than durability (`fsync=off` etc.), since test data is disposable.
//!
//! `initdb` and `postgres` refuse to run as root. When the test runs as root the server is run as
//! the `postgres` system user and the temporary directory is handed over to that user; otherwise
//! it runs as the current user.
//!
//! PostgreSQL forks one backend process per connection, so the fault methods act on the whole
//! process tree (found through `/proc`): freezing only the postmaster would leave established
//! connections working, which is not what a stalled database host looks like.
//!
//! Cleanup happens in `Drop`, which also runs while a failing test unwinds. If the test process
//! is killed outright no destructor runs; the server then shares the test's process group, so an
//! interactive Ctrl-C still shuts it down. Do not keep a `PgServer` in a `static`: statics are
//! never dropped.
//!
//! The server's lifecycle and faults live here; creating the cluster and launching the
//! postmaster (as the right user) live in [`launch`].

mod launch;
pub mod patroni;
mod pgbouncer;
mod replication;

pub use self::patroni::{PatroniCluster, PatroniOptions, PatroniTimings};
pub use self::pgbouncer::{PgBouncer, PoolMode};
pub use self::replication::{ReplicatedPg, Replication};

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid};
use tempfile::TempDir;
use tokio_postgres::NoTls;

use self::launch::{pg_bin_dir, server_user, LaunchError};
use super::process::free_port;
use super::procfs::{self, ProcId};

/// How long a (re)started server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fast shutdown (`stop`) may take before the harness falls back to `SIGKILL`.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `Drop` waits for an immediate shutdown (`SIGQUIT`) before using `SIGKILL`.
const DROP_QUIT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many fresh ports `start` tries when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 5;
/// Log lines included in error messages.
const LOG_TAIL_LINES: usize = 40;

/// A PostgreSQL server owned by one test.
///
/// Dropping it kills the server (all processes) and deletes its data directory.
#[derive(Debug)]
pub struct PgServer {
    /// TCP port on 127.0.0.1. Fixed for the server's lifetime so that `restart` brings the
    /// database back at the address the services under test were configured with.
    port: u16,
    /// Directory holding `initdb` and `postgres` (highest installed version or
    /// `ALLOCATOR_PG_BIN`).
    bin_dir: PathBuf,
    /// uid/gid to run the server as; `Some` only when the test runs as root, because PostgreSQL
    /// refuses to run as root.
    run_as: Option<(Uid, Gid)>,
    /// The cluster's data directory, kept across `stop`/`restart` so data survives a restart
    /// exactly as it would in production.
    data_dir: PathBuf,
    /// Private directory for the Unix-domain socket and its lock file, so we never collide with
    /// the system server's sockets in `/var/run/postgresql`.
    socket_dir: PathBuf,
    /// Server log (stdout+stderr, appended across restarts); its tail is put into errors.
    log_path: PathBuf,
    /// The running postmaster; `None` after `stop`/`kill`. Owning the `Child` lets us reap it and
    /// know for sure whether it is still running.
    postmaster: Option<Child>,
    /// Identity (pid + start time) of the running postmaster, used to signal it and to walk its
    /// process tree from `&self` methods without touching the `Child`.
    postmaster_id: Option<ProcId>,
    /// Pid of the most recently started postmaster, reported by [`PgServer::pid`].
    last_pid: u32,
    /// Whether the tree is currently frozen; every shutdown path resumes it first because a
    /// stopped process cannot act on a shutdown signal.
    paused: AtomicBool,
    /// Server settings passed as `-c name=value` after the defaults (so they win), on every
    /// launch: a replicated server needs durable commits and WAL senders.
    settings: Vec<(String, String)>,
    /// Owns the temporary directory. Declared last so it is removed only after `Drop::drop` has
    /// killed the server.
    tmp: TempDir,
}

impl PgServer {
    /// Creates a fresh cluster in a temporary directory and starts it on a free port, returning
    /// once it accepts connections (at most 30 s; the error includes the server log tail).
    pub async fn start() -> Result<PgServer> {
        PgServer::start_with(Vec::new()).await
    }

    /// [`PgServer::start`] with server settings (`-c name=value`) after the test defaults, so they
    /// win: `fsync=on` and `synchronous_commit=on` give a durable server for benchmarks.
    pub async fn start_with(settings: Vec<(String, String)>) -> Result<PgServer> {
        let mut server = PgServer::create(settings).await?;
        server.initdb().await?;
        server.launch_on_free_port().await?;
        Ok(server)
    }

    /// A server in a new temporary directory, not yet initialised or running.
    async fn create(settings: Vec<(String, String)>) -> Result<PgServer> {
        let bin_dir = pg_bin_dir()?;
        let run_as = server_user()?;
        let tmp = tempfile::Builder::new()
            .prefix("allocator-pg-")
            .tempdir()
            .context("creating temporary directory for PostgreSQL")?;
        let data_dir = tmp.path().join("data");
        let socket_dir = tmp.path().join("sock");
        std::fs::create_dir(&socket_dir).context("creating socket directory")?;
        if let Some((uid, gid)) = run_as {
            for dir in [tmp.path(), socket_dir.as_path()] {
                std::os::unix::fs::chown(dir, Some(uid.as_raw()), Some(gid.as_raw()))
                    .with_context(|| format!("chown {} to postgres", dir.display()))?;
            }
        }
        Ok(PgServer {
            port: 0,
            bin_dir,
            run_as,
            data_dir,
            socket_dir,
            log_path: tmp.path().join("postgres.log"),
            postmaster: None,
            postmaster_id: None,
            last_pid: 0,
            paused: AtomicBool::new(false),
            settings,
            tmp,
        })
    }

    /// Launches the server on a free port, trying another one when the chosen port was taken in
    /// the meantime.
    async fn launch_on_free_port(&mut self) -> Result<()> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port();
            match self.launch().await {
                Ok(()) => return Ok(()),
                Err(LaunchError::PortInUse(e)) => last_err = Some(e),
                Err(LaunchError::Other(e)) => return Err(e),
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no port attempts made"))
            .context(format!("no free port found after {PORT_ATTEMPTS} attempts")))
    }

    /// Connection URL of the default `postgres` database (superuser `postgres`, no password).
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Pid of the most recently started postmaster. After `stop`/`kill` it no longer names a
    /// running process, so only signal it while the server is up.
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    /// Whether a postmaster started by this harness is currently running (it may be paused).
    pub fn is_running(&self) -> bool {
        self.postmaster_id.as_ref().is_some_and(procfs::is_alive)
    }

    /// Whether [`PgServer::pause`] froze the server and it has not been resumed since.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The data directory, e.g. to inspect files after a crash.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The last `n_lines` lines of the server log.
    pub fn log_tail(&self, n_lines: usize) -> String {
        procfs::tail_file(&self.log_path, n_lines)
    }

    /// Creates database `name` and returns its connection URL. Giving each test (or each service
    /// instance) its own database keeps schemas and data isolated on a shared server.
    pub async fn create_database(&self, name: &str) -> Result<String> {
        let client = self.connect_url(&self.url()).await?;
        client
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(name)))
            .await
            .with_context(|| format!("creating database {name:?}"))?;
        Ok(self.url_for(name))
    }

    /// A client connected to the default database, with its connection driven by a spawned
    /// tokio task (so it must be called inside a tokio runtime).
    pub async fn client(&self) -> Result<tokio_postgres::Client> {
        self.connect_url(&self.url()).await
    }

    /// A client for an arbitrary URL (e.g. one returned by [`PgServer::create_database`]),
    /// driven by a spawned tokio task. Times out after 10 s so a paused server fails the test
    /// instead of hanging it.
    pub async fn connect_url(&self, url: &str) -> Result<tokio_postgres::Client> {
        let (client, connection) =
            tokio::time::timeout(Duration::from_secs(10), tokio_postgres::connect(url, NoTls))
                .await
                .map_err(|_| anyhow!("connecting to {url} timed out"))?
                .with_context(|| format!("connecting to {url}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "testkit postgres connection ended");
            }
        });
        Ok(client)
    }

    /// Freezes the postmaster and every backend (`SIGSTOP`): TCP connections stay open and new
    /// connects complete at the kernel level, but nothing is answered — the database "hangs".
    pub fn pause(&self) -> Result<()> {
        let pm = self.running_id()?;
        procfs::freeze_tree(&pm);
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Undoes [`PgServer::pause`] (`SIGCONT` to the postmaster and all its descendants).
    pub fn resume(&self) -> Result<()> {
        let pm = self.running_id()?;
        self.continue_tree(&pm);
        Ok(())
    }

    /// Fast shutdown (`SIGINT`): the server terminates sessions, checkpoints and exits, like an
    /// orderly `pg_ctl stop -m fast`. Waits for the exit (falling back to `SIGKILL` after 30 s,
    /// which is reported as an error). A no-op if the server is not running.
    pub async fn stop(&mut self) -> Result<()> {
        let (Some(mut child), Some(pm)) = (self.postmaster.take(), self.postmaster_id.take())
        else {
            return Ok(());
        };
        self.continue_tree(&pm);
        let before = procfs::descendants(pm.pid);
        procfs::signal(&pm, Signal::SIGINT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() >= deadline {
                procfs::kill_tree(&pm, &mut child);
                bail!(
                    "PostgreSQL (pid {}) ignored fast shutdown for {STOP_TIMEOUT:?} and was \
                     killed; log tail:\n{}",
                    pm.pid,
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The postmaster waits for its children in a fast shutdown; this only double-checks.
        if !procfs::wait_gone_async(&before, Duration::from_secs(5)).await {
            for p in &before {
                procfs::signal(p, Signal::SIGKILL);
            }
        }
        Ok(())
    }

    /// Starts the server again on the same port and data directory and waits until it accepts
    /// connections. A running server is stopped (fast shutdown) first. After [`PgServer::kill`]
    /// this performs crash recovery, as a real restart after a crash would.
    ///
    /// The port is not reserved while the server is down; if another process grabbed it in the
    /// meantime (unlikely with ephemeral ports) the restart fails with the log showing why.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.launch().await.map_err(LaunchError::into_inner)
    }

    /// Crashes the server: `SIGKILL` to the postmaster and to all its backends, like the host
    /// losing power or the OOM killer taking the database down.
    ///
    /// The backends are killed too because an orphaned backend keeps serving its connection and
    /// keeps the shared memory attached, which would make the server refuse to `restart`.
    /// Connected clients see their connections reset. A no-op if the server is not running.
    pub fn kill(&mut self) -> Result<()> {
        let (Some(mut child), Some(pm)) = (self.postmaster.take(), self.postmaster_id.take())
        else {
            return Ok(());
        };
        procfs::kill_tree(&pm, &mut child);
        self.paused.store(false, Ordering::SeqCst);
        // The pid and socket lock files are stale now. PostgreSQL would normally detect that by
        // probing the recorded pid, but that probe is fooled if the pid got reused; we know for
        // certain the server is dead, so remove them.
        let _ = std::fs::remove_file(self.data_dir.join("postmaster.pid"));
        let _ = std::fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}", self.port)));
        let _ = std::fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}.lock", self.port)));
        Ok(())
    }

    /// Connection URL of database `db` on this server.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port,
            schema::path::encode_segment(db)
        )
    }

    fn running_id(&self) -> Result<ProcId> {
        self.postmaster_id
            .filter(procfs::is_alive)
            .ok_or_else(|| anyhow!("PostgreSQL on port {} is not running", self.port))
    }

    /// Sends `SIGCONT` to the whole tree, children first so that the postmaster does not wake up
    /// to find (and react to) still-frozen children.
    fn continue_tree(&self, pm: &ProcId) {
        for p in procfs::descendants(pm.pid) {
            procfs::signal(&p, Signal::SIGCONT);
        }
        procfs::signal(pm, Signal::SIGCONT);
        self.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let Some(mut child) = self.postmaster.take() else {
            return;
        };
        let Some(pm) = self.postmaster_id.take() else {
            // Could not identify the process (it died instantly); just make sure it is reaped.
            let _ = child.kill();
            let _ = child.wait();
            return;
        };
        // Immediate shutdown: the postmaster SIGQUITs its children and exits without a
        // checkpoint; a frozen tree must be thawed first or it would never react.
        let before = procfs::descendants(pm.pid);
        for p in &before {
            procfs::signal(p, Signal::SIGCONT);
        }
        procfs::signal(&pm, Signal::SIGCONT);
        procfs::signal(&pm, Signal::SIGQUIT);
        let deadline = Instant::now() + DROP_QUIT_TIMEOUT;
        let exited = loop {
            match child.try_wait() {
                Ok(Some(_)) => break true,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => break false,
            }
        };
        if !exited {
            procfs::kill_tree(&pm, &mut child);
        }
        // Anything that escaped (e.g. re-parented before the postmaster could reap it).
        for p in &before {
            procfs::signal(p, Signal::SIGKILL);
        }
        procfs::wait_gone(&before, Duration::from_secs(5));
    }
}

/// Quotes an SQL identifier (database names may need it, e.g. with dashes).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
