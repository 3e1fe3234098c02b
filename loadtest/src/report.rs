//! Counters each worker keeps, how they are merged, the invariant checks and the final report.
//!
//! Everything here is pure (no I/O) so it is unit-tested directly.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use allocator::wire::Inventory;
use serde::Serialize;

use crate::histogram::Histogram;

/// Increment `map[key]` by `by`.
pub fn bump(map: &mut BTreeMap<String, u64>, key: &str, by: u64) {
    if let Some(v) = map.get_mut(key) {
        *v += by;
    } else {
        map.insert(key.to_owned(), by);
    }
}

fn merge_counts(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        bump(into, k, *v);
    }
}

/// Per operation kind (reserve, confirm, release, ...).
#[derive(Debug, Clone, Default)]
pub struct OpStats {
    /// End-to-end latency of an operation, retries and backoff included.
    pub latency: Histogram,
    /// Latency of every single HTTP attempt.
    pub attempt_latency: Histogram,
    /// Final outcome per operation (`created`, `insufficient_stock`, `gave_up_timeout`, ...).
    pub outcomes: BTreeMap<String, u64>,
    /// Every attempt by HTTP status (`201`, `503`) or transport failure (`timeout`, `connect`).
    pub attempts: BTreeMap<String, u64>,
    /// Retries (attempts after the first) by the cause of the failed attempt before them.
    pub retries: BTreeMap<String, u64>,
}

impl OpStats {
    pub fn merge(&mut self, other: &OpStats) {
        self.latency.merge(&other.latency);
        self.attempt_latency.merge(&other.attempt_latency);
        merge_counts(&mut self.outcomes, &other.outcomes);
        merge_counts(&mut self.attempts, &other.attempts);
        merge_counts(&mut self.retries, &other.retries);
    }

    pub fn operations(&self) -> u64 {
        self.outcomes.values().sum()
    }

    pub fn http_requests(&self) -> u64 {
        self.attempts.values().sum()
    }
}

/// What this run did to one SKU, in units (quantity), from outcomes the client knows for sure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SkuTally {
    /// Reserve operations sent for this SKU (whatever their outcome).
    pub attempted: u64,
    /// Units of reservations that were created (held at creation).
    pub reserved: i64,
    /// Units of those later confirmed.
    pub confirmed: i64,
    /// Units of those later released.
    pub released: i64,
}

impl SkuTally {
    pub fn merge(&mut self, other: &SkuTally) {
        self.attempted += other.attempted;
        self.reserved += other.reserved;
        self.confirmed += other.confirmed;
        self.released += other.released;
    }

    /// Account a reservation of `quantity` units by its final status.
    pub fn account(&mut self, status: allocator::wire::ReservationStatus, quantity: i64) {
        use allocator::wire::ReservationStatus::*;
        self.reserved += quantity;
        match status {
            Held => {}
            Confirmed => self.confirmed += quantity,
            // An expired hold gives its units back like a release.
            Released | Expired => self.released += quantity,
        }
    }
}

/// A reservation whose final state the worker could not learn (gave up retrying, 5xx); resolved
/// after the run with `GET /v1/reservations/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub reservation_id: String,
    pub sku_index: usize,
    pub quantity: i64,
}

/// Everything one worker accumulates; merged into one at the end.
#[derive(Debug, Clone, Default)]
pub struct WorkerStats {
    pub ops: BTreeMap<String, OpStats>,
    pub iterations: u64,
    pub tallies: BTreeMap<usize, SkuTally>,
    pub pending: Vec<Pending>,
}

impl WorkerStats {
    pub fn op(&mut self, name: &str) -> &mut OpStats {
        if !self.ops.contains_key(name) {
            self.ops.insert(name.to_owned(), OpStats::default());
        }
        self.ops.get_mut(name).expect("inserted above")
    }

    pub fn tally(&mut self, sku_index: usize) -> &mut SkuTally {
        self.tallies.entry(sku_index).or_default()
    }

    pub fn merge(&mut self, other: &WorkerStats) {
        for (name, stats) in &other.ops {
            self.op(name).merge(stats);
        }
        self.iterations += other.iterations;
        for (sku, tally) in &other.tallies {
            self.tally(*sku).merge(tally);
        }
        self.pending.extend(other.pending.iter().cloned());
    }
}

// ------------------------------------------------------------------------------------------------
// Invariants
// ------------------------------------------------------------------------------------------------

/// The invariant verdict for one SKU touched by the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkuCheck {
    pub sku: String,
    pub tally: SkuTally,
    pub before: Option<Counts>,
    pub after: Option<Counts>,
    /// `false` when a reservation of this SKU has an unknown outcome, so the accounting check
    /// (not I1) was skipped.
    pub accounting_checked: bool,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub on_hand: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
}

impl From<&Inventory> for Counts {
    fn from(inv: &Inventory) -> Self {
        Counts {
            on_hand: inv.on_hand,
            available: inv.available,
            held: inv.held,
            confirmed: inv.confirmed,
        }
    }
}

/// Check one SKU.
///
/// * I1: `available >= 0` and `on_hand == available + held + confirmed` after the run.
/// * Accounting (only when every outcome for the SKU is known, and nobody else wrote to it):
///   `Δ(held + confirmed) == reserved − released`, and more precisely `Δconfirmed == confirmed`,
///   `Δheld == reserved − confirmed − released`, `Δon_hand == 0`. `before` is the snapshot taken
///   before the run; `None` means "not snapshotted", taken as a fresh SKU with no holds (and then
///   `Δon_hand` is not checked).
pub fn check_sku(
    sku: &str,
    tally: SkuTally,
    before: Option<Counts>,
    after: Option<Counts>,
    accounting_known: bool,
) -> SkuCheck {
    let mut violations = Vec::new();
    match after {
        None => {
            if tally.reserved > 0 {
                violations.push(format!(
                    "inventory row missing after {} units were reserved",
                    tally.reserved
                ));
            }
        }
        Some(a) => {
            if a.available < 0 {
                violations.push(format!("I1: available {} < 0", a.available));
            }
            if a.held < 0 || a.confirmed < 0 {
                violations.push(format!(
                    "negative counter: held {} confirmed {}",
                    a.held, a.confirmed
                ));
            }
            if a.on_hand != a.available + a.held + a.confirmed {
                violations.push(format!(
                    "I1: on_hand {} != available {} + held {} + confirmed {}",
                    a.on_hand, a.available, a.held, a.confirmed
                ));
            }
            if accounting_known {
                let b = before.unwrap_or(Counts {
                    on_hand: a.on_hand,
                    available: a.on_hand,
                    held: 0,
                    confirmed: 0,
                });
                let net = tally.reserved - tally.released;
                let d_taken = (a.held + a.confirmed) - (b.held + b.confirmed);
                if d_taken != net {
                    violations.push(format!(
                        "accounting: held+confirmed changed by {d_taken}, but this run created {} and released {} units (expected {net})",
                        tally.reserved, tally.released
                    ));
                }
                let d_confirmed = a.confirmed - b.confirmed;
                if d_confirmed != tally.confirmed {
                    violations.push(format!(
                        "accounting: confirmed changed by {d_confirmed}, this run confirmed {}",
                        tally.confirmed
                    ));
                }
                let d_held = a.held - b.held;
                let expected_held = tally.reserved - tally.confirmed - tally.released;
                if d_held != expected_held {
                    violations.push(format!(
                        "accounting: held changed by {d_held}, expected {expected_held}"
                    ));
                }
                if before.is_some() && a.on_hand != b.on_hand {
                    violations.push(format!(
                        "accounting: on_hand changed from {} to {} without adjustments",
                        b.on_hand, a.on_hand
                    ));
                }
            }
        }
    }
    SkuCheck {
        sku: sku.to_owned(),
        tally,
        before,
        after,
        accounting_checked: accounting_known && after.is_some(),
        violations,
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct InvariantReport {
    pub ok: bool,
    pub skus_checked: usize,
    pub accounting_checked: usize,
    pub snapshot_before: bool,
    /// Reservations with an unknown outcome at the end of the run, and how many of them a GET
    /// resolved.
    pub pending: usize,
    pub pending_resolved: usize,
    /// Problems reading inventory (the check could not be made).
    pub errors: Vec<String>,
    /// SKUs with violations (all of them) followed by the hottest SKUs (for context).
    pub skus: Vec<SkuCheck>,
    pub violations: usize,
}

// ------------------------------------------------------------------------------------------------
// Report
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl From<&Histogram> for LatencySummary {
    fn from(h: &Histogram) -> Self {
        LatencySummary {
            count: h.count(),
            mean_ms: round3(h.mean_micros() / 1000.0),
            p50_ms: h.quantile_ms(0.50),
            p90_ms: h.quantile_ms(0.90),
            p99_ms: h.quantile_ms(0.99),
            p999_ms: h.quantile_ms(0.999),
            max_ms: h.max_micros() as f64 / 1000.0,
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    pub operations: u64,
    pub http_requests: u64,
    pub latency: LatencySummary,
    pub attempt_latency: LatencySummary,
    pub outcomes: BTreeMap<String, u64>,
    pub attempts: BTreeMap<String, u64>,
    pub retries: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    pub target: String,
    pub run_id: String,
    pub skus: usize,
    pub prefix: String,
    pub skew: String,
    pub concurrency: usize,
    pub duration_secs: Option<f64>,
    pub requests: Option<u64>,
    pub quantity: i64,
    pub ttl_seconds: u32,
    pub confirm_ratio: f64,
    pub release_ratio: f64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub config: RunConfig,
    pub elapsed_secs: f64,
    /// Reserve/confirm/release iterations completed.
    pub iterations: u64,
    /// HTTP requests sent (every attempt of every operation, final GETs excluded).
    pub http_requests: u64,
    pub http_requests_per_sec: f64,
    /// Reserve operations completed (final outcome known or given up) per second.
    pub reserves_per_sec: f64,
    /// Reservations created (201, or 200 replaying our own earlier attempt) per second.
    pub reservations_created_per_sec: f64,
    /// Latency of all operations' end-to-end times (reserve + confirm + release).
    pub latency: LatencySummary,
    /// Latency of every HTTP attempt.
    pub attempt_latency: LatencySummary,
    pub ops: BTreeMap<String, OpReport>,
    /// Sum over operations.
    pub attempts_by_status: BTreeMap<String, u64>,
    pub retries_by_cause: BTreeMap<String, u64>,
    pub invariants: InvariantReport,
}

impl Report {
    pub fn build(
        config: RunConfig,
        elapsed_secs: f64,
        stats: &WorkerStats,
        invariants: InvariantReport,
    ) -> Report {
        let per_sec = |n: u64| {
            if elapsed_secs > 0.0 {
                round3(n as f64 / elapsed_secs)
            } else {
                0.0
            }
        };
        let mut all = OpStats::default();
        let mut ops = BTreeMap::new();
        for (name, op) in &stats.ops {
            all.merge(op);
            ops.insert(
                name.clone(),
                OpReport {
                    operations: op.operations(),
                    http_requests: op.http_requests(),
                    latency: (&op.latency).into(),
                    attempt_latency: (&op.attempt_latency).into(),
                    outcomes: op.outcomes.clone(),
                    attempts: op.attempts.clone(),
                    retries: op.retries.clone(),
                },
            );
        }
        let (reserves, created) = stats
            .ops
            .get("reserve")
            .map(|r| {
                let created = ["created", "replayed"]
                    .iter()
                    .map(|k| r.outcomes.get(*k).copied().unwrap_or(0))
                    .sum();
                (r.operations(), created)
            })
            .unwrap_or((0, 0));
        Report {
            config,
            elapsed_secs: round3(elapsed_secs),
            iterations: stats.iterations,
            http_requests: all.http_requests(),
            http_requests_per_sec: per_sec(all.http_requests()),
            reserves_per_sec: per_sec(reserves),
            reservations_created_per_sec: per_sec(created),
            latency: (&all.latency).into(),
            attempt_latency: (&all.attempt_latency).into(),
            ops,
            attempts_by_status: all.attempts.clone(),
            retries_by_cause: all.retries.clone(),
            invariants,
        }
    }

    /// Human-readable report.
    pub fn render_text(&self) -> String {
        let c = &self.config;
        let mut out = String::new();
        let limit = match (c.duration_secs, c.requests) {
            (Some(d), Some(r)) => format!("{d} s or {r} iterations"),
            (Some(d), None) => format!("{d} s"),
            (None, Some(r)) => format!("{r} iterations"),
            (None, None) => "-".into(),
        };
        let _ = writeln!(out, "loadtest run {} against {}", c.run_id, c.target);
        let _ = writeln!(
            out,
            "  workload   : {} workers (closed loop), {limit}, skew {} over {} SKUs ({}-0..{}), quantity {}, confirm {} / release {}, seed {}",
            c.concurrency, c.skew, c.skus, c.prefix, c.skus.saturating_sub(1), c.quantity, c.confirm_ratio, c.release_ratio, c.seed
        );
        let _ = writeln!(
            out,
            "  requests   : {} HTTP requests in {:.2} s = {:.1} req/s; {} iterations",
            self.http_requests, self.elapsed_secs, self.http_requests_per_sec, self.iterations
        );
        let _ = writeln!(
            out,
            "  throughput : {:.1} reserves/s ({:.1} reservations created/s)",
            self.reserves_per_sec, self.reservations_created_per_sec
        );
        let _ = writeln!(
            out,
            "  latency ms : {:<18} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
            "operation", "count", "p50", "p90", "p99", "p99.9", "max"
        );
        let line = |out: &mut String, name: &str, l: &LatencySummary| {
            let _ = writeln!(
                out,
                "               {:<18} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
                name, l.count, l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
            );
        };
        for (name, op) in &self.ops {
            line(&mut out, name, &op.latency);
        }
        line(&mut out, "(every attempt)", &self.attempt_latency);
        let _ = writeln!(out, "  outcomes   :");
        for (name, op) in &self.ops {
            let _ = writeln!(out, "    {:<9} {}", name, fmt_counts(&op.outcomes));
        }
        let _ = writeln!(
            out,
            "  attempts   : {}",
            fmt_counts(&self.attempts_by_status)
        );
        let _ = writeln!(
            out,
            "  retries    : {}",
            if self.retries_by_cause.is_empty() {
                "none".to_owned()
            } else {
                fmt_counts(&self.retries_by_cause)
            }
        );
        let inv = &self.invariants;
        let _ = writeln!(
            out,
            "  invariants : {} — {} SKUs checked (I1), accounting on {} (snapshot before run: {}), {} unknown outcomes ({} resolved by GET), {} violations",
            if inv.ok { "OK" } else { "FAILED" },
            inv.skus_checked,
            inv.accounting_checked,
            if inv.snapshot_before { "yes" } else { "no" },
            inv.pending,
            inv.pending_resolved,
            inv.violations
        );
        for e in &inv.errors {
            let _ = writeln!(out, "    error: {e}");
        }
        for s in &inv.skus {
            let a = s
                .after
                .map(|a| {
                    format!(
                        "on_hand {} available {} held {} confirmed {}",
                        a.on_hand, a.available, a.held, a.confirmed
                    )
                })
                .unwrap_or_else(|| "missing".into());
            let _ = writeln!(
                out,
                "    {} {:<14} {} | run: {} reserves, +{} held, {} confirmed, {} released",
                if s.violations.is_empty() { "ok" } else { "!!" },
                s.sku,
                a,
                s.tally.attempted,
                s.tally.reserved,
                s.tally.confirmed,
                s.tally.released
            );
            for v in &s.violations {
                let _ = writeln!(out, "       {v}");
            }
        }
        out
    }
}

pub fn fmt_counts(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    map.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocator::wire::ReservationStatus;

    fn counts(on_hand: i64, available: i64, held: i64, confirmed: i64) -> Counts {
        Counts {
            on_hand,
            available,
            held,
            confirmed,
        }
    }

    #[test]
    fn bump_and_merge_counts() {
        let mut a = BTreeMap::new();
        bump(&mut a, "201", 2);
        bump(&mut a, "503", 1);
        let mut b = BTreeMap::new();
        bump(&mut b, "201", 3);
        bump(&mut b, "timeout", 1);
        merge_counts(&mut a, &b);
        assert_eq!(fmt_counts(&a), "201 5, 503 1, timeout 1");
        assert_eq!(fmt_counts(&BTreeMap::new()), "-");
    }

    #[test]
    fn tally_accounts_by_final_status() {
        let mut t = SkuTally::default();
        t.account(ReservationStatus::Held, 2);
        t.account(ReservationStatus::Confirmed, 1);
        t.account(ReservationStatus::Released, 3);
        t.account(ReservationStatus::Expired, 1);
        assert_eq!(
            t,
            SkuTally {
                attempted: 0,
                reserved: 7,
                confirmed: 1,
                released: 4
            }
        );
    }

    #[test]
    fn worker_stats_merge_sums_everything() {
        let mut a = WorkerStats {
            iterations: 3,
            ..Default::default()
        };
        a.op("reserve").latency.record_micros(1_000);
        bump(&mut a.op("reserve").outcomes, "created", 3);
        bump(&mut a.op("reserve").attempts, "201", 3);
        a.tally(0).reserved = 3;
        let mut b = WorkerStats {
            iterations: 2,
            ..Default::default()
        };
        b.op("reserve").latency.record_micros(3_000);
        bump(&mut b.op("reserve").outcomes, "created", 1);
        bump(&mut b.op("reserve").outcomes, "insufficient_stock", 1);
        bump(&mut b.op("reserve").attempts, "201", 1);
        bump(&mut b.op("reserve").attempts, "409", 1);
        bump(&mut b.op("reserve").attempts, "503", 1);
        bump(&mut b.op("reserve").retries, "503", 1);
        bump(&mut b.op("confirm").outcomes, "confirmed", 1);
        bump(&mut b.op("confirm").attempts, "200", 1);
        b.tally(0).reserved = 1;
        b.tally(0).confirmed = 1;
        b.tally(5).attempted = 1;
        b.pending.push(Pending {
            reservation_id: "x".into(),
            sku_index: 5,
            quantity: 1,
        });
        a.merge(&b);
        assert_eq!(a.iterations, 5);
        assert_eq!(a.ops["reserve"].operations(), 5);
        assert_eq!(a.ops["reserve"].http_requests(), 6);
        assert_eq!(a.ops["reserve"].latency.count(), 2);
        assert_eq!(a.ops.values().map(OpStats::http_requests).sum::<u64>(), 7);
        assert_eq!(a.tallies[&0].reserved, 4);
        assert_eq!(a.tallies[&0].confirmed, 1);
        assert_eq!(a.tallies[&5].attempted, 1);
        assert_eq!(a.pending.len(), 1);
    }

    #[test]
    fn report_aggregates_rates_and_outcomes() {
        let mut s = WorkerStats {
            iterations: 10,
            ..Default::default()
        };
        for v in 1..=10u64 {
            s.op("reserve").latency.record_micros(v * 1000);
            s.op("reserve").attempt_latency.record_micros(v * 1000);
        }
        bump(&mut s.op("reserve").outcomes, "created", 8);
        bump(&mut s.op("reserve").outcomes, "replayed", 1);
        bump(&mut s.op("reserve").outcomes, "insufficient_stock", 1);
        bump(&mut s.op("reserve").attempts, "201", 8);
        bump(&mut s.op("reserve").attempts, "200", 1);
        bump(&mut s.op("reserve").attempts, "timeout", 1);
        bump(&mut s.op("reserve").attempts, "409", 1);
        bump(&mut s.op("reserve").retries, "timeout", 1);
        bump(&mut s.op("release").outcomes, "released", 2);
        bump(&mut s.op("release").attempts, "200", 2);
        s.op("release").latency.record_micros(500);
        let config = RunConfig {
            target: "http://x".into(),
            run_id: "r".into(),
            skus: 10,
            prefix: "p".into(),
            skew: "hot:0.9".into(),
            concurrency: 2,
            duration_secs: Some(2.0),
            requests: None,
            quantity: 1,
            ttl_seconds: 3600,
            confirm_ratio: 0.5,
            release_ratio: 0.3,
            seed: 42,
        };
        let r = Report::build(config, 2.0, &s, InvariantReport::default());
        assert_eq!(r.http_requests, 13);
        assert_eq!(r.http_requests_per_sec, 6.5);
        assert_eq!(r.reserves_per_sec, 5.0);
        assert_eq!(r.reservations_created_per_sec, 4.5);
        assert!((r.ops["reserve"].latency.p50_ms - 5.0).abs() < 0.05);
        assert_eq!(r.ops["reserve"].latency.max_ms, 10.0);
        assert_eq!(r.latency.count, 11);
        assert_eq!(r.attempts_by_status["200"], 3);
        assert_eq!(r.retries_by_cause["timeout"], 1);
        let text = r.render_text();
        assert!(text.contains("5.0 reserves/s"), "{text}");
        assert!(text.contains("retries    : timeout 1"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ops"]["reserve"]["outcomes"]["created"], 8);
        assert_eq!(json["invariants"]["ok"], false);
    }

    #[test]
    fn consistent_sku_passes() {
        let tally = SkuTally {
            attempted: 10,
            reserved: 10,
            confirmed: 5,
            released: 3,
        };
        let before = counts(100, 98, 1, 1);
        let after = counts(100, 91, 3, 6);
        let c = check_sku("s-0", tally, Some(before), Some(after), true);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert!(c.accounting_checked);
        // Without a snapshot the SKU is taken as fresh.
        let c = check_sku("s-0", tally, None, Some(counts(100, 93, 2, 5)), true);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    #[test]
    fn oversell_and_broken_sum_are_caught() {
        let tally = SkuTally::default();
        let c = check_sku("s", tally, None, Some(counts(5, -1, 6, 0)), false);
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
        assert!(c.violations[0].contains("available -1"));
        let c = check_sku("s", tally, None, Some(counts(5, 1, 1, 1)), false);
        assert!(c.violations[0].contains("on_hand 5"));
        assert!(!c.accounting_checked);
    }

    #[test]
    fn accounting_mismatch_is_caught_only_when_outcomes_are_known() {
        let tally = SkuTally {
            attempted: 4,
            reserved: 4,
            confirmed: 1,
            released: 1,
        };
        let before = counts(10, 10, 0, 0);
        // One hold too many (a lost release or a double decrement).
        let after = counts(10, 6, 3, 1);
        let c = check_sku("s", tally, Some(before), Some(after), true);
        assert!(c.violations.iter().any(|v| v.contains("held+confirmed")));
        assert!(c.violations.iter().any(|v| v.contains("held changed")));
        let c = check_sku("s", tally, Some(before), Some(after), false);
        assert!(c.violations.is_empty());
        // on_hand moving is reported when a snapshot exists.
        let c = check_sku("s", tally, Some(before), Some(counts(11, 9, 1, 1)), true);
        assert!(c.violations.iter().any(|v| v.contains("on_hand changed")));
    }

    #[test]
    fn missing_row_after_reservations_is_a_violation() {
        let tally = SkuTally {
            attempted: 1,
            reserved: 1,
            ..Default::default()
        };
        assert_eq!(check_sku("s", tally, None, None, true).violations.len(), 1);
        let untouched = SkuTally {
            attempted: 3,
            ..Default::default()
        };
        assert!(check_sku("s", untouched, None, None, true)
            .violations
            .is_empty());
    }
}
