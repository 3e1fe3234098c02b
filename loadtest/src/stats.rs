//! Counters and latency histograms: what one operation leaves behind ([`OpTrace`]), what a worker
//! or the open-loop driver accumulates ([`WorkerStats`]), and how those are merged.
//!
//! Latencies go into [`hdrhistogram`] histograms (microseconds, 3 significant digits, 1 µs to
//! 10 min; longer values are clamped to the top and still counted).

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use schema::wire::ReservationStatus;

/// Increment `map[key]` by `by`.
pub fn bump(map: &mut BTreeMap<String, u64>, key: &str, by: u64) {
    if let Some(v) = map.get_mut(key) {
        *v += by;
    } else {
        map.insert(key.to_owned(), by);
    }
}

pub fn merge_counts(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
    for (k, v) in from {
        bump(into, k, *v);
    }
}

/// Highest latency tracked exactly: 10 minutes, in microseconds.
const LATENCY_MAX_MICROS: u64 = 600_000_000;

/// A latency histogram in microseconds.
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(
            Histogram::new_with_bounds(1, LATENCY_MAX_MICROS, 3)
                .expect("static histogram bounds are valid"),
        )
    }
}

impl Latency {
    /// Two significant digits (1 % resolution): an eighth of the memory of the default, for the
    /// run's per-second histograms, of which there can be many.
    pub fn coarse() -> Self {
        Latency(
            Histogram::new_with_bounds(1, LATENCY_MAX_MICROS, 2)
                .expect("static histogram bounds are valid"),
        )
    }

    pub fn record(&mut self, elapsed: Duration) {
        self.record_micros(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn record_micros(&mut self, micros: u64) {
        self.0.saturating_record(micros.max(1));
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so this cannot fail.
        self.0
            .add(&other.0)
            .expect("histograms with equal bounds add");
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Value at quantile `q` (0..=1) in milliseconds; 0 when empty.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn mean_ms(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.mean() / 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.max() as f64 / 1000.0
    }
}

/// What one operation (with its retries) did, recorded by the HTTP client.
#[derive(Debug, Clone, Default)]
pub struct OpTrace {
    /// End to end, from the operation's origin (its intended start in open-loop mode).
    pub latency: Duration,
    /// Each HTTP attempt: status or transport failure label, and its latency.
    pub attempts: Vec<(String, Duration)>,
    /// Retry causes, one per attempt after the first.
    pub retries: Vec<String>,
}

/// Per operation kind (reserve, confirm, release, order).
#[derive(Debug, Clone, Default)]
pub struct OpStats {
    /// End-to-end latency of an operation, retries and backoff included.
    pub latency: Latency,
    /// Latency of every single HTTP attempt.
    pub attempt_latency: Latency,
    /// Final outcome per operation (`created`, `insufficient_stock`, `gave_up_timeout`, ...).
    pub outcomes: BTreeMap<String, u64>,
    /// Every attempt by HTTP status (`201`, `503`) or transport failure (`timeout`, `connect`).
    pub attempts: BTreeMap<String, u64>,
    /// Retries (attempts after the first) by the cause of the failed attempt before them.
    pub retries: BTreeMap<String, u64>,
}

impl OpStats {
    pub fn absorb(&mut self, trace: &OpTrace, outcome: &str) {
        self.latency.record(trace.latency);
        for (label, latency) in &trace.attempts {
            self.attempt_latency.record(*latency);
            bump(&mut self.attempts, label, 1);
        }
        for cause in &trace.retries {
            bump(&mut self.retries, cause, 1);
        }
        bump(&mut self.outcomes, outcome, 1);
    }

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SkuTally {
    /// Reserve operations (or order lines) sent for this SKU, whatever their outcome.
    pub attempted: u64,
    /// Units of reservations that were created (held at creation).
    pub reserved: i64,
    /// Units of those later confirmed.
    pub confirmed: i64,
    /// Units of those later released.
    pub released: i64,
    /// Units of those that expired (read back from the service).
    pub expired: i64,
}

impl SkuTally {
    pub fn merge(&mut self, other: &SkuTally) {
        self.attempted += other.attempted;
        self.reserved += other.reserved;
        self.confirmed += other.confirmed;
        self.released += other.released;
        self.expired += other.expired;
    }

    /// Account a reservation of `quantity` units by its final status.
    pub fn account(&mut self, status: ReservationStatus, quantity: i64) {
        self.reserved += quantity;
        self.leave_held(status, quantity);
    }

    /// A reservation accounted as held has since moved to `status`.
    pub fn leave_held(&mut self, status: ReservationStatus, quantity: i64) {
        match status {
            ReservationStatus::Held => {}
            ReservationStatus::Confirmed => self.confirmed += quantity,
            ReservationStatus::Released => self.released += quantity,
            ReservationStatus::Expired => self.expired += quantity,
        }
    }

    /// Units this run holds now, by the client's count.
    pub fn held(&self) -> i64 {
        self.reserved - self.confirmed - self.released - self.expired
    }
}

/// A reservation the run needs to look up after the load: its outcome is unknown (gave up
/// retrying, 5xx), or it was left held and may have expired since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    pub reservation_id: String,
    pub sku_index: usize,
    pub quantity: i64,
}

/// Open-loop scheduling counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pacing {
    /// Requests the schedule called for within the run.
    pub scheduled: u64,
    pub started: u64,
    /// Started more than the lateness threshold after their intended time (no free in-flight
    /// slot, or the client itself lagging); their latency still counts from the intended time.
    pub started_late: u64,
    /// Never started: still waiting for an in-flight slot when the run ended.
    pub not_started: u64,
}

/// Everything a worker (or the open-loop driver) accumulates; merged into one at the end.
#[derive(Debug, Clone, Default)]
pub struct WorkerStats {
    pub ops: BTreeMap<String, OpStats>,
    pub iterations: u64,
    pub tallies: BTreeMap<usize, SkuTally>,
    /// Unknown outcomes, resolved with a GET after the run.
    pub pending: Vec<Tracked>,
    /// Reservations left held; read back after the run when they may have expired.
    pub held: Vec<Tracked>,
    /// Open loop: time from the intended start to the actual start.
    pub start_lag: Latency,
    pub pacing: Pacing,
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
        self.held.extend(other.held.iter().cloned());
        self.start_lag.merge(&other.start_lag);
        self.pacing.scheduled += other.pacing.scheduled;
        self.pacing.started += other.pacing.started;
        self.pacing.started_late += other.pacing.started_late;
        self.pacing.not_started += other.pacing.not_started;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_and_merge_counts() {
        let mut a = BTreeMap::new();
        bump(&mut a, "201", 2);
        bump(&mut a, "503", 1);
        let mut b = BTreeMap::new();
        bump(&mut b, "201", 3);
        bump(&mut b, "timeout", 1);
        merge_counts(&mut a, &b);
        assert_eq!(a["201"], 5);
        assert_eq!(a["timeout"], 1);
    }

    #[test]
    fn latency_quantiles_come_from_the_histogram() {
        let mut h = Latency::default();
        assert_eq!(h.quantile_ms(0.99), 0.0);
        for v in 1..=1000u64 {
            h.record_micros(v * 1000);
        }
        assert_eq!(h.count(), 1000);
        assert!(
            (h.quantile_ms(0.5) - 500.0).abs() < 1.0,
            "{}",
            h.quantile_ms(0.5)
        );
        assert!((h.quantile_ms(0.99) - 990.0).abs() < 1.0);
        assert!((h.quantile_ms(0.999) - 999.0).abs() < 1.0);
        assert!((h.max_ms() - 1000.0).abs() < 1.0);
        let mut other = Latency::default();
        other.record(Duration::from_secs(3600)); // beyond the top: clamped, still counted
        h.merge(&other);
        assert_eq!(h.count(), 1001);
        assert!(h.max_ms() >= 599_000.0);
    }

    #[test]
    fn tally_accounts_by_final_status_and_later_expiry() {
        let mut t = SkuTally::default();
        t.account(ReservationStatus::Held, 2);
        t.account(ReservationStatus::Confirmed, 1);
        t.account(ReservationStatus::Released, 3);
        t.account(ReservationStatus::Expired, 1);
        assert_eq!(t.held(), 2);
        // One of the two held units expired after the load.
        t.leave_held(ReservationStatus::Expired, 1);
        assert_eq!(
            t,
            SkuTally {
                attempted: 0,
                reserved: 7,
                confirmed: 1,
                released: 3,
                expired: 2
            }
        );
        assert_eq!(t.held(), 1);
    }

    #[test]
    fn op_stats_absorb_traces() {
        let mut s = OpStats::default();
        let trace = OpTrace {
            latency: Duration::from_millis(30),
            attempts: vec![
                ("503".into(), Duration::from_millis(5)),
                ("201".into(), Duration::from_millis(10)),
            ],
            retries: vec!["503".into()],
        };
        s.absorb(&trace, "created");
        assert_eq!(s.operations(), 1);
        assert_eq!(s.http_requests(), 2);
        assert_eq!(s.retries["503"], 1);
        assert_eq!(s.attempt_latency.count(), 2);
        assert!((s.latency.quantile_ms(0.5) - 30.0).abs() < 0.1);
    }

    #[test]
    fn worker_stats_merge_sums_everything() {
        let mut a = WorkerStats {
            iterations: 3,
            ..Default::default()
        };
        a.op("reserve").latency.record_micros(1_000);
        bump(&mut a.op("reserve").outcomes, "created", 3);
        a.tally(0).reserved = 3;
        a.pacing.scheduled = 4;
        let mut b = WorkerStats {
            iterations: 2,
            ..Default::default()
        };
        b.op("reserve").latency.record_micros(3_000);
        bump(&mut b.op("reserve").outcomes, "created", 1);
        bump(&mut b.op("confirm").outcomes, "confirmed", 1);
        b.tally(0).reserved = 1;
        b.tally(5).attempted = 1;
        b.pending.push(Tracked {
            reservation_id: "x".into(),
            sku_index: 5,
            quantity: 1,
        });
        b.held.push(Tracked {
            reservation_id: "y".into(),
            sku_index: 0,
            quantity: 1,
        });
        b.pacing.not_started = 2;
        a.merge(&b);
        assert_eq!(a.iterations, 5);
        assert_eq!(a.ops["reserve"].operations(), 4);
        assert_eq!(a.ops["reserve"].latency.count(), 2);
        assert_eq!(a.tallies[&0].reserved, 4);
        assert_eq!(a.tallies[&5].attempted, 1);
        assert_eq!((a.pending.len(), a.held.len()), (1, 1));
        assert_eq!((a.pacing.scheduled, a.pacing.not_started), (4, 2));
    }
}
