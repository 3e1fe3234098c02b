//! The Prometheus server of the test: its configuration derived from
//! `ops/prometheus/prometheus.yml`, its process and the HTTP API the checks use.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(super) use testkit::cluster::Prometheus;

use super::{COPY_LABEL, SHORT_FOR};
use crate::common::Cluster;

pub(super) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("router crate lives in the workspace")
        .to_path_buf()
}

/// The Prometheus server binary, or `None` (test skipped) outside CI.
pub(super) fn prometheus_bin() -> Option<PathBuf> {
    let ci = matches!(std::env::var("CI").as_deref(), Ok("true" | "1"));
    let why = match std::env::var_os("ALLOCATOR_PROMETHEUS_BIN").map(PathBuf::from) {
        Some(path) if path.is_file() => return Some(path),
        Some(path) => format!("ALLOCATOR_PROMETHEUS_BIN={} is not a file", path.display()),
        None => "ALLOCATOR_PROMETHEUS_BIN is not set".to_owned(),
    };
    assert!(
        !ci,
        "{why}: under CI the Prometheus test must run (ops/test.sh exports the variable)"
    );
    eprintln!(
        "SKIPPED prometheus_scrapes_the_cluster: {why}; run it through ops/test.sh, which \
         unpacks Debian's prometheus package"
    );
    None
}

/// ops/prometheus/prometheus.yml with only the targets replaced: everything before
/// `scrape_configs:` (global settings, rule_files) is kept verbatim with the test rule file added
/// to rule_files, and every scrape job keeps its name and metrics path but reads its targets from
/// `<job>.json` (file_sd, written by the test). Returns the config and the job names.
fn derived_config(original: &str) -> (String, Vec<String>) {
    let (head, scrape) = original
        .split_once("\nscrape_configs:")
        .expect("prometheus.yml has a top-level scrape_configs");
    let mut config = String::new();
    let mut rule_files = false;
    for line in head.lines() {
        config.push_str(line);
        config.push('\n');
        if line.trim_end() == "rule_files:" {
            // List items of rule_files in prometheus.yml are indented by two spaces.
            config.push_str("  - test-rules.yml\n");
            rule_files = true;
        }
    }
    assert!(rule_files, "prometheus.yml has no block rule_files list");
    config.push_str("scrape_configs:\n");
    let mut jobs = Vec::new();
    let mut current: Option<(String, String)> = None;
    let flush = |config: &mut String, job: Option<(String, String)>| {
        if let Some((name, path)) = job {
            config.push_str(&format!(
                "  - job_name: {name}\n    metrics_path: {path}\n    file_sd_configs:\n      \
                 - files: [{name}.json]\n        refresh_interval: 1s\n"
            ));
        }
    };
    for line in scrape.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- job_name:") {
            flush(&mut config, current.take());
            jobs.push(name.trim().to_owned());
            current = Some((name.trim().to_owned(), "/metrics".to_owned()));
        } else if let (Some(path), Some(job)) = (line.strip_prefix("metrics_path:"), &mut current) {
            job.1 = path.trim().to_owned();
        }
    }
    flush(&mut config, current);
    (config, jobs)
}

/// A Prometheus server configured like ops/prometheus/prometheus.yml, scraping `cluster`'s
/// allocators and `router`, with alerts.yml and an (empty) test rule file loaded; its directory
/// is removed when the guard drops after a passing test.
pub(super) async fn start(
    bin: &Path,
    cluster: &Cluster,
    router_url: &str,
) -> (Prometheus, KeepOnFailure) {
    let original = std::fs::read_to_string(repo_root().join("ops/prometheus/prometheus.yml"))
        .expect("read prometheus.yml");
    assert!(
        original.contains("scrape_interval: 5s"),
        "RATE_INTERVAL assumes the 5 s scrape interval of prometheus.yml"
    );
    let (config, jobs) = derived_config(&original);
    assert_eq!(
        jobs,
        ["allocator", "router"],
        "alerts.yml and the dashboard select job=\"allocator\" and job=\"router\""
    );
    let dir = std::env::temp_dir().join(format!(
        "router-test-prometheus-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("prometheus dir");
    let keep_on_failure = KeepOnFailure(dir.clone());
    std::fs::write(dir.join("prometheus.yml"), &config).expect("write config");
    std::fs::copy(
        repo_root().join("ops/prometheus/alerts.yml"),
        dir.join("alerts.yml"),
    )
    .expect("copy alerts.yml");
    std::fs::write(dir.join("test-rules.yml"), "groups: []\n").expect("write test rules");
    let router_addr = router_url.trim_start_matches("http://").to_owned();
    let prometheus = Prometheus::start(bin, &dir)
        .await
        .expect("start prometheus");
    prometheus.set_targets("allocator", &allocator_targets(cluster));
    prometheus.set_targets("router", &[(router_addr, "router-0".to_owned())]);
    (prometheus, keep_on_failure)
}

/// The scrape targets of the allocators that run, labelled with their ids.
pub(super) fn allocator_targets(cluster: &Cluster) -> Vec<(String, String)> {
    cluster
        .allocators
        .iter()
        .filter(|a| a.process.is_some())
        .map(|a| (format!("127.0.0.1:{}", a.port), a.id.clone()))
        .collect()
}

/// What the test asks of its Prometheus beyond testkit's: the state of its alert copies.
pub(super) trait AlertCopies {
    async fn copy_state(&self, alert: &str) -> String;
    async fn wait_alert(&self, alert: &str, want: &str, timeout: Duration) -> Duration;
}

impl AlertCopies for Prometheus {
    /// State of the short-`for:` copy of `alert` ("inactive" when it has no active alert).
    async fn copy_state(&self, alert: &str) -> String {
        let data = self.api("/api/v1/alerts").await.expect("alerts");
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == alert && a["labels"][COPY_LABEL] == "true")
            .map(|a| a["state"].as_str().unwrap_or("?").to_owned())
            .unwrap_or_else(|| "inactive".to_owned())
    }

    async fn wait_alert(&self, alert: &str, want: &str, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let state = self.copy_state(alert).await;
            if state == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{alert} (for: {SHORT_FOR} copy) is {state}, wanted {want} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Removes the Prometheus directory (config, rules, data, log) after a passing test and keeps it,
/// with a message, after a failing one.
pub(super) struct KeepOnFailure(PathBuf);

impl Drop for KeepOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "prometheus config, data and log kept in {}",
                self.0.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
