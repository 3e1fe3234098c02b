//! `up`, `run` and `down`: the supervisor that owns a running cluster, and starting and stopping
//! it.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use testkit::cluster::{Database, Redis};
use testkit::{Cluster, Replication};
use tokio::signal::unix::{signal as unix_signal, SignalKind};

use crate::state::{self, Recorded};
use crate::{show, UpArgs};

/// How long `down` waits for the supervisor's graceful stop before killing what is left.
const DOWN_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts the supervisor detached, waits until it reports the cluster ready (or fails), and
/// prints what runs where.
pub async fn up(dir: &Path, args: &UpArgs) -> Result<i32> {
    std::fs::create_dir_all(dir.join("logs"))?;
    if supervisor(dir).is_some() {
        eprintln!(
            "a cluster from an earlier 'up' is running in {}; stopping it first",
            dir.display()
        );
        down(dir).await?;
    }
    state::clear(dir);
    std::fs::create_dir_all(state::run_dir(dir))?;
    // Fresh logs per `up`; the previous run's are kept as *.log.1.
    for entry in std::fs::read_dir(dir.join("logs"))?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::rename(&path, path.with_extension("log.1"));
        }
    }
    let log_path = dir.join("logs/cluster.log");
    let log = std::fs::File::create(&log_path)?;
    // The same command line with `run` for `up`.
    let mut argv: Vec<_> = std::env::args_os().skip(1).collect();
    if let Some(sub) = argv.iter_mut().find(|a| *a == "up") {
        *sub = "run".into();
    }
    let mut child = unsafe {
        Command::new(std::env::current_exe()?)
            .args(&argv)
            .env("CLUSTER_DIR", dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own session: a Ctrl-C in the terminal that ran `up` does not reach the cluster.
            .pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            })
            .spawn()
            .context("starting the cluster supervisor")?
    };
    let limit = Duration::from_secs(args.ready_timeout + args.map_timeout + 120);
    let deadline = Instant::now() + limit;
    loop {
        if state::ready_file(dir).exists() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            eprint!("{}", std::fs::read_to_string(&log_path).unwrap_or_default());
            bail!(
                "cluster up failed ({status}); logs in {}",
                dir.join("logs").display()
            );
        }
        if Instant::now() >= deadline {
            down(dir).await?;
            bail!(
                "cluster not up within {limit:?}; logs in {}",
                dir.join("logs").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprint!("{}", std::fs::read_to_string(&log_path).unwrap_or_default());
    println!("\ncluster is up:");
    for r in state::recorded(dir) {
        println!(
            "  {:<9} {:<24} pid {:<7} log {}",
            r.name,
            r.url.as_deref().unwrap_or("-"),
            r.pid,
            dir.join("logs").join(format!("{}.log", r.name)).display()
        );
    }
    for key in ["DATABASE_URL", "REDIS_URL"] {
        println!(
            "  {:<12} {}",
            key,
            state::env_value(dir, key).unwrap_or_default()
        );
    }
    println!(
        "\n  source {}   # DATABASE_URL REDIS_URL ROUTER_URL ROUTER_URLS ALLOCATOR_URLS",
        dir.join("cluster.env").display()
    );
    if !state::recorded(dir).is_empty() {
        println!();
        show::map(dir, &args.show).await?;
    }
    Ok(0)
}

/// The supervisor: starts the cluster, records it, and stops it gracefully on SIGTERM/SIGINT.
pub async fn run(dir: &Path, args: &UpArgs) -> Result<i32> {
    std::fs::create_dir_all(state::run_dir(dir))?;
    let me = std::env::current_exe()?;
    state::write_pid(&state::supervisor_file(dir), std::process::id(), &me)?;
    let mut term = unix_signal(SignalKind::terminate())?;
    let mut int = unix_signal(SignalKind::interrupt())?;
    let started = tokio::select! {
        started = start(dir, args) => started,
        _ = term.recv() => bail!("stopped while starting"),
        _ = int.recv() => bail!("stopped while starting"),
    };
    let mut cluster = match started {
        Ok(cluster) => cluster,
        Err(e) => {
            state::clear(dir);
            return Err(e);
        }
    };
    state::write(dir, &mut cluster)?;
    std::fs::write(state::ready_file(dir), "")?;
    eprintln!("cluster ready; supervisor pid {}", std::process::id());
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("stopping: routers, then allocators, then the servers");
    let result = cluster
        .shutdown(Duration::from_secs(args.stop_timeout))
        .await;
    state::clear(dir);
    result?;
    eprintln!("cluster stopped");
    Ok(0)
}

/// Builds the cluster `args` describe and starts it.
async fn start(dir: &Path, args: &UpArgs) -> Result<Cluster> {
    let standby = match args.pg_standby.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some("sync") => Some(Replication::Synchronous),
        Some("async") => Some(Replication::Asynchronous),
        Some(other) => bail!("CLUSTER_PG_STANDBY must be sync or async, got {other:?}"),
    };
    let private_pg = args.private || args.private_pg;
    if standby.is_some() && !private_pg {
        bail!("CLUSTER_PG_STANDBY needs a private PostgreSQL (CLUSTER_PRIVATE=1)");
    }
    let patroni = match args.ha.as_deref().filter(|s| !s.is_empty()) {
        None => false,
        Some("patroni") => true,
        Some(other) => bail!("--ha (CLUSTER_HA) must be patroni, got {other:?}"),
    };
    if patroni && standby.is_some() {
        bail!("--ha patroni and CLUSTER_PG_STANDBY are two ways of replicating; choose one");
    }
    let external = args.database_url.as_deref().filter(|url| !url.is_empty());
    if external.is_some() && (standby.is_some() || patroni) {
        bail!("--database-url (CLUSTER_DATABASE_URL) names the database to use; CLUSTER_PG_STANDBY and --ha start their own: choose one");
    }
    let database = match (external, standby) {
        (Some(url), _) => Database::Url(url.to_owned()),
        (None, None) if patroni => Database::Patroni(usize::from(args.ha_nodes)),
        (None, Some(mode)) => Database::Replicated(mode),
        (None, None) if private_pg => Database::Private,
        (None, None) => match system_database(args).await {
            Ok(url) => Database::Url(url),
            Err(e) => {
                eprintln!("PostgreSQL: the machine's server is not usable ({e:#}); starting a private one");
                Database::Private
            }
        },
    };
    let redis = if args.private || args.private_redis {
        Redis::Private
    } else if testkit::redis::answers_ping(&args.system_redis_host, args.system_redis_port).await {
        Redis::Url(format!(
            "redis://{}:{}/",
            args.system_redis_host, args.system_redis_port
        ))
    } else {
        eprintln!(
            "Redis: nothing answers on {}:{}; starting a private one",
            args.system_redis_host, args.system_redis_port
        );
        Redis::Private
    };
    let (allocators, routers) = match args.services_only {
        true => (0, 0),
        false => (args.allocators, args.routers),
    };
    let sibling =
        |name: &str| -> Result<PathBuf> { Ok(std::env::current_exe()?.with_file_name(name)) };
    let split = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    eprintln!(
        "starting PostgreSQL ({} shard(s)), Redis, {allocators} allocators and {routers} routers ({} partitions)",
        args.shards, args.partitions
    );
    let cluster = Cluster::builder()
        .name("cluster")
        .database(database)
        .db_name(&args.db_name)
        .pg_settings(pg_settings(args)?)
        .redis(redis)
        .partitions(args.partitions)
        .shards(usize::from(args.shards))
        .allocators(allocators)
        .routers(routers)
        .migrate(!args.services_only)
        .first_id(1)
        .allocator_bin(
            &args
                .allocator_bin
                .clone()
                .map_or_else(|| sibling("allocator"), Ok)?,
        )
        .router_bin(
            &args
                .router_bin
                .clone()
                .map_or_else(|| sibling("router"), Ok)?,
        )
        .allocator_args(split(&args.allocator_args))
        .router_args(split(&args.router_args))
        .rust_log(&args.rust_log)
        .log_dir(&dir.join("logs"))
        .timeouts(
            Duration::from_secs(args.ready_timeout),
            Duration::from_secs(args.map_timeout),
        )
        .start()
        .await?;
    eprintln!(
        "PostgreSQL ({}): {}",
        state::pg_mode(&cluster),
        cluster.db_url
    );
    eprintln!(
        "Redis ({}): {}",
        state::redis_mode(&cluster),
        cluster.redis.url()
    );
    Ok(cluster)
}

/// Settings of a private server from CLUSTER_PG_DURABLE and CLUSTER_PG_OPTIONS (`-c a=b ...`).
fn pg_settings(args: &UpArgs) -> Result<Vec<(String, String)>> {
    let mut settings = Vec::new();
    if args.pg_durable {
        for name in ["fsync", "full_page_writes", "synchronous_commit"] {
            settings.push((name.to_owned(), "on".to_owned()));
        }
    }
    let options = args.pg_options.clone().unwrap_or_default();
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let setting = match word {
            "-c" => words
                .next()
                .context("CLUSTER_PG_OPTIONS: -c without a setting")?,
            other => other.strip_prefix("-c").unwrap_or(other),
        };
        let (name, value) = setting
            .split_once('=')
            .with_context(|| format!("CLUSTER_PG_OPTIONS: {setting:?} is not name=value"))?;
        settings.push((name.to_owned(), value.to_owned()));
    }
    Ok(settings)
}

/// The machine's PostgreSQL: the database `args.db_name` dropped and created again.
async fn system_database(args: &UpArgs) -> Result<String> {
    let name = &args.db_name;
    let ours = name.strip_prefix("allocator_").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    });
    if !ours {
        bail!("CLUSTER_DB_NAME must match ^allocator_[a-z0-9_]+$ (it is dropped and recreated), got {name:?}");
    }
    let server = format!(
        "postgres://{}@{}:{}",
        args.system_pg_user, args.system_pg_host, args.system_pg_port
    );
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(3),
        tokio_postgres::connect(&format!("{server}/postgres"), tokio_postgres::NoTls),
    )
    .await
    .context("connecting timed out")??;
    tokio::spawn(connection);
    let may: bool = client
        .query_one(
            "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await?
        .get(0);
    if !may {
        bail!("{} may not create databases", args.system_pg_user);
    }
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await?;
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await?;
    eprintln!(
        "PostgreSQL: using the server on {}:{}, database {name} (recreated)",
        args.system_pg_host, args.system_pg_port
    );
    Ok(format!("{server}/{name}"))
}

/// The running supervisor of `dir`, if any.
fn supervisor(dir: &Path) -> Option<u32> {
    let (pid, bin) = state::read_pid(&state::supervisor_file(dir))?;
    state::pid_alive(pid, Some(&bin)).then_some(pid)
}

/// Asks the supervisor to stop and waits; kills whatever of its process group is left after
/// [`DOWN_TIMEOUT`] or after it died.
pub async fn down(dir: &Path) -> Result<i32> {
    let recorded: Vec<Recorded> = state::recorded(dir);
    let Some(pid) = supervisor(dir) else {
        // A supervisor that was killed leaves its processes behind in its process group.
        let leftover = state::read_pid(&state::supervisor_file(dir)).map(|(pid, _)| pid);
        if let Some(group) = leftover.filter(|pid| !state::pid_alive(*pid, None)) {
            kill_group(group);
        }
        for r in recorded.iter().filter(|r| r.alive()) {
            let _ = signal::kill(Pid::from_raw(r.pid as i32), Signal::SIGKILL);
        }
        // Killed servers are gone only once reaped; give them a moment before removing.
        tokio::time::sleep(Duration::from_millis(300)).await;
        state::remove_server_dirs(dir);
        state::clear(dir);
        eprintln!("no cluster running in {}", dir.display());
        return Ok(0);
    };
    eprintln!("stopping the cluster (supervisor pid {pid}): routers, allocators, servers");
    signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM)?;
    let deadline = Instant::now() + DOWN_TIMEOUT;
    while state::pid_alive(pid, None) {
        if Instant::now() >= deadline {
            eprintln!("warning: the supervisor did not finish within {DOWN_TIMEOUT:?}; killing what is left");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kill_group(pid);
    state::clear(dir);
    eprintln!("cluster down (logs kept in {})", dir.join("logs").display());
    Ok(0)
}

/// SIGKILL to every process left in process group `group` (the supervisor's session), called
/// only while the supervisor runs or once its pid is gone: a group id is not reused while any
/// member lives, so the members found are ours.
fn kill_group(group: u32) {
    let _ = signal::killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
}
