//! What the Grafana dashboards and the alert rules use: the metric names in their queries, the
//! panels and template variables of ops/grafana, and the two checks against a Prometheus that
//! has scraped the cluster.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::label::MatchOp;
use promql_parser::parser::{Expr, VectorSelector};
use serde_json::Value;

use super::server::{repo_root, Prometheus};
use super::{FAULT_ONLY, RATE_INTERVAL};

/// This project's metric names and `up` that `expr` selects, read from its syntax tree: the
/// name of every vector and range selector (or its `__name__="…"` matcher). Recording rules
/// (`allocator:…`) and other exporters' metrics are not taken.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let parsed = promql_parser::parser::parse(expr)
        .unwrap_or_else(|e| panic!("`{expr}` is not PromQL: {e}"));
    selected_names(&parsed, into);
}

fn selected_names(expr: &Expr, into: &mut BTreeSet<String>) {
    let children: Vec<&Expr> = match expr {
        Expr::Aggregate(a) => std::iter::once(&*a.expr)
            .chain(a.param.as_deref())
            .collect(),
        Expr::Unary(u) => vec![&*u.expr],
        Expr::Binary(b) => vec![&*b.lhs, &*b.rhs],
        Expr::Paren(p) => vec![&*p.expr],
        Expr::Subquery(s) => vec![&*s.expr],
        Expr::Call(c) => c.args.args.iter().map(|a| &**a).collect(),
        Expr::VectorSelector(vs) => return selector_name(vs, into),
        Expr::MatrixSelector(ms) => return selector_name(&ms.vs, into),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => Vec::new(),
    };
    for child in children {
        selected_names(child, into);
    }
}

fn selector_name(vs: &VectorSelector, into: &mut BTreeSet<String>) {
    let name = vs.name.as_deref().or_else(|| {
        vs.matchers
            .matchers
            .iter()
            .find(|m| m.name == "__name__" && m.op == MatchOp::Equal)
            .map(|m| m.value.as_str())
    });
    if let Some(name) = name.filter(|n| {
        *n == "up"
            || ((n.starts_with("allocator_") || n.starts_with("router_")) && !n.contains(':'))
    }) {
        into.insert(name.to_owned());
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

/// "All" for every template variable, as the panels' `=~` matchers take it.
fn all_values() -> BTreeMap<String, String> {
    dashboard_variables()
        .into_keys()
        .map(|name| (name, ".*".to_owned()))
        .collect()
}

/// Every metric name the dashboards and `rule_exprs` use is declared in a metrics.rs and was
/// scraped, unless only a fault creates it ([`FAULT_ONLY`]).
pub(super) async fn assert_used_metrics_exist(
    prometheus: &Prometheus,
    rule_exprs: &[(String, String)],
) {
    let panels = dashboard_panels();
    let all = all_values();
    let mut used = BTreeSet::new();
    for panel in &panels {
        metric_names(&substitute(&panel.expr, &all), &mut used);
    }
    for (_, expr) in rule_exprs {
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
}

/// Every panel query answers with data for "All" of every template variable. With one concrete
/// value of one variable (`victim` where it is a value, else the first value label_values
/// returns) every query must still be valid, and each variable must select data in at least one
/// panel; an empty answer there can be legitimate (a replica that never released a lease has no
/// release counter).
pub(super) async fn assert_panel_queries_answer(prometheus: &Prometheus, victim: &str) {
    let panels = dashboard_panels();
    let fault_only: BTreeMap<&str, &str> = FAULT_ONLY.iter().copied().collect();
    let vars = dashboard_variables();
    let mut all = BTreeMap::new();
    let mut one = BTreeMap::new();
    for (name, (selector, label)) in &vars {
        let series = prometheus
            .api(&format!(
                "/api/v1/series?match[]={}",
                schema::path::encode_segment(selector)
            ))
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
        let pick = if values.contains(victim) {
            victim
        } else {
            values.iter().next().unwrap()
        };
        all.insert(name.clone(), ".*".to_owned());
        one.insert(name.clone(), pick.to_owned());
    }
    let mut failures = Vec::new();
    let mut selected: BTreeSet<&str> = BTreeSet::new();
    for panel in &panels {
        let expr = substitute(&panel.expr, &all);
        let mut names = BTreeSet::new();
        metric_names(&expr, &mut names);
        let only_fault_counters = names.iter().all(|n| fault_only.contains_key(n.as_str()));
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
}

/// The expressions of ops/prometheus/alerts.yml: (alert or record name, expr).
fn alert_rule_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("ops/prometheus/alerts.yml"))
        .expect("read alerts.yml");
    let rules: serde_norway::Value = serde_norway::from_str(&text).expect("alerts.yml is YAML");
    let mut exprs = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .expect("named rule");
            let expr = rule["expr"].as_str().expect("rule expr");
            exprs.push((name.to_owned(), expr.to_owned()));
        }
    }
    exprs
}

/// Without a server: every dashboard query (with "All" for its variables) and every rule of
/// alerts.yml parses as PromQL and names only metrics a metrics.rs declares.
#[test]
fn dashboard_and_rule_queries_parse_and_name_declared_metrics() {
    let all = all_values();
    let declared = declared_metrics();
    let mut used = BTreeSet::new();
    for panel in dashboard_panels() {
        metric_names(&substitute(&panel.expr, &all), &mut used);
    }
    let rules = alert_rule_exprs();
    for (_, expr) in &rules {
        metric_names(expr, &mut used);
    }
    let undeclared: Vec<_> = used
        .iter()
        .filter(|n| *n != "up" && !declared.contains(base_metric(n)))
        .collect();
    assert!(
        undeclared.is_empty(),
        "used but not declared: {undeclared:?}"
    );
    assert!(used.contains("up") && used.len() > 20, "{used:?}");
    eprintln!(
        "{} metric names in the dashboards and {} rules: {used:?}",
        used.len(),
        rules.len()
    );
}
