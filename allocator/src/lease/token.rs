//! The fence token: which lease, at which epoch, a piece of work acts under.
//!
//! Every acquisition of a partition's lease yields a strictly higher epoch, so the pair names one
//! tenure of one owner. The database compares it with the lease row and with every inventory row
//! it touches and refuses anything older; locally it ties a worker, a batch and a loss report to
//! the tenure they belong to, so a late report about an old tenure cannot drop a newer one.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceToken {
    pub partition: u32,
    /// The lease epoch the database handed out with the acquisition; only ever compared, never
    /// incremented here, because only the database may mint a newer one.
    pub epoch: i64,
}

impl FenceToken {
    pub fn new(partition: u32, epoch: i64) -> Self {
        Self { partition, epoch }
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} at epoch {}", self.partition, self.epoch)
    }
}
