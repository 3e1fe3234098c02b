//! Structured JSON logs (DESIGN.md §10): one JSON object per line with the message and the
//! structured fields (`partition`, `epoch`, `revision`, `reservation_id`, `outcome`, ...).
//! The level filter comes from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

/// Install the global subscriber; call once from `main` (tests may call [`try_init`]).
pub fn init() {
    let _ = try_init();
}

/// Install the global subscriber unless one is installed already (then an error).
pub fn try_init() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
}
