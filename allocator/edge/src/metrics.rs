//! The Prometheus exporter both services run: installing the process-wide recorder with each
//! service's histogram buckets, and folding buffered histogram samples on a timer.
//!
//! The machinery is the same in both services, so it lives here; what differs, the metric names
//! and their bucket tables, stays in each service's `metrics.rs` (the names are a contract with
//! the alert rules and dashboards in `ops/`, and one file per service declares them all).
//!
//! The recorder is process-global. [`Exporter::install`] installs it once and hands out the same
//! handle on later calls, so several applications built in one process (tests) share one
//! registry; `/metrics` renders that handle.
//!
//! The exporter buffers every histogram sample until something folds the buffers into their
//! buckets; without its HTTP listener (default features off) only a render or an explicit
//! upkeep does that. A process nobody scrapes would therefore grow without bound, so
//! [`run_upkeep`] folds them on a timer of its own, independent of scrapes.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// How often histogram samples are folded into their buckets. Bounds the buffered samples to
/// what arrives in this period (about 0.5 MB at 1.3k requests/s), scraped or not.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The bucket bounds of one histogram, by its full metric name. A histogram without an entry is
/// exported as a summary.
pub type Buckets = (&'static str, &'static [f64]);

/// One service's recorder: its bucket table, its metric descriptions, and the handle once
/// installed. Each service keeps one in a `static`.
pub struct Exporter {
    buckets: &'static [Buckets],
    describe: Option<fn()>,
    handle: OnceLock<PrometheusHandle>,
}

impl Exporter {
    /// An exporter with these histogram buckets; `describe` (the `describe_*!` calls of the
    /// service's metrics) runs once, right after the recorder is installed.
    pub const fn new(buckets: &'static [Buckets], describe: Option<fn()>) -> Exporter {
        Exporter {
            buckets,
            describe,
            handle: OnceLock::new(),
        }
    }

    /// Install the global recorder (once per process) and return its handle.
    ///
    /// If another recorder was installed first (e.g. the other service's, in a shared test
    /// process), a detached recorder is returned so `/metrics` still renders, just without this
    /// process's other metrics.
    pub fn install(&self) -> PrometheusHandle {
        self.handle
            .get_or_init(|| {
                let handle = match self.builder().install_recorder() {
                    Ok(handle) => handle,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics recorder already installed; using a detached one");
                        self.builder().build_recorder().handle()
                    }
                };
                if let Some(describe) = self.describe {
                    describe();
                }
                handle
            })
            .clone()
    }

    fn builder(&self) -> PrometheusBuilder {
        self.buckets
            .iter()
            .try_fold(PrometheusBuilder::new(), |builder, (metric, bounds)| {
                builder.set_buckets_for_metric(Matcher::Full((*metric).to_owned()), bounds)
            })
            .expect("static, non-empty bucket lists")
    }
}

/// Fold buffered histogram samples every [`UPKEEP_INTERVAL`] until `shutdown` fires.
pub async fn run_upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_in_the_table_get_its_buckets_and_others_stay_summaries() {
        static BOUNDS: &[f64] = &[0.5, 1.0];
        static TABLE: &[Buckets] = &[("edge_test_seconds", BOUNDS)];
        let recorder = Exporter::new(TABLE, None).builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("edge_test_seconds").record(0.7);
            metrics::histogram!("edge_other_seconds").record(0.7);
        });
        let text = handle.render();
        assert!(
            text.contains("edge_test_seconds_bucket{le=\"0.5\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("edge_test_seconds_bucket{le=\"1\"} 1"),
            "{text}"
        );
        assert!(!text.contains("edge_other_seconds_bucket"), "{text}");
        assert!(text.contains("edge_other_seconds{quantile="), "{text}");
    }
}
