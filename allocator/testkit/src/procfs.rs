//! Minimal `/proc` process-table helpers shared by the server harnesses and the load generator.
//!
//! PostgreSQL is a multi-process server: the postmaster forks one backend per client connection
//! plus a handful of auxiliary processes. Freezing or killing only the postmaster does not model a
//! stalled or crashed database host, because the backends keep serving their existing
//! connections. The harness therefore needs the set of the postmaster's descendants, which Linux
//! exposes through the parent-pid field of `/proc/<pid>/stat`.
//!
//! Every process is identified by its pid *and* its start time. A process we signal late (for
//! example a backend that was re-parented to init after its postmaster died) might have exited
//! and had its pid reused; checking the start time before signalling makes sure the harness never
//! hits an unrelated process on the machine.

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

/// One process, identified robustly against pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcId {
    /// The kernel pid, used to address signals.
    pub pid: i32,
    /// `starttime` from `/proc/<pid>/stat` (clock ticks after boot); together with the pid it
    /// uniquely names a process for the lifetime of the machine, so a recycled pid is detected.
    pub start_time: u64,
}

/// The fields of `/proc/<pid>/stat` the harness needs.
#[derive(Debug, Clone, Copy)]
struct Stat {
    /// Single-letter state; `Z` (zombie) and `X` (dead) mean the process no longer runs code.
    state: char,
    /// Parent pid, used to walk the process tree downwards.
    ppid: i32,
    /// Start time, see [`ProcId::start_time`].
    start_time: u64,
    /// User plus system CPU of the process (all its threads), in clock ticks.
    own_ticks: u64,
    /// User plus system CPU of its children that it has waited for, in clock ticks.
    children_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is wrapped in parentheses and may itself
/// contain spaces or parentheses, so parsing starts after the *last* `)`.
fn read_stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime, stime, cutime, cstime are fields 14-17 and
    // starttime is field 22 (proc(5)).
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    Some(Stat {
        state,
        ppid,
        start_time: field(22)?,
        own_ticks: field(14)? + field(15)?,
        children_ticks: field(16)? + field(17)?,
    })
}

/// Identifies the live process `pid`, if it exists.
pub(crate) fn proc_id(pid: i32) -> Option<ProcId> {
    read_stat(pid).map(|s| ProcId {
        pid,
        start_time: s.start_time,
    })
}

/// All (transitive) descendants of `root`, excluding `root` itself; every process is listed
/// before its own children.
pub(crate) fn descendants(root: i32) -> Vec<ProcId> {
    descendant_stats(root)
        .into_iter()
        .map(|(pid, stat)| ProcId {
            pid,
            start_time: stat.start_time,
        })
        .collect()
}

/// [`descendants`] with their `/proc/<pid>/stat` fields, from one scan of the process table.
fn descendant_stats(root: i32) -> Vec<(i32, Stat)> {
    let mut children: HashMap<i32, Vec<(i32, Stat)>> = HashMap::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some(stat) = read_stat(pid) {
                children.entry(stat.ppid).or_default().push((pid, stat));
            }
        }
    }
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            queue.push(child.0);
            out.push(child);
        }
    }
    out
}

/// CPU time of one process, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// User plus system time of the process itself, all its threads.
    pub own: Duration,
    /// User plus system time of its children that have exited and been waited for.
    pub children: Duration,
}

/// The kernel's clock tick (`sysconf(_SC_CLK_TCK)`, 100 on Linux): the unit of the CPU fields.
fn ticks(n: u64) -> Duration {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100);
    Duration::from_nanos(n.saturating_mul(1_000_000_000) / hz)
}

/// CPU time of `pid` and of its waited-for children; `None` when there is no such process.
pub fn cpu_times(pid: u32) -> Option<CpuTimes> {
    let stat = read_stat(i32::try_from(pid).ok()?)?;
    Some(CpuTimes {
        own: ticks(stat.own_ticks),
        children: ticks(stat.children_ticks),
    })
}

/// CPU time spent so far by `root` and every process it ever started, transitively: the live
/// ones' own time plus what each live one has collected from children it waited for. The
/// difference of two readings is what the tree spent in between, also when processes started
/// or exited meanwhile (a PostgreSQL backend that exits is waited for by the postmaster, so its
/// time moves from its own entry into the postmaster's children time). A process whose parent
/// exited is re-parented and drops out; PostgreSQL's postmaster outlives its backends.
/// `None` when `root` does not exist.
pub fn tree_cpu_time(root: u32) -> Option<Duration> {
    let root = i32::try_from(root).ok()?;
    let stat = read_stat(root)?;
    let total = descendant_stats(root)
        .iter()
        .map(|(_, s)| s.own_ticks + s.children_ticks)
        .sum::<u64>()
        + stat.own_ticks
        + stat.children_ticks;
    Some(ticks(total))
}

/// True while the process still exists and is not a zombie.
pub(crate) fn is_alive(p: &ProcId) -> bool {
    matches!(read_stat(p.pid), Some(s) if s.start_time == p.start_time && s.state != 'Z' && s.state != 'X')
}

/// The single-letter scheduler state of `p` (`T` = stopped), or `None` once it is gone or its
/// pid was reused.
pub(crate) fn state(p: &ProcId) -> Option<char> {
    read_stat(p.pid)
        .filter(|s| s.start_time == p.start_time)
        .map(|s| s.state)
}

/// Freezes `root` and then all of its descendants with `SIGSTOP`, returning the descendants.
///
/// The root is stopped first and confirmed stopped so that it cannot fork new children while the
/// tree is being walked; the walk is repeated until it finds nothing new, which catches a child
/// forked just before the stop took effect.
pub(crate) fn freeze_tree(root: &ProcId) -> Vec<ProcId> {
    signal(root, Signal::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(2);
    while matches!(state(root), Some(s) if s != 'T' && s != 't' && s != 'Z')
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut frozen: Vec<ProcId> = Vec::new();
    loop {
        let new: Vec<ProcId> = descendants(root.pid)
            .into_iter()
            .filter(|p| !frozen.contains(p))
            .collect();
        if new.is_empty() {
            return frozen;
        }
        for p in &new {
            signal(p, Signal::SIGSTOP);
        }
        frozen.extend(new);
    }
}

/// Sends `sig` to `p` unless it has exited or its pid now belongs to another process.
/// Errors (typically "no such process" because it just exited) are ignored: callers signal whole
/// process sets where members may legitimately disappear concurrently.
pub(crate) fn signal(p: &ProcId, sig: Signal) {
    if matches!(read_stat(p.pid), Some(s) if s.start_time == p.start_time) {
        let _ = signal::kill(Pid::from_raw(p.pid), sig);
    }
}

/// Waits (blocking, polling) until none of `procs` is alive or `timeout` elapses. Returns true if
/// all are gone. Used where the harness cannot `wait()` on a process because it is not its
/// parent (re-parented backends).
pub(crate) fn wait_gone(procs: &[ProcId], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(gone) = settled(procs, deadline) {
            return gone;
        }
        std::thread::sleep(GONE_POLL);
    }
}

const GONE_POLL: Duration = Duration::from_millis(10);

/// One poll of the wait loops: `Some(true)` when every process is gone, `Some(false)` at the
/// deadline, `None` to poll again.
fn settled(procs: &[ProcId], deadline: Instant) -> Option<bool> {
    if !procs.iter().any(is_alive) {
        Some(true)
    } else if Instant::now() >= deadline {
        Some(false)
    } else {
        None
    }
}

/// Async variant of [`wait_gone`] that does not block a runtime worker thread.
pub(crate) async fn wait_gone_async(procs: &[ProcId], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(gone) = settled(procs, deadline) {
            return gone;
        }
        tokio::time::sleep(GONE_POLL).await;
    }
}

/// Resident set size of `pid` in KiB (`VmRSS` in `/proc/<pid>/status`), for memory-bound tests;
/// `None` once the process is gone.
pub fn resident_set_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The last `n` lines of a (log) file, for error messages. Missing files yield a placeholder
/// instead of an error because this is only ever used to enrich another error.
pub(crate) fn tail_file(path: &std::path::Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("<could not read {}: {e}>", path.display()),
    }
}

/// `SIGKILL`s `root` and all its descendants, reaps `root` and waits until the descendants (which
/// we cannot reap, they get re-parented) are gone, so that e.g. PostgreSQL's shared memory is
/// released before a restart. The tree is frozen first so nothing forks while it is killed.
pub(crate) fn kill_tree(root: &ProcId, child: &mut std::process::Child) {
    let tree = freeze_tree(root);
    signal(root, Signal::SIGKILL);
    for p in &tree {
        signal(p, Signal::SIGKILL);
    }
    let _ = child.wait();
    wait_gone(&tree, Duration::from_secs(5));
}

/// Processes whose command line contains `needle` (the cluster's directory).
pub(crate) fn with_cmdline(needle: &str) -> Vec<ProcId> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = needle.as_bytes();
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.windows(needle.len()).any(|w| w == needle))
        })
        .filter_map(proc_id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_fields_after_a_command_name_with_spaces_and_parentheses() {
        // proc(5) fields 1-22; comm "(a) b)" contains ") " itself.
        let line = "42 ((a) b)) S 7 42 42 0 -1 4194304 100 0 0 0 \
                    250 30 12 8 20 0 4 0 987654 1000 200";
        let stat = parse_stat(line).expect("parses");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.ppid, 7);
        assert_eq!(stat.own_ticks, 280);
        assert_eq!(stat.children_ticks, 20);
        assert_eq!(stat.start_time, 987654);
        assert!(parse_stat("42 (x) S 7").is_none());
    }

    #[test]
    fn a_waited_for_child_moves_into_the_parents_children_time() {
        let me = std::process::id();
        let before = cpu_times(me).expect("this process");
        let tree_before = tree_cpu_time(me).expect("this process");
        // A child that burns at least a few clock ticks of CPU, then is waited for.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let after = cpu_times(me).expect("this process");
        assert!(after.children > before.children, "{before:?} -> {after:?}");
        assert!(
            tree_cpu_time(me).expect("this process")
                >= tree_before + (after.children - before.children)
        );
        assert_eq!(cpu_times(u32::MAX), None);
        assert_eq!(tree_cpu_time(u32::MAX), None);
    }
}
