//! The replica layer (DESIGN.md §4, §5): which partitions this process owns, and the tasks that
//! keep it so.
//!
//! * [`ownership`] — the ownership table: one lease state and one worker per partition, the
//!   routes the dispatcher reads, and the [`PartitionAuthority`](crate::authority::PartitionAuthority)
//!   handles it gives workers.
//! * [`manager`] — the lease manager's tasks: watchdog and renewer.
//! * [`campaign`] — acquiring a fair share of partitions and starting supervised workers for them.
//! * [`handback`] — giving leases back: on purpose (rebalancing, shutdown) or after authority was
//!   dropped locally.
//!
//! This layer sits above [`lease`](crate::lease) (pure state and SQL) and
//! [`worker`](crate::worker) (which it spawns), and below request dispatch and the HTTP API.
pub mod campaign;
pub mod handback;
pub mod manager;
pub mod ownership;
