//! The singleton settlement job (DESIGN.md §8).
//!
//! Every replica is a candidate for the lease `job/settlement`. The holder sums the confirmed
//! reservations of each closed window into `settlements`, one `settlement_runs` row per window,
//! in two steps: *claim* (a `running` row under its term) and *settle* (the per-SKU sums and the
//! `settled` mark, one statement). The lease's epoch is the job's term, and the tables' trigger
//! refuses any write of an older term, so exactly-once does not depend on the holder knowing it
//! still holds the lease:
//!
//! * a window is settled by one statement, so it is either settled whole or not at all;
//! * a run a holder claimed and never finished (it crashed, paused or lost its link) is taken
//!   over by the next holder's claim, which raises the run's term and so fences the old holder's
//!   settle out;
//! * the next window always starts where the last settled one ended, so none is skipped or
//!   overlapped, and a window is only claimed once the database clock is past its end plus a grace
//!   longer than a batch statement may run, so no confirmation can still commit into it.
//!
//! Authority and the lease are [`crate::singleton`]'s, shared with the retention job. The job
//! reads and writes only its own tables and the ledger's confirmation index; it never takes a
//! lock a reservation waits for.

mod job;
pub mod store;

pub use job::{Settlement, SettlementSettings};
