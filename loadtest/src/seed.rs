//! `seed`, `check` and `partitions`: preparing SKUs and checking I1 outside a run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use allocator_client::Client;
use futures::StreamExt;
use schema::partition::partition_for;
use schema::wire::AdjustmentRequest;
use serde::Serialize;

use crate::check::{check_sku, Counts, SkuCheck};
use crate::client::failure_label;
use crate::iteration::{checked, sku_name};
use crate::report::fmt_counts;
use crate::run::fetch_inventories;
use crate::stats::{bump, OpTrace, SkuTally};

// ------------------------------------------------------------------------------------------------
// seed
// ------------------------------------------------------------------------------------------------

pub struct SeedParams {
    pub api: Client,
    pub skus: usize,
    pub stock: i64,
    pub prefix: String,
    pub concurrency: usize,
}

#[derive(Debug, Serialize)]
pub struct SeedReport {
    pub target: String,
    pub skus: usize,
    pub stock: i64,
    pub prefix: String,
    pub elapsed_secs: f64,
    pub outcomes: BTreeMap<String, u64>,
    pub attempts: BTreeMap<String, u64>,
    pub retries: BTreeMap<String, u64>,
    pub failures: Vec<String>,
    pub ok: bool,
}

impl SeedReport {
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "seeded {} SKUs ({}-0..{}) with {} units each against {} in {:.2} s: {}\n  attempts: {}; retries: {}\n",
            self.skus,
            self.prefix,
            self.skus.saturating_sub(1),
            self.stock,
            self.target,
            self.elapsed_secs,
            fmt_counts(&self.outcomes),
            fmt_counts(&self.attempts),
            fmt_counts(&self.retries),
        );
        for f in self.failures.iter().take(20) {
            out.push_str(&format!("  failed: {f}\n"));
        }
        if self.failures.len() > 20 {
            out.push_str(&format!(
                "  ... {} more failures\n",
                self.failures.len() - 20
            ));
        }
        out
    }
}

/// Restock `{prefix}-0..N` with `stock` units each. The adjustment id is derived from the SKU
/// and the stock, so running the same seed twice applies it once (the second run is replayed),
/// while a seed with another stock level adds to it.
pub async fn seed(p: SeedParams) -> SeedReport {
    let started = Instant::now();
    let api = &p.api;
    let prefix = p.prefix.as_str();
    let stock = p.stock;
    let results: Vec<(usize, String, OpTrace)> = futures::stream::iter(0..p.skus)
        .map(|k| async move {
            let sku = sku_name(prefix, k);
            let mut trace = OpTrace::default();
            let body = AdjustmentRequest {
                adjustment_id: checked(format!("seed-{sku}-{stock}")),
                delta: checked(stock),
            };
            let started = Instant::now();
            let outcome = match api.adjust(&sku, &body).observe(&mut trace).await {
                Ok(reply) if reply.status == 201 => "created".to_owned(),
                Ok(_) => "replayed".to_owned(),
                Err(error) => format!("{}: {error}", failure_label(&error)),
            };
            trace.latency = started.elapsed();
            (k, outcome, trace)
        })
        .buffer_unordered(p.concurrency.max(1))
        .collect()
        .await;
    let (mut outcomes, mut attempts, mut retries) = Default::default();
    let mut failures = Vec::new();
    for (k, outcome, trace) in &results {
        for (label, _) in &trace.attempts {
            bump(&mut attempts, label, 1);
        }
        for cause in &trace.retries {
            bump(&mut retries, cause, 1);
        }
        if outcome == "created" || outcome == "replayed" {
            bump(&mut outcomes, outcome, 1);
        } else {
            let label = outcome.split(':').next().unwrap_or(outcome);
            bump(&mut outcomes, label, 1);
            failures.push(format!("{}: {outcome}", sku_name(prefix, *k)));
        }
    }
    failures.sort();
    SeedReport {
        target: api.url(""),
        skus: p.skus,
        stock,
        prefix: p.prefix.clone(),
        elapsed_secs: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        outcomes,
        attempts,
        retries,
        ok: failures.is_empty(),
        failures,
    }
}

// ------------------------------------------------------------------------------------------------
// check
// ------------------------------------------------------------------------------------------------

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub target: String,
    pub skus: usize,
    pub present: usize,
    pub ok: bool,
    pub errors: Vec<String>,
    pub violations: Vec<SkuCheck>,
    pub totals: Counts,
}

/// I1 over `{prefix}-0..N`: `available >= 0` and `on_hand = available + held + confirmed`.
pub async fn check(api: &Client, prefix: &str, skus: usize, concurrency: usize) -> CheckReport {
    let reads = fetch_inventories(api, prefix, (0..skus).collect(), concurrency).await;
    let mut errors = Vec::new();
    let mut violations = Vec::new();
    let mut present = 0;
    let mut totals = Counts {
        on_hand: 0,
        available: 0,
        held: 0,
        confirmed: 0,
    };
    for (k, read) in reads {
        match read {
            Err(e) => errors.push(e),
            Ok(None) => {}
            Ok(Some(inv)) => {
                present += 1;
                totals.on_hand += inv.on_hand;
                totals.available += inv.available;
                totals.held += inv.held;
                totals.confirmed += inv.confirmed;
                let c = check_sku(
                    &sku_name(prefix, k),
                    SkuTally::default(),
                    None,
                    Some(Counts::from(&inv)),
                    false,
                );
                if !c.violations.is_empty() {
                    violations.push(c);
                }
            }
        }
    }
    CheckReport {
        target: api.url(""),
        skus,
        present,
        ok: errors.is_empty() && violations.is_empty(),
        errors,
        violations,
        totals,
    }
}

impl CheckReport {
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "check {}: {} of {} SKUs present; totals on_hand {} available {} held {} confirmed {}: {}\n",
            self.target,
            self.present,
            self.skus,
            self.totals.on_hand,
            self.totals.available,
            self.totals.held,
            self.totals.confirmed,
            if self.ok { "OK" } else { "FAILED" }
        );
        for e in &self.errors {
            let _ = writeln!(out, "  error: {e}");
        }
        for v in &self.violations {
            let _ = writeln!(out, "  !! {}: {}", v.sku, v.violations.join("; "));
        }
        out
    }
}

/// `sku,partition` lines for `{prefix}-0..N` in a cluster of `partitions` partitions, computed by
/// the same function as the allocator's and the router's (`schema::partition::partition_for`),
/// for loading SKUs straight into PostgreSQL (see `ops/bench/seed.sql`).
pub fn partitions_csv(prefix: &str, skus: usize, partitions: u32) -> String {
    let mut out = String::with_capacity(skus * (prefix.len() + 12));
    for k in 0..skus {
        let sku = sku_name(prefix, k);
        let _ = writeln!(out, "{sku},{}", partition_for(&sku, partitions));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_csv_uses_the_shared_hash() {
        let csv = partitions_csv("bench", 3, 16);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        for (k, line) in lines.iter().enumerate() {
            let sku = format!("bench-{k}");
            assert_eq!(*line, format!("{sku},{}", partition_for(&sku, 16)));
        }
        // FNV-1a 64 pinned value: "a" hashes to 0xaf63dc4c8601ec8c.
        assert_eq!(partition_for("a", 1 << 16), 0xec8c);
    }
}
