//! One Patroni node's configuration file, and the timings every node of a test cluster shares.
//!
//! The file is written as JSON, which Patroni's YAML loader reads unchanged, so no YAML writer is
//! needed. The cluster-wide part (`bootstrap.dcs`) is written into the DCS by the node that
//! bootstraps; the rest is per node: its ports, directories and the private Unix socket
//! directory (never `/var/run/postgresql`, so a test node cannot collide with the machine's own
//! server).

use std::path::Path;

use serde_json::{json, Value};

/// Patroni's timings for tests, in seconds.
///
/// Patroni needs `loop_wait + 2 × retry_timeout ≤ ttl`: a leader that cannot reach the DCS
/// retries for `retry_timeout`, and must be able to do so twice within one loop and still demote
/// itself before its leader key expires and a replica takes over. The defaults (30/10/10) make a
/// lost leader (host gone, Patroni frozen, cut off from etcd) cost up to `ttl + loop_wait` = 40 s,
/// longer than a CI test should wait. The test values:
///
/// * `ttl = 10`: a lost leader is replaced within about 12 s. Lower would save little and risks
///   spurious failovers when a loaded 2-core CI machine stalls etcd or Patroni for a second or
///   two.
/// * `loop_wait = 2`: a crashed postmaster is noticed within 2 s (each HA loop checks it).
/// * `retry_timeout = 4`: rides out an etcd leader election (1 s election timeout) or a stalled
///   PostgreSQL query without demoting; `2 + 2 × 4 = 10 = ttl`.
/// * `primary_start_timeout = 0`: a crashed primary is failed over at once instead of being
///   restarted in place (default 300 s of crash recovery attempts). In synchronous mode that
///   loses no acknowledged commit (the synchronous standby has each one), so it is the faster
///   path, and the old primary then rejoins through `pg_rewind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatroniTimings {
    pub ttl: u32,
    pub loop_wait: u32,
    pub retry_timeout: u32,
    pub primary_start_timeout: u32,
}

impl Default for PatroniTimings {
    fn default() -> Self {
        PatroniTimings {
            ttl: 10,
            loop_wait: 2,
            retry_timeout: 4,
            primary_start_timeout: 0,
        }
    }
}

/// Server settings of every node (the DCS's `postgresql.parameters`).
///
/// `pg_rewind` needs `wal_log_hints` (or data checksums) and `full_page_writes`; synchronous
/// mode needs `synchronous_commit = on` (Patroni manages `synchronous_standby_names`). `fsync`
/// stays off as in every test server: the faults here kill processes, not the machine, so the
/// page cache survives them.
fn server_parameters() -> Value {
    json!({
        "wal_log_hints": "on",
        "full_page_writes": "on",
        "synchronous_commit": "on",
        "fsync": "off",
        "wal_level": "replica",
        "hot_standby": "on",
        "max_connections": 300,
        "shared_buffers": "64MB",
        "max_wal_senders": 10,
        "max_replication_slots": 10,
        "wal_keep_size": "256MB",
        "wal_receiver_status_interval": "1s",
        "wal_sender_timeout": "10s",
        "listen_addresses": "127.0.0.1",
    })
}

/// Where one node lives and what it listens on.
pub(super) struct NodeLayout<'a> {
    pub scope: &'a str,
    pub name: &'a str,
    pub pg_port: u16,
    pub api_port: u16,
    pub data_dir: &'a Path,
    pub socket_dir: &'a Path,
    pub pgpass: &'a Path,
    pub bin_dir: &'a Path,
    pub etcd_hosts: &'a [String],
    /// `etcd_hosts` are proxies: no discovery of the members' own addresses.
    pub etcd_use_proxies: bool,
    pub timings: PatroniTimings,
}

/// The node's configuration file contents.
pub(super) fn node_config(node: &NodeLayout<'_>) -> Value {
    let t = node.timings;
    json!({
        "scope": node.scope,
        "namespace": "/allocator-test/",
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": format!("127.0.0.1:{}", node.api_port),
            "connect_address": format!("127.0.0.1:{}", node.api_port),
        },
        "etcd3": {
            "hosts": node.etcd_hosts,
            "protocol": "http",
            "use_proxies": node.etcd_use_proxies,
        },
        "bootstrap": {
            "dcs": {
                "ttl": t.ttl,
                "loop_wait": t.loop_wait,
                "retry_timeout": t.retry_timeout,
                "primary_start_timeout": t.primary_start_timeout,
                "maximum_lag_on_failover": 1_048_576,
                "synchronous_mode": true,
                "postgresql": {
                    "use_pg_rewind": true,
                    "use_slots": true,
                    "parameters": server_parameters(),
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
        },
        "postgresql": {
            "listen": format!("127.0.0.1:{}", node.pg_port),
            "connect_address": format!("127.0.0.1:{}", node.pg_port),
            "data_dir": node.data_dir,
            "bin_dir": node.bin_dir,
            "pgpass": node.pgpass,
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
                "rewind": {"username": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": {"unix_socket_directories": node.socket_dir},
            "basebackup": [{"checkpoint": "fast"}],
        },
        "tags": {"nofailover": false, "noloadbalance": false, "clonefrom": false},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_timings_keep_patronis_rule_and_fail_over_a_crash_at_once() {
        let t = PatroniTimings::default();
        assert!(t.loop_wait + 2 * t.retry_timeout <= t.ttl, "{t:?}");
        assert_eq!(t.primary_start_timeout, 0);
    }

    #[test]
    fn a_node_runs_synchronous_with_pg_rewind_and_its_own_socket_directory() {
        let hosts = ["127.0.0.1:1".to_owned()];
        let node = NodeLayout {
            scope: "s",
            name: "pg0",
            pg_port: 2,
            api_port: 3,
            data_dir: Path::new("/d/data"),
            socket_dir: Path::new("/d/sock"),
            pgpass: Path::new("/d/pgpass"),
            bin_dir: Path::new("/bin"),
            etcd_hosts: &hosts,
            etcd_use_proxies: true,
            timings: PatroniTimings::default(),
        };
        let config = node_config(&node);
        let dcs = &config["bootstrap"]["dcs"];
        assert_eq!(dcs["synchronous_mode"], true);
        assert_eq!(dcs["postgresql"]["use_pg_rewind"], true);
        assert_eq!(dcs["postgresql"]["parameters"]["wal_log_hints"], "on");
        assert_eq!(dcs["postgresql"]["parameters"]["full_page_writes"], "on");
        assert_eq!(dcs["ttl"], 10);
        assert_eq!(config["etcd3"]["use_proxies"], true);
        assert_eq!(
            config["postgresql"]["parameters"]["unix_socket_directories"],
            "/d/sock"
        );
        assert_eq!(config["postgresql"]["listen"], "127.0.0.1:2");
    }
}
