//! Faults of a cluster over several PostgreSQL shards (`--shards N`, DESIGN.md §12): a shard
//! stopped, crashed, frozen or cut off from its allocators, and a partition moved between shards
//! under load — sometimes with the mover killed part-way and run again, which is how an operator
//! finishes an interrupted move.
//!
//! Each fault takes one shard, so the others must keep serving their partitions throughout; the
//! checker judges every shard's writes (stale epochs across a move included) from the merged
//! dump.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::Rng;
use testkit::{ChildProcess, ProxyMode};

use crate::cluster::{Cluster, LEASE_TTL_MS, PARTITIONS};

/// How long one run of the mover may take before it is called stuck.
const MOVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Runs of an interrupted move before the fault gives up (a shard restarting under it).
const MOVE_ATTEMPTS: usize = 5;

fn ms(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

/// `shard-stop`: a fast shutdown of a shard other than the catalog, down for a while, then
/// started again on its data directory.
pub async fn stop(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let index = rng.random_range(1..cluster.shard_count());
    let down = ms(rng, 1500..=4000);
    let shard = cluster.shard_mut(index)?;
    shard.server.stop().await?;
    tokio::time::sleep(down).await;
    shard.server.restart().await?;
    Ok((
        shard.name.clone(),
        format!("fast shutdown, started again after {} ms", down.as_millis()),
    ))
}

/// `shard-crash`: SIGKILL of a shard's postmaster and backends (not the catalog), then a start
/// with crash recovery.
pub async fn crash(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let index = rng.random_range(1..cluster.shard_count());
    let down = ms(rng, 300..=2000);
    let shard = cluster.shard_mut(index)?;
    shard.server.kill()?;
    tokio::time::sleep(down).await;
    shard.server.restart().await?;
    Ok((
        shard.name.clone(),
        format!("sigkill, crash recovery after {} ms down", down.as_millis()),
    ))
}

/// `shard-freeze`: SIGSTOP of a shard's server (not the catalog) past the lease TTL: open
/// connections hang, for its allocators and the routers alike.
pub async fn freeze(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let index = rng.random_range(1..cluster.shard_count());
    let hold = ms(rng, LEASE_TTL_MS + 500..=LEASE_TTL_MS + 2500);
    let shard = cluster.shard_mut(index)?;
    shard.server.pause()?;
    tokio::time::sleep(hold).await;
    shard.server.resume()?;
    Ok((
        shard.name.clone(),
        format!("sigstop for {} ms, then sigcont", hold.as_millis()),
    ))
}

/// `shard-blackhole`: every allocator of one shard (the catalog included) loses its database
/// link past the lease TTL, so the shard's partitions have no owner that can write; what the
/// links held lands when they heal.
pub async fn blackhole(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let index = rng.random_range(0..cluster.shard_count());
    let hold = ms(rng, LEASE_TTL_MS + 1000..=LEASE_TTL_MS + 3000);
    let ids = serving(cluster, index);
    for a in cluster.allocators.iter().filter(|a| ids.contains(&a.id)) {
        a.set_link(ProxyMode::Blackhole);
    }
    tokio::time::sleep(hold).await;
    for a in cluster.allocators.iter().filter(|a| ids.contains(&a.id)) {
        a.set_link(ProxyMode::Pass);
    }
    Ok((
        testkit::cluster::shard_name(index),
        format!(
            "database links of {} black-holed for {} ms",
            ids.join(", "),
            hold.as_millis()
        ),
    ))
}

/// The ids of the allocators that serve shard `index`.
fn serving(cluster: &Cluster, index: usize) -> Vec<String> {
    cluster
        .allocators
        .iter()
        .filter(|a| cluster.allocator_shard(&a.id) == index)
        .map(|a| a.id.clone())
        .collect()
}

/// `shard-move`: moves a random partition to another shard with `allocator shards move` while
/// the load runs; half the time the mover is SIGKILLed part-way and run again until it finishes.
pub async fn move_partition(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    crate::move_faults::finish_leftovers(cluster).await?;
    let partition = rng.random_range(0..PARTITIONS);
    let map = cluster.shard_map().await?;
    let from = map
        .iter()
        .find(|(p, _)| *p == partition)
        .map(|(_, s)| s.clone())
        .context("the catalog's map has no such partition")?;
    let others: Vec<String> = cluster
        .shard_urls()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| *name != from)
        .collect();
    let to = others[rng.random_range(0..others.len())].clone();
    let interrupt = rng.random_bool(0.5).then(|| ms(rng, 20..=400));
    let t0 = Instant::now();
    let mut killed = None;
    for attempt in 1..=MOVE_ATTEMPTS {
        let mut mover = spawn_mover(cluster, partition, &to, attempt)?;
        if attempt == 1 {
            if let Some(after) = interrupt {
                tokio::time::sleep(after).await;
                if mover.sigkill().is_ok() {
                    let status = mover.wait_exit(Duration::from_secs(10)).await?;
                    if !status.success() {
                        killed = Some(after);
                        continue;
                    }
                    // It finished before the kill landed.
                    break;
                }
            }
        }
        let status = mover.wait_exit(MOVE_TIMEOUT).await?;
        if status.success() {
            break;
        }
        tracing::warn!(attempt, %status, log = %mover.log_path().display(), "the mover failed; running it again");
        if attempt == MOVE_ATTEMPTS {
            bail!("moving partition {partition} to {to} failed {MOVE_ATTEMPTS} times");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let now = cluster.shard_map().await?;
    anyhow::ensure!(
        now.iter().any(|(p, s)| *p == partition && *s == to),
        "partition {partition} is not on {to} after the move"
    );
    let how = match killed {
        Some(after) => format!(
            ", the mover killed after {} ms and run again",
            after.as_millis()
        ),
        None => String::new(),
    };
    Ok((
        format!("partition {partition}"),
        format!(
            "moved from {from} to {to} in {} ms{how}",
            t0.elapsed().as_millis()
        ),
    ))
}

fn spawn_mover(
    cluster: &Cluster,
    partition: u32,
    to: &str,
    attempt: usize,
) -> Result<ChildProcess> {
    let mut args = vec![
        "shards".to_owned(),
        "move".to_owned(),
        "--partition".to_owned(),
        partition.to_string(),
        "--to".to_owned(),
        to.to_owned(),
    ];
    args.extend(cluster.shard_args());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let log = cluster
        .log_dir()
        .join(format!("move-p{partition}-{stamp}-{attempt}.log"));
    ChildProcess::spawn(&cluster.spec.allocator_bin, args, &[], &log)
        .context("starting allocator shards move")
}
