//! Publishes assignment change hints to Redis.
//!
//! Hints are best effort and never block lease work: they go through a bounded queue to one task
//! that (re)connects with backoff and drops hints it cannot deliver. Routers poll PostgreSQL as
//! the fallback, so a lost hint only delays a map refresh.

use std::time::Duration;

use redis::AsyncCommands;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use schema::hint::{AssignmentHint, HINT_CHANNEL};

#[derive(Clone, Debug)]
pub struct HintPublisher {
    tx: Option<mpsc::Sender<AssignmentHint>>,
}

impl HintPublisher {
    /// A publisher that drops everything (no Redis configured).
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    pub fn spawn(
        redis_url: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<(Self, tokio::task::JoinHandle<()>)> {
        let client = redis::Client::open(redis_url)?;
        let (tx, rx) = mpsc::channel(1024);
        let task = tokio::spawn(run(client, rx, shutdown));
        Ok((Self { tx: Some(tx) }, task))
    }

    pub fn publish(&self, hint: AssignmentHint) {
        if let Some(tx) = &self.tx {
            if tx.try_send(hint).is_err() {
                metrics::counter!(m::HINTS_PUBLISHED, "result" => "dropped").increment(1);
            }
        }
    }
}

async fn run(
    client: redis::Client,
    mut rx: mpsc::Receiver<AssignmentHint>,
    shutdown: CancellationToken,
) {
    let mut connection: Option<redis::aio::MultiplexedConnection> = None;
    let mut failures = 0u32;
    loop {
        let hint = tokio::select! {
            _ = shutdown.cancelled() => return,
            hint = rx.recv() => match hint { Some(h) => h, None => return },
        };
        if connection.is_none() {
            match tokio::time::timeout(
                Duration::from_secs(1),
                client.get_multiplexed_async_connection(),
            )
            .await
            {
                Ok(Ok(c)) => {
                    failures = 0;
                    connection = Some(c);
                }
                _ => {
                    metrics::counter!(m::HINTS_PUBLISHED, "result" => "unavailable").increment(1);
                    tracing::debug!(
                        partition = hint.partition,
                        "redis unavailable, hint dropped"
                    );
                    tokio::time::sleep(edge::Backoff::RECONNECT.delay(failures)).await;
                    failures = failures.saturating_add(1);
                    continue;
                }
            }
        }
        let Some(conn) = connection.as_mut() else {
            continue;
        };
        let payload = serde_json::to_string(&hint).expect("hint serialises");
        let sent: Result<Result<i64, redis::RedisError>, _> =
            tokio::time::timeout(Duration::from_secs(1), conn.publish(HINT_CHANNEL, payload)).await;
        match sent {
            Ok(Ok(_)) => {
                metrics::counter!(m::HINTS_PUBLISHED, "result" => "sent").increment(1);
            }
            _ => {
                metrics::counter!(m::HINTS_PUBLISHED, "result" => "failed").increment(1);
                connection = None;
            }
        }
    }
}
