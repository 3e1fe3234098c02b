//! `router serve ...`: parse the command line, log as JSON, run until SIGTERM or Ctrl-C.

use clap::Parser;
use router::config::{Cli, Command};
use router::{telemetry, Application, RouterConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init();
    match cli.command {
        Command::Serve(args) => {
            let app = Application::build(RouterConfig::from(args)).await?;
            let shutdown = app.shutdown_token();
            tokio::spawn(async move {
                wait_for_signal().await;
                shutdown.cancel();
            });
            app.run_until_stopped().await
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!(signal = "sigterm", "stopping"),
                _ = tokio::signal::ctrl_c() => tracing::info!(signal = "sigint", "stopping"),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for sigterm; only ctrl-c stops the router");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
