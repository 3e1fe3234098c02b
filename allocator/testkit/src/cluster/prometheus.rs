//! A Prometheus server for tests that scrape a cluster: started on a free port from a
//! configuration directory the test writes, with file-based scrape targets
//! ([`Prometheus::set_targets`]) and the parts of its HTTP API the checks use.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::{free_port, ChildProcess};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("http client")
}

/// A running Prometheus; killed and reaped on drop.
pub struct Prometheus {
    pub url: String,
    dir: PathBuf,
    /// Killed and reaped on drop.
    _process: ChildProcess,
}

impl Prometheus {
    /// Starts `bin` with `dir/prometheus.yml`, its data and log (`prometheus.log`) in `dir`, on a
    /// free port with the lifecycle API on (`POST /-/reload`), and waits up to 30 s for
    /// `/-/ready`.
    pub async fn start(bin: &Path, dir: &Path) -> Result<Prometheus> {
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
        )?;
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
                Ok(r) if r.status().is_success() => return Ok(prometheus),
                _ if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                other => bail!(
                    "prometheus not ready within 30 s: {other:?}; log: {}",
                    std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
                ),
            }
        }
    }

    /// The directory of its configuration, rules, data and log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `data` of a successful API answer, or the API's error text.
    pub async fn api(&self, path_and_query: &str) -> Result<Value, String> {
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
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!(
                "/api/v1/query?query={}",
                schema::path::encode_segment(expr)
            ))
            .await?;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            Some("scalar" | "string") => Ok(vec![data["result"].clone()]),
            other => Err(format!("unexpected result type {other:?}")),
        }
    }

    pub async fn value(&self, expr: &str) -> Option<f64> {
        let result = self.query(expr).await.ok()?;
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Rewrite `<job>.json`; Prometheus watches the file.
    pub fn set_targets(&self, job: &str, targets: &[(String, String)]) {
        let groups: Vec<Value> = targets
            .iter()
            .map(|(addr, replica)| json!({"targets": [addr], "labels": {"replica": replica}}))
            .collect();
        let path = self.dir.join(format!("{job}.json"));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&groups).unwrap()).expect("write targets");
        std::fs::rename(&tmp, &path).expect("replace targets");
    }

    pub async fn wait_for(&self, what: &str, timeout: Duration, expr: &str, want: f64) {
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
}
