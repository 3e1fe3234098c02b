//! The fenced reservation transaction (DESIGN.md §6).
//!
//! A batch of commands for one or more partitions runs as **one statement**: the server-side
//! function `apply_fenced_batch` (`schema/functions/apply_fenced_batch.sql`) takes the whole
//! batch as arrays and returns one outcome per command. As an autocommit statement it is also one
//! transaction, so a batch of any size costs one round trip:
//!
//! 1. **Fence.** Each partition's lease row is read `FOR KEY SHARE` and must name this replica at
//!    this epoch with an unexpired lease. `FOR KEY SHARE` conflicts with the `FOR UPDATE` that an
//!    acquisition takes first, so a newer owner's acquire either committed before the check (and
//!    the check sees the new epoch) or waits until this transaction ends: no write of it can
//!    commit after a newer epoch exists, for any row of the partition (I4). It does not conflict
//!    with a renewal (a plain non-key `UPDATE`), so a stuck batch never fails renewals. A
//!    partition whose fence fails is answered [`FencedError::StaleEpoch`] without affecting the
//!    other partitions of the group.
//! 2. **Row fence.** Every inventory write sets `highest_epoch`; a trigger refuses a lower epoch
//!    than the row already carries, whoever the writer is.
//! 3. **Idempotency.** Existing ids are looked up once; a replay returns the stored outcome, a
//!    reuse with another payload (sku, quantity, ttl_seconds; sku, delta) is a mismatch (422).
//!    A reservation of another client ([`access::Owner`], `V18__owners.sql`) is, to a reserve
//!    of its id, a confirm or a release, an unknown id (`not_found`, 404).
//! 4. **Decrement-if-available** per command in arrival order, in memory over rows locked once
//!    per distinct SKU; then one bulk write per table, so a hot SKU gets one row update per batch.
//!    Not enough stock records a durable refusal; an unknown SKU records nothing.
//! 5. A ledger row for every stock movement; overdue holds the batch touches are expired in it.
//!
//! A stale epoch aborts a partition's part of the batch and surfaces as
//! [`FencedError::StaleEpoch`], never as a partial write.
//!
//! The Rust side of the path, by concept:
//!
//! * [`command`] — the command protocol: [`Command`]s in, one [`Outcome`] each.
//! * [`fence`] — the [`Fence`] a transaction runs under and the [`FencedError`]s it can end in.
//! * [`driver`] — one statement per group of partition batches: encoding, retry, decoding.
//! * [`fast`] — the set-based statement that writes groups of plain reserves without the
//!   procedural function, falling back to it for everything else.
//! * [`reservations`] — the stored status mapping and the one reservation reader.
//! * `adjustments` — decoding restocks and shrinks.
//! * [`ledger`] — [`StockDelta`], the unit of the append-only stock ledger.
//!
//! Overdue holds are expired by the [`Command::ExpireDue`] command, which the partition worker
//! schedules; the batch also expires any overdue hold it touches before acting on it.

mod adjustments;
mod answer;
pub mod command;
pub mod driver;
pub mod fast;
pub mod fence;
pub mod ledger;
pub mod reservations;

pub use command::{Command, Outcome};
pub use driver::{apply_function, apply_group, fenced_transaction};
pub use fence::{Fence, FencedError, PartitionBatch};
pub use ledger::StockDelta;
pub use reservations::{read_reservation, ReadError, ReservationRecord};
