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
