use allocator::app::Application;
use allocator::config::{AllocatorConfig, Cli, Command};
use clap::Parser;

/// mimalloc instead of glibc's malloc: serving a request allocates and frees many small buffers
/// (headers, JSON, futures), and a profile under load put glibc's malloc and free at 15-20 % of
/// the process's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    edge::telemetry::init();
    let cli = Cli::parse();
    match cli.command {
        Command::Migrate(args) => {
            for (shard, report) in allocator::shard::migrate(&args).await? {
                tracing::info!(
                    %shard,
                    applied = ?report.applied,
                    partition_count = report.partition_count,
                    created_cluster = report.created_cluster,
                    "schema ready"
                );
                let installed = report.functions.iter().filter(|f| f.changed()).count();
                println!(
                    "schema ready: {} partitions, {} migration(s) applied, {installed} of {} \
                     function file(s) installed (shard {shard})",
                    report.partition_count,
                    report.applied.len(),
                    report.functions.len()
                );
                // Every file that was installed, or that the database holds a newer revision of.
                for function in &report.functions {
                    if function.outcome != schema::functions::FunctionOutcome::Unchanged {
                        tracing::info!(%shard, function = %function, "stored function");
                        println!("  function {function}");
                    }
                }
            }
            Ok(())
        }
        Command::Ledger(args) => allocator::retention::command::run(args).await,
        Command::Shards(args) => allocator::shard::run(args).await,
        Command::Serve(args) => {
            let config = AllocatorConfig::try_from(*args)?;
            let app = Application::build(config).await?;
            let shutdown = app.shutdown_token();
            tokio::spawn(async move {
                edge::signals::wait_for_shutdown_signal().await;
                shutdown.cancel();
            });
            app.run_until_stopped().await
        }
    }
}
