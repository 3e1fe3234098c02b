//! `seed`, `run` and `check`: the parts that talk to a router or allocator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allocator::wire::{
    AdjustmentRequest, Inventory, Reservation, ReservationStatus, ReserveRequest,
};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::client::{encode_segment, Api, Final};
use crate::report::{
    bump, check_sku, fmt_counts, Counts, InvariantReport, OpStats, Pending, Report, RunConfig,
    SkuCheck, SkuTally, WorkerStats,
};
use crate::skew::SkuPicker;

pub fn sku_name(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index}")
}

/// A worker's RNG seed: distinct per worker, reproducible per `--seed`.
pub fn worker_seed(seed: u64, worker: usize) -> u64 {
    seed ^ (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What a reserve/confirm/release iteration does after the reservation is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Confirm,
    Release,
    Leave,
}

/// `u` uniform in [0, 1): below `confirm` → confirm, below `confirm + release` → release.
pub fn choose_action(u: f64, confirm: f64, release: f64) -> Action {
    if u < confirm {
        Action::Confirm
    } else if u < confirm + release {
        Action::Release
    } else {
        Action::Leave
    }
}

// ------------------------------------------------------------------------------------------------
// Inventory reads
// ------------------------------------------------------------------------------------------------

/// GET /v1/inventory/{sku} with retries: `Ok(None)` for 404.
async fn fetch_inventory(api: &Api, sku: &str, seed: u64) -> Result<Option<Inventory>, String> {
    let mut stats = OpStats::default();
    let mut rng = StdRng::seed_from_u64(seed);
    match api
        .get(
            &format!("/v1/inventory/{}", encode_segment(sku)),
            &mut stats,
            &mut rng,
        )
        .await
    {
        Final::Answer { status: 200, body } => serde_json::from_slice::<Inventory>(&body)
            .map(Some)
            .map_err(|e| format!("GET inventory {sku}: unparsable body: {e}")),
        Final::Answer { status: 404, .. } => Ok(None),
        Final::Answer { status, body } => Err(format!(
            "GET inventory {sku}: HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        )),
        Final::GaveUp { cause } => Err(format!("GET inventory {sku}: gave up ({cause})")),
    }
}

type InventoryReads = BTreeMap<usize, Result<Option<Inventory>, String>>;

async fn fetch_inventories(
    api: &Api,
    prefix: &str,
    indexes: Vec<usize>,
    concurrency: usize,
) -> InventoryReads {
    futures::stream::iter(indexes)
        .map(|k| async move {
            (
                k,
                fetch_inventory(api, &sku_name(prefix, k), k as u64).await,
            )
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

// ------------------------------------------------------------------------------------------------
// seed
// ------------------------------------------------------------------------------------------------

pub struct SeedParams {
    pub api: Api,
    pub skus: usize,
    pub stock: i64,
    pub prefix: String,
    pub concurrency: usize,
}

#[derive(Debug, Serialize)]
pub struct SeedReport {
    pub target: String,
    pub skus: usize,
    pub stock: i64,
    pub prefix: String,
    pub elapsed_secs: f64,
    pub outcomes: BTreeMap<String, u64>,
    pub attempts: BTreeMap<String, u64>,
    pub retries: BTreeMap<String, u64>,
    pub failures: Vec<String>,
    pub ok: bool,
}

impl SeedReport {
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "seeded {} SKUs ({}-0..{}) with {} units each against {} in {:.2} s: {}\n  attempts: {}; retries: {}\n",
            self.skus,
            self.prefix,
            self.skus.saturating_sub(1),
            self.stock,
            self.target,
            self.elapsed_secs,
            fmt_counts(&self.outcomes),
            fmt_counts(&self.attempts),
            fmt_counts(&self.retries),
        );
        for f in self.failures.iter().take(20) {
            out.push_str(&format!("  failed: {f}\n"));
        }
        if self.failures.len() > 20 {
            out.push_str(&format!(
                "  ... {} more failures\n",
                self.failures.len() - 20
            ));
        }
        out
    }
}

/// Restock `{prefix}-0..N` with `stock` units each. The adjustment id is derived from the SKU
/// and the stock, so running the same seed twice applies it once (the second run is replayed),
/// while a seed with another stock level adds to it.
pub async fn seed(p: SeedParams) -> SeedReport {
    let started = Instant::now();
    let api = &p.api;
    let prefix = p.prefix.as_str();
    let stock = p.stock;
    let results: Vec<(usize, String, OpStats)> = futures::stream::iter(0..p.skus)
        .map(|k| async move {
            let sku = sku_name(prefix, k);
            let mut stats = OpStats::default();
            let mut rng = StdRng::seed_from_u64(k as u64);
            let body = AdjustmentRequest {
                adjustment_id: format!("seed-{sku}-{stock}"),
                delta: stock,
            };
            let outcome = match api
                .post_json(
                    &format!("/v1/inventory/{}/adjustments", encode_segment(&sku)),
                    &body,
                    &mut stats,
                    &mut rng,
                )
                .await
            {
                Final::Answer { status: 201, .. } => "created".to_owned(),
                Final::Answer { status: 200, .. } => "replayed".to_owned(),
                Final::Answer { status, body } => format!(
                    "http_{status}: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(200)
                        .collect::<String>()
                ),
                Final::GaveUp { cause } => format!("gave_up_{cause}"),
            };
            (k, outcome, stats)
        })
        .buffer_unordered(p.concurrency.max(1))
        .collect()
        .await;
    let mut all = OpStats::default();
    let mut failures = Vec::new();
    for (k, outcome, stats) in &results {
        all.merge(stats);
        if outcome == "created" || outcome == "replayed" {
            bump(&mut all.outcomes, outcome, 1);
        } else {
            let label = outcome.split(':').next().unwrap_or(outcome);
            bump(&mut all.outcomes, label, 1);
            failures.push(format!("{}: {outcome}", sku_name(prefix, *k)));
        }
    }
    failures.sort();
    SeedReport {
        target: api.url(""),
        skus: p.skus,
        stock,
        prefix: p.prefix.clone(),
        elapsed_secs: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        outcomes: all.outcomes,
        attempts: all.attempts,
        retries: all.retries,
        ok: failures.is_empty(),
        failures,
    }
}

// ------------------------------------------------------------------------------------------------
// run
// ------------------------------------------------------------------------------------------------

pub struct RunParams {
    pub api: Api,
    pub config: RunConfig,
    pub picker: SkuPicker,
    /// Snapshot every SKU before the run when there are at most this many.
    pub snapshot_max: usize,
    /// Wait this long before resolving unknown outcomes (lets queued requests finish).
    pub settle: Duration,
    /// Print progress to stderr this often (`None`: never).
    pub progress: Option<Duration>,
    /// Concurrency of the snapshot / resolution / check reads.
    pub check_concurrency: usize,
}

struct Shared {
    api: Api,
    config: RunConfig,
    picker: SkuPicker,
    stop: AtomicBool,
    started: AtomicU64,
    completed: AtomicU64,
    deadline: Option<Instant>,
}

async fn worker(shared: Arc<Shared>, index: usize) -> WorkerStats {
    let c = &shared.config;
    let mut rng = StdRng::seed_from_u64(worker_seed(c.seed, index));
    let mut stats = WorkerStats::default();
    let mut iteration = 0u64;
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if shared.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if let Some(max) = c.requests {
            if shared.started.fetch_add(1, Ordering::Relaxed) >= max {
                break;
            }
        }
        let k = shared.picker.pick(&mut rng);
        let reservation_id = format!("{}-w{index}-{iteration}", c.run_id);
        iteration += 1;
        stats.tally(k).attempted += 1;
        let request = ReserveRequest {
            reservation_id: reservation_id.clone(),
            sku: sku_name(&c.prefix, k),
            quantity: c.quantity,
            ttl_seconds: Some(c.ttl_seconds),
        };

        // 1. reserve
        let mut unknown = false;
        let outcome = shared
            .api
            .post_json("/v1/reservations", &request, stats.op("reserve"), &mut rng)
            .await;
        let (label, mut status) = match outcome {
            Final::Answer {
                status: code @ (200 | 201),
                body,
            } => match serde_json::from_slice::<Reservation>(&body) {
                Ok(r) => (
                    if code == 201 { "created" } else { "replayed" }.to_owned(),
                    Some(r.status),
                ),
                Err(_) => {
                    unknown = true;
                    (format!("unparsable_{code}"), None)
                }
            },
            Final::Answer { status: 409, .. } => ("insufficient_stock".to_owned(), None),
            Final::Answer { status: 422, .. } => ("idempotency_mismatch".to_owned(), None),
            Final::Answer { status, .. } => {
                // A 5xx may have been applied; a 4xx was refused.
                unknown = status >= 500;
                (format!("http_{status}"), None)
            }
            Final::GaveUp { cause } => {
                unknown = true;
                (format!("gave_up_{cause}"), None)
            }
        };
        bump(&mut stats.op("reserve").outcomes, &label, 1);

        // 2. confirm / release / leave it held
        if status == Some(ReservationStatus::Held) {
            let action = choose_action(rng.random::<f64>(), c.confirm_ratio, c.release_ratio);
            let (op, verb) = match action {
                Action::Confirm => ("confirm", "confirm"),
                Action::Release => ("release", "release"),
                Action::Leave => ("", ""),
            };
            if !op.is_empty() {
                let path = format!(
                    "/v1/reservations/{}/{verb}",
                    encode_segment(&reservation_id)
                );
                let outcome = shared.api.post_empty(&path, stats.op(op), &mut rng).await;
                let label = match outcome {
                    Final::Answer { status: 200, body } => {
                        match serde_json::from_slice::<Reservation>(&body) {
                            Ok(r) => {
                                status = Some(r.status);
                                match r.status {
                                    ReservationStatus::Confirmed if op == "confirm" => {
                                        "confirmed".to_owned()
                                    }
                                    ReservationStatus::Released if op == "release" => {
                                        "released".to_owned()
                                    }
                                    other => format!("ok_but_{}", other.as_str()),
                                }
                            }
                            Err(_) => {
                                unknown = true;
                                "unparsable_200".to_owned()
                            }
                        }
                    }
                    Final::Answer { status: code, .. } => {
                        // 409 invalid-state (expired?), 404, 5xx: learn the state later.
                        unknown = true;
                        match code {
                            409 => "invalid_state".to_owned(),
                            404 => "not_found".to_owned(),
                            _ => format!("http_{code}"),
                        }
                    }
                    Final::GaveUp { cause } => {
                        unknown = true;
                        format!("gave_up_{cause}")
                    }
                };
                bump(&mut stats.op(op).outcomes, &label, 1);
            }
        }

        // 3. account
        if unknown {
            stats.pending.push(Pending {
                reservation_id,
                sku_index: k,
                quantity: c.quantity,
            });
        } else if let Some(final_status) = status {
            stats.tally(k).account(final_status, c.quantity);
        }
        stats.iterations += 1;
        shared.completed.fetch_add(1, Ordering::Relaxed);
    }
    stats
}

/// Learn the state of reservations with an unknown outcome. Returns the SKU indexes that stay
/// unknown.
async fn resolve_pending(
    api: &Api,
    pending: &[Pending],
    tallies: &mut BTreeMap<usize, SkuTally>,
    concurrency: usize,
) -> (usize, Vec<usize>) {
    let answers: Vec<(&Pending, Result<Option<ReservationStatus>, String>)> =
        futures::stream::iter(pending.iter().enumerate())
            .map(|(i, p)| async move {
                let mut stats = OpStats::default();
                let mut rng = StdRng::seed_from_u64(i as u64);
                let path = format!("/v1/reservations/{}", encode_segment(&p.reservation_id));
                let answer = match api.get(&path, &mut stats, &mut rng).await {
                    Final::Answer { status: 200, body } => {
                        serde_json::from_slice::<Reservation>(&body)
                            .map(|r| Some(r.status))
                            .map_err(|e| e.to_string())
                    }
                    // Never created, or a durable out-of-stock outcome: nothing held.
                    Final::Answer {
                        status: 404 | 409, ..
                    } => Ok(None),
                    Final::Answer { status, .. } => Err(format!("HTTP {status}")),
                    Final::GaveUp { cause } => Err(format!("gave up ({cause})")),
                };
                (p, answer)
            })
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    let mut resolved = 0;
    let mut unknown = Vec::new();
    for (p, answer) in answers {
        match answer {
            Ok(Some(status)) => {
                tallies
                    .entry(p.sku_index)
                    .or_default()
                    .account(status, p.quantity);
                resolved += 1;
            }
            Ok(None) => resolved += 1,
            Err(e) => {
                eprintln!(
                    "loadtest: could not resolve reservation {}: {e}",
                    p.reservation_id
                );
                unknown.push(p.sku_index);
            }
        }
    }
    (resolved, unknown)
}

/// Pick the SKUs shown in the report: every violation, then the most used ones.
fn shown_skus(mut checks: Vec<SkuCheck>, top: usize) -> Vec<SkuCheck> {
    checks.sort_by(|a, b| {
        // Violations (is_empty() == false) first.
        a.violations
            .is_empty()
            .cmp(&b.violations.is_empty())
            .then(b.tally.attempted.cmp(&a.tally.attempted))
            .then(a.sku.cmp(&b.sku))
    });
    let bad = checks.iter().filter(|c| !c.violations.is_empty()).count();
    checks.truncate(bad + top);
    checks
}

pub async fn run(p: RunParams) -> anyhow::Result<Report> {
    let n = p.config.skus;
    let check_concurrency = p.check_concurrency;

    // Snapshot before the run so that the accounting is relative (the SKUs may carry holds from
    // earlier runs).
    let before: Option<InventoryReads> = if n <= p.snapshot_max {
        let reads = fetch_inventories(
            &p.api,
            &p.config.prefix,
            (0..n).collect(),
            check_concurrency,
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
        Some(reads)
    } else {
        eprintln!(
            "loadtest: {n} SKUs > --snapshot-max {}: no snapshot; accounting assumes SKUs without earlier holds",
            p.snapshot_max
        );
        None
    };

    let shared = Arc::new(Shared {
        api: p.api.clone(),
        picker: p.picker,
        stop: AtomicBool::new(false),
        started: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        deadline: p
            .config
            .duration_secs
            .map(|d| Instant::now() + Duration::from_secs_f64(d)),
        config: p.config.clone(),
    });

    // Ctrl-C: stop starting iterations, finish the report. A second one exits at once.
    let interrupt = {
        let shared = shared.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!(
                    "loadtest: interrupted; finishing in-flight iterations (Ctrl-C again to abort)"
                );
                shared.stop.store(true, Ordering::Relaxed);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        })
    };

    let started = Instant::now();
    let progress = p.progress.map(|every| {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            let mut last = 0u64;
            loop {
                ticker.tick().await;
                let done = shared.completed.load(Ordering::Relaxed);
                eprintln!(
                    "loadtest: {:>6.1} s  {done} iterations  {:.0}/s now",
                    started.elapsed().as_secs_f64(),
                    (done - last) as f64 / every.as_secs_f64()
                );
                last = done;
            }
        })
    });

    let handles: Vec<_> = (0..p.config.concurrency)
        .map(|w| tokio::spawn(worker(shared.clone(), w)))
        .collect();
    let mut stats = WorkerStats::default();
    for handle in handles {
        stats.merge(&handle.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(progress) = progress {
        progress.abort();
    }

    // Unknown outcomes: let queued work finish, then ask.
    let pending = std::mem::take(&mut stats.pending);
    let mut unknown_skus = Vec::new();
    let mut resolved = 0;
    if !pending.is_empty() {
        tokio::time::sleep(p.settle).await;
        (resolved, unknown_skus) =
            resolve_pending(&p.api, &pending, &mut stats.tallies, check_concurrency).await;
    }

    // Invariants on every touched SKU.
    let touched: Vec<usize> = stats.tallies.keys().copied().collect();
    let after = fetch_inventories(&p.api, &p.config.prefix, touched, check_concurrency).await;
    let mut invariants = InvariantReport {
        snapshot_before: before.is_some(),
        pending: pending.len(),
        pending_resolved: resolved,
        ..Default::default()
    };
    let mut checks = Vec::new();
    for (k, read) in &after {
        let sku = sku_name(&p.config.prefix, *k);
        let after = match read {
            Ok(inv) => inv.as_ref().map(Counts::from),
            Err(e) => {
                invariants.errors.push(e.clone());
                continue;
            }
        };
        let before_counts = before
            .as_ref()
            .and_then(|b| b.get(k))
            .and_then(|r| r.as_ref().ok())
            .and_then(|inv| inv.as_ref().map(Counts::from));
        let tally = stats.tallies.get(k).copied().unwrap_or_default();
        let check = check_sku(&sku, tally, before_counts, after, !unknown_skus.contains(k));
        invariants.skus_checked += 1;
        if check.accounting_checked {
            invariants.accounting_checked += 1;
        }
        invariants.violations += check.violations.len();
        checks.push(check);
    }
    invariants.ok = invariants.violations == 0 && invariants.errors.is_empty();
    invariants.skus = shown_skus(checks, 5);

    interrupt.abort();
    Ok(Report::build(p.config, elapsed, &stats, invariants))
}

// ------------------------------------------------------------------------------------------------
// check
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub target: String,
    pub skus: usize,
    pub present: usize,
    pub ok: bool,
    pub errors: Vec<String>,
    pub violations: Vec<SkuCheck>,
    pub totals: Counts,
}

/// I1 over `{prefix}-0..N`: `available >= 0` and `on_hand = available + held + confirmed`.
pub async fn check(api: &Api, prefix: &str, skus: usize, concurrency: usize) -> CheckReport {
    let reads = fetch_inventories(api, prefix, (0..skus).collect(), concurrency).await;
    let mut errors = Vec::new();
    let mut violations = Vec::new();
    let mut present = 0;
    let mut totals = Counts {
        on_hand: 0,
        available: 0,
        held: 0,
        confirmed: 0,
    };
    for (k, read) in reads {
        match read {
            Err(e) => errors.push(e),
            Ok(None) => {}
            Ok(Some(inv)) => {
                present += 1;
                totals.on_hand += inv.on_hand;
                totals.available += inv.available;
                totals.held += inv.held;
                totals.confirmed += inv.confirmed;
                let c = check_sku(
                    &sku_name(prefix, k),
                    SkuTally::default(),
                    None,
                    Some(Counts::from(&inv)),
                    false,
                );
                if !c.violations.is_empty() {
                    violations.push(c);
                }
            }
        }
    }
    CheckReport {
        target: api.url(""),
        skus,
        present,
        ok: errors.is_empty() && violations.is_empty(),
        errors,
        violations,
        totals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_follow_the_ratios() {
        assert_eq!(choose_action(0.0, 0.5, 0.3), Action::Confirm);
        assert_eq!(choose_action(0.49, 0.5, 0.3), Action::Confirm);
        assert_eq!(choose_action(0.5, 0.5, 0.3), Action::Release);
        assert_eq!(choose_action(0.79, 0.5, 0.3), Action::Release);
        assert_eq!(choose_action(0.8, 0.5, 0.3), Action::Leave);
        assert_eq!(choose_action(0.99, 0.0, 0.0), Action::Leave);
        assert_eq!(choose_action(0.99, 1.0, 0.0), Action::Confirm);
    }

    #[test]
    fn worker_seeds_differ_and_are_stable() {
        assert_eq!(worker_seed(42, 3), worker_seed(42, 3));
        let seeds: std::collections::BTreeSet<u64> =
            (0..1000).map(|w| worker_seed(42, w)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_ne!(worker_seed(42, 0), worker_seed(43, 0));
    }

    #[test]
    fn shown_skus_lists_violations_first_then_the_busiest() {
        let check = |sku: &str, attempted: u64, bad: bool| SkuCheck {
            sku: sku.into(),
            tally: SkuTally {
                attempted,
                ..Default::default()
            },
            before: None,
            after: None,
            accounting_checked: true,
            violations: if bad { vec!["x".into()] } else { vec![] },
        };
        let shown = shown_skus(
            vec![
                check("a", 5, false),
                check("b", 50, false),
                check("c", 1, true),
                check("d", 7, false),
                check("e", 2, true),
            ],
            2,
        );
        let names: Vec<&str> = shown.iter().map(|c| c.sku.as_str()).collect();
        assert_eq!(names, vec!["e", "c", "b", "d"]);
    }

    #[test]
    fn sku_names() {
        assert_eq!(sku_name("bench", 0), "bench-0");
        assert_eq!(sku_name("bench", 999), "bench-999");
    }
}
