//! The run's time series: operations completed per second, by outcome class, and the latency
//! percentiles of each second.
//!
//! Every operation (reserve, order, confirm, release) lands in the bucket of the second, counted
//! from the run's start, in which it completed. A bucket keeps three counters and its own
//! latency histogram, so the percentiles of one second are exact (to the histogram's 1 %), not
//! an average of averages. The same buckets feed the live progress display (the last complete
//! second is the "recent window": a histogram that is in effect rotated every second) and, after
//! the run, the JSON `timeline` and the SVG chart.
//!
//! Workers record a finished iteration under one short lock (never held across an await); an
//! iteration costs a few histogram increments, next to milliseconds of HTTP.
//!
//! Memory stays bounded on long runs: a bucket's histogram is folded into its percentiles once
//! the bucket is [`SEAL_AFTER_SECS`] old. Operations are recorded when their iteration ends, so an
//! operation can reach an older bucket only as late as one iteration lasts (a few retry
//! deadlines); one that finds its bucket sealed still counts but is left out of that second's
//! percentiles, and is reported as `late_records`.
//!
//! Time is passed in (`Instant`s), never read here, so the bucketing is testable without sleeps.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::stats::Latency;

/// A bucket's histogram is replaced by its percentiles once it ended this long ago.
pub const SEAL_AFTER_SECS: u64 = 120;

/// What an operation's final outcome label (see `iteration.rs`) means for the charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Did what was asked: created, replayed, placed, confirmed, released.
    Ok,
    /// Refused for stock: `insufficient_stock` (reserve), `order_failed` (order).
    OutOfStock,
    /// Anything else: gave up retrying, unexpected status, invalid state, unparsable answer.
    Error,
}

impl Outcome {
    pub fn of(label: &str) -> Outcome {
        match label {
            "created" | "replayed" | "placed" | "confirmed" | "released" => Outcome::Ok,
            // A replay of our own hold that has moved on (e.g. expired) is a correct answer.
            l if l.starts_with("replayed_") => Outcome::Ok,
            "insufficient_stock" | "order_failed" => Outcome::OutOfStock,
            _ => Outcome::Error,
        }
    }
}

/// Percentiles kept for a sealed bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Quantiles {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Quantiles {
    fn of(h: &Latency) -> Quantiles {
        Quantiles {
            p50_ms: h.quantile_ms(0.50),
            p99_ms: h.quantile_ms(0.99),
            max_ms: h.max_ms(),
        }
    }
}

#[derive(Debug, Default)]
struct Bucket {
    ok: u64,
    out_of_stock: u64,
    error: u64,
    /// Allocated on the first record: idle seconds cost nothing.
    latency: Option<Latency>,
    sealed: Option<Quantiles>,
}

impl Bucket {
    fn count(&self) -> u64 {
        self.ok + self.out_of_stock + self.error
    }

    fn quantiles(&self) -> Option<Quantiles> {
        self.sealed
            .or_else(|| self.latency.as_ref().map(Quantiles::of))
    }
}

/// What the progress display shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Live {
    /// Operations completed since the start.
    pub done: u64,
    /// Operations per second over the last complete second (during the first second: so far).
    pub rate: f64,
    /// p99 latency over the same window; `None` before the first operation in it.
    pub p99_ms: Option<f64>,
}

#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    buckets: Vec<Bucket>,
    /// Buckets below this index are sealed.
    sealed_below: usize,
    done: u64,
    late: u64,
}

pub type SharedTimeline = Arc<Mutex<Timeline>>;

impl Timeline {
    pub fn new(start: Instant) -> Timeline {
        Timeline {
            start,
            buckets: Vec::new(),
            sealed_below: 0,
            done: 0,
            late: 0,
        }
    }

    pub fn shared(start: Instant) -> SharedTimeline {
        Arc::new(Mutex::new(Timeline::new(start)))
    }

    fn second(&self, at: Instant) -> usize {
        at.saturating_duration_since(self.start).as_secs() as usize
    }

    /// An operation that completed at `at` with `outcome` after `latency`.
    pub fn record(&mut self, at: Instant, outcome: Outcome, latency: Duration) {
        let s = self.second(at);
        if self.buckets.len() <= s {
            self.buckets.resize_with(s + 1, Bucket::default);
        }
        let b = &mut self.buckets[s];
        match outcome {
            Outcome::Ok => b.ok += 1,
            Outcome::OutOfStock => b.out_of_stock += 1,
            Outcome::Error => b.error += 1,
        }
        if b.sealed.is_some() {
            self.late += 1;
        } else {
            b.latency
                .get_or_insert_with(Latency::coarse)
                .record(latency);
        }
        self.done += 1;
    }

    /// Fold the histograms of buckets that ended at least [`SEAL_AFTER_SECS`] before `now`.
    pub fn seal_before(&mut self, now: Instant) {
        // Bucket `s` ends at `s + 1` s: sealed once `now >= s + 1 + SEAL_AFTER_SECS`.
        let limit = self
            .second(now)
            .saturating_sub(SEAL_AFTER_SECS as usize)
            .min(self.buckets.len());
        for b in &mut self.buckets[self.sealed_below.min(limit)..limit] {
            b.sealed = Some(b.latency.take().map_or(
                Quantiles {
                    p50_ms: 0.0,
                    p99_ms: 0.0,
                    max_ms: 0.0,
                },
                |h| Quantiles::of(&h),
            ));
        }
        self.sealed_below = self.sealed_below.max(limit);
    }

    #[cfg(test)]
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Rate and p99 of the last complete second before `now`.
    pub fn live(&self, now: Instant) -> Live {
        let elapsed = now.saturating_duration_since(self.start);
        let s = elapsed.as_secs() as usize;
        let (bucket, span) = if s == 0 {
            (self.buckets.first(), elapsed.as_secs_f64())
        } else {
            (self.buckets.get(s - 1), 1.0)
        };
        let count = bucket.map_or(0, Bucket::count);
        Live {
            done: self.done,
            rate: if span > 0.0 { count as f64 / span } else { 0.0 },
            p99_ms: bucket
                .filter(|b| b.count() > 0)
                .and_then(Bucket::quantiles)
                .map(|q| q.p99_ms),
        }
    }

    /// The series for a run that lasted `elapsed`: one entry per second, empty seconds included.
    pub fn report(&self, elapsed: Duration) -> TimelineReport {
        let secs = elapsed.as_secs_f64();
        let n = self.buckets.len().max(secs.ceil() as usize);
        let empty = Bucket::default();
        let seconds = (0..n)
            .map(|s| {
                let b = self.buckets.get(s).unwrap_or(&empty);
                let q = b.quantiles().filter(|_| b.count() > 0);
                SecondReport {
                    second: s as u64,
                    // The last second is usually cut short by the end of the run.
                    span_secs: round3((secs - s as f64).clamp(0.0, 1.0)),
                    ok: b.ok,
                    out_of_stock: b.out_of_stock,
                    error: b.error,
                    p50_ms: q.map(|q| q.p50_ms),
                    p99_ms: q.map(|q| q.p99_ms),
                    max_ms: q.map(|q| q.max_ms),
                }
            })
            .collect();
        TimelineReport {
            interval_secs: 1.0,
            late_records: self.late,
            seconds,
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One second of the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SecondReport {
    /// Seconds since the start of the load: this entry covers `[second, second + span_secs)`.
    pub second: u64,
    /// 1, except for the last second of the run.
    pub span_secs: f64,
    /// Operations completed in this second, by outcome class.
    pub ok: u64,
    pub out_of_stock: u64,
    pub error: u64,
    /// Latency of the operations completed in this second; `null` when there were none.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

#[cfg(test)]
impl SecondReport {
    pub fn total(&self) -> u64 {
        self.ok + self.out_of_stock + self.error
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TimelineReport {
    pub interval_secs: f64,
    /// Operations recorded after their second was sealed: counted, not in its percentiles.
    pub late_records: u64,
    pub seconds: Vec<SecondReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn outcome_classes() {
        for ok in ["created", "replayed", "placed", "confirmed", "released"] {
            assert_eq!(Outcome::of(ok), Outcome::Ok, "{ok}");
        }
        assert_eq!(Outcome::of("replayed_expired"), Outcome::Ok);
        assert_eq!(Outcome::of("insufficient_stock"), Outcome::OutOfStock);
        assert_eq!(Outcome::of("order_failed"), Outcome::OutOfStock);
        for err in [
            "gave_up_timeout",
            "http_500",
            "invalid_state",
            "unparsable_201",
        ] {
            assert_eq!(Outcome::of(err), Outcome::Error, "{err}");
        }
    }

    #[test]
    fn operations_land_in_the_second_they_completed() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0);
        // Second 0: fast answers; second 2: slow ones and an error; second 1 stays idle.
        for i in 0..100u64 {
            t.record(t0 + MS(i * 9), Outcome::Ok, MS(1 + i % 10));
        }
        t.record(t0 + MS(999), Outcome::OutOfStock, MS(2));
        t.record(t0 + MS(2000), Outcome::Ok, MS(100));
        t.record(t0 + MS(2500), Outcome::Ok, MS(300));
        t.record(t0 + MS(2999), Outcome::Error, MS(200));
        assert_eq!(t.done(), 104);

        let r = t.report(MS(3400));
        assert_eq!(
            r.seconds.len(),
            4,
            "3.4 s: four seconds, the last one partial"
        );
        let [s0, s1, s2, s3] = &r.seconds[..] else {
            panic!("{r:?}")
        };
        assert_eq!((s0.ok, s0.out_of_stock, s0.error), (100, 1, 0));
        assert!((s0.p50_ms.unwrap() - 5.0).abs() < 0.1, "{s0:?}");
        assert!((s0.p99_ms.unwrap() - 10.0).abs() < 0.1, "{s0:?}");
        assert_eq!(s1.total(), 0);
        assert_eq!((s1.p50_ms, s1.p99_ms), (None, None));
        assert_eq!((s2.ok, s2.error), (2, 1));
        assert!((s2.p50_ms.unwrap() - 200.0).abs() < 2.0, "{s2:?}");
        assert!((s2.max_ms.unwrap() - 300.0).abs() < 3.0, "{s2:?}");
        assert_eq!(s3.total(), 0);
        assert_eq!(
            r.seconds.iter().map(|s| s.span_secs).collect::<Vec<_>>(),
            [1.0, 1.0, 1.0, 0.4]
        );
        assert_eq!(
            r.seconds.iter().map(|s| s.second).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(r.late_records, 0);
    }

    #[test]
    fn live_view_uses_the_last_complete_second() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0);
        // First half second: 50 ops → 100/s so far.
        for i in 0..50u64 {
            t.record(t0 + MS(i * 10), Outcome::Ok, MS(4));
        }
        let live = t.live(t0 + MS(500));
        assert_eq!(live.done, 50);
        assert!((live.rate - 100.0).abs() < 1e-9, "{live:?}");
        assert!((live.p99_ms.unwrap() - 4.0).abs() < 0.05);
        // Second 1: 20 slow ops; at 2.3 s the window is second 1 only, not the cumulative run.
        for i in 0..20u64 {
            t.record(t0 + MS(1000 + i * 40), Outcome::Ok, MS(50));
        }
        t.record(t0 + MS(2100), Outcome::Ok, MS(1));
        let live = t.live(t0 + MS(2300));
        assert_eq!(live.done, 71);
        assert_eq!(live.rate, 20.0);
        assert!((live.p99_ms.unwrap() - 50.0).abs() < 0.5, "{live:?}");
        // An idle second: no rate, no p99.
        let live = t.live(t0 + MS(4200));
        assert_eq!((live.rate, live.p99_ms), (0.0, None));
        // At the very start nothing divides by zero.
        assert_eq!(Timeline::new(t0).live(t0).rate, 0.0);
    }

    #[test]
    fn old_buckets_are_sealed_and_keep_their_percentiles() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0);
        t.record(t0, Outcome::Ok, MS(10));
        t.record(t0 + MS(1500), Outcome::Ok, MS(20));
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Second 0 ends at 1 s: still open at 1 s + SEAL_AFTER - 1 ms.
        t.seal_before(at(SEAL_AFTER_SECS) + MS(999));
        assert_eq!(t.sealed_below, 0);
        t.seal_before(at(SEAL_AFTER_SECS + 1));
        assert_eq!(t.sealed_below, 1);
        assert!(t.buckets[0].latency.is_none());
        assert!(t.buckets[1].latency.is_some());
        // Far beyond the last bucket: everything sealed, no panic, idempotent.
        t.seal_before(at(10 * SEAL_AFTER_SECS));
        t.seal_before(at(10 * SEAL_AFTER_SECS));
        assert_eq!(t.sealed_below, 2);
        // A straggler for a sealed second: counted, not in the percentiles, reported as late.
        t.record(t0 + MS(200), Outcome::Error, MS(90_000));
        let r = t.report(Duration::from_secs(2));
        assert_eq!((r.seconds[0].ok, r.seconds[0].error), (1, 1));
        assert!((r.seconds[0].max_ms.unwrap() - 10.0).abs() < 0.1);
        assert!((r.seconds[1].p50_ms.unwrap() - 20.0).abs() < 0.2);
        assert_eq!(r.late_records, 1);
        // New seconds after the sealed ones are recorded normally.
        t.record(at(10 * SEAL_AFTER_SECS), Outcome::Ok, MS(1));
        assert_eq!(t.report(Duration::ZERO).late_records, 1);
    }
}
