//! The fence a transaction runs under, and how a fenced transaction can fail.

use super::command::Command;
use crate::error::{classify, DbFailure};
use crate::lease::FenceToken;

/// The authority a transaction runs under: the database accepts its writes only while the
/// partition's lease row names `replica_id` at `token.epoch` and has not expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub token: FenceToken,
    /// Compared with the lease row's holder as well as the epoch: an epoch alone would let a
    /// replica that never held the lease pass the fence by guessing it.
    pub replica_id: String,
}

impl Fence {
    pub fn new(token: FenceToken, replica_id: impl Into<String>) -> Self {
        Self {
            token,
            replica_id: replica_id.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FencedError {
    /// The lease row or an inventory row names a newer epoch (or another holder, or the lease
    /// expired): this replica must stop acting for the partition.
    #[error("stale epoch {ours} for partition {partition} (lease epoch {current:?})")]
    StaleEpoch {
        partition: u32,
        ours: i64,
        current: Option<i64>,
    },
    #[error("database: {}", crate::error::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The batch function answered something this build does not understand (a schema and
    /// binary out of step).
    #[error("malformed batch answer: {0}")]
    Malformed(String),
}

impl FencedError {
    pub fn stale(fence: FenceToken, current: Option<i64>) -> Self {
        FencedError::StaleEpoch {
            partition: fence.partition,
            ours: fence.epoch,
            current,
        }
    }

    pub fn failure(&self) -> DbFailure {
        match self {
            FencedError::StaleEpoch { .. } => DbFailure::StaleEpoch,
            FencedError::Db(e) => classify(e),
            FencedError::Malformed(_) => DbFailure::Other,
        }
    }

    /// Whether the statement may have committed: only when the connection broke before an
    /// answer arrived. An error answered by the server means the statement rolled back.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            FencedError::Db(e) => e.code().is_none(),
            _ => false,
        }
    }
}

pub(super) fn malformed(what: impl Into<String>) -> FencedError {
    FencedError::Malformed(what.into())
}

/// One partition's share of a group: its fence and its commands in arrival order.
#[derive(Debug, Clone, Copy)]
pub struct PartitionBatch<'a> {
    pub fence: &'a Fence,
    pub commands: &'a [Command],
}
