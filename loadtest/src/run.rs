//! `run`: snapshot, load (closed or open loop), then the end-of-run accounting: unknown outcomes
//! and holds that may have expired are read back from the service before the invariants are
//! checked.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allocator_client::Client;
use rand::rngs::StdRng;
use rand::SeedableRng;
use schema::wire::ReservationStatus;

use crate::check::{check_sku, shown_skus, Counts, InvariantReport};
use crate::cpu::{CpuMeter, Watch};
use crate::iteration::{iterate, sku_name, worker_seed};
use crate::pacer::{run_open_loop, OpenLoop};
use crate::progress::{Progress, ProgressParams};
use crate::readback::{apply_readback, fetch_inventories, read_statuses, InventoryReads};
use crate::report::{Report, RunConfig};
use crate::skew::SkuPicker;
use crate::stats::WorkerStats;
use crate::timeline::{SharedTimeline, Timeline};

/// Holds are read back after the load when their TTL is shorter than the run plus the settle
/// time plus this margin (the service's clock decides; this only avoids useless reads).
const EXPIRY_MARGIN_SECS: f64 = 30.0;
/// Read-back rounds while holds keep expiring during the final reads.
const READBACK_ROUNDS: usize = 4;

pub struct RunParams {
    pub api: Client,
    pub config: RunConfig,
    pub picker: SkuPicker,
    /// Open loop: in-flight bound (closed loop uses `config.concurrency` workers).
    pub max_in_flight: usize,
    /// Snapshot every SKU before the run when there are at most this many.
    pub snapshot_max: usize,
    /// Wait this long before resolving unknown outcomes (lets queued requests finish).
    pub settle: Duration,
    /// Draw a live progress bar on stderr when it is a terminal.
    pub progress_bar: bool,
    /// Without a bar: a progress line on stderr this often (`None`: never).
    pub progress: Option<Duration>,
    /// Concurrency of the snapshot / resolution / check reads.
    pub check_concurrency: usize,
    /// Process trees whose CPU over the load is reported per operation.
    pub cpu_watches: Vec<Watch>,
}

/// What the closed-loop workers share.
#[derive(Clone)]
struct Closed {
    api: Client,
    config: Arc<RunConfig>,
    picker: Arc<SkuPicker>,
    stop: Arc<AtomicBool>,
    /// Iterations started (for `--requests`).
    started: Arc<AtomicU64>,
    /// Iterations completed (for the progress display).
    completed: Arc<AtomicU64>,
    timeline: SharedTimeline,
}

async fn closed_loop_worker(shared: Closed, index: usize) -> WorkerStats {
    let Closed {
        api,
        config: c,
        picker,
        stop,
        started,
        completed,
        timeline,
    } = shared;
    let mut rng = StdRng::seed_from_u64(worker_seed(c.seed, index));
    let mut stats = WorkerStats::default();
    let deadline = c
        .duration_secs
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    for iteration in 0u64.. {
        if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if c.requests
            .is_some_and(|max| started.fetch_add(1, Ordering::Relaxed) >= max)
        {
            break;
        }
        let id = format!("{}-w{index}-{iteration}", c.run_id);
        let record = iterate(&api, &c, &picker, id, None, &mut rng).await;
        record.feed(&mut timeline.lock().expect("timeline lock"), Instant::now());
        record.apply(&mut stats);
        completed.fetch_add(1, Ordering::Relaxed);
    }
    stats
}

async fn snapshot(p: &RunParams) -> anyhow::Result<Option<InventoryReads>> {
    let n = p.config.skus;
    if n > p.snapshot_max {
        eprintln!(
            "loadtest: {n} SKUs > --snapshot-max {}: no snapshot; accounting assumes SKUs without earlier holds",
            p.snapshot_max
        );
        return Ok(None);
    }
    let reads = fetch_inventories(
        &p.api,
        &p.config.prefix,
        (0..n).collect(),
        p.check_concurrency,
    )
    .await;
    let errors: Vec<&String> = reads.values().filter_map(|r| r.as_ref().err()).collect();
    if !errors.is_empty() {
        anyhow::bail!(
            "snapshot before the run failed for {} SKUs, e.g. {}",
            errors.len(),
            errors[0]
        );
    }
    let missing = reads.values().filter(|r| matches!(r, Ok(None))).count();
    if missing == n {
        anyhow::bail!(
            "none of the {n} SKUs {}-0.. exists at {}; run `loadtest seed` first",
            p.config.prefix,
            p.api.url("")
        );
    }
    if missing > 0 {
        eprintln!("loadtest: warning: {missing} of {n} SKUs are not stocked");
    }
    Ok(Some(reads))
}

pub async fn run(p: RunParams) -> anyhow::Result<Report> {
    // Relative accounting: the SKUs may carry holds from earlier runs.
    let before = snapshot(&p).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicU64::new(0));
    let interrupt = stop_on_ctrl_c(stop.clone());
    let meter = CpuMeter::start(&p.cpu_watches)?;
    let started = Instant::now();
    let timeline = Timeline::shared(started);
    let progress = Progress::start(ProgressParams {
        timeline: timeline.clone(),
        started,
        duration: p.config.duration_secs.map(Duration::from_secs_f64),
        requests: p.config.requests,
        iterations: completed.clone(),
        bar: p.progress_bar,
        lines_every: p.progress,
    });

    let mut stats = load(&p, &stop, &completed, &timeline).await?;
    let elapsed = started.elapsed();
    let operations = stats.ops.values().map(|op| op.operations()).sum();
    let cpu = meter.finish(operations, Some("loadtest"), None);
    progress.finish();
    let series = timeline.lock().expect("timeline lock").report(elapsed);
    let elapsed = elapsed.as_secs_f64();

    let mut inv = InvariantReport {
        snapshot_before: before.is_some(),
        ..Default::default()
    };
    let may_expire =
        f64::from(p.config.ttl_seconds) <= elapsed + p.settle.as_secs_f64() + EXPIRY_MARGIN_SECS;
    let unknown_skus = resolve_pending(&p, &mut stats, &mut inv, may_expire).await;
    let (after, unstable) = read_back_holds(&p, &mut stats, &mut inv, may_expire).await;
    check_invariants(
        &p.config.prefix,
        before.as_ref(),
        &after,
        &stats,
        |k| !unknown_skus.contains(k) && !unstable.contains(k),
        &mut inv,
    );

    interrupt.abort();
    let mut report = Report::build(p.config, elapsed, &stats, inv, series);
    report.cpu = Some(cpu);
    Ok(report)
}

/// Ctrl-C: stop starting iterations, finish the report. A second one exits at once. The run
/// aborts the returned task once its report is complete.
fn stop_on_ctrl_c(stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!(
                "loadtest: interrupted; finishing in-flight iterations (ctrl-c again to abort)"
            );
            stop.store(true, Ordering::Relaxed);
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    })
}

/// The load itself: the open loop at `--rate` when one is given, otherwise `--concurrency`
/// closed-loop workers; returns every worker's statistics merged.
async fn load(
    p: &RunParams,
    stop: &Arc<AtomicBool>,
    completed: &Arc<AtomicU64>,
    timeline: &SharedTimeline,
) -> anyhow::Result<WorkerStats> {
    Ok(match p.config.rate {
        Some(rate) => {
            run_open_loop(OpenLoop {
                api: p.api.clone(),
                config: p.config.clone(),
                picker: p.picker.clone(),
                rate,
                max_in_flight: p.max_in_flight,
                stop: stop.clone(),
                completed: completed.clone(),
                timeline: timeline.clone(),
            })
            .await
        }
        None => {
            let shared = Closed {
                api: p.api.clone(),
                config: Arc::new(p.config.clone()),
                picker: Arc::new(p.picker.clone()),
                stop: stop.clone(),
                started: Arc::new(AtomicU64::new(0)),
                completed: completed.clone(),
                timeline: timeline.clone(),
            };
            let handles: Vec<_> = (0..p.config.concurrency)
                .map(|w| tokio::spawn(closed_loop_worker(shared.clone(), w)))
                .collect();
            let mut stats = WorkerStats::default();
            for handle in handles {
                stats.merge(&handle.await?);
            }
            stats
        }
    })
}

/// Unknown outcomes: let queued work finish (also when holds may expire), then ask for each
/// one's status and account it. Returns the SKUs with an outcome that stayed unknown: their
/// accounting cannot be checked.
async fn resolve_pending(
    p: &RunParams,
    stats: &mut WorkerStats,
    inv: &mut InvariantReport,
    may_expire: bool,
) -> BTreeSet<usize> {
    let pending = std::mem::take(&mut stats.pending);
    let mut unknown_skus = BTreeSet::new();
    if !pending.is_empty() || may_expire {
        tokio::time::sleep(p.settle).await;
    }
    inv.pending = pending.len();
    for (t, answer) in pending
        .iter()
        .zip(read_statuses(&p.api, &pending, p.check_concurrency).await)
    {
        match answer {
            Ok(Some(status)) => {
                stats.tally(t.sku_index).account(status, t.quantity);
                if status == ReservationStatus::Held {
                    stats.held.push(t.clone());
                }
                inv.pending_resolved += 1;
            }
            Ok(None) => inv.pending_resolved += 1,
            Err(e) => {
                eprintln!(
                    "loadtest: could not resolve reservation {}: {e}",
                    t.reservation_id
                );
                unknown_skus.insert(t.sku_index);
            }
        }
    }
    unknown_skus
}

/// Holds that may have expired: read them back before and after the inventory reads until
/// no hold of a SKU changes across its read (a hold never returns to held). Returns the
/// inventory reads after the run and the SKUs whose holds were still changing at the last round.
async fn read_back_holds(
    p: &RunParams,
    stats: &mut WorkerStats,
    inv: &mut InvariantReport,
    may_expire: bool,
) -> (InventoryReads, BTreeSet<usize>) {
    let cc = p.check_concurrency;
    let mut held = std::mem::take(&mut stats.held);
    if may_expire {
        inv.holds_read_back = held.len();
        let statuses = read_statuses(&p.api, &held, cc).await;
        let (_, expired, errors) = apply_readback(&mut held, statuses, &mut stats.tallies);
        inv.expired += expired;
        inv.errors.extend(errors);
    }
    let touched: Vec<usize> = stats.tallies.keys().copied().collect();
    let mut after = fetch_inventories(&p.api, &p.config.prefix, touched, cc).await;
    let mut unstable = BTreeSet::new();
    for round in 0..READBACK_ROUNDS {
        if !may_expire || held.is_empty() {
            break;
        }
        let statuses = read_statuses(&p.api, &held, cc).await;
        let (changed, expired, errors) = apply_readback(&mut held, statuses, &mut stats.tallies);
        inv.expired += expired;
        inv.errors.extend(errors);
        if changed.is_empty() {
            break;
        }
        if round + 1 == READBACK_ROUNDS {
            unstable = changed;
            break;
        }
        let again = fetch_inventories(&p.api, &p.config.prefix, changed.into_iter().collect(), cc);
        after.extend(again.await);
    }
    inv.unstable_skus = unstable.len();
    (after, unstable)
}

/// Check every SKU read after the run against its reading before and the run's tally (the
/// accounting only where `known` says the tally is complete), and decide the run's verdict.
fn check_invariants(
    prefix: &str,
    before: Option<&InventoryReads>,
    after: &InventoryReads,
    stats: &WorkerStats,
    known: impl Fn(&usize) -> bool,
    inv: &mut InvariantReport,
) {
    let mut checks = Vec::new();
    for (k, read) in after {
        let after_counts = match read {
            Ok(row) => row.as_ref().map(Counts::from),
            Err(e) => {
                inv.errors.push(e.clone());
                continue;
            }
        };
        let before_counts = before
            .and_then(|b| b.get(k))
            .and_then(|r| r.as_ref().ok())
            .and_then(|row| row.as_ref().map(Counts::from));
        let tally = stats.tallies.get(k).copied().unwrap_or_default();
        let sku = sku_name(prefix, *k);
        let check = check_sku(&sku, tally, before_counts, after_counts, known(k));
        inv.skus_checked += 1;
        inv.accounting_checked += usize::from(check.accounting_checked);
        inv.violations += check.violations.len();
        checks.push(check);
    }
    inv.ok = inv.violations == 0 && inv.errors.is_empty();
    inv.skus = shown_skus(checks, 5);
}
