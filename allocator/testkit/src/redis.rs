//! A private, throw-away Redis server per test.
//!
//! The service uses Redis only as a cache/accelerator; tests must show that losing it (crash,
//! restart with empty state) never compromises correctness. That requires a Redis instance the
//! test can kill and bring back on the same address, which must not be the shared instance on
//! port 6379. [`RedisServer`] runs `redis-server` on a free port with persistence disabled (a
//! restart therefore starts empty, the worst case for a cache) and its working directory and log
//! in a temporary directory.
//!
//! Readiness is checked with a raw `PING` over TCP so the harness does not depend on a Redis
//! client library. Cleanup happens in `Drop` (also while a failing test unwinds).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::process::free_port;
use super::procfs::{self, ProcId};

/// How long a (re)started server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How many fresh ports `start` tries when the chosen one was taken in the meantime.
const PORT_ATTEMPTS: usize = 5;

/// A `redis-server` owned by one test. Dropping it kills the server and deletes its directory.
#[derive(Debug)]
pub struct RedisServer {
    /// TCP port on 127.0.0.1, kept by `start_again` so clients can reconnect to the same URL.
    port: u16,
    /// The `redis-server` executable (`$ALLOCATOR_REDIS_SERVER`, `/usr/bin/redis-server`, or
    /// found on `PATH`).
    bin: PathBuf,
    /// Server output, appended across restarts; its tail is put into errors.
    log_path: PathBuf,
    /// The running server; `None` after `stop`. Owning the `Child` lets us reap it.
    child: Option<Child>,
    /// Identity (pid + start time) of the running server, so signals can never hit a recycled
    /// pid and any forked children (e.g. a `BGSAVE` a test triggered) can be found.
    id: Option<ProcId>,
    /// Owns the temporary working directory; declared last so it is removed after the server
    /// has been killed in `Drop::drop`.
    tmp: TempDir,
}

impl RedisServer {
    /// Starts a server on a free port and returns once it answers `PING`.
    pub async fn start() -> Result<RedisServer> {
        let bin = redis_bin()?;
        let tmp = tempfile::Builder::new()
            .prefix("allocator-redis-")
            .tempdir()
            .context("creating temporary directory for Redis")?;
        let mut server = RedisServer {
            port: 0,
            bin,
            log_path: tmp.path().join("redis.log"),
            child: None,
            id: None,
            tmp,
        };
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            match server.launch().await {
                Ok(()) => return Ok(server),
                Err(e) if server.log_tail(20).contains("Address already in use") => {
                    last_err = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no port attempts made"))
            .context(format!("no free port found after {PORT_ATTEMPTS} attempts")))
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its working directory (log, no data: persistence is off), removed on drop.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Pid of the running server, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n_lines` lines of the server log.
    pub fn log_tail(&self, n_lines: usize) -> String {
        procfs::tail_file(&self.log_path, n_lines)
    }

    /// Crashes the server (`SIGKILL`) and reaps it. All data is lost since persistence is off.
    /// A no-op if it is not running.
    pub fn stop(&mut self) -> Result<()> {
        if let (Some(mut child), Some(id)) = (self.child.take(), self.id.take()) {
            procfs::kill_tree(&id, &mut child);
        } else if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts the server again on the same port (after [`RedisServer::stop`]; a running server
    /// is stopped first) and waits until it answers `PING`. It comes back empty.
    pub async fn start_again(&mut self) -> Result<()> {
        self.stop()?;
        self.launch().await
    }

    /// Freezes the server (`SIGSTOP`): connections stay open but nothing is answered.
    pub fn pause(&self) -> Result<()> {
        let id = self.running_id()?;
        procfs::freeze_tree(&id);
        Ok(())
    }

    /// Undoes [`RedisServer::pause`].
    pub fn resume(&self) -> Result<()> {
        let id = self.running_id()?;
        for p in procfs::descendants(id.pid) {
            procfs::signal(&p, Signal::SIGCONT);
        }
        procfs::signal(&id, Signal::SIGCONT);
        Ok(())
    }

    fn running_id(&self) -> Result<ProcId> {
        self.id
            .filter(procfs::is_alive)
            .ok_or_else(|| anyhow!("Redis on port {} is not running", self.port))
    }

    /// Spawns the server on `self.port` and waits for `PING`; on failure the process is killed
    /// and the error carries the log tail.
    async fn launch(&mut self) -> Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .context("opening Redis log")?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
            ])
            .arg(self.tmp.path())
            .current_dir(self.tmp.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating log handle")?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.id = procfs::proc_id(child.id() as i32);
        self.child = Some(child);

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self.child.as_mut().expect("just spawned");
            if let Some(status) = child.try_wait().context("polling redis-server")? {
                self.child = None;
                self.id = None;
                bail!(
                    "redis-server on port {} exited during startup with {status}; log tail:\n{}",
                    self.port,
                    self.log_tail(20)
                );
            }
            let last_err = match ping(self.port).await {
                Ok(()) => return Ok(()),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                self.stop()?;
                bail!(
                    "redis-server on port {} did not answer PING within {READY_TIMEOUT:?} \
                     (last error: {last_err}); log tail:\n{}",
                    self.port,
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Whether a Redis at `host:port` answers `PING` within a second (e.g. the machine's own, which
/// a local cluster may use instead of a private server).
pub async fn answers_ping(host: &str, port: u16) -> bool {
    ping_at(host, port).await.is_ok()
}

/// One `PING` round trip over a fresh TCP connection, bounded to one second.
async fn ping(port: u16) -> Result<()> {
    ping_at("127.0.0.1", port).await
}

async fn ping_at(host: &str, port: u16) -> Result<()> {
    let attempt = async {
        let mut stream = TcpStream::connect((host, port)).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        // A reply line ends with CRLF; read until we have one (replies are tiny).
        while !buf[..n].ends_with(b"\r\n") && n < buf.len() {
            let read = stream.read(&mut buf[n..]).await?;
            if read == 0 {
                break;
            }
            n += read;
        }
        let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
        if reply.starts_with("+PONG") {
            Ok(())
        } else {
            // e.g. `-LOADING ...` while a server is still starting.
            Err(anyhow!("unexpected PING reply {reply:?}"))
        }
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .map_err(|_| anyhow!("PING timed out"))?
}

/// Locates `redis-server`: `$ALLOCATOR_REDIS_SERVER`, `/usr/bin/redis-server`, then `PATH`.
fn redis_bin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ALLOCATOR_REDIS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let default = Path::new("/usr/bin/redis-server");
    if default.is_file() {
        return Ok(default.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("redis-server not found in /usr/bin or on PATH"))
}
