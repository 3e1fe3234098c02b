//! Assignment change hints on Redis.
//!
//! An allocator publishes a hint after every lease acquisition and release commits; routers
//! subscribe to refresh their map early. Hints carry no authority: a receiver re-reads the map from
//! PostgreSQL, and routers poll as well, so a lost or reordered hint only delays a refresh.

use serde::{Deserialize, Serialize};

/// Redis pub/sub channel carrying assignment change hints.
pub const HINT_CHANNEL: &str = "allocator:assignments";

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HintKind {
    Acquire,
    Release,
}

/// Published by an allocator after every acquire and release commits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AssignmentHint {
    pub kind: HintKind,
    pub partition: u32,
    pub epoch: i64,
    /// The assignment revision the change took.
    pub revision: i64,
    pub owner_id: String,
}
