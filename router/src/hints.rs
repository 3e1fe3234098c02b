//! The subscribing end of the Redis hint channel (the allocator's `hints` module publishes):
//! hints that make the router re-read the map soon after ownership changes, instead of waiting
//! for the next poll. (Logs and the `router_redis_feed_connected` gauge call it "the feed".)
//!
//! Redis is never an authority (DESIGN.md §3). A hint ([`AssignmentHint`]) only *triggers* a
//! re-read of PostgreSQL; its contents are used for logs and for gap detection, never applied to
//! the map. Pub/sub delivers at most once and forgets everything while a subscriber is away, so:
//!
//! * on every (re)connect the map is re-read (cause `reconnect`), covering hints missed while
//!   disconnected;
//! * a hint whose revision skips past everything seen so far is a `gap` (a hint was lost or is
//!   still in flight); it is re-read like any other hint but counted separately. Revisions are
//!   per shard, so a hint is compared with what is known of its partition's shard, and a batch
//!   of hints re-reads only the shards its partitions are on (every shard when one cannot be
//!   placed);
//! * a frozen Redis keeps the TCP connection open and silent, so the subscription pings every
//!   `hints_ping_interval` and treats a missing pong as a disconnect.
//!
//! The subscription runs in the background and reconnects with capped, jittered backoff forever; the
//! router starts and serves without Redis (routing then relies on [`crate::poll`]).
//! `router_redis_feed_connected` is 1 only while subscribed and answering pings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use redis::aio::{PubSubSink, PubSubStream};
use schema::hint::{AssignmentHint, HINT_CHANNEL};
use tokio_util::sync::CancellationToken;

use crate::assignment_cache::AssignmentCache;
use crate::metrics::{self, RefreshCause};
use edge::Backoff;

/// How long connecting and subscribing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// First reconnect delay.
const RECONNECT_BASE: Duration = Backoff::RECONNECT.base;

#[derive(Debug, Clone)]
pub struct HintsConfig {
    pub redis_url: String,
    /// Cap of the reconnect backoff.
    pub reconnect_max: Duration,
    /// Ping period; also the ping timeout.
    pub ping_interval: Duration,
}

/// Why a subscription ended.
enum Ended {
    Shutdown,
    Lost(String),
}

/// Whether a hint with `hint_revision` reveals missed changes, given the highest revision known
/// so far (from the map or earlier hints on this connection).
pub fn hint_cause(known: Option<i64>, hint_revision: i64) -> RefreshCause {
    match known {
        Some(known) if hint_revision > known.saturating_add(1) => RefreshCause::Gap,
        _ => RefreshCause::Hint,
    }
}

/// What one batch of hints asks for: its cause (a gap if any hint skipped revisions of its
/// shard) and the shards to re-read (`None`: every shard, because a hint could not be placed).
#[derive(Debug, PartialEq, Eq)]
pub struct BatchPlan {
    pub cause: RefreshCause,
    pub shards: Option<Vec<usize>>,
}

impl Default for BatchPlan {
    fn default() -> Self {
        Self {
            cause: RefreshCause::Hint,
            shards: Some(Vec::new()),
        }
    }
}

impl BatchPlan {
    /// Add a hint of `revision` for a partition on `shard` (`None`: the placement is not known),
    /// whose routed map is at `routed`. `known` is the highest revision seen per shard on this
    /// connection; revisions are per shard, so a hint is compared with its own shard's only.
    pub fn add(
        &mut self,
        known: &mut HashMap<usize, Option<i64>>,
        shard: Option<usize>,
        routed: Option<i64>,
        revision: i64,
    ) {
        let Some(shard) = shard else {
            return self.add_unplaced();
        };
        if let Some(list) = self.shards.as_mut() {
            if !list.contains(&shard) {
                list.push(shard);
            }
        }
        let known = known.entry(shard).or_default();
        *known = (*known).max(routed);
        if hint_cause(*known, revision) == RefreshCause::Gap {
            self.cause = RefreshCause::Gap;
        }
        *known = (*known).max(Some(revision));
    }

    /// Add a hint that names no shard (unreadable, or the placement is not known).
    pub fn add_unplaced(&mut self) {
        self.shards = None;
    }
}

/// Run the subscription until `shutdown` is cancelled.
pub async fn run(config: HintsConfig, cache: Arc<AssignmentCache>, shutdown: CancellationToken) {
    metrics::set_redis_feed_connected(false);
    let client = match redis::Client::open(config.redis_url.as_str()) {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "invalid redis url; hint feed disabled, routing by polling only");
            return;
        }
    };
    let backoff = Backoff {
        base: RECONNECT_BASE,
        max: config.reconnect_max.max(RECONNECT_BASE),
    };
    let mut failures = 0u32;
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = tokio::time::timeout(CONNECT_TIMEOUT, subscribe(&client)) => r,
        };
        match attempt {
            Ok(Ok((sink, stream))) => {
                failures = 0;
                metrics::set_redis_feed_connected(true);
                tracing::info!(channel = HINT_CHANNEL, "redis feed connected");
                // Hints published while we were not subscribed are gone: re-read.
                let _ = cache.refresh(RefreshCause::Reconnect, Instant::now()).await;
                let ended = listen(sink, stream, &cache, &config, &shutdown).await;
                metrics::set_redis_feed_connected(false);
                match ended {
                    Ended::Shutdown => break,
                    Ended::Lost(reason) => {
                        tracing::warn!(reason = %reason, "redis feed disconnected; reconnecting")
                    }
                }
            }
            Ok(Err(e)) => log_connect_failure(failures, &e.to_string()),
            Err(_) => log_connect_failure(failures, "connect timed out"),
        }
        let delay = backoff.delay(failures);
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    metrics::set_redis_feed_connected(false);
    tracing::info!("redis feed stopped");
}

fn log_connect_failure(failures: u32, error: &str) {
    // Loud on the first failure and then every tenth, so a long Redis outage does not flood logs.
    if failures.is_multiple_of(10) {
        tracing::warn!(
            error,
            failures,
            "redis feed unavailable; routing by polling"
        );
    } else {
        tracing::debug!(error, failures, "redis feed reconnect failed");
    }
}

async fn subscribe(client: &redis::Client) -> redis::RedisResult<(PubSubSink, PubSubStream)> {
    let (mut sink, stream) = client.get_async_pubsub().await?.split();
    sink.subscribe(HINT_CHANNEL).await?;
    Ok((sink, stream))
}

async fn listen(
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    cache: &AssignmentCache,
    config: &HintsConfig,
    shutdown: &CancellationToken,
) -> Ended {
    // The highest revision known per shard (index), from its map or earlier hints on this
    // connection.
    let mut known: HashMap<usize, Option<i64>> = HashMap::new();
    let mut ping = tokio::time::interval(config.ping_interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ended::Shutdown,
            msg = stream.next() => {
                let Some(first) = msg else {
                    return Ended::Lost("subscription stream ended".to_owned());
                };
                // Drain what is already queued so a burst of hints costs one re-read.
                let mut batch = vec![first];
                while let Some(Some(msg)) = stream.next().now_or_never() {
                    batch.push(msg);
                }
                let current = cache.current();
                let mut plan = BatchPlan::default();
                for msg in &batch {
                    match serde_json::from_slice::<AssignmentHint>(msg.get_payload_bytes()) {
                        Ok(hint) => {
                            let shard = cache.shard_of(hint.partition);
                            let routed = shard.and_then(|s| {
                                current.as_ref()?.shard(s).map(|m| m.revision())
                            });
                            plan.add(&mut known, shard, routed, hint.revision);
                            tracing::debug!(
                                kind = ?hint.kind,
                                partition = hint.partition,
                                epoch = hint.epoch,
                                revision = hint.revision,
                                owner_id = %hint.owner_id,
                                shard = shard,
                                "assignment hint received"
                            );
                        }
                        Err(e) => {
                            plan.add_unplaced();
                            tracing::warn!(error = %e, "malformed assignment hint; re-reading anyway")
                        }
                    }
                }
                let BatchPlan { cause, shards } = plan;
                if cause == RefreshCause::Gap {
                    tracing::info!(shards = ?shards, "assignment hint gap; full re-read");
                }
                let _ = match shards {
                    Some(shards) => cache.refresh_shards(&shards, cause, Instant::now()).await,
                    None => cache.refresh(cause, Instant::now()).await,
                };
            }
            _ = ping.tick() => {
                match tokio::time::timeout(config.ping_interval, sink.ping::<redis::Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Ended::Lost(format!("ping failed: {e}")),
                    Err(_) => return Ended::Lost("ping timed out".to_owned()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_revisions_are_plain_hints() {
        assert_eq!(hint_cause(None, 17), RefreshCause::Hint);
        assert_eq!(hint_cause(Some(16), 17), RefreshCause::Hint);
        // Older or duplicate hints (reordered publishers) are not gaps.
        assert_eq!(hint_cause(Some(20), 17), RefreshCause::Hint);
        assert_eq!(hint_cause(Some(17), 17), RefreshCause::Hint);
    }

    #[test]
    fn hints_are_compared_with_their_own_shard() {
        let mut known = HashMap::new();
        // Shard 0 is at 40, shard 1 at 3: a hint of 4 on shard 1 is the next revision there,
        // not an old one, and a hint of 41 on shard 0 is no gap either.
        let mut plan = BatchPlan::default();
        plan.add(&mut known, Some(1), Some(3), 4);
        plan.add(&mut known, Some(0), Some(40), 41);
        plan.add(&mut known, Some(1), Some(3), 5);
        assert_eq!(
            plan,
            BatchPlan {
                cause: RefreshCause::Hint,
                shards: Some(vec![1, 0]),
            }
        );
        // Skipping on shard 1 (known 5 now) is a gap, whatever shard 0's revision.
        let mut plan = BatchPlan::default();
        plan.add(&mut known, Some(1), Some(3), 9);
        assert_eq!(plan.cause, RefreshCause::Gap);
        assert_eq!(plan.shards, Some(vec![1]));
        // A hint that cannot be placed re-reads every shard.
        let mut plan = BatchPlan::default();
        plan.add(&mut known, Some(0), Some(40), 42);
        plan.add(&mut known, None, None, 7);
        assert_eq!(plan.shards, None);
    }

    #[test]
    fn skipped_revisions_are_gaps() {
        assert_eq!(hint_cause(Some(15), 17), RefreshCause::Gap);
        assert_eq!(hint_cause(Some(i64::MAX), 17), RefreshCause::Hint);
    }
}
