//! Creating and launching the cluster: finding the server binaries, `initdb`, and starting the
//! postmaster until it accepts connections.
//!
//! `initdb` and `postgres` refuse to run as root, so when the tests run as root both are run as
//! the `postgres` system user (found by [`server_user`]) in a directory handed over to it; as
//! anyone else they run as the current user.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::unistd::{Gid, Uid, User};
use tokio_postgres::NoTls;

use super::{PgServer, LOG_TAIL_LINES, READY_TIMEOUT};
use crate::procfs;

impl PgServer {
    /// Applies the server user (if we are root) and a working directory that user can access.
    fn prepare_std(&self, cmd: &mut Command) {
        cmd.current_dir(self.tmp.path());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
    }

    pub(super) async fn initdb(&self) -> Result<()> {
        let initdb = self.bin_dir.join("initdb");
        let mut cmd = tokio::process::Command::new(&initdb);
        cmd.arg("-D").arg(&self.data_dir).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        self.run_setup_tool(cmd, &initdb).await
    }

    /// Runs one of the server's setup tools (`initdb`, `pg_basebackup`) to completion as the
    /// server user, in a directory it can access; a failure carries the tool's output.
    pub(super) async fn run_setup_tool(
        &self,
        mut cmd: tokio::process::Command,
        tool: &Path,
    ) -> Result<()> {
        cmd.current_dir(self.tmp.path())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let out = cmd
            .output()
            .await
            .with_context(|| format!("running {}", tool.display()))?;
        if !out.status.success() {
            bail!(
                "{} failed with {}:\n{}{}",
                tool.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Spawns the postmaster on `self.port` and waits until it accepts connections.
    pub(super) async fn launch(&mut self) -> Result<(), LaunchError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .context("opening PostgreSQL log")?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let postgres = self.bin_dir.join("postgres");
        let mut cmd = Command::new(&postgres);
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.socket_dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=64MB",
            ])
            .args(
                self.settings
                    .iter()
                    .flat_map(|(name, value)| ["-c".to_owned(), format!("{name}={value}")]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating log handle")?)
            .stderr(log);
        self.prepare_std(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", postgres.display()))?;
        let pid = child.id();
        self.last_pid = pid;
        self.postmaster_id = procfs::proc_id(pid as i32);
        self.postmaster = Some(child);
        self.paused.store(false, Ordering::SeqCst);

        let url = self.url();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.postmaster.as_mut().expect("just spawned");
            if let Some(status) = child.try_wait().context("polling postmaster")? {
                self.postmaster = None;
                self.postmaster_id = None;
                let new_log = read_from(&self.log_path, log_start);
                let err = anyhow!(
                    "PostgreSQL on port {} exited during startup with {status}; log:\n{}",
                    self.port,
                    new_log
                );
                return Err(if new_log.contains("Address already in use") {
                    LaunchError::PortInUse(err)
                } else {
                    LaunchError::Other(err)
                });
            }
            let last_err = match tokio::time::timeout(
                Duration::from_secs(2),
                tokio_postgres::connect(&url, NoTls),
            )
            .await
            {
                Ok(Ok((client, connection))) => {
                    // Dropping the client makes the connection send Terminate and finish.
                    drop(client);
                    let _ = tokio::time::timeout(Duration::from_secs(2), connection).await;
                    if self.postmaster_id.is_none() {
                        self.postmaster_id = procfs::proc_id(pid as i32);
                    }
                    return Ok(());
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "connection attempt timed out".to_string(),
            };
            if Instant::now() >= deadline {
                let tail = self.log_tail(LOG_TAIL_LINES);
                if let (Some(mut child), Some(pm)) =
                    (self.postmaster.take(), self.postmaster_id.take())
                {
                    procfs::kill_tree(&pm, &mut child);
                }
                return Err(LaunchError::Other(anyhow!(
                    "PostgreSQL on port {} not ready within {READY_TIMEOUT:?} (last error: \
                     {last_err}); log tail:\n{tail}",
                    self.port
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Why a launch failed: a taken port is retried with another port by `start`.
pub(super) enum LaunchError {
    /// The postmaster could not bind its port (someone took it after `free_port`).
    PortInUse(anyhow::Error),
    /// Anything else; not retried.
    Other(anyhow::Error),
}

impl LaunchError {
    pub(super) fn into_inner(self) -> anyhow::Error {
        match self {
            LaunchError::PortInUse(e) | LaunchError::Other(e) => e,
        }
    }
}

impl From<anyhow::Error> for LaunchError {
    fn from(e: anyhow::Error) -> Self {
        LaunchError::Other(e)
    }
}
/// The PostgreSQL binary directory: `$ALLOCATOR_PG_BIN`, else the highest version under
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout allows several side by side).
pub(super) fn pg_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ALLOCATOR_PG_BIN") {
        let dir = PathBuf::from(dir);
        if !dir.join("postgres").is_file() || !dir.join("initdb").is_file() {
            bail!(
                "ALLOCATOR_PG_BIN={} does not contain postgres and initdb",
                dir.display()
            );
        }
        return Ok(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for entry in std::fs::read_dir(root).with_context(|| {
        format!(
            "listing {} (install PostgreSQL or set ALLOCATOR_PG_BIN)",
            root.display()
        )
    })? {
        let entry = entry?;
        let Some(version) = entry.file_name().to_str().and_then(|n| {
            n.split('.')
                .map(|p| p.parse::<u32>().ok())
                .collect::<Option<Vec<u32>>>()
        }) else {
            continue;
        };
        let bin = entry.path().join("bin");
        if bin.join("postgres").is_file()
            && bin.join("initdb").is_file()
            && best.as_ref().is_none_or(|(v, _)| version > *v)
        {
            best = Some((version, bin));
        }
    }
    best.map(|(_, bin)| bin).ok_or_else(|| {
        anyhow!(
            "no PostgreSQL under {}/<version>/bin; set ALLOCATOR_PG_BIN",
            root.display()
        )
    })
}

/// The user to run the server as: `postgres` when we are root, else ourselves (`None`).
pub(super) fn server_user() -> Result<Option<(Uid, Gid)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres")
        .context("looking up the postgres user")?
        .ok_or_else(|| {
            anyhow!("running as root but there is no `postgres` user to run PostgreSQL as")
        })?;
    Ok(Some((user.uid, user.gid)))
}
/// The part of a file written after byte `offset` (this launch's share of the log).
fn read_from(path: &Path, offset: u64) -> String {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(bytes.get(offset as usize..).unwrap_or(&[])).into(),
        Err(e) => format!("<could not read {}: {e}>", path.display()),
    }
}
