//! The `window-change` fault: a replica restarted (gracefully) with another settlement window
//! length, as an operator's rolling configuration change would. Replicas of one cluster then run
//! with different lengths, and whichever holds the settlement job next — after a kill, a pause,
//! a partition or this very restart — settles with its own length from where the last settled
//! window ended, and takes over a window left open as it was claimed.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::Rng;

use crate::cluster::Cluster;
use crate::faults::stop_allocator;

/// Window lengths (seconds) a replica may be restarted with.
const WINDOWS: [u64; 4] = [2, 3, 5, 8];

/// Restarts a random replica with a window length other than its current one.
pub async fn inject(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let i = rng.random_range(0..cluster.allocators.len());
    let was = cluster.allocators[i].settlement_window_secs;
    let choices: Vec<u64> = WINDOWS.into_iter().filter(|w| *w != was).collect();
    let window = choices[rng.random_range(0..choices.len())];
    stop_allocator(cluster, i).await?;
    cluster.allocators[i].settlement_window_secs = window;
    let skew = cluster.allocators[i].skew.clone();
    cluster.spawn_allocator(i, skew)?;
    Ok((
        cluster.allocators[i].id.clone(),
        format!("restarted with --settlement-window-secs {window} (was {was})"),
    ))
}
