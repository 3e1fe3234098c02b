//! Storage error classification: SQLSTATE is translated in exactly one place.

use tokio_postgres::error::SqlState;

/// SQLSTATE raised by the inventory trigger when a lower epoch tries to write a row.
pub const SQLSTATE_STALE_EPOCH: &str = "FA001";
/// SQLSTATE raised by the settlement tables' trigger when a write carries an older job term.
pub const SQLSTATE_STALE_TERM: &str = "FA010";
/// SQLSTATE raised by `apply_fenced_batch` when a new id was inserted concurrently; nothing was
/// written and the batch can run again (the id then replays).
pub const SQLSTATE_CONCURRENT_ID: &str = "FA004";
/// SQLSTATE raised by `apply_fenced_batch` for a group that names a partition twice (two tenures
/// of one partition in one statement); nothing was written.
pub const SQLSTATE_DUPLICATE_PARTITION: &str = "FA005";
/// SQLSTATE of the set-based reserve statement aborting itself because a row changed between its
/// decision and its write; nothing was written and the group runs through `apply_fenced_batch`.
pub const SQLSTATE_FAST_PATH_ABORTED: &str = "FA006";

/// What a database error means to the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFailure {
    /// The resource-side fence refused a stale epoch (or a stale job term): this replica is no
    /// longer the owner.
    StaleEpoch,
    /// Transient: connection lost, timeouts, server shutting down, lock wait exceeded,
    /// serialization failures. The outcome of an in-flight commit may be unknown.
    Unavailable,
    /// A constraint refused the write (a bug if it ever happens: the code checks first).
    ConstraintViolation,
    /// Anything else.
    Other,
}

pub fn classify(err: &tokio_postgres::Error) -> DbFailure {
    let Some(code) = err.code() else {
        // No SQLSTATE: the connection broke or a client-side failure happened.
        return DbFailure::Unavailable;
    };
    if code.code() == SQLSTATE_STALE_EPOCH || code.code() == SQLSTATE_STALE_TERM {
        return DbFailure::StaleEpoch;
    }
    if code.code() == SQLSTATE_CONCURRENT_ID {
        return DbFailure::Unavailable;
    }
    if code.code().starts_with("08") || code.code().starts_with("57") {
        // connection exceptions, operator intervention (query_canceled, admin_shutdown, ...)
        return DbFailure::Unavailable;
    }
    match *code {
        SqlState::T_R_SERIALIZATION_FAILURE
        | SqlState::T_R_DEADLOCK_DETECTED
        | SqlState::LOCK_NOT_AVAILABLE
        | SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
        | SqlState::TOO_MANY_CONNECTIONS => DbFailure::Unavailable,
        SqlState::CHECK_VIOLATION
        | SqlState::UNIQUE_VIOLATION
        | SqlState::FOREIGN_KEY_VIOLATION
        | SqlState::NOT_NULL_VIOLATION => DbFailure::ConstraintViolation,
        _ => DbFailure::Other,
    }
}

/// A one-line description that includes the server's message and SQLSTATE (tokio-postgres'
/// own `Display` says only "db error").
pub fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => err.to_string(),
    }
}
