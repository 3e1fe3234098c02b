//! Controlled stops of the cluster's allocators, shared by the faults that restart one.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cluster::Cluster;

/// Graceful stop of allocator `i` (SIGTERM, releases its leases); SIGKILL if it does not exit
/// in time.
pub(crate) async fn stop_allocator(cluster: &mut Cluster, i: usize) -> Result<()> {
    let a = &mut cluster.allocators[i];
    let p = a.process.as_mut().context("allocator not running")?;
    if p.try_exit_status()?.is_some() {
        bail!("{} exited on its own:\n{}", a.id, p.log_tail(20));
    }
    p.sigterm()?;
    if p.wait_exit(Duration::from_secs(10)).await.is_err() {
        p.sigkill()?;
        p.wait_exit(Duration::from_secs(10)).await?;
    }
    Ok(())
}
