//! Faults of the move state machine (`--shards N`, DESIGN.md §12, I13), each on a partition
//! with no move in flight, moved to another shard under load:
//! * `move-abort`: the mover stops after `fenced`, `copied` or `retired`, then
//!   `allocator shards move --abort` gives the partition back to its source;
//! * `move-rerun`: the mover stops after any state up to `flipped`, then a re-run finishes it;
//! * `move-race`: two movers of the partition at once, one refused; the move is then finished;
//! * `move-killed`: the mover stops between the copy and the retire, then is cancelled with
//!   `--abort` (the interrupted move that used to leave a second owner on the target).
//!
//! A mover "stops" through the allocator's fault hook (`ALLOCATOR_FAULT_MOVE_STOP_AFTER`, the
//! chaos build has the `fault-hooks` feature): it exits right after recording the state, as a
//! mover killed there would, its claim going with its connection.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rand::rngs::StdRng;
use rand::Rng;
use testkit::ChildProcess;

use crate::cluster::{Cluster, PARTITIONS};

/// How long one run of the mover may take before it is called stuck.
const MOVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Runs of a mover that must succeed (a shard restarting under it) before the fault gives up.
const ATTEMPTS: usize = 5;
/// The allocator's fault hook (`allocator::faults::MOVE_STOP_ENV`).
const STOP_ENV: &str = "ALLOCATOR_FAULT_MOVE_STOP_AFTER";

/// Finishes the moves an earlier fault that gave up left in flight.
pub async fn finish_leftovers(cluster: &Cluster) -> Result<()> {
    for (partition, to) in cluster.moves_in_flight().await? {
        finish(cluster, partition, &["--to", &to], "leftover").await?;
    }
    Ok(())
}

/// A partition with no move in flight, its shard, and another shard to move it to.
async fn pick(cluster: &Cluster, rng: &mut StdRng) -> Result<(u32, String, String)> {
    finish_leftovers(cluster).await?;
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
    Ok((partition, from, to))
}

fn spawn_mover(
    cluster: &Cluster,
    partition: u32,
    args: &[&str],
    stop_after: Option<&str>,
    tag: &str,
) -> Result<ChildProcess> {
    let mut all: Vec<String> = ["shards", "move", "--partition", &partition.to_string()]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    all.extend(cluster.shard_args());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let log = cluster
        .log_dir()
        .join(format!("move-p{partition}-{stamp}-{tag}.log"));
    let env: Vec<(String, String)> = stop_after
        .map(|s| (STOP_ENV.to_owned(), s.to_owned()))
        .into_iter()
        .collect();
    ChildProcess::spawn(&cluster.spec.allocator_bin, all, &env, &log)
        .context("starting allocator shards move")
}

/// Runs the mover with `args` until one run succeeds.
async fn finish(cluster: &Cluster, partition: u32, args: &[&str], tag: &str) -> Result<usize> {
    for attempt in 1..=ATTEMPTS {
        let mut mover = spawn_mover(cluster, partition, args, None, &format!("{tag}{attempt}"))?;
        if mover.wait_exit(MOVE_TIMEOUT).await?.success() {
            return Ok(attempt);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("allocator shards move {args:?} of partition {partition} failed {ATTEMPTS} times")
}

/// The first run, stopped after `state`: whether it left the move in flight (a run refused
/// before the fence, say by a shard that is down, leaves nothing to resume).
async fn stopped_run(cluster: &Cluster, partition: u32, to: &str, state: &str) -> Result<bool> {
    let mut mover = spawn_mover(cluster, partition, &["--to", to], Some(state), "stopped")?;
    mover.wait_exit(MOVE_TIMEOUT).await?;
    Ok(cluster
        .moves_in_flight()
        .await?
        .iter()
        .any(|(p, _)| *p == partition))
}

async fn ensure_on(cluster: &Cluster, partition: u32, shard: &str) -> Result<()> {
    let map = cluster.shard_map().await?;
    ensure!(
        map.iter().any(|(p, s)| *p == partition && s == shard),
        "partition {partition} is not on {shard} after the fault"
    );
    Ok(())
}

/// `move-abort` (`killed`: stopped after `copied` only, for `move-killed`).
pub async fn abort(
    cluster: &mut Cluster,
    rng: &mut StdRng,
    killed: bool,
) -> Result<(String, String)> {
    let (partition, from, to) = pick(cluster, rng).await?;
    let state = match killed {
        true => "copied",
        false => ["fenced", "copied", "retired"][rng.random_range(0..3)],
    };
    let t0 = Instant::now();
    if !stopped_run(cluster, partition, &to, state).await? {
        return Ok((
            format!("partition {partition}"),
            format!("the move to {to} was refused"),
        ));
    }
    let runs = finish(cluster, partition, &["--abort"], "abort").await?;
    ensure_on(cluster, partition, &from).await?;
    Ok((
        format!("partition {partition}"),
        format!(
            "the move from {from} to {to} stopped after {state}, aborted ({runs} runs) in {} ms",
            t0.elapsed().as_millis()
        ),
    ))
}

/// `move-rerun`.
pub async fn rerun(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let (partition, from, to) = pick(cluster, rng).await?;
    let state = ["fenced", "copied", "retired", "flipped"][rng.random_range(0..4)];
    let t0 = Instant::now();
    if !stopped_run(cluster, partition, &to, state).await? {
        return Ok((
            format!("partition {partition}"),
            format!("the move to {to} was refused"),
        ));
    }
    let runs = finish(cluster, partition, &["--to", &to], "rerun").await?;
    ensure_on(cluster, partition, &to).await?;
    Ok((
        format!("partition {partition}"),
        format!(
            "the move from {from} to {to} stopped after {state}, finished by a re-run ({runs} \
             runs) in {} ms",
            t0.elapsed().as_millis()
        ),
    ))
}

/// `move-race`.
pub async fn race(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let (partition, from, to) = pick(cluster, rng).await?;
    let t0 = Instant::now();
    let mut a = spawn_mover(cluster, partition, &["--to", &to], None, "race-a")?;
    let mut b = spawn_mover(cluster, partition, &["--to", &to], None, "race-b")?;
    let ok = [
        a.wait_exit(MOVE_TIMEOUT).await?.success(),
        b.wait_exit(MOVE_TIMEOUT).await?.success(),
    ];
    let refused = ok.iter().filter(|ok| !**ok).count();
    finish(cluster, partition, &["--to", &to], "race-finish").await?;
    ensure_on(cluster, partition, &to).await?;
    Ok((
        format!("partition {partition}"),
        format!(
            "two movers from {from} to {to} at once, {refused} failed or refused, moved in {} ms",
            t0.elapsed().as_millis()
        ),
    ))
}
