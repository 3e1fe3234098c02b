//! Supervising service binaries (allocator replicas, the router) spawned by end-to-end tests.
//!
//! Fault-injection tests need to crash (`SIGKILL`), freeze (`SIGSTOP`, e.g. to simulate a replica
//! that stalls past its lease) and gracefully stop (`SIGTERM`) real service processes, and then
//! look at what the process logged. [`ChildProcess`] wraps [`std::process::Child`] to make those
//! operations one call each and, crucially, kills and reaps the process in `Drop` so a failing
//! (panicking) test never leaves a replica running that would hold leases or ports and disturb
//! later tests.
//!
//! Signals are only sent while the child has not yet been reaped: once the harness has collected
//! its exit status the pid may be reused by an unrelated process, so signalling it would be a bug.

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{self, Signal};
use nix::unistd::{Gid, Pid, Uid};

use super::procfs::tail_file;

/// A spawned service binary whose stdout and stderr go to a log file.
///
/// Dropping it sends `SIGKILL` and reaps the process (also while unwinding from a panic).
#[derive(Debug)]
pub struct ChildProcess {
    /// The OS handle; needed to reap the process (no zombies) and to learn whether it already
    /// exited, which guards every signal against pid reuse.
    child: Child,
    /// Where stdout and stderr are appended, so tests can assert on or print what the service
    /// logged (see [`ChildProcess::log_tail`]).
    log_path: PathBuf,
    /// The binary that was started, kept for error messages.
    program: PathBuf,
}

impl ChildProcess {
    /// Spawns `program` with `args`, the current environment plus `envs` (later entries win),
    /// stdin closed and stdout+stderr appended to `log_path` (created, with parent directories,
    /// if missing). Appending lets a test restart a replica with the same log file and keep the
    /// history of both incarnations.
    pub fn spawn<I, S>(
        program: &Path,
        args: I,
        envs: &[(String, String)],
        log_path: &Path,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        ChildProcess::spawn_as(program, args, envs, log_path, None)
    }

    /// [`ChildProcess::spawn`] as another user (`Some((uid, gid))`, which needs root), e.g. a
    /// Patroni node, which runs PostgreSQL and so must not be root. The log file is opened by
    /// this process, so the other user needs no access to its directory.
    pub fn spawn_as<I, S>(
        program: &Path,
        args: I,
        envs: &[(String, String)],
        log_path: &Path,
        run_as: Option<(Uid, Gid)>,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        if let Some(parent) = log_path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating log directory {}", parent.display()))?;
            }
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("opening log file {}", log_path.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating log file handle")?)
            .stderr(log);
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", program.display()))?;
        Ok(ChildProcess {
            child,
            log_path: log_path.to_path_buf(),
            program: program.to_path_buf(),
        })
    }

    /// The process id (stays the same after exit; do not signal it yourself once it exited).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file the process writes to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Crash the process (`SIGKILL`). Succeeds if it already exited: the goal state is reached.
    pub fn sigkill(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        self.signal(Signal::SIGKILL)
    }

    /// Freeze the process (`SIGSTOP`): it keeps its sockets and leases but makes no progress, like
    /// a long GC pause or a VM stall.
    pub fn sigstop(&mut self) -> Result<()> {
        self.signal_running(Signal::SIGSTOP)
    }

    /// Unfreeze a process stopped with [`ChildProcess::sigstop`].
    pub fn sigcont(&mut self) -> Result<()> {
        self.signal_running(Signal::SIGCONT)
    }

    /// Ask the process to shut down gracefully (`SIGTERM`).
    pub fn sigterm(&mut self) -> Result<()> {
        self.signal_running(Signal::SIGTERM)
    }

    /// Ask the process to re-read its credentials and certificates (`SIGHUP`).
    pub fn sighup(&mut self) -> Result<()> {
        self.signal_running(Signal::SIGHUP)
    }

    /// The exit status if the process has exited (reaping it), without waiting.
    pub fn try_exit_status(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits up to `timeout` for the process to exit and returns its status. Polls instead of
    /// blocking so it never stalls the async runtime the test runs on. On timeout the process is
    /// left running (the caller decides whether to escalate) and the error carries the log tail.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} (pid {}) did not exit within {timeout:?}; log tail:\n{}",
                    self.program.display(),
                    self.pid(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The last `n_lines` lines of the process log, for assertions and failure messages.
    pub fn log_tail(&self, n_lines: usize) -> String {
        tail_file(&self.log_path, n_lines)
    }

    fn signal_running(&mut self, sig: Signal) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "cannot send {sig} to {} (pid {}): it already exited with {status}",
                self.program.display(),
                self.pid()
            );
        }
        self.signal(sig)
    }

    /// Only called after `try_wait` reported the child as not yet reaped, so the pid is still
    /// ours (an exited but unreaped child is a zombie and cannot be reused).
    fn signal(&self, sig: Signal) -> Result<()> {
        let pid = self.pid();
        signal::kill(Pid::from_raw(pid as i32), sig)
            .with_context(|| format!("sending {sig} to {} (pid {pid})", self.program.display()))
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal(Signal::SIGKILL);
            // SIGKILL also terminates stopped processes, so this wait is short.
            let _ = self.child.wait();
        }
    }
}

/// A currently free TCP port on 127.0.0.1.
///
/// The port is found by binding port 0 and dropping the listener, so there is a small window in
/// which another process could take it; the server harnesses retry with a new port when that
/// happens. Never returns the ports of the shared PostgreSQL/Redis instances (5432/6379), because
/// those are bound.
pub fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding 127.0.0.1:0 to find a port");
    listener
        .local_addr()
        .expect("local address of a bound listener")
        .port()
}

/// Path of the workspace binary `name` (for example `"allocator"`) in the cargo target dir.
///
/// Uses `CARGO_BIN_EXE_<name>` if set at run time; otherwise derives it from the running test
/// executable, which lives at `target/<profile>/deps/<test>-<hash>`, so the binary is
/// `target/<profile>/<name>`. Cargo only builds the binaries of the package under test, so a test
/// in another package must make sure the binary was built (e.g. `cargo build -p allocator`). The
/// path is returned even if nothing exists there; spawning then fails with a clear error.
pub fn cargo_bin(name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("locating the current test executable");
    let mut dir = exe
        .parent()
        .expect("test executable has a parent directory")
        .to_path_buf();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}
