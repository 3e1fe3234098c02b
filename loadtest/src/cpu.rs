//! CPU cost per operation, read from `/proc` (through the test kit's process-table helpers).
//!
//! A benchmark that only reports throughput and latency hides what each operation costs: on a
//! shared machine the server, the database and the load generator compete for the same cores,
//! and a cheaper service shows up first as fewer CPU microseconds per request. So a run can name
//! the processes to watch (`--cpu-watch postgres=PID`); each is read as a whole process tree (a
//! PostgreSQL postmaster with all its backends, including those that start or exit during the
//! run) right before the load starts and right after it ends, and the difference is divided by
//! the operations completed in between. The load generator reports its own CPU the same way, so a
//! table can show whether the generator or the service was measured.
//!
//! `loadtest cpu --watch ... --out FILE -- CMD ...` does the same around another load generator
//! (pgbench): it runs the command, and reports the command's CPU (it is this process's child, so
//! its time arrives in our children time when it has been waited for) beside the watched trees.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

/// A process tree to watch: `NAME=PID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub name: String,
    pub pid: u32,
}

impl FromStr for Watch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, pid) = s
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
        let pid = pid
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{s:?}: the PID must be a positive integer"))?;
        if name.is_empty() {
            return Err(format!("{s:?}: empty name"));
        }
        Ok(Watch {
            name: name.to_owned(),
            pid,
        })
    }
}

/// CPU one process (tree) spent in the measured window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessCpu {
    pub name: String,
    /// `None` for the load generator itself.
    pub pid: Option<u32>,
    pub cpu_secs: f64,
    /// CPU microseconds per completed operation; `None` without operations.
    pub us_per_op: Option<f64>,
    /// Average cores busy over the window.
    pub cores: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CpuReport {
    pub window_secs: f64,
    pub operations: u64,
    pub processes: Vec<ProcessCpu>,
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Readings at the start of a window.
pub struct CpuMeter {
    watches: Vec<(Watch, Duration)>,
    own: Duration,
    children: Duration,
    started: Instant,
}

fn own_times() -> testkit::CpuTimes {
    testkit::cpu_times(std::process::id()).unwrap_or_default()
}

impl CpuMeter {
    /// Read every watched tree and this process now. A watched process that does not exist is
    /// an error: a benchmark must not silently report zero for it.
    pub fn start(watches: &[Watch]) -> anyhow::Result<CpuMeter> {
        let watches = watches
            .iter()
            .map(|w| {
                testkit::tree_cpu_time(w.pid)
                    .map(|t| (w.clone(), t))
                    .with_context(|| format!("--cpu-watch {}={}: no such process", w.name, w.pid))
            })
            .collect::<anyhow::Result<_>>()?;
        let own = own_times();
        Ok(CpuMeter {
            watches,
            own: own.own,
            children: own.children,
            started: Instant::now(),
        })
    }

    /// Close the window. `me` names this process's own CPU (`None`: leave it out) and
    /// `children` the CPU of children waited for meanwhile (`None`: leave it out).
    pub fn finish(self, operations: u64, me: Option<&str>, children: Option<&str>) -> CpuReport {
        let window = self.started.elapsed().as_secs_f64();
        let now = own_times();
        let entry = |name: &str, pid: Option<u32>, spent: Duration| {
            let secs = spent.as_secs_f64();
            ProcessCpu {
                name: name.to_owned(),
                pid,
                cpu_secs: round(secs, 3),
                us_per_op: (operations > 0).then(|| round(secs * 1e6 / operations as f64, 1)),
                cores: if window > 0.0 {
                    round(secs / window, 3)
                } else {
                    0.0
                },
            }
        };
        let mut processes: Vec<ProcessCpu> = self
            .watches
            .iter()
            .map(|(w, before)| {
                // A tree that vanished spent at least nothing more; report what is known.
                let after = testkit::tree_cpu_time(w.pid).unwrap_or(*before);
                entry(&w.name, Some(w.pid), after.saturating_sub(*before))
            })
            .collect();
        if let Some(name) = me {
            processes.push(entry(name, None, now.own.saturating_sub(self.own)));
        }
        if let Some(name) = children {
            processes.push(entry(
                name,
                None,
                now.children.saturating_sub(self.children),
            ));
        }
        CpuReport {
            window_secs: round(window, 3),
            operations,
            processes,
        }
    }
}

impl CpuReport {
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "cpu over {:.1}s, {} operations:",
            self.window_secs, self.operations
        );
        for p in &self.processes {
            let per_op = p.us_per_op.map_or("-".to_owned(), |us| format!("{us:.1}"));
            out.push_str(&format!(
                " {} {:.2}s ({} µs/op, {:.2} cores);",
                p.name, p.cpu_secs, per_op, p.cores
            ));
        }
        out.pop();
        out.push('\n');
        out
    }
}

/// `loadtest cpu`: run a command and report its CPU and the watched trees' over its run.
#[derive(Debug, clap::Args)]
pub struct CpuArgs {
    /// A process tree to watch, `NAME=PID` (repeatable).
    #[arg(long = "watch")]
    watches: Vec<Watch>,
    /// Where the JSON report goes (the command keeps stdout and stderr).
    #[arg(long)]
    out: PathBuf,
    /// The command's name in the report.
    #[arg(long, default_value = "command")]
    name: String,
    /// Operations the command completed, when known beforehand (else 0: no per-operation
    /// figures; the caller divides).
    #[arg(long, default_value_t = 0)]
    operations: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn cmd_cpu(args: CpuArgs) -> anyhow::Result<ExitCode> {
    let meter = CpuMeter::start(&args.watches)?;
    let status = std::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .status()
        .with_context(|| format!("running {:?}", args.command[0]))?;
    let report = meter.finish(args.operations, None, Some(&args.name));
    let mut json = serde_json::to_string_pretty(&report)?;
    json.push('\n');
    std::fs::write(&args.out, json).with_context(|| format!("writing {}", args.out.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::from(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_watches() {
        assert_eq!(
            "postgres=123".parse::<Watch>(),
            Ok(Watch {
                name: "postgres".into(),
                pid: 123
            })
        );
        assert!("postgres".parse::<Watch>().is_err());
        assert!("postgres=0".parse::<Watch>().is_err());
        assert!("=5".parse::<Watch>().is_err());
        assert!("pg=x".parse::<Watch>().is_err());
    }

    #[test]
    fn a_missing_process_is_refused() {
        let gone = Watch {
            name: "gone".into(),
            pid: u32::MAX,
        };
        assert!(CpuMeter::start(&[gone]).is_err());
    }

    #[test]
    fn reports_the_watched_tree_and_the_command_per_operation() {
        let me = Watch {
            name: "self".into(),
            pid: std::process::id(),
        };
        let meter = CpuMeter::start(&[me]).expect("this process exists");
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let report = meter.finish(1000, Some("loadtest"), Some("sh"));
        let names: Vec<&str> = report.processes.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["self", "loadtest", "sh"]);
        let sh = &report.processes[2];
        assert!(sh.cpu_secs > 0.0, "{report:?}");
        let us = sh.us_per_op.expect("operations > 0");
        assert!((us - sh.cpu_secs * 1000.0).abs() <= 1.0, "{report:?}");
        // The watched tree (this process) contains the waited-for child.
        assert!(report.processes[0].cpu_secs >= sh.cpu_secs, "{report:?}");
        assert!(meter_without_operations().processes[0].us_per_op.is_none());
    }

    fn meter_without_operations() -> CpuReport {
        CpuMeter::start(&[])
            .expect("no watches")
            .finish(0, Some("loadtest"), None)
    }
}
