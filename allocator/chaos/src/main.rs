//! `chaos`: a randomized, seeded fault run against real allocator and router processes, with
//! every client operation and every fault recorded for `chaos-check` (see the library docs).
//!
//! The run: start the cluster, stock every SKU, record each process's resident memory, start
//! the clients and the restocker, inject faults until the duration is over, stop the clients,
//! heal whatever a fault left behind, wait until every partition has an owner again, record
//! memory again, wait for the change-event relay, dump the database and drain the event
//! consumer. The harness only records; judging is the checker's job,
//! so the harness exits 0 whenever it could run and record the whole schedule.

mod cluster;
mod consumer;
mod faults;
mod history;
mod lease_sampler;
mod move_faults;
mod replicas;
mod shard_faults;
mod tokens;
mod window_change;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;

use chaos::dump;
use chaos::shards::ShardDb;

use crate::cluster::{Cluster, ClusterSpec};
use crate::faults::Fault;
use crate::history::{Clock, JsonLines};
use crate::workload::Workload;

#[derive(Debug, Parser)]
#[command(name = "chaos", about = "Seeded fault run over a recorded history")]
struct Args {
    /// Seed of the workload and of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds of load under faults.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Comma-separated fault kinds to draw from (default: all).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Arm the negative control in every replica (the allocator binary must be built with the
    /// `negative-control` feature).
    #[arg(long)]
    negative_control: bool,
    /// Output directory (default: a new directory under the system temp dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The allocator binary (default: next to this one).
    #[arg(long)]
    allocator_bin: Option<PathBuf>,
    /// The router binary (default: next to this one).
    #[arg(long)]
    router_bin: Option<PathBuf>,
    /// The load generator, whose `events` command is the run's change-event consumer (default:
    /// next to this one).
    #[arg(long)]
    loadtest_bin: Option<PathBuf>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// PostgreSQL shards: 1 (the default) is one replicated database; with more, partitions
    /// are spread over a replicated catalog shard and further shards of one server each, two
    /// replicas serve each shard, and the shard faults are drawn too.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    shards: u16,
    /// `patroni`: the (catalog) database is a two-node Patroni cluster with three etcd members
    /// instead of the replicated pair; `patroni-failover` replaces `pg-restart` and
    /// `pg-failover` among the faults.
    #[arg(long, value_parser = ["patroni"])]
    ha: Option<String>,
    /// Run nothing: dump the database at this URL into `--out` (with an empty history), for
    /// `chaos-check` to judge a database on its own, such as a restored backup.
    #[arg(long, value_name = "URL", requires = "out")]
    dump_database: Option<String>,
}

fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("locating the chaos binary");
    exe.parent().expect("binary directory").join(name)
}

fn libfaketime() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ALLOCATOR_LIBFAKETIME") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// Waits (at most `limit`) until every shard's settlement job has settled past its last
/// confirmation, so the checker's settlement rule covers the whole run; a job that lags is the
/// checker's business, not a reason to stop.
async fn wait_for_settlement(shards: &[ShardDb], limit: Duration) {
    for shard in shards {
        wait_for_shard_settlement(&shard.client, limit).await;
    }
}

async fn wait_for_shard_settlement(client: &tokio_postgres::Client, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let caught_up = client
            .query_one(
                "SELECT coalesce((SELECT max(window_end) FROM settlement_runs
                                   WHERE status = 'settled'), '-infinity')
                        > coalesce((SELECT max(recorded_at) FROM ledger WHERE kind = 'confirm'),
                                   '-infinity')",
                &[],
            )
            .await
            .map(|row| row.get::<_, bool>(0));
        match caught_up {
            Ok(true) => return,
            _ if Instant::now() >= deadline => {
                tracing::warn!(?caught_up, "settlement did not catch up before the dump");
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// JSON logs on stderr (stdout carries the run's own lines), `info` unless `RUST_LOG` says
/// otherwise.
fn init_tracing() {
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

/// `--dump-database URL --out DIR`: only write the dump of an existing database (and an empty
/// history) into `out`, for the checker to read without a run.
async fn dump_only(url: &str, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(connection);
    dump::write(&client, &out.join("dump.json"), None).await?;
    std::fs::write(out.join("history.jsonl"), "")?;
    println!("dumped the database into {}", out.display());
    Ok(())
}

/// The fault kinds named by `--faults`, or every kind the cluster can take when none is named
/// (the shard faults only over several shards).
fn parse_fault_kinds(names: &[String], shards: u16, patroni: bool) -> Result<Vec<Fault>> {
    if names.is_empty() {
        let shard_faults = if shards > 1 { &Fault::SHARD[..] } else { &[] };
        let patroni_faults = if patroni { &Fault::PATRONI[..] } else { &[] };
        return Ok(Fault::ALL
            .iter()
            .filter(|k| !(patroni && k.needs_pair()))
            .chain(patroni_faults)
            .chain(shard_faults)
            .copied()
            .collect());
    }
    let kinds: Vec<Fault> = names
        .iter()
        .map(|s| s.parse::<Fault>())
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    if let Some(k) = kinds.iter().find(|k| k.needs_shards() && shards < 2) {
        anyhow::bail!("the fault {} needs --shards 2 or more", k.name());
    }
    if let Some(k) = kinds.iter().find(|k| k.needs_pair() && patroni) {
        anyhow::bail!(
            "the fault {} acts on the replicated pair, not on Patroni",
            k.name()
        );
    }
    if let Some(k) = kinds
        .iter()
        .find(|k| Fault::PATRONI.contains(k) && !patroni)
    {
        anyhow::bail!("the fault {} needs --ha patroni", k.name());
    }
    Ok(kinds)
}

/// The run's output directory (`--out`, or a new one under the temporary directory named by
/// the seed and the time), created and announced.
fn output_dir(out: Option<PathBuf>, seed: u64) -> Result<PathBuf> {
    let out = match out {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!(
            "chaos-seed{}-{}",
            seed,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        )),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!("output directory: {}", out.display());
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    init_tracing();
    let args = Args::parse();
    if let (Some(url), Some(out)) = (&args.dump_database, &args.out) {
        return dump_only(url, out).await;
    }
    let mut kinds = parse_fault_kinds(&args.faults, args.shards, args.ha.is_some())?;
    let libfaketime = libfaketime();
    if libfaketime.is_none() && kinds.contains(&Fault::ClockSkew) {
        tracing::warn!(
            "libfaketime not found (set ALLOCATOR_LIBFAKETIME); clock-skew faults are skipped"
        );
        kinds.retain(|k| *k != Fault::ClockSkew);
    }
    anyhow::ensure!(!kinds.is_empty(), "no fault kinds to draw from");

    let out = output_dir(args.out, args.seed)?;

    let tokens = tokens::write_auth_file(&out.join("routers.auth"))?;
    let spec = ClusterSpec {
        allocator_bin: args.allocator_bin.unwrap_or_else(|| sibling("allocator")),
        router_bin: args.router_bin.unwrap_or_else(|| sibling("router")),
        negative_control: args.negative_control,
        libfaketime,
        log_dir: out.join("logs"),
        auth_file: Some(out.join("routers.auth")),
        shards: args.shards.into(),
        patroni: args.ha.is_some(),
    };
    let loadtest_bin = args.loadtest_bin.unwrap_or_else(|| sibling("loadtest"));
    for bin in [&spec.allocator_bin, &spec.router_bin, &loadtest_bin] {
        anyhow::ensure!(
            bin.is_file(),
            "{} is missing: build it first",
            bin.display()
        );
    }
    tracing::info!(seed = args.seed, duration_s = args.duration, negative_control = args.negative_control, dir = %out.display(), "starting cluster");
    let mut cluster = Cluster::start(spec, 2).await?;
    let consumer = consumer::EventConsumer::start(
        &loadtest_bin,
        &cluster.redis.url(),
        cluster::PARTITIONS,
        &cluster.routers[0].url,
        &tokens.client,
        &cluster
            .shard_urls()
            .into_iter()
            .map(|(name, _)| name)
            .collect::<Vec<_>>(),
        &out,
    )?;

    let clock = Clock::start();
    let history = Arc::new(JsonLines::create(&out.join("history.jsonl"))?);
    let fault_log = JsonLines::create(&out.join("faults.jsonl"))?;
    let routers = cluster.routers.iter().map(|r| r.url.clone()).collect();
    let workload = Arc::new(Workload::new(clock, history.clone(), routers, tokens)?);
    workload.seed().await?;
    cluster.record_rss_start();

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for n in 0..args.clients {
        let seed = args.seed.wrapping_mul(1000).wrapping_add(n as u64);
        tasks.push(tokio::spawn(workload.clone().client(n, seed, stop.clone())));
    }
    tasks.push(tokio::spawn(
        workload
            .clone()
            .restocker(args.seed.wrapping_add(7), stop.clone()),
    ));
    // Over several shards, every shard's leases are sampled for the `two-lease-holders` rule.
    let sampler = (args.shards > 1)
        .then(|| -> Result<_> {
            let log = Arc::new(JsonLines::create(&out.join("leases.jsonl"))?);
            let task = tokio::spawn(lease_sampler::run(
                cluster.shard_urls(),
                clock,
                log.clone(),
                stop.clone(),
            ));
            Ok((task, log))
        })
        .transpose()?;
    let load_start = Instant::now();
    let stop_at = load_start + Duration::from_secs(args.duration);
    let schedule = faults::run_schedule(
        &mut cluster,
        clock,
        &fault_log,
        &kinds,
        args.seed,
        stop_at,
        args.negative_control,
    )
    .await;
    // Load runs for the whole duration, and until the last fault has been healed.
    tokio::time::sleep_until(stop_at.into()).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let load_seconds = load_start.elapsed().as_secs_f64();
    let lease_rounds = match sampler {
        Some((task, log)) => {
            let rounds = task.await.unwrap_or_default();
            log.flush()?;
            rounds
        }
        None => 0,
    };
    cluster.heal()?;
    let injected = schedule?;
    history.flush()?;

    // Anything a healed fault released (statements held in a black-holed link) lands now.
    cluster
        .wait_ready_with(Duration::from_secs(60), args.negative_control)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = cluster.rss_report();
    let shards = cluster.shard_dbs().await?;
    wait_for_settlement(&shards, Duration::from_secs(45)).await;
    consumer::wait_for_relay(&shards, Duration::from_secs(45)).await;
    let horizon = Duration::from_secs(cluster::RETENTION_HORIZON_SECS);
    dump::write_shards(&shards, &out, Some(horizon)).await?;
    consumer.drain(&shards, Duration::from_secs(60)).await?;
    consumer::write_heads(&shards, &out).await?;
    let summary = json!({
        "seed": args.seed,
        "duration_s": args.duration,
        "shards": args.shards,
        "load_seconds": load_seconds,
        "negative_control": args.negative_control,
        "fault_kinds": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "faults_injected": injected,
        "lease_sample_rounds": lease_rounds,
        "rss_kib": rss,
    });
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )?;
    println!(
        "recorded {load_seconds:.0} s of load and {} faults; logs in {}",
        injected.values().sum::<u64>(),
        cluster.log_dir().display()
    );
    println!("output directory: {}", out.display());
    Ok(())
}
