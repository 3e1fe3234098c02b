//! Request dispatch: hand a command to the local worker that owns its partition and wait for the
//! answer.
//!
//! The ownership table says where a partition's commands go; dispatch only ever queues on a
//! worker whose lease grants authority right now, and never waits for queue space: a full queue
//! is answered at once, so overload turns into quick retries elsewhere instead of piling up
//! requests behind a slow partition. Errors are the worker's own ([`WorkError`]); turning them
//! into HTTP answers (and looking up who owns a partition instead) is the caller's job.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::fenced::{Command, Outcome};
use crate::lease::FenceToken;
use crate::metrics as m;
use crate::replica::ownership::{Ownership, Placement};
use crate::stages::{Mark, Stamps};
use crate::work::{WorkError, WorkItem};

/// One command for one partition.
#[derive(Debug)]
pub struct Dispatch {
    pub partition: u32,
    /// The epoch the caller (a router) believes owns the partition, if it said. A different one
    /// means its map is out of date, and it should refresh instead of acting on a view that may
    /// be older than ours (or newer, when this replica lost the lease unawares).
    pub expected_epoch: Option<i64>,
    pub command: Command,
    /// How long to wait for the worker's answer.
    pub timeout: Duration,
    /// The request's stage marks (`crate::stages`).
    pub stamps: Arc<Stamps>,
}

/// Queue `dispatch.command` on the owning worker and wait for its outcome; the outcome comes
/// with the tenure it was applied under.
pub async fn dispatch(
    ownership: &Ownership,
    dispatch: Dispatch,
) -> Result<(Outcome, FenceToken), WorkError> {
    let Dispatch {
        partition,
        expected_epoch,
        command,
        timeout,
        stamps,
    } = dispatch;
    let (token, sender) = match ownership.placement(partition) {
        Placement::Owned { token, sender } => (token, sender),
        Placement::Uncertain => {
            return Err(WorkError::Unavailable {
                partition,
                reason: "lease renewal unconfirmed".into(),
                outcome_unknown: false,
            })
        }
        Placement::NotOwned => return Err(WorkError::NotOwner { partition }),
    };
    if expected_epoch.is_some_and(|expected| expected != token.epoch) {
        metrics::counter!(m::STALE_ROUTER_REQUESTS).increment(1);
        return Err(WorkError::NotOwner { partition });
    }
    let (reply, answer) = oneshot::channel();
    stamps.mark(Mark::Enqueued, Instant::now());
    let item = WorkItem {
        command,
        reply,
        stamps,
    };
    if sender.try_send(item).is_err() {
        metrics::counter!(m::QUEUE_REJECTIONS).increment(1);
        return Err(WorkError::Unavailable {
            partition,
            reason: "partition queue is full".into(),
            outcome_unknown: false,
        });
    }
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(Ok(outcome))) => Ok((outcome, token)),
        Ok(Ok(Err(error))) => Err(error),
        // The worker stopped (authority lost) before answering.
        Ok(Err(_)) => Err(WorkError::NotOwner { partition }),
        Err(_) => Err(WorkError::Unavailable {
            partition,
            reason: "request deadline exceeded".into(),
            outcome_unknown: true,
        }),
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
