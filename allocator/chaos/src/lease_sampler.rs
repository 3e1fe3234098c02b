//! Samples every shard's partition leases while the run goes on (`leases.jsonl`), for the
//! checker's `two-lease-holders` rule (I13): each round reads every shard, then every shard
//! again, so a lease seen the same in both reads of its shard was held through the round.
//!
//! A read is one statement on a connection of the harness's own, straight to the shard (no
//! proxy): a shard that is down, frozen or slow is left out of the round, and its connection is
//! made again in a later one. A lease row a move is bringing in (`moving_in`) is not read: no
//! allocator may act on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::history::{Clock, JsonLines};

/// Time between rounds.
const EVERY: Duration = Duration::from_millis(250);
/// How long one read may take before its shard is left out of the round.
const READ_TIMEOUT: Duration = Duration::from_millis(1000);

const LEASES: &str = "SELECT coalesce(json_agg(json_build_array(partition, holder_id, epoch)
                                      ORDER BY partition), '[]'::json)::text
                        FROM leases
                       WHERE partition IS NOT NULL AND holder_id IS NOT NULL
                         AND expires_at > now() AND NOT moving_in";

struct Shard {
    name: String,
    url: String,
    client: Option<tokio_postgres::Client>,
}

impl Shard {
    /// The shard's unexpired partition leases, or `None` when it did not answer in time.
    async fn read(&mut self) -> Option<Value> {
        if self.client.is_none() {
            let connect = tokio_postgres::connect(&self.url, tokio_postgres::NoTls);
            let (client, connection) = tokio::time::timeout(READ_TIMEOUT, connect)
                .await
                .ok()?
                .ok()?;
            tokio::spawn(connection);
            self.client = Some(client);
        }
        let client = self.client.as_ref()?;
        match tokio::time::timeout(READ_TIMEOUT, client.query_one(LEASES, &[])).await {
            Ok(Ok(row)) => serde_json::from_str(row.get::<_, &str>(0)).ok(),
            _ => {
                self.client = None;
                None
            }
        }
    }
}

/// Samples `shards` (name, URL) into `log` until `stop` is set; returns the rounds taken.
pub async fn run(
    shards: Vec<(String, String)>,
    clock: Clock,
    log: Arc<JsonLines>,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut shards: Vec<Shard> = shards
        .into_iter()
        .map(|(name, url)| Shard {
            name,
            url,
            client: None,
        })
        .collect();
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        let at_ms = clock.ms();
        let mut first = Vec::with_capacity(shards.len());
        for shard in &mut shards {
            first.push(shard.read().await);
        }
        let mut read = Vec::new();
        for (shard, first) in shards.iter_mut().zip(first) {
            if let (Some(first), Some(second)) = (first, shard.read().await) {
                read.push(json!({"shard": shard.name, "first": first, "second": second}));
            }
        }
        log.write(&json!({"at_ms": at_ms, "shards": read}));
        rounds += 1;
        tokio::time::sleep(EVERY).await;
    }
    rounds
}
