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

/// ops/prometheus/prometheus.yml with only the targets replaced: everything is kept (global
/// settings, rule files, each scrape job's settings) except that the test rule file is added to
/// `rule_files` and every scrape job reads its targets from `<job>.json` (file_sd, written by
/// the test) instead of its static or file targets. Returns the config and the job names.
fn derived_config(original: &str) -> (String, Vec<String>) {
    use serde_norway::Value;
    let mut config: Value = serde_norway::from_str(original).expect("prometheus.yml is YAML");
    config["rule_files"]
        .as_sequence_mut()
        .expect("prometheus.yml has a rule_files list")
        .push("test-rules.yml".into());
    let mut jobs = Vec::new();
    for job in config["scrape_configs"]
        .as_sequence_mut()
        .expect("prometheus.yml has a scrape_configs list")
    {
        let job = job.as_mapping_mut().expect("a scrape job is a mapping");
        let name = job["job_name"].as_str().expect("job_name").to_owned();
        job.remove("static_configs");
        let targets = format!("[{{files: [{name}.json], refresh_interval: 1s}}]");
        let file_sd = serde_norway::from_str(&targets).expect("file_sd_configs");
        job.insert("file_sd_configs".into(), file_sd);
        jobs.push(name);
    }
    let config = serde_norway::to_string(&config).expect("prometheus.yml again");
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
