//! `router serve ...`: parse the command line, log as JSON, run until SIGTERM or Ctrl-C.

use clap::Parser;
use edge::telemetry;
use router::config::{Cli, Command};
use router::{Application, RouterConfig};

/// mimalloc instead of glibc's malloc: serving a request allocates and frees many small buffers
/// (headers, JSON, futures), and a profile under load put glibc's malloc and free at 15-20 % of
/// the process's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init();
    match cli.command {
        Command::Serve(args) => {
            let app = Application::build(RouterConfig::try_from(args)?).await?;
            let shutdown = app.shutdown_token();
            tokio::spawn(async move {
                edge::signals::wait_for_shutdown_signal().await;
                shutdown.cancel();
            });
            app.run_until_stopped().await
        }
    }
}
