//! `loadtest hoard`: the flash-sale attack a hold quota is for. One client (the hoarder) keeps
//! many reserves of one hot SKU in flight and never releases what it gets, holding it until its
//! holds expire; other clients (the buyers) reserve one unit at a time and confirm it. With the
//! hoarder's `max_held_per_sku` set in the auth file, the hoarder ends with at most its quota and
//! the buyers get the rest of the stock; without it, the hoarder takes whatever it can.
//!
//! Each side is its own client with its own bearer token, so the services see several clients;
//! the run reports what each side got and checks it against the SKU's row read at the end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use allocator_client::{new_reservation, Client, Error, Policy};

#[derive(Debug, Args)]
pub struct HoardArgs {
    /// Router (or allocator) base URL.
    #[arg(long, env = "LOADTEST_TARGET", default_value = "http://127.0.0.1:8080")]
    target: String,
    /// The hot SKU both sides want (restock it first).
    #[arg(long, default_value = "hot:1")]
    sku: String,
    /// File holding the hoarding client's bearer token.
    #[arg(long)]
    hoarder_token_file: PathBuf,
    /// File holding one buying client's bearer token (repeat for more clients).
    #[arg(long = "buyer-token-file", required = true)]
    buyer_token_files: Vec<PathBuf>,
    /// Reserves the hoarder keeps in flight.
    #[arg(long, default_value_t = 16)]
    hoarders: usize,
    /// Buyers (one reserve then confirm at a time) per buying client.
    #[arg(long, default_value_t = 4)]
    buyers_per_client: usize,
    /// How long both sides run.
    #[arg(long, default_value_t = 5.0)]
    duration_secs: f64,
    /// TTL of the hoarder's holds; it never releases them.
    #[arg(long, default_value_t = 600)]
    hold_ttl_seconds: u32,
    /// The hoarder's `max_held_per_sku`: the run fails when the hoarder ends holding more.
    #[arg(long)]
    expect_quota: Option<i64>,
    /// Timeout of one HTTP attempt; a call retries ambiguous answers for up to 10 s.
    #[arg(long, default_value_t = 5000)]
    request_timeout_ms: u64,
}

/// What one side got.
#[derive(Debug, Default, Serialize)]
pub struct Side {
    pub clients: usize,
    pub attempts: u64,
    /// Units held (hoarder) or held and then confirmed (buyers).
    pub units: u64,
    pub quota_refusals: u64,
    pub out_of_stock: u64,
    pub errors: u64,
}

#[derive(Debug, Serialize)]
pub struct HoardReport {
    pub sku: String,
    pub seconds: f64,
    pub hoarder: Side,
    pub buyers: Side,
    /// The SKU's row at the end.
    pub on_hand: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
    /// Every check that failed (empty: passed).
    pub failures: Vec<String>,
}

#[derive(Default)]
struct Counts {
    attempts: AtomicU64,
    units: AtomicU64,
    quota_refusals: AtomicU64,
    out_of_stock: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn side(&self, clients: usize) -> Side {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Side {
            clients,
            attempts: get(&self.attempts),
            units: get(&self.units),
            quota_refusals: get(&self.quota_refusals),
            out_of_stock: get(&self.out_of_stock),
            errors: get(&self.errors),
        }
    }

    fn refused(&self, error: &Error) {
        let counter = match error {
            Error::QuotaExceeded(_) => &self.quota_refusals,
            Error::InsufficientStock(_) => &self.out_of_stock,
            _ => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

pub async fn run(args: HoardArgs) -> anyhow::Result<HoardReport> {
    if args.hoarders == 0 || args.buyers_per_client == 0 || args.duration_secs <= 0.0 {
        bail!("--hoarders, --buyers-per-client and --duration-secs must be positive");
    }
    let client = |file: &PathBuf| -> anyhow::Result<Client> {
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("token file {}", file.display()))?;
        Ok(Client::builder(&args.target)
            .token(token.trim())
            .policy(Policy {
                attempt_timeout: Duration::from_millis(args.request_timeout_ms),
                ..Policy::default()
            })
            .build()?)
    };
    let hoarder = client(&args.hoarder_token_file)?;
    let buyers = args
        .buyer_token_files
        .iter()
        .map(client)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let until = Instant::now() + Duration::from_secs_f64(args.duration_secs);
    let (hoarded, bought) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.hoarders {
        let (api, counts, sku) = (hoarder.clone(), hoarded.clone(), args.sku.clone());
        let ttl = args.hold_ttl_seconds;
        tasks.spawn(async move { hoard(&api, &counts, &sku, ttl, until).await });
    }
    for api in &buyers {
        for _ in 0..args.buyers_per_client {
            let (api, counts, sku) = (api.clone(), bought.clone(), args.sku.clone());
            tasks.spawn(async move { buy(&api, &counts, &sku, until).await });
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a load task panicked")??;
    }
    let row = buyers[0]
        .inventory(&args.sku)
        .await
        .context("reading the SKU at the end")?
        .value;
    let mut report = HoardReport {
        sku: args.sku.clone(),
        seconds: args.duration_secs,
        hoarder: hoarded.side(1),
        buyers: bought.side(buyers.len()),
        on_hand: row.on_hand,
        available: row.available,
        held: row.held,
        confirmed: row.confirmed,
        failures: Vec::new(),
    };
    report.failures = check(&report, args.expect_quota);
    Ok(report)
}

/// Reserve one unit after another under fresh ids, keeping every hold.
async fn hoard(
    api: &Client,
    counts: &Counts,
    sku: &str,
    ttl: u32,
    until: Instant,
) -> anyhow::Result<()> {
    while Instant::now() < until {
        let mut request = new_reservation(sku, 1)?;
        request.ttl_seconds = Some(ttl.try_into()?);
        counts.attempts.fetch_add(1, Ordering::Relaxed);
        match api.reserve(&request).await {
            Ok(_) => drop(counts.units.fetch_add(1, Ordering::Relaxed)),
            Err(e) => counts.refused(&e),
        }
    }
    Ok(())
}

/// Reserve one unit and confirm it, again and again.
async fn buy(api: &Client, counts: &Counts, sku: &str, until: Instant) -> anyhow::Result<()> {
    while Instant::now() < until {
        let request = new_reservation(sku, 1)?;
        counts.attempts.fetch_add(1, Ordering::Relaxed);
        match api.reserve(&request).await {
            Ok(_) => match api.confirm(request.reservation_id.as_str()).await {
                Ok(_) => drop(counts.units.fetch_add(1, Ordering::Relaxed)),
                Err(_) => drop(counts.errors.fetch_add(1, Ordering::Relaxed)),
            },
            Err(e) => counts.refused(&e),
        }
    }
    Ok(())
}

/// What must hold at the end: the SKU's row balances; nothing the services acknowledged is
/// missing from it (each side's units are in it; the hoarder's holds have not expired);
/// the hoarder holds no more than its quota; and while the buyers were refused for stock, the
/// stock was gone (held or sold), not withheld.
fn check(report: &HoardReport, quota: Option<i64>) -> Vec<String> {
    let mut failures = Vec::new();
    let (hoarded, bought) = (report.hoarder.units as i64, report.buyers.units as i64);
    if report.on_hand != report.available + report.held + report.confirmed {
        failures.push(format!(
            "the row does not balance: on_hand {} != available {} + held {} + confirmed {}",
            report.on_hand, report.available, report.held, report.confirmed
        ));
    }
    if report.confirmed < bought || report.held < hoarded {
        failures.push(format!(
            "acknowledged units missing: buyers confirmed {bought} (row {}), hoarder held \
             {hoarded} (row {})",
            report.confirmed, report.held
        ));
    }
    if let Some(quota) = quota {
        if hoarded > quota {
            failures.push(format!(
                "the hoarder holds {hoarded} units, over its max_held_per_sku {quota}"
            ));
        }
    }
    if report.buyers.out_of_stock > 0 && report.available > 0 {
        failures.push(format!(
            "buyers were refused for stock {} times but {} units are still available",
            report.buyers.out_of_stock, report.available
        ));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(hoarded: u64, bought: u64, available: i64) -> HoardReport {
        HoardReport {
            sku: "hot:1".into(),
            seconds: 1.0,
            hoarder: Side {
                units: hoarded,
                ..Side::default()
            },
            buyers: Side {
                units: bought,
                out_of_stock: 3,
                ..Side::default()
            },
            on_hand: 100,
            available,
            held: hoarded as i64,
            confirmed: 100 - available - hoarded as i64,
            failures: Vec::new(),
        }
    }

    #[test]
    fn the_checks_name_a_hoarder_over_quota_and_withheld_stock() {
        assert!(check(&report(2, 98, 0), Some(2)).is_empty());
        let over = check(&report(5, 95, 0), Some(2));
        assert_eq!(over.len(), 1, "{over:?}");
        assert!(over[0].contains("over its max_held_per_sku 2"), "{over:?}");
        assert!(check(&report(5, 95, 0), None).is_empty());
        let withheld = check(&report(2, 90, 8), Some(2));
        assert!(withheld[0].contains("still available"), "{withheld:?}");
        let mut lost = report(2, 98, 0);
        lost.confirmed = 90;
        lost.available = 8;
        let failures = check(&lost, Some(2));
        assert!(
            failures.iter().any(|f| f.contains("missing")),
            "{failures:?}"
        );
    }
}
