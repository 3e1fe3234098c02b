//! Live progress during the load: elapsed / planned time, operations done, the rate and the p99
//! latency of the last complete second.
//!
//! The numbers come from the run's [`Timeline`](crate::timeline::Timeline) (per-second buckets,
//! each with its own histogram, so the p99 is over a recent window and not the whole run) and the
//! iteration counter the workers already bump. A separate task samples them a few times per
//! second; the workers never wait for the display.
//!
//! On a terminal an `indicatif` bar is drawn on stderr. When stderr is not a terminal (logs, CI,
//! `ops/bench.sh`) or with `--no-progress`, plain lines are printed every `--progress-secs`
//! instead, so logs do not fill with redraws.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

use crate::timeline::{Live, SharedTimeline};

/// How often the display samples the counters.
const REFRESH: Duration = Duration::from_millis(250);

pub struct ProgressParams {
    pub timeline: SharedTimeline,
    pub started: Instant,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    /// Iterations completed (bumped by the workers).
    pub iterations: Arc<AtomicU64>,
    /// Draw a bar when stderr is a terminal.
    pub bar: bool,
    /// Without a bar: a plain line this often (`None`: silent).
    pub lines_every: Option<Duration>,
}

pub struct Progress {
    bar: Option<ProgressBar>,
    task: Option<JoinHandle<()>>,
}

/// The status text: `4.2/10 s  1234 ops  310 ops/s  p99 12.40 ms  400 iterations`.
pub fn status(
    elapsed: Duration,
    duration: Option<Duration>,
    iterations: u64,
    live: &Live,
) -> String {
    let time = match duration {
        Some(d) => format!("{:.1}/{} s", elapsed.as_secs_f64(), d.as_secs_f64()),
        None => format!("{:.1} s", elapsed.as_secs_f64()),
    };
    let p99 = live
        .p99_ms
        .map_or_else(|| "-".to_owned(), |p| format!("{p:.2} ms"));
    format!(
        "{time}  {} ops  {:.0} ops/s  p99 {p99}  {iterations} iterations",
        live.done, live.rate
    )
}

/// Where the bar stands: milliseconds of the planned duration, else iterations of `--requests`.
fn bar_length(duration: Option<Duration>, requests: Option<u64>) -> u64 {
    match (duration, requests) {
        (Some(d), _) => d.as_millis() as u64,
        (None, Some(r)) => r,
        (None, None) => 0,
    }
}

impl Progress {
    pub fn start(p: ProgressParams) -> Progress {
        let bar = p.bar.then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(bar_length(p.duration, p.requests)),
                ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                ProgressStyle::with_template("[{bar:30}] {msg}")
                    .expect("static template is valid")
                    .progress_chars("=> "),
            );
            bar
        });
        // indicatif hides itself when stderr is not a terminal: fall back to lines then.
        let bar = bar.filter(|b| !b.is_hidden());
        if bar.is_none() && p.lines_every.is_none() {
            return Progress { bar, task: None };
        }
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(REFRESH);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let every = p.lines_every.unwrap_or(Duration::MAX);
            let mut next_line = p.started.checked_add(every);
            loop {
                ticker.tick().await;
                let now = Instant::now();
                let live = p.timeline.lock().expect("timeline lock").live(now);
                let iterations = p.iterations.load(Ordering::Relaxed);
                let elapsed = now.saturating_duration_since(p.started);
                let line = status(elapsed, p.duration, iterations, &live);
                match &shown {
                    Some(bar) => {
                        bar.set_position(match p.duration {
                            Some(_) => elapsed.as_millis() as u64,
                            None => iterations,
                        });
                        bar.set_message(line);
                    }
                    None => {
                        if next_line.is_some_and(|t| now >= t) {
                            eprintln!("loadtest: {line}");
                            next_line = next_line.and_then(|t| t.checked_add(every));
                        }
                    }
                }
            }
        });
        Progress {
            bar,
            task: Some(task),
        }
    }

    /// Stop sampling and remove the bar, so the report starts on a clean line.
    pub fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_shows_time_ops_rate_and_p99() {
        let live = Live {
            done: 1234,
            rate: 310.4,
            p99_ms: Some(12.4),
        };
        assert_eq!(
            status(
                Duration::from_millis(4250),
                Some(Duration::from_secs(10)),
                400,
                &live
            ),
            "4.2/10 s  1234 ops  310 ops/s  p99 12.40 ms  400 iterations"
        );
        let idle = Live {
            done: 0,
            rate: 0.0,
            p99_ms: None,
        };
        assert_eq!(
            status(Duration::from_millis(300), None, 0, &idle),
            "0.3 s  0 ops  0 ops/s  p99 -  0 iterations"
        );
    }

    #[test]
    fn bar_follows_time_or_requests() {
        assert_eq!(bar_length(Some(Duration::from_secs(20)), Some(5)), 20_000);
        assert_eq!(bar_length(None, Some(5)), 5);
        assert_eq!(bar_length(None, None), 0);
    }
}
