//! PgBouncer in front of a test's [`PgServer`]: the connection pooler operators often put
//! between services and PostgreSQL, in the pooling mode a test chooses.
//!
//! Debian's `pgbouncer` (1.18) runs on a free loopback port with its configuration in a
//! temporary directory, `auth_type = trust` like the test servers, one pool per database
//! (`* = host=… port=…`). It refuses to run as root, so when the test is root it runs as the
//! `postgres` user, as the server does. Dropping it kills it (its [`ChildProcess`] does).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tempfile::TempDir;
use tokio_postgres::NoTls;

use super::launch::server_user;
use super::PgServer;
use crate::process::{free_port, ChildProcess};

/// How long PgBouncer may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// PgBouncer's `pool_mode`: when a server session goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: one server session per client connection.
    Session,
    /// After each transaction.
    Transaction,
    /// After each statement (transactions refused).
    Statement,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// The PgBouncer binary: `$ALLOCATOR_PGBOUNCER_BIN`, else Debian's.
fn pgbouncer_bin() -> PathBuf {
    std::env::var_os("ALLOCATOR_PGBOUNCER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"))
}

/// A running PgBouncer; see the module docs.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    mode: PoolMode,
    process: ChildProcess,
    _dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` in front of `server`, with pools of up to `pool_size` server
    /// sessions per database and user.
    pub async fn start(server: &PgServer, mode: PoolMode, pool_size: usize) -> Result<Self> {
        let bin = pgbouncer_bin();
        if !bin.exists() {
            bail!(
                "no PgBouncer at {} (apt-get install pgbouncer, or set ALLOCATOR_PGBOUNCER_BIN)",
                bin.display()
            );
        }
        let dir = tempfile::Builder::new().prefix("pgbouncer-").tempdir()?;
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n")?;
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\npool_mode = {mode}\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 500\n",
                server_port = server.port(),
                users = users.display(),
                mode = mode.as_str(),
            ),
        )?;
        let run_as = server_user()?;
        if let Some((uid, gid)) = run_as {
            for path in [dir.path(), ini.as_path(), users.as_path()] {
                std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw()))
                    .with_context(|| format!("chown {} to postgres", path.display()))?;
            }
        }
        let process = ChildProcess::spawn_as(
            &bin,
            [ini.as_os_str()],
            &[],
            &dir.path().join("pgbouncer.log"),
            run_as,
        )?;
        let bouncer = PgBouncer {
            port,
            mode,
            process,
            _dir: dir,
        };
        bouncer.wait_ready().await?;
        Ok(bouncer)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    /// Connection URL of database `db` through PgBouncer.
    pub fn url_for(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port,
            schema::path::encode_segment(db)
        )
    }

    /// PgBouncer's log so far.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = self.url_for("postgres");
        loop {
            let error = match tokio_postgres::connect(&url, NoTls).await {
                Ok((client, connection)) => {
                    let task = tokio::spawn(connection);
                    let answered = client.simple_query("SELECT 1").await;
                    drop(client);
                    let _ = task.await;
                    match answered {
                        Ok(_) => return Ok(()),
                        Err(e) => e.to_string(),
                    }
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                bail!(
                    "PgBouncer not ready within {READY_TIMEOUT:?} ({error}); log:\n{}",
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
