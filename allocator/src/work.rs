//! What travels from a request to a partition worker and back.
//!
//! Kept apart from the worker itself so that the ownership table (which holds each worker's
//! queue) and the dispatcher (which fills it) share the queue's item type without depending on
//! how a worker runs its batches.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::fenced::{Command, Outcome};
use crate::stages::Stamps;

/// One command for a partition and where its answer goes.
pub struct WorkItem {
    pub command: Command,
    /// Dropped unanswered only if the worker dies mid-batch; the caller reads that as "not
    /// owner", because the lease is given up when a worker dies.
    pub reply: oneshot::Sender<Result<Outcome, WorkError>>,
    /// The request's stage marks: the worker sets when it took the command and copies in its
    /// batch's hand-over and statement.
    pub stamps: Arc<Stamps>,
}

impl std::fmt::Debug for WorkItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItem")
            .field("command", &self.command)
            .finish()
    }
}

/// Why a partition could not apply a command.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum WorkError {
    #[error("partition {partition} is not owned by this replica")]
    NotOwner { partition: u32 },
    /// The partition cannot serve right now. `outcome_unknown` is true when a commit may have
    /// happened (the client must retry with the same id to learn the outcome).
    #[error("partition {partition} unavailable: {reason}")]
    Unavailable {
        partition: u32,
        reason: String,
        outcome_unknown: bool,
    },
    /// The database refused the transaction for a reason other than fencing or availability
    /// (a constraint, an unexpected error). Nothing was committed.
    #[error("partition {partition} storage error: {reason}")]
    Storage { partition: u32, reason: String },
}
