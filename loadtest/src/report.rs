//! The run report: configuration, throughput, latency percentiles, outcomes, pacing and the
//! invariant verdict, as text or JSON. Pure (no I/O).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::check::InvariantReport;
use crate::cpu::CpuReport;
use crate::stats::{Latency, OpStats, Pacing, WorkerStats};
use crate::timeline::TimelineReport;

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

impl From<&Latency> for LatencySummary {
    fn from(h: &Latency) -> Self {
        LatencySummary {
            count: h.count(),
            mean_ms: round3(h.mean_ms()),
            p50_ms: h.quantile_ms(0.50),
            p90_ms: h.quantile_ms(0.90),
            p99_ms: h.quantile_ms(0.99),
            p999_ms: h.quantile_ms(0.999),
            max_ms: h.max_ms(),
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
    /// Closed loop: workers, each with one iteration in flight. Open loop: the in-flight bound.
    pub concurrency: usize,
    /// Open loop: iterations started per second on a fixed schedule; `None` for closed loop.
    pub rate: Option<f64>,
    /// Open loop: a start later than this after its intended time counts as late.
    pub late_ms: u64,
    pub duration_secs: Option<f64>,
    pub requests: Option<u64>,
    pub quantity: i64,
    pub ttl_seconds: u32,
    pub confirm_ratio: f64,
    pub release_ratio: f64,
    /// Fraction of iterations that place a multi-line order (router only) instead of a reserve.
    pub order_ratio: f64,
    pub order_lines: usize,
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
    /// Order operations completed per second.
    pub orders_per_sec: f64,
    /// Open loop: schedule counters and the lag between intended and actual starts.
    pub pacing: Option<Pacing>,
    pub start_lag: Option<LatencySummary>,
    /// Latency of all operations' end-to-end times (reserve + confirm + release).
    pub latency: LatencySummary,
    /// Latency of every HTTP attempt.
    pub attempt_latency: LatencySummary,
    pub ops: BTreeMap<String, OpReport>,
    /// Sum over operations.
    pub attempts_by_status: BTreeMap<String, u64>,
    pub retries_by_cause: BTreeMap<String, u64>,
    pub invariants: InvariantReport,
    /// Operations completed per second by outcome class, and per-second latency percentiles
    /// (also drawn as the SVG chart beside `--json-out`).
    pub timeline: TimelineReport,
    /// CPU of this process and of the `--cpu-watch` trees over the load (not the checks), per
    /// operation completed.
    pub cpu: Option<CpuReport>,
}

impl Report {
    pub fn build(
        config: RunConfig,
        elapsed_secs: f64,
        stats: &WorkerStats,
        invariants: InvariantReport,
        timeline: TimelineReport,
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
        let orders = stats.ops.get("order").map_or(0, OpStats::operations);
        let open_loop = config.rate.is_some();
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
            orders_per_sec: per_sec(orders),
            pacing: open_loop.then_some(stats.pacing),
            start_lag: open_loop.then(|| (&stats.start_lag).into()),
            latency: (&all.latency).into(),
            attempt_latency: (&all.attempt_latency).into(),
            ops,
            attempts_by_status: all.attempts.clone(),
            retries_by_cause: all.retries.clone(),
            invariants,
            timeline,
            cpu: None,
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
        let mode = match c.rate {
            Some(rate) => format!(
                "open loop at {rate} iterations/s, at most {} in flight",
                c.concurrency
            ),
            None => format!("{} workers (closed loop)", c.concurrency),
        };
        let _ = writeln!(
            out,
            "  workload   : {mode}, {limit}, skew {} over {} SKUs ({}-0..{}), quantity {}, confirm {} / release {}, orders {} x {} lines, ttl {} s, seed {}",
            c.skew, c.skus, c.prefix, c.skus.saturating_sub(1), c.quantity, c.confirm_ratio,
            c.release_ratio, c.order_ratio, c.order_lines, c.ttl_seconds, c.seed
        );
        if let (Some(p), Some(lag)) = (&self.pacing, &self.start_lag) {
            let _ = writeln!(
                out,
                "  pacing     : {} scheduled, {} started, {} started late (> {} ms), {} not started; start lag p50 {:.2} ms p99 {:.2} ms max {:.2} ms (latency counts from the intended start)",
                p.scheduled, p.started, p.started_late, c.late_ms, p.not_started, lag.p50_ms, lag.p99_ms, lag.max_ms
            );
        }
        if let Some(cpu) = &self.cpu {
            let _ = write!(out, "  {}", cpu.render_text());
        }
        let _ = writeln!(
            out,
            "  requests   : {} HTTP requests in {:.2} s = {:.1} req/s; {} iterations",
            self.http_requests, self.elapsed_secs, self.http_requests_per_sec, self.iterations
        );
        let _ = writeln!(
            out,
            "  throughput : {:.1} reserves/s ({:.1} reservations created/s), {:.1} orders/s",
            self.reserves_per_sec, self.reservations_created_per_sec, self.orders_per_sec
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
            "  invariants : {} — {} SKUs checked (I1), accounting on {} (snapshot before run: {}), {} unknown outcomes ({} resolved by GET), {} holds read back ({} expired), {} SKUs unstable, {} violations",
            if inv.ok { "OK" } else { "FAILED" },
            inv.skus_checked,
            inv.accounting_checked,
            if inv.snapshot_before { "yes" } else { "no" },
            inv.pending,
            inv.pending_resolved,
            inv.holds_read_back,
            inv.expired,
            inv.unstable_skus,
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
                "    {} {:<14} {} | run: {} reserves, +{} held, {} confirmed, {} released, {} expired",
                if s.violations.is_empty() { "ok" } else { "!!" },
                s.sku,
                a,
                s.tally.attempted,
                s.tally.reserved,
                s.tally.confirmed,
                s.tally.released,
                s.tally.expired
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
impl RunConfig {
    /// A closed-loop run's settings, for the tests that build reports.
    pub(crate) fn example() -> RunConfig {
        RunConfig {
            target: "http://x".into(),
            run_id: "r".into(),
            skus: 10,
            prefix: "p".into(),
            skew: "hot:0.9".into(),
            concurrency: 2,
            rate: None,
            late_ms: 10,
            duration_secs: Some(2.0),
            requests: None,
            quantity: 1,
            ttl_seconds: 3600,
            confirm_ratio: 0.5,
            release_ratio: 0.3,
            order_ratio: 0.0,
            order_lines: 2,
            seed: 42,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::bump;

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
        let config = RunConfig::example();
        let r = Report::build(
            config.clone(),
            2.0,
            &s,
            InvariantReport::default(),
            TimelineReport::default(),
        );
        assert_eq!(r.http_requests, 13);
        assert_eq!(r.http_requests_per_sec, 6.5);
        assert_eq!(r.reserves_per_sec, 5.0);
        assert_eq!(r.reservations_created_per_sec, 4.5);
        assert!((r.ops["reserve"].latency.p50_ms - 5.0).abs() < 0.05);
        assert!((r.ops["reserve"].latency.max_ms - 10.0).abs() < 0.05);
        assert!(r.pacing.is_none());
        assert_eq!(r.latency.count, 11);
        assert_eq!(r.attempts_by_status["200"], 3);
        assert_eq!(r.retries_by_cause["timeout"], 1);
        let text = r.render_text();
        assert!(text.contains("5.0 reserves/s"), "{text}");
        assert!(text.contains("retries    : timeout 1"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ops"]["reserve"]["outcomes"]["created"], 8);
        assert_eq!(json["invariants"]["ok"], false);
        // Open loop: pacing is reported.
        s.pacing.scheduled = 20;
        s.pacing.started = 18;
        s.pacing.started_late = 3;
        s.pacing.not_started = 2;
        s.start_lag.record_micros(2_000);
        let open = RunConfig {
            rate: Some(10.0),
            ..config
        };
        let r = Report::build(
            open,
            2.0,
            &s,
            InvariantReport::default(),
            TimelineReport::default(),
        );
        assert_eq!(r.pacing.unwrap().not_started, 2);
        let text = r.render_text();
        assert!(text.contains("open loop at 10 iterations/s"), "{text}");
        assert!(
            text.contains("3 started late (> 10 ms), 2 not started"),
            "{text}"
        );
    }
}
