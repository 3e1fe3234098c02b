//! Waiting for the signals that stop a service gracefully (SIGTERM from an orchestrator, SIGINT
//! from a terminal).

/// Resolves on the first SIGTERM or SIGINT.
pub async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => tracing::info!(signal = "sigterm", "stopping"),
                _ = tokio::signal::ctrl_c() => tracing::info!(signal = "sigint", "stopping"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for sigterm; only ctrl-c stops the service");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
