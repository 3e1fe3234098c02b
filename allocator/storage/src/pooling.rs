//! Is each client connection its own server session? A connection pooler in front of
//! PostgreSQL (PgBouncer) may hand one server session to many clients: per transaction
//! (`pool_mode = transaction`) or per statement (`statement`). The services cannot work that
//! way, and not only for speed:
//!
//! - the storage fence judges a connection once, when it is made ([`crate::pool`]): a later
//!   transaction on a multiplexed connection may run on another server session, whose server the
//!   fence never judged;
//! - a `LISTEN` session hears nothing once its server session goes back to the pool;
//! - prepared statements (every statement here is one) exist only in the session that
//!   prepared them;
//! - session settings (the server-side timeouts) would leak to, and be reset by, other clients.
//!
//! So both services check at start-up and refuse to run behind such a pooler. Session pooling
//! (`pool_mode = session`) is one server session per client connection for the client's whole
//! life, which is what a direct connection is: it works, and every per-session check holds.
//!
//! The check needs no access to the pooler's console and no configuration: two client
//! connections, A and B. A reads its server process id; B opens a transaction and reads its
//! own; A reads its id again while B's transaction is open. Directly, or through session
//! pooling, B's id differs from A's and A's stays the same. A pooler that multiplexes gives B
//! the server session A just released (PgBouncer reuses the most recently released one first)
//! or gives A a different one the second time, or makes A wait for a server while B holds it;
//! statement pooling refuses B's transaction outright. Any of these is a refusal.

use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls, SimpleQueryMessage};

use crate::fence::StorageFence;

/// How long one step of the check may take before the connection counts as waiting for a
/// server session another client holds.
const STEP: Duration = Duration::from_secs(2);

/// What the check found. When it could not decide (the database is unreachable, say), the
/// caller starts anyway and its pools report the database as they find it.
#[derive(Debug)]
pub enum PoolingCheck {
    /// One server session per client connection (direct, or session pooling).
    Session,
    /// Client connections share server sessions: the services must not run like this.
    Multiplexed(String),
    /// Not decided; the reason.
    Unknown(anyhow::Error),
}

/// What a [`PoolingCheck::Multiplexed`] means, for the start-up error.
pub const MULTIPLEXED_HELP: &str = "client connections share server sessions: a connection \
    pooler (PgBouncer?) runs in transaction or statement mode in front of PostgreSQL. The \
    services need one server session per connection (session pooling or a direct connection): \
    the storage fence judges each session once, LISTEN and prepared statements live in one \
    session. Set pool_mode = session for this database, or connect directly";

/// Runs the check on every configured host of `config` (with its session settings) that
/// accepts connections: one host behind a multiplexing pooler is enough to refuse. The hosts are
/// connected to without the fence's identity reads, which are prepared statements and so would
/// themselves fail, now and then, behind transaction pooling.
pub async fn check(config: &Config) -> PoolingCheck {
    let mut checked = 0;
    let mut last_error = None;
    for (label, host) in StorageFence::hosts_of(config) {
        let verdict = match tokio::join!(open(&host), open(&host)) {
            (Ok(a), Ok(b)) => sessions_of(&a, &b).await,
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        match verdict {
            Ok(PoolingCheck::Multiplexed(how)) => {
                return PoolingCheck::Multiplexed(format!("{label}: {how}"))
            }
            Ok(_) => checked += 1,
            Err(e) => last_error = Some(e.context(label)),
        }
    }
    match (checked, last_error) {
        (0, Some(e)) => PoolingCheck::Unknown(e),
        _ => PoolingCheck::Session,
    }
}

/// One connection to one host, its connection driven by a task of its own (which ends when
/// the client is dropped).
async fn open(host: &Config) -> anyhow::Result<Client> {
    let (client, connection) = tokio::time::timeout(STEP * 2, host.connect(NoTls))
        .await
        .map_err(|_| anyhow::anyhow!("connecting took over {:?}", STEP * 2))??;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// [`ROUNDS`] rounds of the check on one pair of connections: A's server process must be the
/// same throughout, and never B's.
async fn sessions_of(a: &Client, b: &Client) -> anyhow::Result<PoolingCheck> {
    let first = server_pid(a).await?;
    for _ in 0..ROUNDS {
        let verdict = round(a, b, first).await?;
        if !matches!(verdict, PoolingCheck::Session) {
            return Ok(verdict);
        }
    }
    Ok(PoolingCheck::Session)
}

/// Several rounds, because a pooler that hands out its longest-idle server session
/// (PgBouncer's `server_round_robin`) may give A its own session back once by chance.
const ROUNDS: usize = 3;

async fn round(a: &Client, b: &Client, first: i32) -> anyhow::Result<PoolingCheck> {
    let now = server_pid(a).await?;
    if now != first {
        return Ok(PoolingCheck::Multiplexed(format!(
            "one client connection ran on two server sessions (pids {first}, {now})"
        )));
    }
    if let Err(e) = b.batch_execute("BEGIN").await {
        if e.as_db_error().is_none() {
            return Err(e.into());
        }
        // PgBouncer's statement mode: "transaction blocks not allowed in statement pooling mode".
        return Ok(PoolingCheck::Multiplexed(format!(
            "a transaction was refused ({e})"
        )));
    }
    let verdict = async {
        let other = server_pid(b).await?;
        if other == first {
            return Ok(PoolingCheck::Multiplexed(format!(
                "two client connections ran on the same server session (pid {first})"
            )));
        }
        Ok(match tokio::time::timeout(STEP, server_pid(a)).await {
            Err(_) => PoolingCheck::Multiplexed(
                "a client connection waited for a server session another client held".into(),
            ),
            Ok(again) => {
                let again = again?;
                if again == first {
                    PoolingCheck::Session
                } else {
                    PoolingCheck::Multiplexed(format!(
                        "one client connection ran on two server sessions (pids {first}, {again})"
                    ))
                }
            }
        })
    }
    .await;
    // Ends B's transaction; a failure here changes nothing the check found.
    let _ = b.batch_execute("COMMIT").await;
    verdict
}

/// The server process behind `client`'s session now. A simple query: a prepared one would
/// itself fail behind transaction pooling (its parse and execution may meet different sessions)
/// and leave the check undecided.
async fn server_pid(client: &Client) -> anyhow::Result<i32> {
    let messages = tokio::time::timeout(STEP, client.simple_query("SELECT pg_backend_pid()"))
        .await
        .map_err(|_| anyhow::anyhow!("SELECT pg_backend_pid() took over {STEP:?}"))??;
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(|pid| pid.parse().ok()),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("SELECT pg_backend_pid() returned no process id"))
}
