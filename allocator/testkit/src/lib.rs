//! Test harness for fault-injection tests of the allocator, the router and the load generator.
//!
//! The allocator's guarantees — fenced leases, idempotent reservations, no double allocation —
//! only matter when something fails, so its tests must make real dependencies fail on demand:
//!
//! * [`PgServer`]: a private PostgreSQL cluster per test that can be paused (`SIGSTOP`), stopped,
//!   killed and restarted on the same port and data directory.
//! * [`ReplicatedPg`]: a primary with a synchronous or asynchronous streaming standby, for killing
//!   the primary, promoting the standby, reviving the old primary and rebuilding a standby.
//! * [`PatroniCluster`]: PostgreSQL as operators run it — three etcd members and two or three
//!   nodes under Patroni in synchronous mode with `pg_rewind` — for failovers decided by the HA
//!   manager (a killed postmaster, `patronictl switchover`), not by the test.
//! * [`RedisServer`]: a private Redis that can be killed and brought back (empty) on the same
//!   port.
//! * [`TcpProxy`]: a TCP proxy between a service and its database that can delay, blackhole
//!   (partition) or cut connections.
//! * [`ApiClient`]: a typed client of the public API (allocator replica or router).
//! * [`ChildProcess`]: a spawned service binary that can be crashed, frozen or stopped, with its
//!   output captured to a log file; plus [`free_port`] and [`cargo_bin`] to launch it.
//! * [`Browser`]: a headless Chromium driven over WebDriver, for the pages the services serve.
//! * [`tree_cpu_time`], [`cpu_times`]: CPU time of a process tree (a PostgreSQL postmaster and its
//!   backends) or one process, from `/proc`; the load generator reports CPU per operation with
//!   them.
//! * [`TestPki`]: a CA with server and client certificates it signed, for HTTPS and mutual TLS.
//! * [`Cluster`]: all of the above put together — PostgreSQL, Redis, a migrated schema, N
//!   allocators (optionally behind proxies), M routers, waited for until every partition has an
//!   owner — for the router's tests, the chaos harness and the local cluster (`cluster up`, the
//!   `cluster` binary of this crate).
//! * [`fenced`]: leases and fenced batches written as an allocator writes them, for histories
//!   built without a replica.
//! * [`encoded_paths`]: every route asked with each character of its fixed segments
//!   percent-encoded, answered as its canonical path, against either service.
//! * [`workload`]: reserves (and restocks) through a failover with every acknowledgement and its
//!   time recorded, and the acknowledged writes a database lost.
//! * [`history`]: a SKU's history (`GET /v1/inventory/{sku}/history`) made by two clients and an
//!   admin and checked whole, page by page and for its refusals, against either service.
//!
//! Everything binds 127.0.0.1 on ports chosen at run time, never the shared PostgreSQL (5432)
//! and Redis (6379) instances on the machine, so tests can run in parallel with each other and
//! with other users of those instances. Every handle cleans up its processes and temporary files
//! in `Drop`, including while a failing test unwinds.
//!
//! The harness is its own crate, a dev-dependency of the services, so that no service binary links
//! it and every crate's tests share one copy; the load generator (a tool, not a service) links it
//! for the CPU readings.

pub mod api_client;
pub mod browser;
pub mod cluster;
pub mod encoded_paths;
pub mod fenced;
pub mod history;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod shared;
pub mod tls;
pub mod workload;

mod procfs;

pub use self::api_client::{Answer, ApiClient};
pub use self::browser::Browser;
pub use self::cluster::Cluster;
pub use self::postgres::{
    PatroniCluster, PatroniOptions, PatroniTimings, PgBouncer, PgServer, PoolMode, ReplicatedPg,
    Replication,
};
pub use self::process::{cargo_bin, free_port, ChildProcess};
pub use self::procfs::{cpu_times, resident_set_kib, tree_cpu_time, CpuTimes};
pub use self::proxy::{ProxyMode, TcpProxy};
pub use self::redis::RedisServer;
pub use self::tls::TestPki;
