//! One service process of a [`Cluster`](super::Cluster): an allocator replica or a router, with
//! everything needed to start it again the same way (binary, arguments, environment, log file,
//! port) and the TCP proxies between it and the database hosts, if it has any.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::{ChildProcess, ProxyMode, TcpProxy};

/// What a service process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Allocator,
    Router,
}

/// A service process and how to (re)start it.
///
/// The fields are public so that a test can change what the next start uses: another argument
/// (see [`Service::set_arg`]), more environment, or a wall-clock offset ([`Service::skew`]).
#[derive(Debug)]
pub struct Service {
    /// Replica id of an allocator (`--replica-id`), name of a router; also the log file's name.
    pub id: String,
    pub role: Role,
    /// Port it listens on (127.0.0.1), kept across restarts.
    pub port: u16,
    /// The URL others reach it at: an allocator's `--advertise-url` (a proxy's, or HTTPS, when
    /// the test says so), else `http://127.0.0.1:PORT`.
    pub url: String,
    pub bin: PathBuf,
    /// Every argument, starting with the subcommand (`serve`).
    pub args: Vec<String>,
    /// Environment on top of the launcher's own (later entries win).
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr are appended, across restarts.
    pub log: PathBuf,
    /// One per database host, in the hosts' order, when the service reaches the database
    /// through proxies of its own.
    pub proxies: Vec<TcpProxy>,
    /// The running (or exited, not yet restarted) process; `None` before the first start or
    /// after a test took it away.
    pub process: Option<ChildProcess>,
    /// `FAKETIME` offset (e.g. `+30s`) of the next start; needs [`Service::libfaketime`].
    pub skew: Option<String>,
    /// The libfaketime preload library, when the cluster was given one.
    pub libfaketime: Option<PathBuf>,
    /// Starts after the first.
    pub restarts: u64,
}

impl Service {
    /// Starts the process (again, under the same id, port and log file). A process that still
    /// runs is killed first.
    pub fn spawn(&mut self) -> Result<()> {
        let mut env = self.env.clone();
        if let Some(offset) = &self.skew {
            let lib = self
                .libfaketime
                .as_ref()
                .context("a clock skew needs libfaketime")?;
            env.push(("LD_PRELOAD".into(), lib.display().to_string()));
            env.push(("FAKETIME".into(), offset.clone()));
            // Monotonic time stays real, or the service's timers would misbehave.
            env.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
        }
        if let Some(old) = self.process.as_mut() {
            old.sigkill()?;
            self.restarts += 1;
        }
        self.process = Some(ChildProcess::spawn(&self.bin, &self.args, &env, &self.log)?);
        Ok(())
    }

    /// Whether the process runs (possibly frozen).
    pub fn is_running(&mut self) -> bool {
        self.process
            .as_mut()
            .is_some_and(|p| matches!(p.try_exit_status(), Ok(None)))
    }

    /// Pid of the current process, if one was started.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildProcess::pid)
    }

    /// Crashes the process (`SIGKILL`); a no-op when it is not running.
    pub fn kill(&mut self) -> Result<()> {
        match self.process.as_mut() {
            Some(p) => p.sigkill(),
            None => Ok(()),
        }
    }

    /// Freezes the process (`SIGSTOP`).
    pub fn freeze(&mut self) -> Result<()> {
        self.running()?.sigstop()
    }

    /// Undoes [`Service::freeze`].
    pub fn thaw(&mut self) -> Result<()> {
        self.running()?.sigcont()
    }

    /// Graceful stop: `SIGTERM` (an allocator releases its leases), then `SIGKILL` if it has not
    /// exited within `timeout`. Returns whether it had to be killed; an error if it had exited
    /// on its own before (with its log tail).
    pub async fn stop(&mut self, timeout: Duration) -> Result<bool> {
        self.terminate()?;
        self.reap(timeout).await
    }

    /// Sends `SIGTERM` (the first half of [`Service::stop`], for stopping several at once).
    pub fn terminate(&mut self) -> Result<()> {
        self.running()?.sigterm()
    }

    /// Waits up to `timeout` for the process to exit, then kills it; returns whether it had to
    /// be killed.
    pub async fn reap(&mut self, timeout: Duration) -> Result<bool> {
        let id = self.id.clone();
        let p = self
            .process
            .as_mut()
            .with_context(|| format!("{id} was never started"))?;
        if p.wait_exit(timeout).await.is_ok() {
            return Ok(false);
        }
        p.sigkill()?;
        p.wait_exit(Duration::from_secs(10)).await?;
        tracing::warn!(service = %id, "did not stop within {timeout:?} of SIGTERM; killed");
        Ok(true)
    }

    /// [`Service::stop`] if it runs, then [`Service::spawn`].
    pub async fn restart(&mut self, timeout: Duration) -> Result<()> {
        if self.is_running() {
            self.stop(timeout).await?;
        }
        self.spawn()
    }

    /// Sets every proxy of this service's database link to `mode`.
    pub fn set_link(&self, mode: ProxyMode) {
        for proxy in &self.proxies {
            proxy.set_mode(mode);
        }
    }

    /// The value given to `flag` (the last one, when it is repeated).
    pub fn arg(&self, flag: &str) -> Option<&str> {
        self.args
            .windows(2)
            .rev()
            .find(|w| w[0] == flag)
            .map(|w| w[1].as_str())
    }

    /// Sets `flag`'s value for the next start: replaces every occurrence, or appends it.
    pub fn set_arg(&mut self, flag: &str, value: impl Into<String>) {
        let value = value.into();
        let mut found = false;
        for i in 0..self.args.len().saturating_sub(1) {
            if self.args[i] == flag {
                self.args[i + 1] = value.clone();
                found = true;
            }
        }
        if !found {
            self.args.extend([flag.to_owned(), value]);
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self, n_lines: usize) -> String {
        crate::procfs::tail_file(&self.log, n_lines)
    }

    /// The process, or an error naming how it ended (with its log tail).
    fn running(&mut self) -> Result<&mut ChildProcess> {
        let id = &self.id;
        let p = self
            .process
            .as_mut()
            .with_context(|| format!("{id} was never started"))?;
        if let Some(status) = p.try_exit_status()? {
            bail!("{id} exited with {status}:\n{}", p.log_tail(20));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(args: &[&str]) -> Service {
        Service {
            id: "alloc-0".into(),
            role: Role::Allocator,
            port: 1,
            url: "http://127.0.0.1:1".into(),
            bin: PathBuf::from("/bin/true"),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            log: PathBuf::from("/dev/null"),
            proxies: Vec::new(),
            process: None,
            skew: None,
            libfaketime: None,
            restarts: 0,
        }
    }

    #[test]
    fn set_arg_replaces_every_occurrence_or_appends() {
        let mut s = service(&["serve", "--window", "5", "--x", "1", "--window", "6"]);
        assert_eq!(s.arg("--window"), Some("6"));
        s.set_arg("--window", "8");
        assert_eq!(
            s.args,
            ["serve", "--window", "8", "--x", "1", "--window", "8"]
        );
        s.set_arg("--y", "2");
        assert_eq!(s.arg("--y"), Some("2"));
        assert_eq!(s.arg("--z"), None);
    }

    #[test]
    fn a_skew_without_libfaketime_is_refused() {
        let mut s = service(&["serve"]);
        s.skew = Some("+30s".into());
        let err = s.spawn().unwrap_err();
        assert!(err.to_string().contains("libfaketime"), "{err:#}");
        assert!(s.process.is_none());
    }
}
