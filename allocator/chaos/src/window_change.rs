//! The `window-change` fault: a rolling restart of every replica with another settlement window
//! length, as an operator's configuration change would roll out. While it rolls, replicas of one
//! cluster run with different lengths and the settlement job moves between them at each graceful
//! stop, so consecutive terms settle with different lengths: each from where the last settled
//! window ended, taking over a window left open as it was claimed.

use std::time::Duration;

use anyhow::Result;
use rand::rngs::StdRng;
use rand::Rng;

use crate::cluster::Cluster;
use crate::replicas::stop_allocator;

/// The replicas' flag for the window length.
const WINDOW_FLAG: &str = "--settlement-window-secs";
/// Window lengths (seconds) the cluster may be rolled to.
const WINDOWS: [u64; 4] = [2, 3, 5, 8];
/// Pause after each replica's restart, so the job can move before the next one stops.
const BETWEEN_RESTARTS: Duration = Duration::from_millis(1500);

/// Restarts every replica, one after the other, with a window length other than the first
/// replica's current one.
pub async fn inject(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let was: u64 = cluster.allocators[0]
        .arg(WINDOW_FLAG)
        .and_then(|w| w.parse().ok())
        .unwrap_or(crate::cluster::SETTLEMENT_WINDOW_SECS);
    let choices: Vec<u64> = WINDOWS.into_iter().filter(|w| *w != was).collect();
    let window = choices[rng.random_range(0..choices.len())];
    for i in 0..cluster.allocators.len() {
        stop_allocator(cluster, i).await?;
        cluster.allocators[i].set_arg(WINDOW_FLAG, window.to_string());
        let skew = cluster.allocators[i].skew.clone();
        cluster.spawn_allocator(i, skew)?;
        tokio::time::sleep(BETWEEN_RESTARTS).await;
    }
    Ok((
        "all allocators".into(),
        format!("rolled to --settlement-window-secs {window} (was {was}), one replica at a time"),
    ))
}
