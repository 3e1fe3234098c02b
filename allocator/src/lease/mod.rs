//! Partition leases (DESIGN.md §5), free of everything that acts under them.
//!
//! * [`state`] — the per-partition state machine (`NotHeld → Active ⇄ Uncertain → NotHeld`) and
//!   the stall watchdog. Pure: every transition is given the instant it happens at, so tests
//!   drive it with a [`ManualClock`](crate::clock::ManualClock) instead of sleeping.
//! * [`store`] — the SQL that acquires, renews and releases leases and keeps replica heartbeats.
//! * [`take`] — the one statement that takes a lease row, for partitions, jobs and the mover.
//! * [`token`] — [`FenceToken`], the (partition, epoch) pair every fenced write carries.
//!
//! Who holds what, and the tasks that campaign and renew, live one layer up, in the replica
//! module; this module knows nothing about ownership, workers or requests.
pub mod state;
pub mod store;
pub(crate) mod take;
pub mod token;

pub use token::FenceToken;
