//! The router's recent traffic: requests and latency per second over the last minute, kept in
//! memory for the operations page.
//!
//! Prometheus has the same information with history, but the page must work with nothing but the
//! router (no Prometheus on a developer's laptop, or during an outage of the monitoring stack),
//! so the router keeps a ring of [`WINDOW_SECONDS`] one-second slots. Each slot has a request
//! count, a count of `5xx` answers and a latency histogram with geometric buckets (each bound
//! [`GROWTH`] times the previous, from [`FIRST_BOUND_US`]), from which a quantile is read as the
//! upper bound of the bucket it falls in: at most 25 % high, never low, and mergeable across
//! seconds. A slot is reused when its second comes round again, so memory is fixed (60 slots of a
//! few hundred bytes) whatever the request rate.
//!
//! Each slot also sums the stage times of the forwarded requests it counts
//! ([`crate::forward::stages`]), so the page shows where the last minute's time went, stage by stage.
//!
//! One `std::sync::Mutex` guards the ring. It is held for a few array writes, never across an
//! `.await`, so it does not block the executor; at the request rates a router sees it is far from
//! contended, and a sharded or atomic design would only make the snapshot harder to read.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::forward::stages::{Stage, Times};

/// How many seconds the ring covers.
pub const WINDOW_SECONDS: usize = 60;
/// Upper bound of the first latency bucket, in microseconds.
const FIRST_BOUND_US: f64 = 100.0;
/// Ratio between consecutive bucket bounds.
const GROWTH: f64 = 1.25;
/// Buckets with finite bounds (up to about 65 s); one more holds everything slower.
const BUCKETS: usize = 61;

#[derive(Clone, Copy)]
struct Slot {
    /// Seconds since the ring was created; which second the counts belong to.
    second: u64,
    requests: u64,
    errors: u64,
    histogram: [u32; BUCKETS + 1],
    /// Forwarded requests with stage times, and their stage times summed (µs, [`Stage::ALL`]
    /// order).
    staged: u64,
    stage_us: [u64; 6],
}

const EMPTY: Slot = Slot {
    second: u64::MAX,
    requests: 0,
    errors: 0,
    histogram: [0; BUCKETS + 1],
    staged: 0,
    stage_us: [0; 6],
};

/// The last minute of requests.
pub struct Traffic {
    started: Instant,
    started_unix: u64,
    slots: Mutex<[Slot; WINDOW_SECONDS]>,
}

/// One second of [`TrafficSnapshot`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SecondStats {
    /// Unix time of the second's start (router clock).
    pub unix_second: u64,
    pub requests: u64,
    /// Answers with a `5xx` status.
    pub errors: u64,
    /// 99th percentile latency in milliseconds; `None` without requests.
    pub p99_ms: Option<f64>,
}

/// What `GET /v1/cluster/overview` reports as `traffic`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrafficSnapshot {
    pub window_seconds: u64,
    /// Oldest first; the last entry is the current, still-filling second.
    pub seconds: Vec<SecondStats>,
    /// Requests in the window.
    pub requests: u64,
    /// Mean over the window's completed seconds.
    pub requests_per_second: f64,
    /// 99th percentile latency over the whole window, in milliseconds.
    pub p99_ms: Option<f64>,
    /// Mean time per forwarded request in each stage over the window, in stage order; their sum
    /// is the forwarded requests' mean latency.
    pub stages: Vec<StageMean>,
}

/// One stage of [`TrafficSnapshot::stages`].
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageMean {
    pub stage: &'static str,
    /// `None` without forwarded requests in the window.
    pub mean_ms: Option<f64>,
}

impl Default for Traffic {
    fn default() -> Self {
        Self::new()
    }
}

impl Traffic {
    pub fn new() -> Self {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Traffic {
            started: Instant::now(),
            started_unix,
            slots: Mutex::new([EMPTY; WINDOW_SECONDS]),
        }
    }

    fn second_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_secs()
    }

    /// Count one answered request that started at `started` and took `latency`, with its stage
    /// times if it was forwarded.
    pub fn record(
        &self,
        started: Instant,
        latency: Duration,
        server_error: bool,
        stages: Option<Times>,
    ) {
        let second = self.second_at(started);
        let bucket = bucket_of(latency);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut slots[(second % WINDOW_SECONDS as u64) as usize];
        if slot.second != second {
            *slot = Slot { second, ..EMPTY };
        }
        slot.requests += 1;
        slot.errors += u64::from(server_error);
        slot.histogram[bucket] += 1;
        if let Some(Times(times)) = stages {
            slot.staged += 1;
            for (sum, time) in slot.stage_us.iter_mut().zip(times) {
                *sum += time.as_micros() as u64;
            }
        }
    }

    /// The window ending with the second that holds `now`.
    pub fn snapshot(&self, now: Instant) -> TrafficSnapshot {
        let current = self.second_at(now);
        let slots = *self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let first = current.saturating_sub(WINDOW_SECONDS as u64 - 1);
        let mut total = [0u64; BUCKETS + 1];
        let mut seconds = Vec::with_capacity(WINDOW_SECONDS);
        let mut completed_requests = 0;
        let (mut staged, mut stage_us) = (0u64, [0u64; 6]);
        for second in first..=current {
            let slot = slots[(second % WINDOW_SECONDS as u64) as usize];
            let slot = if slot.second == second { slot } else { EMPTY };
            staged += slot.staged;
            for (sum, us) in stage_us.iter_mut().zip(slot.stage_us) {
                *sum += us;
            }
            for (t, &c) in total.iter_mut().zip(&slot.histogram) {
                *t += u64::from(c);
            }
            if second < current {
                completed_requests += slot.requests;
            }
            let histogram = slot.histogram.map(u64::from);
            seconds.push(SecondStats {
                unix_second: self.started_unix + second,
                requests: slot.requests,
                errors: slot.errors,
                p99_ms: quantile_ms(&histogram, 0.99),
            });
        }
        let completed = (current - first).max(1);
        TrafficSnapshot {
            window_seconds: WINDOW_SECONDS as u64,
            requests: seconds.iter().map(|s| s.requests).sum(),
            requests_per_second: completed_requests as f64 / completed as f64,
            p99_ms: quantile_ms(&total, 0.99),
            seconds,
            stages: Stage::ALL
                .iter()
                .zip(stage_us)
                .map(|(stage, us)| StageMean {
                    stage: stage.as_str(),
                    mean_ms: (staged > 0).then(|| (us as f64 / staged as f64).round() / 1000.0),
                })
                .collect(),
        }
    }
}

fn bound_us(bucket: usize) -> f64 {
    FIRST_BOUND_US * GROWTH.powi(bucket as i32)
}

fn bucket_of(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_BOUND_US {
        return 0;
    }
    let k = ((us / FIRST_BOUND_US).ln() / GROWTH.ln()).ceil() as usize;
    // Float rounding can land one bucket low; the bound must hold the value.
    let k = if bound_us(k.min(BUCKETS)) < us {
        k + 1
    } else {
        k
    };
    k.min(BUCKETS)
}

/// The upper bound (ms) of the bucket holding quantile `q`; the overflow bucket reports the last
/// finite bound.
fn quantile_ms(histogram: &[u64; BUCKETS + 1], q: f64) -> Option<f64> {
    let count: u64 = histogram.iter().sum();
    if count == 0 {
        return None;
    }
    let rank = ((count as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (bucket, &c) in histogram.iter().enumerate() {
        seen += c;
        if seen >= rank {
            let ms = bound_us(bucket.min(BUCKETS - 1)) / 1000.0;
            // Three significant decimals are plenty for a page and keep the JSON short.
            return Some((ms * 1000.0).round() / 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values() {
        for us in [1u64, 100, 101, 125, 126, 999, 5_000, 1_000_000, 60_000_000] {
            let d = Duration::from_micros(us);
            let b = bucket_of(d);
            assert!(bound_us(b) >= us as f64 || b == BUCKETS, "{us} in {b}");
            if b > 0 && b < BUCKETS {
                assert!(bound_us(b - 1) < us as f64, "{us} not in a lower bucket");
            }
        }
        assert_eq!(bucket_of(Duration::from_secs(3600)), BUCKETS);
    }

    #[test]
    fn p99_and_counts_per_second() {
        let traffic = Traffic::new();
        let t0 = traffic.started;
        // Second 0: 99 fast requests and one slow one; second 2: one 5xx.
        for _ in 0..99 {
            traffic.record(t0, Duration::from_micros(900), false, None);
        }
        traffic.record(t0, Duration::from_millis(200), false, None);
        traffic.record(
            t0 + Duration::from_secs(2),
            Duration::from_millis(3),
            true,
            None,
        );
        let snap = traffic.snapshot(t0 + Duration::from_millis(2500));
        assert_eq!(snap.seconds.len(), 3);
        assert_eq!(snap.requests, 101);
        let s0 = &snap.seconds[0];
        assert_eq!((s0.requests, s0.errors), (100, 0));
        let p99 = s0.p99_ms.unwrap();
        assert!((0.9..=1.2).contains(&p99), "p99 {p99}");
        assert_eq!(snap.seconds[1].p99_ms, None);
        assert_eq!(snap.seconds[2].errors, 1);
        // Completed seconds 0 and 1 held 100 requests.
        assert_eq!(snap.requests_per_second, 50.0);
        // The overall p99 covers the slow request's bucket only past rank 100 of 101.
        assert!(snap.p99_ms.unwrap() < 250.0);
    }

    #[test]
    fn old_seconds_leave_the_window() {
        let traffic = Traffic::new();
        let t0 = traffic.started;
        traffic.record(t0, Duration::from_millis(1), false, None);
        let later = t0 + Duration::from_secs(WINDOW_SECONDS as u64 + 5);
        traffic.record(later, Duration::from_millis(1), false, None);
        let snap = traffic.snapshot(later);
        assert_eq!(snap.seconds.len(), WINDOW_SECONDS);
        assert_eq!(snap.requests, 1);
        assert_eq!(snap.seconds.last().unwrap().requests, 1);
    }

    #[test]
    fn stage_means_over_the_window() {
        let traffic = Traffic::new();
        let t0 = traffic.started;
        let ms = Duration::from_millis;
        let times = |upstream| Times([ms(1), ms(0), ms(0), ms(upstream), ms(0), ms(1)]);
        traffic.record(t0, ms(4), false, Some(times(2)));
        traffic.record(t0 + Duration::from_secs(1), ms(6), false, Some(times(4)));
        // Not forwarded (a refusal): counted as traffic, not in the stages.
        traffic.record(t0, ms(1), false, None);
        let snap = traffic.snapshot(t0 + Duration::from_secs(1));
        let means: Vec<_> = snap.stages.iter().map(|s| (s.stage, s.mean_ms)).collect();
        assert_eq!(
            means,
            vec![
                ("accept", Some(1.0)),
                ("map", Some(0.0)),
                ("connect", Some(0.0)),
                ("upstream", Some(3.0)),
                ("retry", Some(0.0)),
                ("reply", Some(1.0)),
            ]
        );
        let empty = Traffic::new().snapshot(t0);
        assert!(empty.stages.iter().all(|s| s.mean_ms.is_none()));
    }
}
