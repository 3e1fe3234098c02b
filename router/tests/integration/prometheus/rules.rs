//! The test's rule file: a copy of every alerting rule of alerts.yml, as Prometheus parsed it,
//! with `for:` cut to [`SHORT_FOR`] and a label ([`COPY_LABEL`]) that tells its alerts apart, so
//! an alert's behaviour is observed within the test instead of after the minutes the real ones
//! wait.

use serde_json::{json, Value};

use super::server::{AlertCopies, Prometheus};
use super::unowned;
use super::{COPY_LABEL, SHORT_FOR};
use crate::common::http;

/// The rules Prometheus loaded from alerts.yml.
pub(super) struct Rules {
    /// Every rule's name and query (recording and alerting).
    pub(super) exprs: Vec<(String, String)>,
    /// The short-`for:` copies of the alerting rules, as written to the test rule file.
    copies: Vec<Value>,
}

impl Rules {
    /// A healthy cluster fires none of the critical alerts, even with the short `for:`.
    pub(super) async fn assert_no_critical_alert(&self, prometheus: &Prometheus) {
        for alert in self
            .copies
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
    }
}

/// Write the short-`for:` copies into the test rule file and reload Prometheus. JSON is YAML.
pub(super) async fn load_short_for_copies(prometheus: &Prometheus) -> Rules {
    let dir = prometheus.dir();
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
    let partitions_alert = unowned::ALERT;
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

    Rules {
        exprs: rule_exprs,
        copies,
    }
}
