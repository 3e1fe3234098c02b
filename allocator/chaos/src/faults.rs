//! The seeded fault schedule: one fault at a time, each held for a random while and then healed,
//! with a short calm between faults. Every fault is logged (kind, target, start, end) once it
//! has been healed.
//!
//! Pauses and partitions are drawn longer than the lease TTL, so the victim's leases are taken
//! over while it cannot act, which is exactly when a stale owner would write if fencing were
//! broken. The negative control draws every other fault from those two kinds, so its schedule is
//! sure to contain a stale owner with queued writes.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use testkit::ProxyMode;

use crate::cluster::{Cluster, LEASE_TTL_MS};
use crate::history::{Clock, JsonLines};
use crate::replicas::stop_allocator;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL an allocator, restart it under the same id.
    Kill,
    /// SIGSTOP an allocator past its lease TTL, then SIGCONT.
    Pause,
    /// Black-hole one allocator's database link, then heal it.
    Partition,
    /// Delay every allocator's database traffic.
    Latency,
    /// Restart PostgreSQL (fast shutdown, same data directory and port).
    PgRestart,
    /// Stop Redis and start it again (empty).
    RedisRestart,
    /// Restart an allocator with its wall clock 30 s ahead or behind, then restart it normally.
    ClockSkew,
    /// SIGKILL a router, restart it on the same port.
    RouterKill,
    /// Restart an allocator with another settlement window length (`window_change`).
    WindowChange,
    /// SIGKILL the PostgreSQL primary, promote its synchronous standby, sometimes revive the old
    /// primary writable on its old address for a while, then rebuild a standby there.
    PgFailover,
    /// Patroni's own failover (`--ha patroni`): the leader's postmaster SIGKILLed or a
    /// `patronictl switchover`, then waited for until the old leader streams from the new one.
    PatroniFailover,
    /// Fast shutdown of a shard other than the catalog, started again after a while.
    ShardStop,
    /// SIGKILL of a shard other than the catalog, started again with crash recovery.
    ShardCrash,
    /// SIGSTOP of a shard other than the catalog past the lease TTL.
    ShardFreeze,
    /// Every allocator of one shard cut off from it past the lease TTL.
    ShardBlackhole,
    /// A partition moved to another shard under load, the mover sometimes killed and re-run.
    ShardMove,
    /// A move stopped after `fenced`, `copied` or `retired`, then aborted (`move_faults`).
    MoveAbort,
    /// A move stopped after any state up to `flipped`, then finished by a re-run.
    MoveRerun,
    /// Two movers of one partition at once.
    MoveRace,
    /// A move stopped between copy and retire, then cancelled with `--abort`.
    MoveKilled,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Partition,
        Fault::Latency,
        Fault::PgRestart,
        Fault::RedisRestart,
        Fault::ClockSkew,
        Fault::RouterKill,
        Fault::WindowChange,
        Fault::PgFailover,
    ];

    /// The faults of a cluster over several shards (`--shards`), drawn besides [`Fault::ALL`].
    pub const SHARD: [Fault; 9] = [
        Fault::ShardStop,
        Fault::ShardCrash,
        Fault::ShardFreeze,
        Fault::ShardBlackhole,
        Fault::ShardMove,
        Fault::MoveAbort,
        Fault::MoveRerun,
        Fault::MoveRace,
        Fault::MoveKilled,
    ];

    /// The faults of a cluster on Patroni (`--ha patroni`), which replace the ones that act on
    /// the replicated pair themselves (`pg-restart`, `pg-failover`).
    pub const PATRONI: [Fault; 1] = [Fault::PatroniFailover];

    /// Whether the fault acts on the replicated pair (and so cannot run on Patroni).
    pub fn needs_pair(self) -> bool {
        matches!(self, Fault::PgRestart | Fault::PgFailover)
    }

    /// Whether the fault needs more than one shard.
    pub fn needs_shards(self) -> bool {
        Fault::SHARD.contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Latency => "latency",
            Fault::PgRestart => "pg-restart",
            Fault::RedisRestart => "redis-restart",
            Fault::ClockSkew => "clock-skew",
            Fault::RouterKill => "router-kill",
            Fault::WindowChange => "window-change",
            Fault::PgFailover => "pg-failover",
            Fault::PatroniFailover => "patroni-failover",
            Fault::ShardStop => "shard-stop",
            Fault::ShardCrash => "shard-crash",
            Fault::ShardFreeze => "shard-freeze",
            Fault::ShardBlackhole => "shard-blackhole",
            Fault::ShardMove => "shard-move",
            Fault::MoveAbort => "move-abort",
            Fault::MoveRerun => "move-rerun",
            Fault::MoveRace => "move-race",
            Fault::MoveKilled => "move-killed",
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let known = || {
            Fault::ALL
                .into_iter()
                .chain(Fault::PATRONI)
                .chain(Fault::SHARD)
        };
        known().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<&str> = known().map(|f| f.name()).collect();
            format!("unknown fault {s:?}; known: {}", names.join(","))
        })
    }
}

/// Runs faults drawn from `kinds` until `stop_at`; returns how many of each were injected.
pub async fn run_schedule(
    cluster: &mut Cluster,
    clock: Clock,
    log: &JsonLines,
    kinds: &[Fault],
    seed: u64,
    stop_at: Instant,
    negative_control: bool,
) -> Result<BTreeMap<&'static str, u64>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0f0f_f0f0_5a5a_a5a5);
    let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let stale_owner_kinds: Vec<Fault> = kinds
        .iter()
        .copied()
        .filter(|f| matches!(f, Fault::Pause | Fault::Partition))
        .collect();
    // A short calm first, so the run starts with a working cluster under load.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut n = 0usize;
    // A fault started after this would mostly run without load.
    while Instant::now() + Duration::from_secs(2) < stop_at {
        let fault = if negative_control && n.is_multiple_of(2) && !stale_owner_kinds.is_empty() {
            stale_owner_kinds[rng.random_range(0..stale_owner_kinds.len())]
        } else {
            kinds[rng.random_range(0..kinds.len())]
        };
        n += 1;
        let start_ms = clock.ms();
        let start_wall_ms = clock.wall_ms();
        tracing::info!(fault = fault.name(), "fault starts");
        let (target, detail) = inject(cluster, fault, &mut rng)
            .await
            .with_context(|| format!("fault {}", fault.name()))?;
        log.write(&json!({
            "kind": fault.name(),
            "target": target,
            "detail": detail,
            "start_ms": start_ms,
            "start_wall_ms": start_wall_ms,
            "end_ms": clock.ms(),
            "end_wall_ms": clock.wall_ms(),
        }));
        log.flush()?;
        tracing::info!(fault = fault.name(), %target, %detail, "fault healed");
        *injected.entry(fault.name()).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..=3000))).await;
    }
    Ok(injected)
}

fn ms(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

/// Injects `fault`, holds it, heals it; returns the target and a description.
async fn inject(cluster: &mut Cluster, fault: Fault, rng: &mut StdRng) -> Result<(String, String)> {
    let replicas = cluster.allocators.len();
    Ok(match fault {
        Fault::Kill => {
            let i = rng.random_range(0..replicas);
            let down = ms(rng, 500..=2000);
            kill_allocator(cluster, i).await?;
            tokio::time::sleep(down).await;
            cluster.spawn_allocator(i, None)?;
            (
                cluster.allocators[i].id.clone(),
                format!("sigkill, restarted after {} ms", down.as_millis()),
            )
        }
        Fault::Pause => {
            let i = rng.random_range(0..replicas);
            let hold = ms(rng, LEASE_TTL_MS + 800..=LEASE_TTL_MS + 2500);
            let a = &mut cluster.allocators[i];
            a.freeze()?;
            tokio::time::sleep(hold).await;
            a.thaw()?;
            (
                a.id.clone(),
                format!("sigstop for {} ms, then sigcont", hold.as_millis()),
            )
        }
        Fault::Partition => {
            let i = rng.random_range(0..replicas);
            let hold = ms(rng, LEASE_TTL_MS + 1000..=LEASE_TTL_MS + 3000);
            let a = &cluster.allocators[i];
            a.set_link(ProxyMode::Blackhole);
            tokio::time::sleep(hold).await;
            a.set_link(ProxyMode::Pass);
            (
                a.id.clone(),
                format!("database link black-holed for {} ms", hold.as_millis()),
            )
        }
        Fault::Latency => {
            let delay = ms(rng, 20..=150);
            let hold = ms(rng, 3000..=6000);
            for a in &cluster.allocators {
                a.set_link(ProxyMode::Delay(delay));
            }
            tokio::time::sleep(hold).await;
            for a in &cluster.allocators {
                a.set_link(ProxyMode::Pass);
            }
            (
                "all allocators".into(),
                format!(
                    "{} ms per chunk on the database link for {} ms",
                    delay.as_millis(),
                    hold.as_millis()
                ),
            )
        }
        Fault::PgRestart => {
            let t0 = Instant::now();
            cluster.pg().primary_mut().restart().await?;
            cluster.pg_restarts += 1;
            (
                "postgres".into(),
                format!(
                    "fast shutdown and start, down {} ms",
                    t0.elapsed().as_millis()
                ),
            )
        }
        Fault::RedisRestart => {
            let down = ms(rng, 1000..=3000);
            cluster.redis.stop()?;
            tokio::time::sleep(down).await;
            cluster.redis.start_again().await?;
            cluster.redis_restarts += 1;
            (
                "redis".into(),
                format!("stopped for {} ms, started empty", down.as_millis()),
            )
        }
        Fault::ClockSkew => {
            let i = rng.random_range(0..replicas);
            let offset = if rng.random_bool(0.5) { "+30s" } else { "-30s" };
            let hold = ms(rng, 5000..=8000);
            stop_allocator(cluster, i).await?;
            cluster.spawn_allocator(i, Some(offset.to_owned()))?;
            tokio::time::sleep(hold).await;
            stop_allocator(cluster, i).await?;
            cluster.spawn_allocator(i, None)?;
            (
                cluster.allocators[i].id.clone(),
                format!(
                    "restarted with wall clock {offset} for {} ms, then restarted normally",
                    hold.as_millis()
                ),
            )
        }
        Fault::PgFailover => pg_failover(cluster, rng).await?,
        Fault::PatroniFailover => patroni_failover(cluster, rng).await?,
        Fault::RouterKill => {
            let i = rng.random_range(0..cluster.routers.len());
            let down = ms(rng, 500..=1500);
            let p = cluster.routers[i]
                .process
                .as_mut()
                .context("router not running")?;
            p.sigkill()?;
            p.wait_exit(Duration::from_secs(10)).await?;
            tokio::time::sleep(down).await;
            cluster.spawn_router(i)?;
            (
                cluster.routers[i].id.clone(),
                format!("sigkill, restarted after {} ms", down.as_millis()),
            )
        }
        Fault::WindowChange => crate::window_change::inject(cluster, rng).await?,
        Fault::ShardStop => {
            cluster.shard_restarts += 1;
            crate::shard_faults::stop(cluster, rng).await?
        }
        Fault::ShardCrash => {
            cluster.shard_restarts += 1;
            crate::shard_faults::crash(cluster, rng).await?
        }
        Fault::ShardFreeze => crate::shard_faults::freeze(cluster, rng).await?,
        Fault::ShardBlackhole => crate::shard_faults::blackhole(cluster, rng).await?,
        Fault::ShardMove => crate::shard_faults::move_partition(cluster, rng).await?,
        Fault::MoveAbort => crate::move_faults::abort(cluster, rng, false).await?,
        Fault::MoveRerun => crate::move_faults::rerun(cluster, rng).await?,
        Fault::MoveRace => crate::move_faults::race(cluster, rng).await?,
        Fault::MoveKilled => crate::move_faults::abort(cluster, rng, true).await?,
    })
}

/// The failover an HA manager performs, with the failure it must fence: the old primary may come
/// back writable on its old address (with what it had committed, on the old timeline) while the
/// services can reach it; they must take no write there.
async fn pg_failover(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let detect = ms(rng, 300..=1500);
    let t0 = Instant::now();
    cluster.pg().kill_primary()?;
    tokio::time::sleep(detect).await;
    cluster.pg().promote_standby().await?;
    let promoted_ms = t0.elapsed().as_millis();
    let revived = if rng.random_bool(0.5) {
        let hold = ms(rng, 2000..=5000);
        cluster.pg().revive_old_primary_writable().await?;
        tokio::time::sleep(hold).await;
        format!(", old primary revived writable for {} ms", hold.as_millis())
    } else {
        String::new()
    };
    cluster.pg().rebuild_standby().await?;
    cluster.pg_restarts += 1;
    Ok((
        "postgres".into(),
        format!(
            "primary sigkilled, standby promoted after {promoted_ms} ms{revived}, new standby streaming after {} ms",
            t0.elapsed().as_millis()
        ),
    ))
}

/// Patroni decides: half the time the leader's postmaster is SIGKILLed (Patroni fails over at
/// once, `primary_start_timeout = 0`), else an operator's `patronictl switchover` to the
/// synchronous standby. Healed once the old leader streams from the new one (through
/// `pg_rewind` when its WAL went past the fork).
async fn patroni_failover(cluster: &mut Cluster, rng: &mut StdRng) -> Result<(String, String)> {
    let kill = rng.random_bool(0.5);
    let pg = cluster.patroni()?;
    let old = pg.leader().await?.name;
    let rewinds = pg.node(&old)?.log_count("pg_rewind exit code=0");
    let t0 = Instant::now();
    let how = if kill {
        pg.kill_postmaster(&old)?;
        "postmaster sigkilled"
    } else {
        let candidate = pg
            .members()
            .await?
            .into_iter()
            .find(|m| m.role == "sync_standby")
            .context("no synchronous standby to switch over to")?
            .name;
        pg.switchover(&old, &candidate).await?;
        "patronictl switchover"
    };
    let new = pg
        .wait_for(Duration::from_secs(30), "a new leader", |c| {
            let old = old.clone();
            async move {
                let leader = c.leader().await?;
                anyhow::ensure!(leader.name != old, "{old} still leads");
                Ok(leader.name)
            }
        })
        .await?;
    let promoted_ms = t0.elapsed().as_millis();
    pg.wait_healthy(Duration::from_secs(60)).await?;
    let rewound = pg.node(&old)?.log_count("pg_rewind exit code=0") > rewinds;
    let detail = format!(
        "{how}: {new} leads after {promoted_ms} ms, {old} streaming again after {} ms{}",
        t0.elapsed().as_millis(),
        if rewound { " (rewound)" } else { "" }
    );
    cluster.pg_restarts += 1;
    Ok((old, detail))
}

async fn kill_allocator(cluster: &mut Cluster, i: usize) -> Result<()> {
    let p = cluster.allocators[i]
        .process
        .as_mut()
        .context("allocator not running")?;
    p.sigkill()?;
    p.wait_exit(Duration::from_secs(10)).await?;
    Ok(())
}
