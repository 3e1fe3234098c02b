//! `chaos-check DIR`: checks a chaos run's recorded history against its final database dump.
//!
//! Reads `DIR/history.jsonl`, `DIR/dump.json` (or, for a run over several shards,
//! `DIR/shards.json` and the `DIR/dump-<shard>.json` it names, merged) and, when the run had a change-event consumer,
//! `DIR/events.jsonl` with `DIR/events.heads.json`, over several shards `DIR/leases.jsonl` (the
//! harness's lease samples) and, for the table only, `DIR/faults.jsonl` and `DIR/summary.json`;
//! prints the operations, faults, memory and violations table, writes `DIR/check.json`
//! (violations per rule) and exits 1 when any rule found a violation, 2 when the input could not
//! be read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chaos::check::{check, shards, Delivery, Dump, LeaseRound, Op};
use serde_json::Value;

fn read_jsonl(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(dir: &Path) -> Result<bool, String> {
    let history: Vec<Op> = read_jsonl(&dir.join("history.jsonl"))?
        .iter()
        .map(Op::from_json)
        .collect::<Result<_, _>>()?;
    let shards_path = dir.join("shards.json");
    let mut dump = if shards_path.is_file() {
        // A run over several shards: one dump per shard, merged.
        let listing = read_json(&shards_path)?;
        let parts = shards::parts(&listing, |file| read_json(&dir.join(file)))?;
        shards::merge(&parts)?
    } else {
        Dump::from_json(&read_json(&dir.join("dump.json"))?)?
    };
    let events = dir.join("events.jsonl");
    if events.is_file() {
        let deliveries = read_jsonl(&events)?
            .iter()
            .map(Delivery::from_json)
            .collect::<Result<_, _>>()?;
        dump.deliveries = Some(deliveries);
    }
    let leases = dir.join("leases.jsonl");
    if leases.is_file() {
        let rounds = read_jsonl(&leases)?
            .iter()
            .map(LeaseRound::from_json)
            .collect::<Result<_, _>>()?;
        dump.lease_samples = Some(rounds);
    }
    let heads = dir.join("events.heads.json");
    if heads.is_file() {
        let text =
            std::fs::read_to_string(&heads).map_err(|e| format!("{}: {e}", heads.display()))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", heads.display()))?;
        let heads = v
            .as_object()
            .ok_or_else(|| format!("{}: not an object", heads.display()))?
            .iter()
            .map(|(k, n)| Ok((k.clone(), n.as_i64().ok_or(format!("{k}: not an integer"))?)))
            .collect::<Result<_, String>>()?;
        dump.final_heads = Some(heads);
    }
    let report = check(&history, &dump);

    println!("{}", report.table());
    if let Ok(faults) = read_jsonl(&dir.join("faults.jsonl")) {
        let mut per_kind: BTreeMap<String, u64> = BTreeMap::new();
        for f in &faults {
            *per_kind
                .entry(f["kind"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
        }
        println!("{:<16} {:>8}", "fault", "injected");
        for (kind, n) in &per_kind {
            println!("{kind:<16} {n:>8}");
        }
        println!("{:<16} {:>8}\n", "total", faults.len());
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("summary.json")) {
        if let Ok(summary) = serde_json::from_str::<Value>(&text) {
            if let Some(procs) = summary["rss_kib"].as_array() {
                println!(
                    "{:<12} {:>14} {:>12} {:>9}",
                    "process", "rss start KiB", "rss end KiB", "restarts"
                );
                for p in procs {
                    let show = |v: &Value| v.as_u64().map_or("-".to_owned(), |n| n.to_string());
                    println!(
                        "{:<12} {:>14} {:>12} {:>9}",
                        p["name"].as_str().unwrap_or("?"),
                        show(&p["start"]),
                        show(&p["end"]),
                        show(&p["restarts"])
                    );
                }
                println!();
            }
        }
    }
    let out = dir.join("check.json");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&report.to_json()).unwrap_or_default(),
    )
    .map_err(|e| format!("{}: {e}", out.display()))?;
    let total = report.total();
    if total == 0 {
        println!("checker: 0 violations ({} operations)", history.len());
    } else {
        println!("checker: {total} violations ({} operations)", history.len());
    }
    Ok(total == 0)
}

fn main() -> ExitCode {
    const USAGE: &str =
        "usage: chaos-check DIR   (DIR holds history.jsonl and dump.json of a chaos run)";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 1 && (args[0] == "-h" || args[0] == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.len() != 1 {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    match run(&PathBuf::from(&args[0])) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("chaos-check: {e}");
            ExitCode::from(2)
        }
    }
}
