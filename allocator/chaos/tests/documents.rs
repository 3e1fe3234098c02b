//! The documents name only flags and environment variables that exist.
//!
//! Every `--flag` and every `NAME_WITH_UNDERSCORES` written in code spans of the documents
//! must be one that a workspace binary's `--help` (every subcommand, found by
//! reading each help's `Commands:` list) or an `ops/*.sh` script's usage header names, or be a
//! flag of an outside tool the documents show a command line of (listed below with the tool).
//! Environment variables may also be ones a script reads. A configuration-table row that pairs
//! flags with variables (`| --a / --b | A_ENV / B_ENV |`) must pair them as `--help` does, and a
//! plain default in that row must be the one `--help` prints.
//!
//! The binaries come from the workspace build: `ops/test.sh` (a workspace run) builds them all;
//! run alone, build first with `cargo build --bins`.
//!
//! Every tracked `*.md` is read ([`refs::tracked_documents`]); [`refs`] checks links, cited
//! paths, metric and alert names.

#[path = "documents/refs.rs"]
mod refs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Binaries whose `--help` is the reference, with the variable cargo sets for this package's own.
const BINARIES: [&str; 6] = [
    "allocator",
    "router",
    "loadtest",
    "chaos",
    "chaos-check",
    "cluster",
];

/// Flags of outside tools that the documents show on a command line, by tool.
const OUTSIDE_FLAGS: &[(&str, &[&str])] = &[
    (
        "cargo",
        &[
            "--workspace",
            "--all-targets",
            "--test",
            "--release",
            "--locked",
            "--all",
            "--nocapture",
            "--test-threads",
            "--bins",
            "--example",
        ],
    ),
    ("promtool", &["--strict"]),
    ("check-jsonschema", &["--builtin-schema"]),
    ("docker compose", &["--build"]),
    ("perf record", &["--call-graph"]),
    ("ps", &["--sort"]),
    ("patronictl switchover", &["--force"]),
    ("pgbackrest", &["--config", "--stanza"]),
    ("pg_receivewal", &["--synchronous"]),
];

/// Variables of the toolchain and of the outside world that the documents mention.
const OUTSIDE_VARIABLES: &[&str] = &["CARGO_TARGET_DIR", "RUST_LOG"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("allocator/chaos is two levels below the repository root")
        .to_path_buf()
}

/// Newest modification time of the Rust sources the binaries are built from.
fn newest_source() -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut dirs: Vec<PathBuf> = ["allocator", "router", "loadtest", "schema"]
        .iter()
        .map(|d| repo_root().join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && name != "tests" {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Ok(modified) = entry.metadata().and_then(|m| m.modified()) {
                    newest = newest.max(modified);
                }
            }
        }
    }
    newest
}

fn binary(name: &str) -> PathBuf {
    // This package's own binaries are built by the cargo run that runs this test.
    match name {
        "chaos" => return PathBuf::from(env!("CARGO_BIN_EXE_chaos")),
        "chaos-check" => return PathBuf::from(env!("CARGO_BIN_EXE_chaos-check")),
        _ => {}
    }
    let bin = testkit::cargo_bin(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --bins` (or the workspace's tests) first",
        bin.display()
    );
    // A run of this package alone does not rebuild the others' binaries: refuse to read the
    // help of a build older than the sources rather than report a stale difference.
    let built = bin
        .metadata()
        .and_then(|m| m.modified())
        .expect("binary mtime");
    assert!(
        built >= newest_source(),
        "{} is older than the sources: run `cargo build --bins` (or the workspace's tests) first",
        bin.display()
    );
    bin
}

fn help(bin: &Path, path: &[String]) -> String {
    let out = Command::new(bin)
        .args(path)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {} {path:?} --help: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {path:?} --help failed",
        bin.display()
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// Subcommand names listed under `Commands:` (without clap's own `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// What one argument block of a help text says: its flag, variable and default.
#[derive(Debug, Default, Clone)]
struct Arg {
    env: Option<String>,
    default: Option<String>,
}

/// Every help text of every binary and subcommand, and the arguments they describe by flag.
#[derive(Default)]
struct Reference {
    texts: Vec<String>,
    args: BTreeMap<String, Vec<Arg>>,
}

impl Reference {
    fn collect() -> Self {
        let mut reference = Self::default();
        for name in BINARIES {
            let bin = binary(name);
            let mut pending = vec![Vec::<String>::new()];
            while let Some(path) = pending.pop() {
                let text = help(&bin, &path);
                for sub in subcommands(&text) {
                    let mut next = path.clone();
                    next.push(sub);
                    pending.push(next);
                }
                reference.parse_args(&text);
                reference.texts.push(text);
            }
        }
        reference
    }

    /// Splits a long help text into argument blocks (a line starting with `-`, up to the next
    /// one) and records each block's `[env: X=]` and `[default: Y]`.
    fn parse_args(&mut self, text: &str) {
        let mut blocks: Vec<(Vec<String>, String)> = Vec::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with('-') && line.len() - trimmed.len() <= 6 {
                let flags = trimmed
                    .split([',', ' ', '='])
                    .filter(|w| w.starts_with("--"))
                    .map(str::to_owned)
                    .collect();
                blocks.push((flags, String::new()));
            } else if let Some((_, body)) = blocks.last_mut() {
                body.push_str(trimmed);
                body.push('\n');
            }
        }
        for (flags, body) in blocks {
            let bracket = |key: &str| {
                let start = body.find(&format!("[{key}: "))? + key.len() + 3;
                let end = body[start..].find(']')? + start;
                Some(body[start..end].trim_end_matches('=').to_owned())
            };
            let arg = Arg {
                env: bracket("env").map(|e| e.split('=').next().unwrap().to_owned()),
                default: bracket("default"),
            };
            for flag in flags {
                self.args.entry(flag).or_default().push(arg.clone());
            }
        }
    }
}

/// Text in backticks (inline spans and fenced blocks) of a Markdown document.
fn code_spans(markdown: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            spans.push(line.to_owned());
            continue;
        }
        spans.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
    }
    spans
}

fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("--") {
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-') {
            continue;
        }
        let word: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if word.starts_with(|c: char| c.is_ascii_lowercase()) {
            out.insert(format!("--{}", word.trim_end_matches('-')));
        }
    }
    out
}

fn variables_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .filter(|w| {
            w.contains('_')
                && w.starts_with(|c: char| c.is_ascii_uppercase())
                && !w.ends_with('_')
                && w.chars().any(|c| c.is_ascii_uppercase())
        })
        .map(str::to_owned)
        .collect()
}

/// Each script under `ops/`: its usage header (what `--help` prints) and its whole source.
fn scripts() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![repo_root().join("ops")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("ops/ is readable") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "sh") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            let header = source
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n");
            out.push((header, source));
        }
    }
    out
}

fn documents() -> Vec<(String, String)> {
    refs::tracked_documents()
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(repo_root().join(&name)).unwrap();
            (name, text)
        })
        .collect()
}

#[test]
fn every_flag_and_variable_the_documents_name_exists() {
    let reference = Reference::collect();
    let scripts = scripts();
    let mut known_flags: BTreeSet<String> = reference.args.keys().cloned().collect();
    let mut known_vars = BTreeSet::new();
    for text in &reference.texts {
        known_vars.extend(variables_in(text));
    }
    for (header, source) in &scripts {
        known_flags.extend(flags_in(header));
        known_vars.extend(variables_in(header));
        known_vars.extend(variables_in(source));
    }
    for (_, flags) in OUTSIDE_FLAGS {
        known_flags.extend(flags.iter().map(|f| f.to_string()));
    }
    known_vars.extend(OUTSIDE_VARIABLES.iter().map(|v| v.to_string()));

    let mut unknown = Vec::new();
    for (name, text) in documents() {
        for span in code_spans(&text) {
            for flag in flags_in(&span) {
                if !known_flags.contains(&flag) {
                    unknown.push(format!("{name}: flag {flag} (in `{span}`)"));
                }
            }
            // `schema::routes::OPEN_PATHS` is a Rust item, not a variable.
            let span = span
                .split_whitespace()
                .filter(|w| !w.contains("::"))
                .collect::<Vec<_>>()
                .join(" ");
            for var in variables_in(&span) {
                if !known_vars.contains(&var) {
                    unknown.push(format!("{name}: variable {var} (in `{span}`)"));
                }
            }
        }
    }
    unknown.dedup();
    assert!(
        unknown.is_empty(),
        "named in the documents but in no binary's --help, no ops script and no listed outside tool:\n  {}",
        unknown.join("\n  ")
    );
}

/// Cells of a Markdown table row, trimmed.
fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

/// Backticked items of a cell split on ` / ` (`--a` / `--b`).
fn items(cell: &str) -> Vec<String> {
    cell.split(" / ")
        .map(|p| p.trim().trim_matches('`').to_owned())
        .collect()
}

#[test]
fn configuration_tables_pair_flags_with_their_variables_and_defaults() {
    let reference = Reference::collect();
    let mut wrong = Vec::new();
    let mut rows = 0;
    for (name, text) in documents() {
        for line in text.lines().filter(|l| l.starts_with("| `--")) {
            let cells = cells(line);
            if cells.len() < 3 || !cells[1].starts_with('`') {
                continue;
            }
            let flags = items(&cells[0]);
            let vars = items(&cells[1]);
            if flags.len() != vars.len() || vars.iter().any(|v| variables_in(v).len() != 1) {
                continue;
            }
            rows += 1;
            let defaults = items(&cells[2]);
            for (i, (flag, var)) in flags.iter().zip(&vars).enumerate() {
                let Some(args) = reference.args.get(flag) else {
                    wrong.push(format!("{name}: {flag} is in no --help"));
                    continue;
                };
                let Some(arg) = args.iter().find(|a| a.env.as_deref() == Some(var.as_str())) else {
                    let envs: Vec<_> = args.iter().filter_map(|a| a.env.clone()).collect();
                    wrong.push(format!(
                        "{name}: {flag} reads {envs:?}, the table says {var}"
                    ));
                    continue;
                };
                // A plain default (a number, `true`/`false`, an address) must be --help's.
                let Some(doc_default) = defaults.get(i).filter(|_| defaults.len() == flags.len())
                else {
                    continue;
                };
                let plain = doc_default
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".:_".contains(c));
                if plain
                    && ["none", "off", "CPUs"].iter().all(|w| doc_default != w)
                    && arg.default.as_deref() != Some(doc_default.as_str())
                {
                    wrong.push(format!(
                        "{name}: {flag} defaults to {:?} in --help, the table says {doc_default}",
                        arg.default
                    ));
                }
            }
        }
    }
    assert!(
        rows >= 10,
        "found only {rows} configuration rows: has the table's shape changed?"
    );
    assert!(
        wrong.is_empty(),
        "configuration tables:\n  {}",
        wrong.join("\n  ")
    );
}
