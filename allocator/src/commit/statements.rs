//! Where a lane sends a group: one statement on a pooled connection (DESIGN.md §6).
//!
//! A trait so that what the lanes decide (which batches share a statement, which are answered
//! without one, how a failed group is re-run) can be tested without a database; the lanes hold
//! a [`Statements`] and the service gives them [`PoolStatements`].

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use futures::future::BoxFuture;

use super::CommitError;
use crate::fenced::{apply_function, apply_group, FencedError, Outcome, PartitionBatch};

/// One result per batch of the group, in the group's order.
pub type GroupResult = Result<Vec<Result<Vec<Outcome>, FencedError>>, CommitError>;

/// Runs one group of partition batches as one statement.
pub trait Statements: Send + Sync + 'static {
    /// Run `group` as one statement, through the set-based reserve statement where it applies
    /// when `set_based` is set, and otherwise through `apply_fenced_batch`; waited for no longer
    /// than `deadline`, after which the outcome is unknown.
    fn run<'a>(
        &'a self,
        group: &'a [PartitionBatch<'a>],
        set_based: bool,
        deadline: Instant,
    ) -> BoxFuture<'a, GroupResult>;
}

/// The service's statements: a connection from the request pool per statement.
pub struct PoolStatements {
    pub pool: Pool,
    /// Longest wait for a pooled connection.
    pub pool_wait: Duration,
}

impl Statements for PoolStatements {
    fn run<'a>(
        &'a self,
        group: &'a [PartitionBatch<'a>],
        set_based: bool,
        deadline: Instant,
    ) -> BoxFuture<'a, GroupResult> {
        Box::pin(async move {
            let client = tokio::time::timeout(self.pool_wait, self.pool.get())
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string()))
                .map_err(|e| CommitError::Unavailable {
                    reason: format!("no database connection: {e}"),
                    outcome_unknown: false,
                })?;
            let work = async {
                if set_based {
                    apply_group(&client, group).await
                } else {
                    apply_function(&client, group).await
                }
            };
            match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), work).await {
                Ok(result) => result.map_err(CommitError::from),
                Err(_) => {
                    // The statement may still be running; never hand this connection to anyone
                    // else.
                    let _ = deadpool_postgres::Object::take(client);
                    Err(CommitError::Unavailable {
                        reason: "lease safe deadline reached during the transaction".into(),
                        outcome_unknown: true,
                    })
                }
            }
        })
    }
}
