//! Open-loop (constant arrival rate) driving.
//!
//! Iteration `i` is due at `origin + i / rate`, whatever happened to earlier ones: a slow answer
//! does not delay the next request (no coordinated omission). A dispatcher hands every due
//! iteration, stamped with its intended start, to a fixed pool of `max_in_flight` lanes. When
//! every lane is busy the iteration waits in the queue; its latency still counts from the
//! intended start, and a start later than `late` counts as late. Iterations still queued when the
//! run's time is up are counted as not started. The schedule is bounded by the duration and the
//! request count; the queue by the schedule.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::sync::mpsc;

use crate::iteration::{iterate, worker_seed};
use crate::report::RunConfig;
use crate::skew::SkuPicker;
use crate::stats::WorkerStats;
use crate::timeline::SharedTimeline;
use allocator_client::Client;

/// The arrival schedule: offsets `i / rate` from the origin for `i < limit`.
#[derive(Debug, Clone)]
pub struct Schedule {
    rate: f64,
    limit: u64,
    dispatched: u64,
}

impl Schedule {
    /// `rate` iterations per second for `duration` and/or at most `requests` iterations.
    pub fn new(rate: f64, duration: Option<Duration>, requests: Option<u64>) -> Schedule {
        assert!(rate.is_finite() && rate > 0.0, "rate must be positive");
        let by_time = duration.map_or(u64::MAX, |d| (d.as_secs_f64() * rate).ceil() as u64);
        Schedule {
            rate,
            limit: by_time.min(requests.unwrap_or(u64::MAX)),
            dispatched: 0,
        }
    }

    #[cfg(test)]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    pub fn dispatched(&self) -> u64 {
        self.dispatched
    }

    /// Intended start of iteration `i`, as an offset from the origin.
    pub fn offset(&self, i: u64) -> Duration {
        Duration::from_secs_f64(i as f64 / self.rate)
    }

    /// When the next iteration is due; `None` when the schedule is complete.
    pub fn next_offset(&self) -> Option<Duration> {
        (self.dispatched < self.limit).then(|| self.offset(self.dispatched))
    }

    /// Take every iteration due at `elapsed` (time since the origin, from whatever clock the
    /// caller uses). After a stall this is a burst: missed iterations are dispatched at once, not skipped.
    pub fn take_due(&mut self, elapsed: Duration) -> Range<u64> {
        let first = self.dispatched;
        while self.dispatched < self.limit && self.offset(self.dispatched) <= elapsed {
            self.dispatched += 1;
        }
        first..self.dispatched
    }
}

/// How an iteration taken from the queue at `now` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    OnTime,
    Late,
    /// The run's time is up: not started.
    Dropped,
}

pub fn classify_start(
    intended: Instant,
    now: Instant,
    late: Duration,
    end: Option<Instant>,
) -> Start {
    if end.is_some_and(|end| now > end) {
        Start::Dropped
    } else if now.saturating_duration_since(intended) > late {
        Start::Late
    } else {
        Start::OnTime
    }
}

pub struct OpenLoop {
    pub api: Client,
    pub config: RunConfig,
    pub picker: SkuPicker,
    pub rate: f64,
    pub max_in_flight: usize,
    pub stop: Arc<AtomicBool>,
    pub completed: Arc<AtomicU64>,
    /// Per-second series; its own lock, so the display never waits for the stats lock.
    pub timeline: SharedTimeline,
}

/// Run the schedule to its end; returns the merged statistics.
pub async fn run_open_loop(p: OpenLoop) -> WorkerStats {
    let c = p.config.clone();
    let duration = c.duration_secs.map(Duration::from_secs_f64);
    let mut schedule = Schedule::new(p.rate, duration, c.requests);
    let origin = Instant::now();
    let end = duration.map(|d| origin + d);
    let late = Duration::from_millis(c.late_ms);
    let stats = Arc::new(Mutex::new(WorkerStats::default()));
    let (tx, rx) = mpsc::unbounded_channel::<(u64, Instant)>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let shared = Arc::new((p.api, c, p.picker));

    let lanes: Vec<_> = (0..p.max_in_flight.max(1))
        .map(|lane| {
            let (rx, stats, shared) = (rx.clone(), stats.clone(), shared.clone());
            let (stop, completed) = (p.stop.clone(), p.completed.clone());
            let timeline = p.timeline.clone();
            tokio::spawn(async move {
                let (api, c, picker) = &*shared;
                let mut rng = StdRng::seed_from_u64(worker_seed(c.seed, lane));
                loop {
                    let job = rx.lock().await.recv().await;
                    let Some((i, intended)) = job else { break };
                    let now = Instant::now();
                    let start = if stop.load(Ordering::Relaxed) {
                        Start::Dropped
                    } else {
                        classify_start(intended, now, late, end)
                    };
                    if start == Start::Dropped {
                        stats.lock().expect("stats lock").pacing.not_started += 1;
                        continue;
                    }
                    let id = format!("{}-o{i}", c.run_id);
                    let record = iterate(api, c, picker, id, Some(intended), &mut rng).await;
                    record.feed(&mut timeline.lock().expect("timeline lock"), Instant::now());
                    let mut s = stats.lock().expect("stats lock");
                    s.pacing.started += 1;
                    if start == Start::Late {
                        s.pacing.started_late += 1;
                    }
                    s.start_lag.record(now.saturating_duration_since(intended));
                    record.apply(&mut s);
                    drop(s);
                    completed.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    while let Some(offset) = schedule.next_offset() {
        if p.stop.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep_until((origin + offset).into()).await;
        for i in schedule.take_due(origin.elapsed()) {
            // The lanes outlive the dispatcher, so the receiver is there.
            let _ = tx.send((i, origin + schedule.offset(i)));
        }
    }
    drop(tx);
    for lane in lanes {
        let _ = lane.await;
    }
    let mut out = std::mem::take(&mut *stats.lock().expect("stats lock"));
    out.pacing.scheduled = schedule.dispatched();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_issues_at_the_rate_and_catches_up_after_a_stall() {
        let ms = Duration::from_millis;
        let mut s = Schedule::new(100.0, Some(Duration::from_secs(1)), None);
        assert_eq!(s.limit(), 100);
        assert_eq!(s.next_offset(), Some(ms(0)));
        assert_eq!(s.take_due(ms(0)), 0..1);
        assert_eq!(s.take_due(ms(5)), 1..1);
        assert_eq!(s.next_offset(), Some(ms(10)));
        assert_eq!(s.take_due(ms(10)), 1..2);
        // The clock jumps 45 ms (a stalled client): the missed iterations come at once.
        assert_eq!(s.take_due(ms(55)), 2..6);
        assert_eq!(s.offset(5), ms(50));
        // Far past the end: only up to the limit.
        assert_eq!(s.take_due(ms(10_000)), 6..100);
        assert_eq!(s.next_offset(), None);
        assert_eq!(s.take_due(ms(20_000)), 100..100);
        assert_eq!(s.dispatched(), 100);
    }

    #[test]
    fn schedule_limits_by_count_and_time() {
        assert_eq!(
            Schedule::new(50.0, Some(Duration::from_secs(2)), Some(30)).limit(),
            30
        );
        assert_eq!(Schedule::new(50.0, None, Some(30)).limit(), 30);
        assert_eq!(
            Schedule::new(2.5, Some(Duration::from_secs(3)), None).limit(),
            8
        );
    }

    #[test]
    fn start_classification() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let end = Some(t0 + ms(1000));
        assert_eq!(classify_start(t0, t0 + ms(3), ms(10), end), Start::OnTime);
        assert_eq!(classify_start(t0, t0 + ms(11), ms(10), end), Start::Late);
        assert_eq!(
            classify_start(t0 + ms(990), t0 + ms(1001), ms(10), end),
            Start::Dropped
        );
        assert_eq!(classify_start(t0, t0 + ms(5000), ms(10), None), Start::Late);
        // A lane that picks the job up before its time (cannot happen, but must not underflow).
        assert_eq!(classify_start(t0 + ms(5), t0, ms(10), end), Start::OnTime);
    }
}
