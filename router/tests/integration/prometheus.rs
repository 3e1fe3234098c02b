//! A real Prometheus server scraping a real cluster, configured like
//! `ops/prometheus/prometheus.yml` and loading `ops/prometheus/alerts.yml`:
//!
//! * every metric name the Grafana dashboards and the alert rules use exists in Prometheus after
//!   the cluster has served traffic and been through a stall, or is on a short, explained list
//!   of counters that only a fault creates (those must still be declared in `metrics.rs`);
//! * every dashboard panel's query (template variables substituted, both "All" and a concrete
//!   value) evaluates without error to a non-empty result, or is on that list;
//! * the partitions-without-owner alert fires once the only allocator that owns partitions is
//!   SIGKILLed, and clears when an allocator takes the partitions again.
//!
//! The Prometheus server comes from `ALLOCATOR_PROMETHEUS_BIN` (`ops/test.sh` exports it from
//! Debian's `prometheus` package). Without it the test skips with a message, except under
//! `CI=true`, where it fails: CI must not pass without running it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::{free_port, ChildProcess};

use crate::common::{balanced, http, serial, Cluster, LEASE_TTL_MS};

/// `allocator:expected_partitions` and `allocator:expected_replicas` in alerts.yml: the test
/// cluster has the shape the rules expect, so the rules are loaded unchanged.
const PARTITIONS: u32 = 16;
const REPLICAS: usize = 3;
/// Grafana's `$__rate_interval` for the 5 s scrape interval of prometheus.yml:
/// max(4 × scrape interval, query step + scrape interval).
const RATE_INTERVAL: &str = "20s";
/// `for:` of the alert copies in the test rule file (the real ones wait a minute or more).
const SHORT_FOR: &str = "3s";
/// Label that marks the short-`for:` copies, so their alerts are told from the originals'.
const COPY_LABEL: &str = "rules_copy";

/// Counters that exist only once their fault has happened. The scenario below creates most
/// faults that a test can create cheaply (a SIGSTOP past the lease, graceful hand-offs, a
/// SIGKILL); these need a fencing race, a panicking worker or a paused job holder, which other
/// tests provoke on purpose (fencing.rs, lifecycle.rs, the settlement tests). For them the test
/// still checks that the name is one the services declare in their metrics.rs.
const FAULT_ONLY: &[(&str, &str)] = &[
    (
        "allocator_stale_epoch_rejections_total",
        "only when a write with a superseded epoch reaches PostgreSQL (a race with a paused owner)",
    ),
    (
        "allocator_worker_failures_total",
        "only when a partition worker panics (a fault hook not built into the service binary)",
    ),
    (
        "allocator_job_stale_term_rejections_total",
        "only when a paused former settlement holder writes after a takeover",
    ),
    (
        "allocator_storage_refusals_total",
        "only when a configured database server is behind, foreign or not serving \
         (storage_failover.rs revives an old primary)",
    ),
    (
        "router_storage_refusals_total",
        "only when a configured database server is behind, foreign or not serving",
    ),
    (
        "allocator_storage_read_only_connects_total",
        "only when a connection attempt meets a standby (a replicated database)",
    ),
    (
        "router_storage_read_only_connects_total",
        "only when a connection attempt meets a standby (a replicated database)",
    ),
    (
        "allocator_lease_renew_failures_total",
        "only when a renewal fails or is ambiguous (database errors); a SIGSTOP makes the \
         replica skip renewals rather than fail them",
    ),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("router crate lives in the workspace")
        .to_path_buf()
}

/// The Prometheus server binary, or `None` (test skipped) outside CI.
fn prometheus_bin() -> Option<PathBuf> {
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

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prometheus {
    url: String,
    dir: PathBuf,
    /// Killed and reaped on drop.
    _process: ChildProcess,
}

impl Prometheus {
    async fn start(bin: &Path, dir: &Path) -> Prometheus {
        let port = free_port();
        let process = ChildProcess::spawn(
            bin,
            [
                format!("--config.file={}", dir.join("prometheus.yml").display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                // POST /-/reload after the test rule file is written.
                "--web.enable-lifecycle".to_owned(),
                "--log.level=warn".to_owned(),
            ],
            &[],
            &dir.join("prometheus.log"),
        )
        .expect("spawn prometheus");
        let prometheus = Prometheus {
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            _process: process,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match http()
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => return prometheus,
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                other => panic!(
                    "prometheus not ready within 30 s: {other:?}; log: {}",
                    std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
                ),
            }
        }
    }

    /// `data` of a successful API answer, or the API's error text.
    async fn api(&self, path_and_query: &str) -> Result<Value, String> {
        let body: Value = http()
            .get(format!("{}{path_and_query}", self.url))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(format!("{}: {}", body["errorType"], body["error"]))
        }
    }

    /// An instant query's result vector (a scalar answers as a one-element vector).
    async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            Some("scalar" | "string") => Ok(vec![data["result"].clone()]),
            other => Err(format!("unexpected result type {other:?}")),
        }
    }

    async fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).await.ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Rewrite `<job>.json`; Prometheus watches the file.
    fn set_targets(&self, job: &str, targets: &[(String, String)]) {
        let groups: Vec<Value> = targets
            .iter()
            .map(|(addr, replica)| json!({"targets": [addr], "labels": {"replica": replica}}))
            .collect();
        let path = self.dir.join(format!("{job}.json"));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&groups).unwrap()).expect("write targets");
        std::fs::rename(&tmp, &path).expect("replace targets");
    }

    async fn wait_for(&self, what: &str, timeout: Duration, expr: &str, want: f64) {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.value(expr).await;
            if got == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: `{expr}` is {got:?}, wanted {want} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

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

/// Every name in `expr` that looks like one of this project's metrics or `up`. Names inside
/// label matchers' quoted values never start with these prefixes followed by `_`, and recording
/// rules (`allocator:...`) contain a colon, so they are not taken.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if starts_word && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
            let end = (i..bytes.len())
                .find(|&j| {
                    !(bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_' || bytes[j] == b':')
                })
                .unwrap_or(bytes.len());
            let word = &expr[i..end];
            let next = expr[end..].trim_start();
            // `up` as a selector (`up{`, `up ==`, `up)`), not inside another word.
            let is_up =
                word == "up" && (next.starts_with('{') || next.starts_with(' ') || next.is_empty());
            if is_up
                || ((word.starts_with("allocator_") || word.starts_with("router_"))
                    && !word.contains(':'))
            {
                into.insert(word.to_owned());
            }
            i = end;
        } else {
            i += 1;
        }
    }
}

/// The metric a name belongs to: histograms are exported as `<name>_bucket`, `_sum`, `_count`.
fn base_metric(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// Metric names the services declare (the string constants of their metrics.rs).
fn declared_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for file in ["allocator/src/metrics.rs", "router/src/metrics.rs"] {
        let text = std::fs::read_to_string(repo_root().join(file)).expect("read metrics.rs");
        for piece in text.split('"').skip(1).step_by(2) {
            if (piece.starts_with("allocator_") || piece.starts_with("router_"))
                && piece
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                names.insert(piece.to_owned());
            }
        }
    }
    names
}

struct Panel {
    dashboard: String,
    title: String,
    expr: String,
}

fn dashboard_panels() -> Vec<Panel> {
    fn walk(dashboard: &str, panels: &[Value], out: &mut Vec<Panel>) {
        for panel in panels {
            walk(
                dashboard,
                panel["panels"].as_array().map_or(&[], |v| v),
                out,
            );
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(Panel {
                        dashboard: dashboard.to_owned(),
                        title: panel["title"].as_str().unwrap_or("?").to_owned(),
                        expr: expr.to_owned(),
                    });
                }
            }
        }
    }
    let mut out = Vec::new();
    let dir = repo_root().join("ops/grafana");
    for entry in std::fs::read_dir(&dir).expect("ops/grafana") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let dashboard: Value =
                serde_json::from_slice(&std::fs::read(&path).expect("read dashboard"))
                    .expect("dashboard is JSON");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            walk(
                &name,
                dashboard["panels"].as_array().expect("panels"),
                &mut out,
            );
        }
    }
    assert!(
        !out.is_empty(),
        "no panel targets found in {}",
        dir.display()
    );
    out
}

/// Template variables of the dashboards: name → label_values(selector, label) query.
fn dashboard_variables() -> BTreeMap<String, (String, String)> {
    let mut vars = BTreeMap::new();
    for entry in std::fs::read_dir(repo_root().join("ops/grafana")).expect("ops/grafana") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let dashboard: Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("dashboard is JSON");
        for var in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if var["type"] != "query" {
                continue;
            }
            let query = var["query"]["query"]
                .as_str()
                .or_else(|| var["query"].as_str())
                .expect("query variable has a query");
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| {
                    panic!(
                        "variable {}: only label_values(...) is supported",
                        var["name"]
                    )
                });
            let (selector, label) = inner
                .rsplit_once(',')
                .expect("label_values(selector, label)");
            vars.insert(
                var["name"].as_str().unwrap().to_owned(),
                (selector.trim().to_owned(), label.trim().to_owned()),
            );
        }
    }
    vars
}

/// `expr` as Grafana would send it: every `$var` of a query variable replaced by `values`
/// (a regex; panels use `=~`), `$__rate_interval` by [`RATE_INTERVAL`].
fn substitute(expr: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = expr.replace("$__rate_interval", RATE_INTERVAL);
    // Longest names first, so that `$replica` does not eat a prefix of a longer name.
    let mut names: Vec<_> = values.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out.replace(&format!("${{{name}}}"), &values[name]);
        out = out.replace(&format!("${name}"), &values[name]);
    }
    assert!(!out.contains('$'), "unsubstituted variable in `{out}`");
    out
}

/// Client traffic through the router until `stop`: reservations that are confirmed, released,
/// left to expire (1 s holds), and refused for lack of stock, so every outcome counter and the
/// latency histograms have samples.
async fn traffic(base: String, skus: Vec<String>, stop: Arc<AtomicBool>) -> u64 {
    let client = http();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let sku = &skus[n as usize % skus.len()];
        let id = format!("prom-{n}");
        let (quantity, ttl) = match n % 4 {
            3 => (1_000_000, 60), // more than the stock: 409 insufficient-stock
            2 => (1, 1),          // left to expire
            _ => (1, 60),
        };
        let answer = client
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": id, "sku": sku, "quantity": quantity, "ttl_seconds": ttl}))
            .send()
            .await;
        if matches!(&answer, Ok(r) if r.status().is_success()) {
            let action = match n % 4 {
                0 => Some("confirm"),
                1 => Some("release"),
                _ => None,
            };
            if let Some(action) = action {
                let _ = client
                    .post(format!("{base}/v1/reservations/{id}/{action}"))
                    .send()
                    .await;
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_cluster_dashboard_queries_answer_and_unowned_partitions_alert() {
    let Some(bin) = prometheus_bin() else { return };
    let _serial = serial().await;
    let started = Instant::now();

    // Settlement windows of 2 s instead of a minute, so the job's run counter and lag gauges
    // exist within the test.
    let mut cluster = Cluster::start_with_env(
        "prometheus",
        REPLICAS,
        PARTITIONS,
        vec![("ALLOCATOR_SETTLEMENT_WINDOW_SECS".into(), "2".into())],
    )
    .await;
    let router = cluster.router(|_| {}).await;
    let skus: Vec<String> = (0..16).map(|i| format!("prom-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 100_000).await;
    }

    // Prometheus configured from ops/prometheus/prometheus.yml.
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
    let _keep_on_failure = KeepOnFailure(dir.clone());
    std::fs::write(dir.join("prometheus.yml"), &config).expect("write config");
    std::fs::copy(
        repo_root().join("ops/prometheus/alerts.yml"),
        dir.join("alerts.yml"),
    )
    .expect("copy alerts.yml");
    std::fs::write(dir.join("test-rules.yml"), "groups: []\n").expect("write test rules");
    let allocator_targets = |cluster: &Cluster| -> Vec<(String, String)> {
        cluster
            .allocators
            .iter()
            .filter(|a| a.process.is_some())
            .map(|a| (format!("127.0.0.1:{}", a.port), a.id.clone()))
            .collect()
    };
    let router_addr = router.url.trim_start_matches("http://").to_owned();
    let prometheus = Prometheus::start(&bin, &dir).await;
    prometheus.set_targets("allocator", &allocator_targets(&cluster));
    prometheus.set_targets("router", &[(router_addr, "router-0".to_owned())]);

    // The test rule file: a copy of every alerting rule of alerts.yml, as Prometheus parsed it,
    // with `for:` cut to SHORT_FOR and a label that tells its alerts apart. JSON is YAML.
    let rules = prometheus.api("/api/v1/rules").await.expect("rules");
    let mut copies = Vec::new();
    let mut rule_exprs = Vec::new();
    for group in rules["groups"].as_array().expect("rule groups") {
        assert!(
            group["file"].as_str().unwrap_or("").ends_with("alerts.yml"),
            "unexpected rule file {}",
            group["file"]
        );
        for rule in group["rules"].as_array().expect("rules") {
            rule_exprs.push((
                rule["name"].as_str().unwrap().to_owned(),
                rule["query"].as_str().unwrap().to_owned(),
            ));
            if rule["type"] == "alerting" {
                let mut labels = rule["labels"].clone();
                labels[COPY_LABEL] = json!("true");
                // Rules without `for:` fire at once in both copies.
                let wait = if rule["duration"].as_f64().unwrap_or(0.0) > 0.0 {
                    SHORT_FOR
                } else {
                    "0s"
                };
                copies.push(json!({
                    "alert": rule["name"],
                    "expr": rule["query"],
                    "for": wait,
                    "labels": labels,
                    "annotations": rule["annotations"],
                }));
            }
        }
    }
    let partitions_alert = "AllocatorPartitionsWithoutOwner";
    assert!(
        copies.iter().any(|c| c["alert"] == partitions_alert),
        "alerts.yml has no {partitions_alert}"
    );
    std::fs::write(
        dir.join("test-rules.yml"),
        serde_json::to_vec_pretty(
            &json!({"groups": [{"name": "short-for copies", "interval": "1s", "rules": copies}]}),
        )
        .unwrap(),
    )
    .expect("write test rules");
    let reload = http()
        .post(format!("{}/-/reload", prometheus.url))
        .send()
        .await
        .expect("reload");
    assert!(reload.status().is_success(), "reload: {}", reload.status());
    let reloaded = prometheus.api("/api/v1/rules").await.expect("rules");
    assert_eq!(
        reloaded["groups"].as_array().unwrap().len(),
        rules["groups"].as_array().unwrap().len() + 1,
        "alerts.yml groups plus the test group after reload"
    );

    // Traffic while Prometheus collects enough scrapes for rate() over RATE_INTERVAL.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(traffic(router.url.clone(), skus.clone(), stop.clone()));
    prometheus
        .wait_for(
            "targets up",
            Duration::from_secs(30),
            "count(up == 1)",
            (REPLICAS + 1) as f64,
        )
        .await;
    tokio::time::sleep(Duration::from_secs(12)).await;

    // A healthy cluster fires none of the critical alerts, even with the short `for:`.
    for alert in copies
        .iter()
        .filter(|c| c["labels"]["severity"] == "critical")
    {
        let name = alert["alert"].as_str().unwrap();
        assert_eq!(
            prometheus.copy_state(name).await,
            "inactive",
            "{name} in a healthy cluster"
        );
    }

    // A stall longer than the lease under traffic: the replica drops its leases (lease losses,
    // process stalls, dropped-lease releases), peers take them over, the router retries.
    let victim = cluster.allocators[2].id.clone();
    {
        let process = cluster.allocator(&victim).process.as_mut().unwrap();
        process.sigstop().expect("sigstop");
        tokio::time::sleep(Duration::from_millis(LEASE_TTL_MS * 2)).await;
        process.sigcont().expect("sigcont");
    }
    let ids: Vec<String> = cluster.allocators.iter().map(|a| a.id.clone()).collect();
    let fair = PARTITIONS.div_ceil(REPLICAS as u32) as usize;
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &ids.iter().map(String::as_str).collect::<Vec<_>>(), fair)
        })
        .await;
    // Two more scrapes after the recovery, and rate() windows that include it.
    tokio::time::sleep(Duration::from_secs(12)).await;

    // 1. Every metric name used by the dashboards and the rules exists.
    let panels = dashboard_panels();
    let mut used = BTreeSet::new();
    for panel in &panels {
        metric_names(&panel.expr, &mut used);
    }
    for (_, expr) in &rule_exprs {
        metric_names(expr, &mut used);
    }
    let stored: BTreeSet<String> = prometheus
        .api("/api/v1/label/__name__/values")
        .await
        .expect("names")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let declared = declared_metrics();
    let fault_only: BTreeMap<&str, &str> = FAULT_ONLY.iter().copied().collect();
    let mut missing = Vec::new();
    for name in &used {
        if name != "up" {
            assert!(
                declared.contains(base_metric(name)),
                "{name} is used by a dashboard or rule but no metrics.rs declares {}",
                base_metric(name)
            );
        }
        if !stored.contains(name) && !fault_only.contains_key(name.as_str()) {
            missing.push(name.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "metrics used by dashboards/rules that Prometheus never scraped: {missing:?}"
    );
    eprintln!(
        "{} metric names used by the dashboards and rules; present: {}; fault-only and absent: {:?}",
        used.len(),
        used.iter().filter(|n| stored.contains(*n)).count(),
        used.iter().filter(|n| !stored.contains(*n)).collect::<Vec<_>>()
    );

    // 2. Every panel query answers with data for "All" of every template variable. With one
    // concrete value of one variable (the stalled replica where it is a value, else the first
    // value label_values returns) every query must still be valid, and each variable must select
    // data in at least one panel; an empty answer there can be legitimate (a replica that never
    // released a lease has no release counter).
    let vars = dashboard_variables();
    let mut all = BTreeMap::new();
    let mut one = BTreeMap::new();
    for (name, (selector, label)) in &vars {
        let series = prometheus
            .api(&format!("/api/v1/series?match[]={}", encode(selector)))
            .await
            .unwrap_or_else(|e| panic!("variable {name}: {e}"));
        let values: BTreeSet<&str> = series
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s[label.as_str()].as_str())
            .collect();
        assert!(
            !values.is_empty(),
            "variable {name}: label_values({selector}, {label}) is empty"
        );
        let pick = if values.contains(victim.as_str()) {
            victim.as_str()
        } else {
            values.iter().next().unwrap()
        };
        all.insert(name.clone(), ".*".to_owned());
        one.insert(name.clone(), pick.to_owned());
    }
    let mut failures = Vec::new();
    let mut selected: BTreeSet<&str> = BTreeSet::new();
    for panel in &panels {
        let mut names = BTreeSet::new();
        metric_names(&panel.expr, &mut names);
        let only_fault_counters = names.iter().all(|n| fault_only.contains_key(n.as_str()));
        let expr = substitute(&panel.expr, &all);
        match prometheus.query(&expr).await {
            Err(e) => failures.push(format!(
                "{} / {}: `{expr}`: {e}",
                panel.dashboard, panel.title
            )),
            Ok(result) if result.is_empty() && !only_fault_counters => failures.push(format!(
                "{} / {}: `{expr}` returned no series",
                panel.dashboard, panel.title
            )),
            Ok(_) => {}
        }
        // One variable at a time, the others "All": two concrete values together (a replica
        // and a partition it never held) may rightly select nothing.
        for (name, value) in &one {
            if !panel.expr.contains(&format!("${name}")) {
                continue;
            }
            let mut values = all.clone();
            values.insert(name.clone(), value.clone());
            let expr = substitute(&panel.expr, &values);
            match prometheus.query(&expr).await {
                Err(e) => failures.push(format!(
                    "{} / {}: `{expr}`: {e}",
                    panel.dashboard, panel.title
                )),
                Ok(result) if !result.is_empty() => {
                    selected.insert(name.as_str());
                }
                Ok(_) => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "dashboard queries:\n{}",
        failures.join("\n")
    );
    for name in vars.keys() {
        assert!(
            selected.contains(name.as_str()),
            "no panel shows data with ${name} = {:?}",
            one[name]
        );
    }
    eprintln!(
        "{} panel queries evaluated with \"All\" and with one of {one:?} at a time",
        panels.len()
    );

    // 3. Unowned partitions alert. After a single SIGKILL the surviving replicas take the
    // partitions over within TTL + one campaign period (about 1.7 s here), which is shorter
    // than one 5 s scrape interval, so "without owner" would be observed by luck or not at all.
    // Instead two replicas stop gracefully (their leases move to the third at once), then the
    // only owner left is SIGKILLed: nothing can take its partitions until an allocator returns.
    stop.store(true, Ordering::Relaxed);
    let requests = load.await.expect("traffic task");
    let keep = cluster.allocators[0].id.clone();
    for other in [
        cluster.allocators[1].id.clone(),
        cluster.allocators[2].id.clone(),
    ] {
        let process = cluster.allocator(&other).process.as_mut().unwrap();
        process.sigterm().expect("sigterm");
        process
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("graceful exit");
        cluster.allocator(&other).process = None;
    }
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &[keep.as_str()], PARTITIONS as usize)
        })
        .await;
    prometheus.set_targets("allocator", &allocator_targets(&cluster));
    prometheus
        .wait_for(
            "sole owner scraped",
            Duration::from_secs(30),
            "allocator:partitions_owned",
            PARTITIONS as f64,
        )
        .await;
    assert_eq!(prometheus.copy_state(partitions_alert).await, "inactive");

    cluster
        .allocator(&keep)
        .process
        .as_mut()
        .unwrap()
        .sigkill()
        .expect("sigkill");
    let fired = prometheus
        .wait_alert(partitions_alert, "firing", Duration::from_secs(60))
        .await;
    let unowned = prometheus
        .value(&format!("ALERTS{{alertname=\"{partitions_alert}\", alertstate=\"firing\", {COPY_LABEL}=\"true\"}}"))
        .await;
    assert_eq!(unowned, Some(1.0), "ALERTS series of the firing copy");
    // The alert's value is the latest evaluation; right after the kill it can still count a few
    // partitions as owned (scrapes and the 5 s recording rule lag), so wait for all of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alerts = prometheus.api("/api/v1/alerts").await.unwrap();
        let value: Option<f64> = alerts["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| {
                a["labels"]["alertname"] == partitions_alert && a["labels"][COPY_LABEL] == "true"
            })
            .and_then(|a| a["value"].as_str()?.parse().ok());
        if value == Some(PARTITIONS as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{partitions_alert}: value {value:?}, wanted every partition ({PARTITIONS}) unowned"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // An allocator back (same id; its old leases have expired): the alert clears.
    cluster.spawn_allocator(&keep);
    prometheus.set_targets("allocator", &allocator_targets(&cluster));
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &[keep.as_str()], PARTITIONS as usize)
        })
        .await;
    let cleared = prometheus
        .wait_alert(partitions_alert, "inactive", Duration::from_secs(60))
        .await;

    eprintln!(
        "prometheus test: {requests} requests; {partitions_alert} fired {:.1} s after the SIGKILL \
         and cleared {:.1} s after the restart; {:.0} s in all",
        fired.as_secs_f64(),
        cleared.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    router.stop().await;
    drop(prometheus);
}

/// Removes the Prometheus directory (config, rules, data, log) after a passing test and keeps it,
/// with a message, after a failing one.
struct KeepOnFailure(PathBuf);

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
