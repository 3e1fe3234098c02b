//! Load generator for the allocator / router HTTP API (DESIGN.md §1 "performance engineers",
//! §6 hot-SKU batching, §9 API).
//!
//! ```text
//! loadtest seed  --target URL --skus 1000 --stock 1000000 --prefix bench
//! loadtest run   --target URL --skus 1000 --prefix bench --concurrency 64 --duration-secs 20 \
//!                --skew hot:0.9 --confirm-ratio 0.5 --release-ratio 0.3 --seed 42 [--json]
//! loadtest run   ... --json-out run.json   # also run.svg: throughput and latency per second
//! loadtest run   ... --rate 500 --max-in-flight 256            # open loop
//! loadtest run   ... --order-ratio 0.2 --order-lines 3         # orders (router target)
//! loadtest check --target URL --skus 1000 --prefix bench
//! loadtest partitions --skus 100000 --prefix bench --partitions 16   # sku,partition CSV
//! loadtest run   ... --cpu-watch postgres=PID --cpu-watch allocator=PID  # CPU µs per operation
//! loadtest cpu   --watch postgres=PID --out cpu.json -- pgbench ...     # the same around a command
//! loadtest events --redis-url URL --partitions 64 --target URL   # consume the change events
//! ```
//!
//! Exit status: 0 on success, 1 when an invariant fails (run, check) or a SKU could not be
//! seeded (seed), 2 on usage or setup errors.

mod chart;
mod check;
mod client;
mod commands;
mod cpu;
mod events;
mod hoard;
mod iteration;
mod pacer;
mod progress;
mod readback;
mod report;
mod run;
mod seed;
mod skew;
mod stats;
mod timeline;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: every request allocates and frees small buffers, and the
/// load generator's own CPU per request is part of what the benchmark must keep small.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "loadtest",
    version,
    about = "Closed- and open-loop load generator and invariant checker for the allocator / router API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Threads driving the load. One (the default) keeps every request and its connection on
    /// one thread, with no wake-up across threads per answer: the cheapest per request, and
    /// enough for tens of thousands of requests per second.
    #[arg(long, global = true, env = "LOADTEST_THREADS", default_value_t = 1)]
    threads: usize,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Restock {prefix}-0..N with --stock units each (idempotent adjustment ids).
    Seed(commands::SeedArgs),
    /// Reserve (or order) → confirm/release workload, closed or open loop; latency report and
    /// invariant checks.
    Run(Box<commands::RunArgs>),
    /// Check I1 (available >= 0, on_hand = available + held + confirmed) on {prefix}-0..N.
    Check(commands::CheckArgs),
    /// Print `sku,partition` for {prefix}-0..N (the allocator's partition function), for
    /// loading SKUs straight into PostgreSQL.
    Partitions(commands::PartitionsArgs),
    /// Run a command (another load generator) and write its CPU and the CPU of watched process
    /// trees over its run as JSON.
    Cpu(cpu::CpuArgs),
    /// Consume the change events from Redis Streams through a consumer group, once each by
    /// position (gaps filled from `GET /v1/events` with --target); prints a JSON report.
    Events(events::EventsArgs),
    /// One client hoards a hot SKU (many reserves in flight, never released) while other
    /// clients buy it one unit at a time; prints what each side got as JSON and fails when a
    /// check does (the hoarder over --expect-quota, stock withheld, an unbalanced row).
    Hoard(hoard::HoardArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        // Runs another program and waits for it: no runtime needed.
        Command::Cpu(args) => {
            return cpu::cmd_cpu(args).unwrap_or_else(|e| {
                eprintln!("loadtest: error: {e:#}");
                ExitCode::from(2)
            })
        }
        other => other,
    };
    let runtime = match cli.threads {
        0 => {
            eprintln!("loadtest: --threads must be at least 1");
            return ExitCode::from(2);
        }
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Seed(args) => commands::cmd_seed(args).await,
            Command::Run(args) => commands::cmd_run(*args).await,
            Command::Check(args) => commands::cmd_check(args).await,
            Command::Partitions(args) => commands::cmd_partitions(args),
            Command::Events(args) => {
                let report = events::run(args).await?;
                println!("{}", serde_json::to_string_pretty(&report)?);
                Ok(report.gaps == 0 && report.key_mismatches == 0)
            }
            Command::Hoard(args) => {
                let report = hoard::run(args).await?;
                println!("{}", serde_json::to_string_pretty(&report)?);
                for failure in &report.failures {
                    eprintln!("loadtest hoard: check failed: {failure}");
                }
                Ok(report.failures.is_empty())
            }
            Command::Cpu(_) => unreachable!("answered above"),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("loadtest: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
