//! The narrow authority a partition worker holds: one lease tenure, nothing more (DESIGN.md §5).
//!
//! A worker must re-check, before every transaction, that its tenure still grants authority and
//! how long for, because authority can lapse while a command waits in the queue; and it must be
//! able to give the tenure up when the database proves it stale. [`PartitionAuthority`] offers
//! exactly those two questions, bound to one [`FenceToken`], so a worker can neither look at
//! other partitions nor install, renew or route anything. Whatever keeps the lease table
//! implements [`AuthoritySource`]; the worker never sees it.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::lease::state::{Authority, LossCause};
use crate::lease::FenceToken;

/// What a [`PartitionAuthority`] asks of the lease table.
pub trait AuthoritySource: Send + Sync + 'static {
    /// Authority for `token`'s partition right now, judged for `token`'s epoch only: a newer
    /// tenure of the same partition is someone else's.
    fn authority(&self, token: FenceToken) -> Authority;
    /// Drop `token`'s tenure, if it is still the current one.
    fn report_loss(&self, token: FenceToken, cause: LossCause);
}

/// Why a worker may not start a transaction now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withheld {
    /// The lease is held but its last renewal is unconfirmed: try again shortly.
    Unconfirmed,
    /// The tenure is over; it never comes back (a new acquisition has a new epoch).
    Lost,
}

/// One partition's authority at one epoch.
#[derive(Clone)]
pub struct PartitionAuthority {
    token: FenceToken,
    source: Arc<dyn AuthoritySource>,
}

impl PartitionAuthority {
    pub fn new(token: FenceToken, source: Arc<dyn AuthoritySource>) -> Self {
        Self { token, source }
    }

    /// The tenure this handle speaks for.
    pub fn token(&self) -> FenceToken {
        self.token
    }

    /// The instant by which a write under this fence must be finished, if one may start now.
    pub fn write_deadline(&self) -> Result<Instant, Withheld> {
        match self.source.authority(self.token) {
            Authority::Granted { safe_until, .. } => Ok(safe_until),
            Authority::Uncertain => Err(Withheld::Unconfirmed),
            Authority::NotHeld => Err(Withheld::Lost),
        }
    }

    /// The tenure is over (e.g. the database refused its epoch): stop acting for it.
    pub fn report_loss(&self, cause: LossCause) {
        self.source.report_loss(self.token, cause);
    }
}

impl fmt::Debug for PartitionAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartitionAuthority")
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}
