//! Storage-level fencing (DESIGN.md §13): an allocator or a router never writes to, reads the
//! assignment map from, or takes a lease from a PostgreSQL server that is not the newest primary
//! it can know of.
//!
//! The lease epoch fences one owner against another *inside* one database. After a failover
//! there are two databases: the promoted standby and, if the failed host comes back and nothing
//! stops it, the old primary, writable, at the address clients were configured with. A pool
//! given a multi-host URL with `target_session_attrs=read-write` takes the first host that
//! accepts writes — possibly that old primary, where the old leases can be taken again and every
//! write is lost to the operator who keeps the promoted one.
//!
//! Each process therefore keeps a [`StorageFence`]: the cluster it works with (system
//! identifier, `storage_identity.cluster_id`) and the newest position it has seen (WAL timeline,
//! then the generation stamped at promotion; [`identity`]). Every configured host is read at
//! start and every probe interval; every new pooled connection is validated and refused unless
//! its server is the newest writable primary of that cluster; a pooled connection made before
//! the known position rose is not reused ([`pool`]). What this guarantees and what it needs from
//! the HA manager is in DESIGN.md §13.

pub mod fence;
pub mod identity;
pub mod pool;
pub mod pooling;
mod probe;

pub use self::fence::{FenceSettings, MetricNames, StorageFence};
pub use self::identity::{Refusal, ServerIdentity, Verdict};
pub use self::pool::{build_pool, connect, connect_listening, PoolLimits};
