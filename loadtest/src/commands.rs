//! The subcommands `seed`, `run`, `check` and `partitions`: each validates its arguments
//! (parsed in `main.rs`), runs, and answers whether every check passed.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use schema::wire::{limits, Quantity, ReservationId, Sku, TtlSeconds};

use allocator_client::backoff::Backoff;
use allocator_client::Client;

use crate::report::RunConfig;
use crate::skew::{Skew, SkuPicker};
use crate::{chart, cpu, iteration, run, seed};

#[derive(Debug, Args)]
pub(crate) struct PartitionsArgs {
    /// SKUs {prefix}-0..N (the same variable as the other subcommands' `--skus`).
    #[arg(long, env = "LOADTEST_SKUS", default_value_t = 1000)]
    skus: usize,
    /// SKU name prefix (the same variable as the other subcommands' `--prefix`).
    #[arg(long, env = "LOADTEST_PREFIX", default_value = "lt")]
    prefix: String,
    /// The cluster's partition count (`allocator migrate --partitions`).
    #[arg(long, env = "LOADTEST_PARTITIONS")]
    partitions: u32,
}

/// Flags shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub(crate) struct Common {
    /// Router or allocator base URL.
    #[arg(long, env = "LOADTEST_TARGET", default_value = "http://127.0.0.1:8080")]
    target: String,
    /// Number of SKUs: {prefix}-0 .. {prefix}-(N-1).
    #[arg(long, env = "LOADTEST_SKUS", default_value_t = 1000)]
    skus: usize,
    /// SKU name prefix.
    #[arg(long, env = "LOADTEST_PREFIX", default_value = "lt")]
    prefix: String,
    /// Timeout of one HTTP attempt (connect, send, whole response).
    #[arg(long, env = "LOADTEST_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    request_timeout_ms: u64,
    /// TCP connect timeout.
    #[arg(long, env = "LOADTEST_CONNECT_TIMEOUT_MS", default_value_t = 1000)]
    connect_timeout_ms: u64,
    /// Total time one operation may spend retrying (503/421/502/504/timeouts/connection errors)
    /// with the same id before it is counted as given up.
    #[arg(long, env = "LOADTEST_RETRY_DEADLINE_MS", default_value_t = 10_000)]
    retry_deadline_ms: u64,
    /// First retry delay; doubles per retry (with jitter) up to --backoff-max-ms.
    #[arg(long, env = "LOADTEST_BACKOFF_BASE_MS", default_value_t = 10)]
    backoff_base_ms: u64,
    /// Largest retry delay; also caps a server's Retry-After.
    #[arg(long, env = "LOADTEST_BACKOFF_MAX_MS", default_value_t = 500)]
    backoff_max_ms: u64,
    /// File holding a bearer token sent with every request, for a cluster with authentication
    /// on (the client needs the `reserve` scope, and `admin` for seeding).
    #[arg(long, env = "LOADTEST_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Print the report as one JSON object on stdout instead of text.
    #[arg(long, env = "LOADTEST_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    json: bool,
    /// Also write the JSON report to this file (`run`: and its per-second chart beside it, as
    /// the same name with `.svg`).
    #[arg(long, env = "LOADTEST_JSON_OUT")]
    json_out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct SeedArgs {
    #[command(flatten)]
    common: Common,
    /// Units added to every SKU.
    #[arg(long, env = "LOADTEST_STOCK", default_value_t = 1_000_000)]
    stock: i64,
    /// Adjustments in flight at once.
    #[arg(long, env = "LOADTEST_SEED_CONCURRENCY", default_value_t = 32)]
    concurrency: usize,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    common: Common,
    /// Closed-loop workers (each has one iteration in flight).
    #[arg(long, env = "LOADTEST_CONCURRENCY", default_value_t = 16)]
    concurrency: usize,
    /// Open loop: start this many iterations per second on a fixed schedule, whatever the
    /// answers; latency counts from each iteration's intended start. Replaces the workers.
    #[arg(long, env = "LOADTEST_RATE")]
    rate: Option<f64>,
    /// Open loop: iterations in flight at most; a due iteration waits for a free slot.
    #[arg(long, env = "LOADTEST_MAX_IN_FLIGHT", default_value_t = 256)]
    max_in_flight: usize,
    /// Open loop: a start later than this after its intended time counts as late.
    #[arg(long, env = "LOADTEST_LATE_MS", default_value_t = 10)]
    late_ms: u64,
    /// Fraction of iterations that place an all-or-nothing order
    /// (POST /v1/orders/{id}/reservations, router only) instead of a single reservation.
    #[arg(long, env = "LOADTEST_ORDER_RATIO", default_value_t = 0.0)]
    order_ratio: f64,
    /// Lines per order (SKUs drawn with --skew).
    #[arg(long, env = "LOADTEST_ORDER_LINES", default_value_t = 3)]
    order_lines: usize,
    /// Run for this long (default 10 s when --requests is not given either).
    #[arg(long, env = "LOADTEST_DURATION_SECS")]
    duration_secs: Option<f64>,
    /// Stop after this many iterations (reservations attempted) in total.
    #[arg(long, env = "LOADTEST_REQUESTS")]
    requests: Option<u64>,
    /// SKU popularity: uniform | zipf:S (rank-k SKU drawn with p ∝ 1/k^S) | hot:F (fraction F
    /// to SKU 0, the rest uniform).
    #[arg(long, env = "LOADTEST_SKEW", default_value = "zipf:1.1")]
    skew: Skew,
    /// Units per reservation.
    #[arg(long, env = "LOADTEST_QUANTITY", default_value_t = 1)]
    quantity: i64,
    /// Hold TTL. Holds that can have expired by the end are read back from the service and
    /// counted as expired.
    #[arg(long, env = "LOADTEST_TTL_SECONDS", default_value_t = 3600)]
    ttl_seconds: u32,
    /// Fraction of held reservations that are then confirmed.
    #[arg(long, env = "LOADTEST_CONFIRM_RATIO", default_value_t = 0.5)]
    confirm_ratio: f64,
    /// Fraction of held reservations that are then released (the rest stay held).
    #[arg(long, env = "LOADTEST_RELEASE_RATIO", default_value_t = 0.3)]
    release_ratio: f64,
    /// RNG seed (SKU choice and actions; reservation ids are unique per run regardless).
    #[arg(long, env = "LOADTEST_SEED", default_value_t = 42)]
    seed: u64,
    /// Prefix of reservation ids; default unique per run (time and pid).
    #[arg(long, env = "LOADTEST_RUN_ID")]
    run_id: Option<String>,
    /// Snapshot every SKU before the run (for relative accounting) when there are at most this
    /// many.
    #[arg(long, env = "LOADTEST_SNAPSHOT_MAX", default_value_t = 100_000)]
    snapshot_max: usize,
    /// Wait before resolving unknown outcomes with GET, so queued requests can finish.
    #[arg(long, env = "LOADTEST_SETTLE_MS", default_value_t = 2000)]
    settle_ms: u64,
    /// When stderr is not a terminal (or with --no-progress): a progress line on stderr every
    /// this many seconds; 0 disables.
    #[arg(long, env = "LOADTEST_PROGRESS_SECS", default_value_t = 5.0)]
    progress_secs: f64,
    /// No live progress bar (drawn on stderr only when it is a terminal).
    #[arg(long, env = "LOADTEST_NO_PROGRESS", value_parser = clap::builder::BoolishValueParser::new())]
    no_progress: bool,
    /// Concurrency of the snapshot, resolution and check reads.
    #[arg(long, env = "LOADTEST_CHECK_CONCURRENCY", default_value_t = 32)]
    check_concurrency: usize,
    /// Report the CPU of this process tree over the load, per operation: `NAME=PID`
    /// (repeatable; a PostgreSQL postmaster counts with all its backends). This process's own
    /// CPU is always reported.
    #[arg(long = "cpu-watch", env = "LOADTEST_CPU_WATCH", value_delimiter = ',')]
    cpu_watches: Vec<cpu::Watch>,
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    common: Common,
    /// Reads in flight at once.
    #[arg(long, env = "LOADTEST_CHECK_CONCURRENCY", default_value_t = 32)]
    concurrency: usize,
}

impl Common {
    fn validate(&self) -> anyhow::Result<()> {
        if !(self.target.starts_with("http://") || self.target.starts_with("https://")) {
            bail!("--target must be an http:// URL, got {:?}", self.target);
        }
        if self.skus == 0 {
            bail!("--skus must be at least 1");
        }
        // The longest name is the last one.
        for k in [0, self.skus - 1] {
            Sku::try_from(iteration::sku_name(&self.prefix, k))
                .map_err(|e| anyhow::anyhow!("--prefix {:?}: {e}", self.prefix))?;
        }
        if self.request_timeout_ms == 0 || self.retry_deadline_ms == 0 {
            bail!("--request-timeout-ms and --retry-deadline-ms must be positive");
        }
        Ok(())
    }

    fn api(&self, max_idle: usize) -> anyhow::Result<Client> {
        let token = match &self.token_file {
            Some(file) => Some(
                std::fs::read_to_string(file)
                    .with_context(|| format!("token file {}", file.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        crate::client::api(
            &self.target,
            Duration::from_millis(self.request_timeout_ms),
            Duration::from_millis(self.connect_timeout_ms.max(1)),
            Duration::from_millis(self.retry_deadline_ms),
            Backoff {
                base: Duration::from_millis(self.backoff_base_ms.max(1)),
                max: Duration::from_millis(self.backoff_max_ms.max(1)),
            },
            max_idle,
            token,
        )
        .context("building the HTTP client")
    }

    /// Print `value` as text or JSON; write the JSON file if asked.
    fn emit<T: serde::Serialize>(
        &self,
        value: &T,
        text: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if let Some(path) = &self.json_out {
            let mut json = serde_json::to_string_pretty(value)?;
            json.push('\n');
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        }
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        } else {
            print!("{}", text());
        }
        Ok(())
    }
}

/// The chart goes beside the JSON report: `run.json` → `run.svg`.
fn chart_path(json: &std::path::Path) -> anyhow::Result<PathBuf> {
    let svg = json.with_extension("svg");
    if svg == json {
        bail!(
            "--json-out {} ends in .svg, where the chart would go",
            json.display()
        );
    }
    Ok(svg)
}

fn default_run_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("lt{millis:x}p{:x}", std::process::id())
}

pub(crate) async fn cmd_seed(args: SeedArgs) -> anyhow::Result<bool> {
    args.common.validate()?;
    if !(1..=limits::ADJUSTMENT_DELTA_MAX).contains(&args.stock) {
        bail!(
            "--stock must be between 1 and {}",
            limits::ADJUSTMENT_DELTA_MAX
        );
    }
    let api = args.common.api(args.concurrency.max(1))?;
    let report = seed::seed(seed::SeedParams {
        api,
        skus: args.common.skus,
        stock: args.stock,
        prefix: args.common.prefix.clone(),
        concurrency: args.concurrency,
    })
    .await;
    args.common.emit(&report, || report.render_text())?;
    Ok(report.ok)
}

pub(crate) async fn cmd_run(args: RunArgs) -> anyhow::Result<bool> {
    let common = &args.common;
    common.validate()?;
    if args.concurrency == 0 || args.max_in_flight == 0 {
        bail!("--concurrency and --max-in-flight must be at least 1");
    }
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0 && rate <= 1e6) {
            bail!("--rate must be in (0, 1000000]");
        }
    }
    if !(args.order_ratio.is_finite() && (0.0..=1.0).contains(&args.order_ratio)) {
        bail!("--order-ratio must be in 0..=1");
    }
    if !(1..=limits::ORDER_LINES_MAX).contains(&args.order_lines) {
        bail!("--order-lines must be in 1..={}", limits::ORDER_LINES_MAX);
    }
    Quantity::try_from(args.quantity).map_err(|e| anyhow::anyhow!("--quantity: {e}"))?;
    TtlSeconds::try_from(args.ttl_seconds).map_err(|e| anyhow::anyhow!("--ttl-seconds: {e}"))?;
    let ratio_ok = |r: f64| r.is_finite() && (0.0..=1.0).contains(&r);
    if !ratio_ok(args.confirm_ratio)
        || !ratio_ok(args.release_ratio)
        || args.confirm_ratio + args.release_ratio > 1.0 + 1e-9
    {
        bail!("--confirm-ratio and --release-ratio must be in 0..=1 and sum to at most 1");
    }
    let duration_secs = match (args.duration_secs, args.requests) {
        (None, None) => Some(10.0),
        (d, _) => d,
    };
    if let Some(d) = duration_secs {
        if !(d.is_finite() && d > 0.0) {
            bail!("--duration-secs must be positive");
        }
    }
    if args.requests == Some(0) {
        bail!("--requests must be at least 1");
    }
    let chart_path = common.json_out.as_deref().map(chart_path).transpose()?;
    let run_id = args.run_id.clone().unwrap_or_else(default_run_id);
    ReservationId::try_from(format!(
        "{run_id}-w{}-{}-o:{}",
        args.concurrency,
        u64::MAX,
        args.order_lines
    ))
    .map_err(|e| anyhow::anyhow!("--run-id: {e}"))?;
    let picker = SkuPicker::new(args.skew, common.skus).map_err(anyhow::Error::msg)?;
    let config = RunConfig {
        target: common.target.clone(),
        run_id,
        skus: common.skus,
        prefix: common.prefix.clone(),
        skew: args.skew.to_string(),
        concurrency: if args.rate.is_some() {
            args.max_in_flight
        } else {
            args.concurrency
        },
        rate: args.rate,
        late_ms: args.late_ms,
        duration_secs,
        requests: args.requests,
        quantity: args.quantity,
        ttl_seconds: args.ttl_seconds,
        confirm_ratio: args.confirm_ratio,
        release_ratio: args.release_ratio,
        order_ratio: args.order_ratio,
        order_lines: args.order_lines,
        seed: args.seed,
    };
    let api = common.api(config.concurrency.max(args.check_concurrency))?;
    let progress = (args.progress_secs.is_finite() && args.progress_secs > 0.0)
        .then(|| Duration::from_secs_f64(args.progress_secs));
    let report = run::run(run::RunParams {
        api,
        config,
        picker,
        max_in_flight: args.max_in_flight,
        snapshot_max: args.snapshot_max,
        settle: Duration::from_millis(args.settle_ms),
        progress_bar: !args.no_progress,
        progress,
        check_concurrency: args.check_concurrency,
        cpu_watches: args.cpu_watches.clone(),
    })
    .await?;
    common.emit(&report, || report.render_text())?;
    if let Some(path) = chart_path {
        std::fs::write(&path, chart::render_svg(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report.invariants.ok)
}

pub(crate) async fn cmd_check(args: CheckArgs) -> anyhow::Result<bool> {
    args.common.validate()?;
    let api = args.common.api(args.concurrency.max(1))?;
    let report = seed::check(
        &api,
        &args.common.prefix,
        args.common.skus,
        args.concurrency,
    )
    .await;
    args.common.emit(&report, || report.render_text())?;
    Ok(report.ok)
}

pub(crate) fn cmd_partitions(args: PartitionsArgs) -> anyhow::Result<bool> {
    if args.skus == 0 || args.partitions == 0 {
        bail!("--skus and --partitions must be at least 1");
    }
    Sku::try_from(iteration::sku_name(&args.prefix, args.skus - 1))
        .map_err(|e| anyhow::anyhow!("--prefix {:?}: {e}", args.prefix))?;
    use std::io::Write as _;
    let csv = seed::partitions_csv(&args.prefix, args.skus, args.partitions);
    std::io::stdout().lock().write_all(csv.as_bytes())?;
    Ok(true)
}
