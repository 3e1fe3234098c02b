//! The periodic re-read of the assignment map: the fallback that keeps routing correct when the
//! Redis feed is down, slow or lossy (DESIGN.md §3: Redis is never needed for correctness).
//!
//! Every `poll_interval` the map is re-read unless some other read (a hint, a `421`) started
//! within the last half interval, so with a healthy feed the poll mostly stays out of the way.
//! The poll also retries the startup read until the first map is loaded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::assignment_cache::AssignmentCache;
use crate::metrics::RefreshCause;

pub async fn run(cache: Arc<AssignmentCache>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; startup already read the map.
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {
                let now = Instant::now();
                let fresh_after = now.checked_sub(interval / 2).unwrap_or(now);
                // Failures are logged and counted by the cache; the next tick tries again.
                let _ = cache.refresh(RefreshCause::Poll, fresh_after).await;
            }
        }
    }
    tracing::debug!("assignment poll stopped");
}
