//! Controlled stops of the cluster's allocators, shared by the faults that restart one.

use std::time::Duration;

use anyhow::Result;

use crate::cluster::Cluster;

/// Graceful stop of allocator `i` (SIGTERM, releases its leases); SIGKILL if it does not exit
/// in time.
pub(crate) async fn stop_allocator(cluster: &mut Cluster, i: usize) -> Result<()> {
    cluster.allocators[i]
        .stop(Duration::from_secs(10))
        .await
        .map(|_killed| ())
}
