//! The files a running cluster leaves in its directory, and reading them back.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use testkit::cluster::{RedisHost, Storage};
use testkit::Cluster;

/// One process `up` recorded: `run/<name>.pid` (pid, binary) and `run/<name>.url`.
pub struct Recorded {
    pub name: String,
    pub pid: u32,
    pub bin: PathBuf,
    pub url: Option<String>,
}

impl Recorded {
    /// Whether the pid still runs the recorded binary (never a recycled pid).
    pub fn alive(&self) -> bool {
        pid_alive(self.pid, Some(&self.bin))
    }
}

pub fn run_dir(dir: &Path) -> PathBuf {
    dir.join("run")
}

/// The supervisor's pidfile.
pub fn supervisor_file(dir: &Path) -> PathBuf {
    run_dir(dir).join("cluster.pid")
}

/// Written once the cluster is ready.
pub fn ready_file(dir: &Path) -> PathBuf {
    run_dir(dir).join("ready")
}

/// `pid\nbinary\n`.
pub fn write_pid(path: &Path, pid: u32, bin: &Path) -> Result<()> {
    std::fs::write(path, format!("{pid}\n{}\n", bin.display()))
        .with_context(|| format!("writing {}", path.display()))
}

pub fn read_pid(path: &Path) -> Option<(u32, PathBuf)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse().ok()?;
    Some((pid, PathBuf::from(lines.next().unwrap_or_default())))
}

/// Whether `pid` runs (not a zombie) and, when given, runs `bin`.
pub fn pid_alive(pid: u32, bin: Option<&Path>) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    if state == Some(Some('Z')) {
        return false;
    }
    match (bin, std::fs::read_link(format!("/proc/{pid}/exe"))) {
        (Some(bin), Ok(exe)) if !bin.as_os_str().is_empty() => {
            let exe = exe
                .to_string_lossy()
                .trim_end_matches(" (deleted)")
                .to_owned();
            std::fs::canonicalize(bin).is_ok_and(|b| Path::new(&exe) == b)
        }
        _ => true,
    }
}

/// The recorded service processes, allocators then routers, each in numeric order.
pub fn recorded(dir: &Path) -> Vec<Recorded> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(run_dir(dir)) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pid"))
        else {
            continue;
        };
        if !(name.starts_with("alloc-") || name.starts_with("router-")) {
            continue;
        }
        let Some((pid, bin)) = read_pid(&path) else {
            continue;
        };
        let url = std::fs::read_to_string(path.with_extension("url"))
            .ok()
            .map(|u| u.trim().to_owned());
        out.push(Recorded {
            name: name.to_owned(),
            pid,
            bin,
            url,
        });
    }
    let key = |r: &Recorded| {
        let (kind, n) = r.name.rsplit_once('-').unwrap_or((&r.name, "0"));
        (kind != "alloc", n.parse::<u64>().unwrap_or(0))
    };
    out.sort_by_key(key);
    out
}

/// Single-quoted for a shell.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// What kind of server the cluster uses.
pub fn pg_mode(cluster: &Cluster) -> &'static str {
    match cluster.pg {
        Storage::External => "system",
        Storage::Private(_) => "private",
        Storage::Replicated(_) => "private-standby",
        Storage::Patroni(_) => "patroni",
    }
}

pub fn redis_mode(cluster: &Cluster) -> &'static str {
    match cluster.redis {
        RedisHost::External(_) => "system",
        RedisHost::Private(_) => "private",
    }
}

/// Writes the pid and URL files of every process and server, the env files and the Prometheus
/// targets.
pub fn write(dir: &Path, cluster: &mut Cluster) -> Result<()> {
    let run = run_dir(dir);
    let mut urls = (Vec::new(), Vec::new());
    for service in cluster.services() {
        let Some(pid) = service.pid() else { continue };
        write_pid(&run.join(format!("{}.pid", service.id)), pid, &service.bin)?;
        std::fs::write(run.join(format!("{}.url", service.id)), &service.url)?;
        match service.role {
            testkit::cluster::Role::Allocator => urls.0.push(service.url.clone()),
            testkit::cluster::Role::Router => urls.1.push(service.url.clone()),
        }
    }
    if let Some(server) = cluster.pg.primary() {
        std::fs::write(run.join("postgres.pid"), format!("{}\n", server.pid()))?;
    }
    for shard in &cluster.extra_shards {
        let pidfile = run.join(format!("postgres-{}.pid", shard.name));
        std::fs::write(pidfile, format!("{}\n", shard.server.pid()))?;
    }
    if let Some(pid) = cluster.redis.pid() {
        std::fs::write(run.join("redis.pid"), format!("{pid}\n"))?;
    }
    // The private servers' temporary directories, for `down` to remove when the supervisor
    // could not (it was killed).
    let mut dirs: Vec<PathBuf> = cluster
        .pg
        .servers()
        .into_iter()
        .chain(cluster.extra_shards.iter().map(|s| &s.server))
        .filter_map(|s| s.data_dir().parent().map(Path::to_path_buf))
        .collect();
    if let Ok(server) = cluster.redis.server() {
        dirs.push(server.dir().to_path_buf());
    }
    if let Storage::Patroni(patroni) = &cluster.pg {
        dirs.push(patroni.dir().to_path_buf());
    }
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    std::fs::write(run.join("server-dirs"), dirs.join("\n"))?;
    let services = format!(
        "export DATABASE_URL={}\nexport SHARD_URLS={}\nexport REDIS_URL={}\nexport CLUSTER_PG_MODE={}\nexport CLUSTER_REDIS_MODE={}\n",
        quoted(&cluster.db_url),
        quoted(
            &cluster
                .shard_urls()
                .iter()
                .map(|(name, url)| format!("{name}={url}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        quoted(&cluster.redis.url()),
        pg_mode(cluster),
        redis_mode(cluster),
    );
    // With Patroni, `patronictl list` (switchover, ...) works in a shell that sourced the env.
    let services = match &cluster.pg {
        Storage::Patroni(patroni) => format!(
            "{services}export PATRONICTL_CONFIG_FILE={}\n",
            quoted(&patroni.nodes()[0].config_path().display().to_string())
        ),
        _ => services,
    };
    let (allocators, routers) = urls;
    let processes = format!(
        "export ROUTER_URL={}\nexport ROUTER_URLS={}\nexport ALLOCATOR_URLS={}\n",
        quoted(routers.first().map_or("", String::as_str)),
        quoted(&routers.join(" ")),
        quoted(&allocators.join(" ")),
    );
    std::fs::write(
        dir.join("env"),
        format!("# written by cluster up\n{services}"),
    )?;
    std::fs::write(
        dir.join("cluster.env"),
        format!("# written by cluster up\n{services}{processes}"),
    )?;
    // Prometheus file_sd targets (see ops/prometheus/prometheus.yml).
    let prometheus = dir.join("prometheus");
    std::fs::create_dir_all(&prometheus)?;
    for (job, role) in [
        ("allocator", testkit::cluster::Role::Allocator),
        ("router", testkit::cluster::Role::Router),
    ] {
        let targets: Vec<serde_json::Value> = cluster
            .services()
            .filter(|s| s.role == role)
            .map(|s| {
                serde_json::json!({
                    "targets": [format!("127.0.0.1:{}", s.port)],
                    "labels": {"replica": s.id},
                })
            })
            .collect();
        std::fs::write(
            prometheus.join(format!("{job}.json")),
            serde_json::to_vec_pretty(&targets)?,
        )?;
    }
    Ok(())
}

/// Removes the private servers' directories recorded by [`write`] (only ones named like
/// testkit's temporary directories).
pub fn remove_server_dirs(dir: &Path) {
    let Ok(text) = std::fs::read_to_string(run_dir(dir).join("server-dirs")) else {
        return;
    };
    for line in text.lines() {
        let path = Path::new(line);
        let ours = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with("allocator-pg-")
                || n.starts_with("allocator-redis-")
                || n.starts_with("allocator-patroni-")
        });
        if ours {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Removes what [`write`] wrote (logs stay).
pub fn clear(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(run_dir(dir)) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let _ = std::fs::remove_file(dir.join("env"));
    let _ = std::fs::remove_file(dir.join("cluster.env"));
}

/// Reads `KEY` from the env file of a running cluster.
pub fn env_value(dir: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("cluster.env"))
        .or_else(|_| std::fs::read_to_string(dir.join("env")))
        .ok()?;
    text.lines().find_map(|line| {
        let value = line.strip_prefix(&format!("export {key}="))?;
        Some(value.trim_matches('\'').replace(r"'\''", "'"))
    })
}
