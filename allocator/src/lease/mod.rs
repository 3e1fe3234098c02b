//! Partition leases (design §5): the pure state machine, the SQL statements, this replica's
//! ownership table, and the manager tasks that campaign, renew, watch for stalls and release.
pub mod manager;
pub mod ownership;
pub mod state;
pub mod store;
