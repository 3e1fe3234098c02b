//! `cluster`: a local cluster (PostgreSQL, Redis, allocators, routers) from testkit's
//! [`testkit::Cluster`], left running in the background.
//!
//! `up` starts a supervisor (`cluster run`, detached in its own session) that owns every process
//! and server, waits until it reports the cluster ready and prints the URLs and the ownership
//! map. `down` asks the supervisor to stop (routers, then allocators, which release their leases,
//! then the servers it started). `status` and `map` read what `up` wrote under the cluster
//! directory and ask the processes. Files: `cluster.env` and `env` (URLs to `source`),
//! `run/<name>.pid|url`, `logs/<name>.log`, `prometheus/*.json` (file_sd targets).

mod show;
mod state;
mod supervise;

use std::path::PathBuf;

use clap::builder::FalseyValueParser;
use clap::{ArgAction, Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cluster",
    about = "A local allocator cluster: up, down, status, map"
)]
struct Cli {
    /// Where the cluster's state, logs and env files live.
    #[arg(long, env = "CLUSTER_DIR", default_value = ".cluster", global = true)]
    dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start PostgreSQL, Redis, migrate, start the allocators and routers, wait until every
    /// partition has an owner, and leave it all running (a cluster from an earlier `up` in the
    /// same directory is stopped first).
    Up(UpArgs),
    /// What `up` starts, in the foreground until SIGTERM or SIGINT.
    #[command(hide = true)]
    Run(UpArgs),
    /// Stop what `up` started: routers, then allocators (they release their leases), then the
    /// private servers. Nothing running is not an error.
    Down,
    /// Processes (pid, URL, /readyz), PostgreSQL and Redis, and the ownership map; exit 1 if
    /// anything is down.
    Status(StatusArgs),
    /// The ownership map: partition, owner, epoch, lease time left; partitions per owner.
    Map(ShowArgs),
}

#[derive(Args, Clone)]
struct ShowArgs {
    /// Bearer token for `GET /v1/partitions` (routers started with --auth-file need one).
    #[arg(long, env = "CLUSTER_TOKEN")]
    token: Option<String>,
}

#[derive(Args, Clone)]
struct StatusArgs {
    /// Only PostgreSQL and Redis.
    #[arg(long)]
    services: bool,
    #[command(flatten)]
    show: ShowArgs,
}

#[derive(Args, Clone)]
pub struct UpArgs {
    #[arg(long, env = "CLUSTER_PARTITIONS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    partitions: u32,
    #[arg(long, env = "CLUSTER_ALLOCATORS", default_value_t = 3)]
    allocators: usize,
    /// Spread the partitions over this many PostgreSQL primaries (DESIGN.md §12): the cluster's
    /// database is shard s0, the catalog; every further shard is a private server of its own.
    /// Allocator i serves shard i mod N; routers get every shard.
    #[arg(long, env = "CLUSTER_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    shards: u16,
    #[arg(long, env = "CLUSTER_ROUTERS", default_value_t = 2)]
    routers: usize,
    /// Only PostgreSQL and Redis: no migration, no allocator, no router.
    #[arg(long)]
    services_only: bool,
    /// Private PostgreSQL and Redis even when the machine's answer.
    #[arg(long, env = "CLUSTER_PRIVATE", action = ArgAction::SetTrue, value_parser = FalseyValueParser::new())]
    private: bool,
    /// A private PostgreSQL (the machine's Redis may still be used).
    #[arg(long, env = "CLUSTER_PRIVATE_PG", action = ArgAction::SetTrue, value_parser = FalseyValueParser::new())]
    private_pg: bool,
    /// A private Redis.
    #[arg(long, env = "CLUSTER_PRIVATE_REDIS", action = ArgAction::SetTrue, value_parser = FalseyValueParser::new())]
    private_redis: bool,
    /// `sync` or `async`: a private primary with a streaming standby; every service gets the
    /// multi-host URL of both servers.
    #[arg(long, env = "CLUSTER_PG_STANDBY")]
    pg_standby: Option<String>,
    /// `patroni`: a private Patroni cluster (three etcd members, synchronous mode, `pg_rewind`)
    /// of `--ha-nodes` PostgreSQL nodes; every service gets the multi-host URL of all of them.
    #[arg(long, env = "CLUSTER_HA")]
    ha: Option<String>,
    /// PostgreSQL nodes of the `--ha patroni` cluster.
    #[arg(long, env = "CLUSTER_HA_NODES", default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=5))]
    ha_nodes: u8,
    /// A private PostgreSQL with fsync, full page writes and synchronous commit on (benchmarks).
    #[arg(long, env = "CLUSTER_PG_DURABLE", action = ArgAction::SetTrue, value_parser = FalseyValueParser::new())]
    pg_durable: bool,
    /// Extra settings of a private PostgreSQL, `-c name=value ...`.
    #[arg(long, env = "CLUSTER_PG_OPTIONS", allow_hyphen_values = true)]
    pg_options: Option<String>,
    /// The database; on the machine's server it is dropped and created again by `up`.
    #[arg(long, env = "CLUSTER_DB_NAME", default_value = "allocator_demo")]
    db_name: String,
    /// An existing database to serve from as it is (e.g. a restored copy): never dropped or
    /// recreated, and `allocator migrate` applies only what it lacks. No PostgreSQL is started.
    #[arg(long, env = "CLUSTER_DATABASE_URL")]
    database_url: Option<String>,
    #[arg(long, env = "CLUSTER_SYSTEM_PG_HOST", default_value = "127.0.0.1")]
    system_pg_host: String,
    #[arg(long, env = "CLUSTER_SYSTEM_PG_PORT", default_value_t = 5432)]
    system_pg_port: u16,
    #[arg(long, env = "CLUSTER_SYSTEM_PG_USER", default_value = "postgres")]
    system_pg_user: String,
    #[arg(long, env = "CLUSTER_SYSTEM_REDIS_HOST", default_value = "127.0.0.1")]
    system_redis_host: String,
    #[arg(long, env = "CLUSTER_SYSTEM_REDIS_PORT", default_value_t = 6379)]
    system_redis_port: u16,
    /// The allocator binary (default: `allocator` beside this one).
    #[arg(long, env = "CLUSTER_ALLOCATOR_BIN")]
    allocator_bin: Option<PathBuf>,
    /// The router binary (default: `router` beside this one).
    #[arg(long, env = "CLUSTER_ROUTER_BIN")]
    router_bin: Option<PathBuf>,
    /// Extra allocator flags, split on whitespace.
    #[arg(
        long,
        env = "CLUSTER_ALLOCATOR_ARGS",
        allow_hyphen_values = true,
        default_value = ""
    )]
    allocator_args: String,
    /// Extra router flags, split on whitespace.
    #[arg(
        long,
        env = "CLUSTER_ROUTER_ARGS",
        allow_hyphen_values = true,
        default_value = ""
    )]
    router_args: String,
    /// Seconds the processes may take to answer /readyz.
    #[arg(long, env = "CLUSTER_READY_TIMEOUT", default_value_t = 90)]
    ready_timeout: u64,
    /// Seconds every partition may then take to have an owner.
    #[arg(long, env = "CLUSTER_MAP_TIMEOUT", default_value_t = 60)]
    map_timeout: u64,
    /// Seconds a process may take to stop after SIGTERM before it is killed.
    #[arg(long, env = "CLUSTER_STOP_TIMEOUT", default_value_t = 30)]
    stop_timeout: u64,
    /// Log filter of the started processes.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    rust_log: String,
    #[command(flatten)]
    show: ShowArgs,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => supervise::up(&cli.dir, &args).await,
        Command::Run(args) => supervise::run(&cli.dir, &args).await,
        Command::Down => supervise::down(&cli.dir).await,
        Command::Status(args) => show::status(&cli.dir, &args.show, args.services).await,
        Command::Map(args) => show::map(&cli.dir, &args).await,
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("cluster: error: {e:#}");
            std::process::exit(1);
        }
    }
}
