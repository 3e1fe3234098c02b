//! SIGHUP re-reads the auth file, the router's own upstream token and the TLS material
//! ([`crate::tls`]), so tokens and certificates can be rotated without a restart.

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::gate::Gate;
use crate::tls::Reload;
use crate::upstream::UpstreamToken;

/// Reload on every SIGHUP until `shutdown`. Failures are logged and counted by
/// [`Gate::reload`]; the table and token in force stay. Registering the handler also means a
/// stray SIGHUP no longer ends the process.
pub fn spawn_sighup_reloader(
    gate: Arc<Gate>,
    upstream: Option<Arc<UpstreamToken>>,
    tls: Vec<Arc<dyn Reload>>,
    shutdown: CancellationToken,
) -> std::io::Result<JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = hangups.recv() => {
                    if received.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP: reloading credentials");
                    if let Ok(None) = gate.reload() {
                        tracing::info!("no auth file configured; nothing to reload");
                    }
                    if let Some(token) = &upstream {
                        if let Err(error) = token.reload() {
                            tracing::error!(%error, "upstream token reload refused; keeping the previous token");
                        }
                    }
                    for material in &tls {
                        let what = material.what();
                        let outcome = match material.reload() {
                            Ok(()) => {
                                tracing::info!(what, "TLS material reloaded");
                                "ok"
                            }
                            Err(error) => {
                                tracing::error!(what, %error, "TLS reload refused; keeping the material in force");
                                "failed"
                            }
                        };
                        metrics::counter!(gate.metric_names().tls_reloads, "outcome" => outcome)
                            .increment(1);
                    }
                }
            }
        }
    }))
}
