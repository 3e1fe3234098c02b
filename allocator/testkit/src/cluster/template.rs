//! How a cluster starts its allocators and routers: binaries, arguments, environment and
//! database links, kept for the services it spawns later.

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::service::{Role, Service};
use super::Cluster;
use crate::TcpProxy;

/// How the cluster's services are started: kept by the cluster for services spawned later.
#[derive(Debug, Clone)]
pub(super) struct Template {
    pub(super) allocator_bin: PathBuf,
    pub(super) router_bin: PathBuf,
    pub(super) allocator_args: Vec<String>,
    pub(super) router_args: Vec<String>,
    pub(super) allocator_env: Vec<(String, String)>,
    pub(super) router_env: Vec<(String, String)>,
    pub(super) proxies: bool,
    pub(super) libfaketime: Option<PathBuf>,
    pub(super) rust_log: String,
}

impl Template {
    /// An allocator that is not started yet: `serve` with the cluster's database (through new
    /// proxies of its own when the cluster has them), Redis, port, id and `url`, then the
    /// cluster's allocator arguments.
    pub(super) fn allocator(
        &self,
        cluster: &Cluster,
        id: &str,
        port: u16,
        url: String,
    ) -> Result<Service> {
        let mut proxies = Vec::new();
        let shards = cluster.shard_urls();
        let shard = cluster.allocator_shard(id);
        let database_url = if !shards.is_empty() && !self.proxies {
            shards[shard].1.clone()
        } else if self.proxies {
            // The servers of the allocator's shard: the cluster's own for shard 0.
            let ports = match shard {
                0 => cluster.pg.ports(),
                i => vec![cluster.extra_shards[i - 1].server.port()],
            };
            if ports.is_empty() {
                bail!("proxies need a database server of the cluster's own");
            }
            for port in ports {
                proxies.push(TcpProxy::start(([127, 0, 0, 1], port).into())?);
            }
            let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
            format!(
                "postgres://postgres@{}/{}?target_session_attrs=read-write",
                hosts.join(","),
                schema::path::encode_segment(&cluster.db_name)
            )
        } else {
            cluster.db_url.clone()
        };
        let mut args: Vec<String> = [
            "serve",
            "--database-url",
            &database_url,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--replica-id",
            id,
            "--advertise-url",
            &url,
            "--redis-url",
            &cluster.redis.url(),
        ]
        .map(str::to_owned)
        .into();
        if shard > 0 {
            args.extend(["--catalog-url".to_owned(), cluster.db_url.clone()]);
        }
        args.extend(self.allocator_args.iter().cloned());
        let mut service = self.service(cluster, Role::Allocator, id, port, url, args, proxies);
        // Every shard, so that retention sees an order's lines on every shard. Given in the
        // environment, not as `--shard`: a build from before the flag ignores the variable, so
        // `ops/bench.sh --compare` can run an older build over several shards.
        let shards = cluster.shard_urls();
        if !shards.is_empty() {
            let list: Vec<String> = shards.iter().map(|(n, u)| format!("{n}={u}")).collect();
            service
                .env
                .push(("ALLOCATOR_SHARDS".to_owned(), list.join(" ")));
        }
        Ok(service)
    }

    /// A router that is not started yet.
    pub(super) fn router(&self, cluster: &Cluster, id: &str, port: u16) -> Result<Service> {
        let mut args: Vec<String> = [
            "serve",
            "--redis-url",
            &cluster.redis.url(),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]
        .map(str::to_owned)
        .into();
        // Every shard, the catalog first; or the one database.
        match cluster.shard_args() {
            none if none.is_empty() => {
                args.extend(["--database-url".to_owned(), cluster.db_url.clone()])
            }
            shards => args.extend(shards),
        }
        args.extend(self.router_args.iter().cloned());
        let url = format!("http://127.0.0.1:{port}");
        Ok(self.service(cluster, Role::Router, id, port, url, args, Vec::new()))
    }

    #[allow(clippy::too_many_arguments)]
    fn service(
        &self,
        cluster: &Cluster,
        role: Role,
        id: &str,
        port: u16,
        url: String,
        args: Vec<String>,
        proxies: Vec<TcpProxy>,
    ) -> Service {
        let (bin, env) = match role {
            Role::Allocator => (&self.allocator_bin, &self.allocator_env),
            Role::Router => (&self.router_bin, &self.router_env),
        };
        Service {
            id: id.to_owned(),
            role,
            port,
            url,
            bin: bin.clone(),
            args,
            env: std::iter::once(("RUST_LOG".to_owned(), self.rust_log.clone()))
                .chain(env.iter().cloned())
                .collect(),
            log: cluster.log_dir.join(format!("{id}.log")),
            proxies,
            process: None,
            skew: None,
            libfaketime: self.libfaketime.clone(),
            restarts: 0,
        }
    }
}
