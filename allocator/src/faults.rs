//! Test-only fault injection (cargo feature `fault-hooks`, never a default feature).
//!
//! Supervision of partition workers can only be tested end to end if a worker inside a real
//! replica can be made to fail on demand. With the feature on, a reservation whose id starts with
//! [`PANIC_PREFIX`] makes the worker that picks it up panic before it touches the database.
//! Without the feature the hook compiles to nothing, so a production build carries no trigger.
//! The crate's own integration tests enable the feature through a dev-dependency on the crate.

use crate::fenced::Command;

/// Reservation ids starting with this make a partition worker panic (feature `fault-hooks`).
pub const PANIC_PREFIX: &str = "fault-hook:worker-panic:";

/// Called by a worker at the top of every batch.
#[inline]
pub fn before_batch<'a>(commands: impl IntoIterator<Item = &'a Command>) {
    #[cfg(feature = "fault-hooks")]
    for command in commands {
        if let Command::Reserve { reservation_id, .. } = command {
            if reservation_id.starts_with(PANIC_PREFIX) {
                panic!("fault hook: worker panic requested by {reservation_id}");
            }
        }
    }
    #[cfg(not(feature = "fault-hooks"))]
    let _ = commands;
}

/// Environment variable naming a pause, in milliseconds, between this process's first claim of a
/// settlement window and its settle (feature `fault-hooks`): the moment at which a holder that
/// crashes or stalls is most dangerous. Only the first run pauses, so the job catches up after.
pub const SETTLE_PAUSE_ENV: &str = "ALLOCATOR_FAULT_SETTLE_PAUSE_MS";

/// Called by the settlement job between claim and settle.
pub async fn before_settle() {
    #[cfg(feature = "fault-hooks")]
    {
        static PAUSED_ONCE: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        pause_once(SETTLE_PAUSE_ENV, &PAUSED_ONCE).await;
    }
}

/// Environment variable naming a pause, in milliseconds, between the event relay's first
/// acknowledged Redis append and its progress update (feature `fault-hooks`): a relay killed
/// there has published entries the database does not know were published.
pub const RELAY_PAUSE_ENV: &str = "ALLOCATOR_FAULT_RELAY_PAUSE_MS";

/// Called by the event relay between Redis's answer and recording progress.
pub async fn before_relay_progress() {
    #[cfg(feature = "fault-hooks")]
    {
        static PAUSED_ONCE: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(false);
        pause_once(RELAY_PAUSE_ENV, &PAUSED_ONCE).await;
    }
}

/// Sleep for the milliseconds the environment variable `env` names, the first time only
/// (`paused` remembers it, one per hook); nothing when it is unset or not a number.
#[cfg(feature = "fault-hooks")]
async fn pause_once(env: &str, paused: &std::sync::atomic::AtomicBool) {
    let pause = std::env::var(env).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = pause {
        if !paused.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
}

/// Environment variable naming a move state (`fenced`, `copied`, `retired`, `flipped`) after
/// which `allocator shards move` stops with an error, as a mover killed there would (feature
/// `fault-hooks`): the chaos run's interrupted moves.
pub const MOVE_STOP_ENV: &str = "ALLOCATOR_FAULT_MOVE_STOP_AFTER";

/// The state [`MOVE_STOP_ENV`] names; always `None` without the feature.
pub fn move_stop_after() -> Option<String> {
    #[cfg(feature = "fault-hooks")]
    return std::env::var(MOVE_STOP_ENV).ok();
    #[cfg(not(feature = "fault-hooks"))]
    None
}
