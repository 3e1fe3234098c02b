//! The documents cite only what exists: every link between documents resolves (file and
//! heading), every repository path in a code span exists, every metric and alert they name is
//! one the code declares or the rules define, and the operations runbook's metric list names
//! every metric the services export.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::{code_spans, repo_root};

/// Every tracked Markdown document (`git ls-files`), relative to the repository root.
pub fn tracked_documents() -> Vec<String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.md",
        ])
        .current_dir(repo_root())
        .output()
        .expect("git ls-files runs");
    assert!(out.status.success(), "git ls-files failed");
    let files: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|f| repo_root().join(f).is_file())
        .map(str::to_owned)
        .collect();
    assert!(files.len() >= 8, "found only {files:?}");
    files
}

fn read(name: &str) -> String {
    std::fs::read_to_string(repo_root().join(name)).unwrap()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens, and `-N`
/// for the N-th repeat of the same anchor in one document.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        let Some(title) = line.strip_prefix('#').filter(|_| !in_block) else {
            continue;
        };
        let title = title.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while out.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        out.insert(candidate);
    }
    out
}

/// Targets of inline links `[text](target)` outside fenced blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            continue;
        }
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_owned());
            }
        }
    }
    out
}

#[test]
fn every_link_between_documents_resolves() {
    let mut broken = Vec::new();
    for name in tracked_documents() {
        let text = read(&name);
        let dir = Path::new(&name).parent().unwrap_or(Path::new(""));
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                repo_root().join(&name)
            } else {
                repo_root().join(dir).join(file)
            };
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
            } else if !anchor.is_empty() && path.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&path).unwrap();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}

const TOP_LEVEL: [&str; 6] = [
    "allocator/",
    "router/",
    "schema/",
    "loadtest/",
    "ops/",
    ".ci/",
];

#[test]
fn every_repository_path_the_documents_cite_exists() {
    let mut missing = BTreeSet::new();
    for name in tracked_documents() {
        for span in code_spans(&read(&name)) {
            for word in span.split_whitespace() {
                let word = word.trim_matches(|c: char| ".,;:()'\"".contains(c));
                if !TOP_LEVEL.iter().any(|t| word.starts_with(t))
                    || word.contains(['*', '{', '<', '$', '[', '…', '='])
                    || word.contains("...")
                    || word.contains("/artifacts/")
                {
                    continue;
                }
                let path = word.split([':', '#']).next().unwrap();
                if !repo_root().join(path).exists() {
                    missing.insert(format!("{name}: {word}"));
                }
            }
        }
    }
    let missing: Vec<_> = missing.into_iter().collect();
    assert!(
        missing.is_empty(),
        "cited paths that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

/// Metric names the services declare (string literals in each service's `metrics.rs`).
fn declared_metrics() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in ["allocator/src/metrics.rs", "router/src/metrics.rs"] {
        for literal in read(file).split('"').skip(1).step_by(2) {
            if (literal.starts_with("allocator_") || literal.starts_with("router_"))
                && literal
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                out.insert(literal.to_owned());
            }
        }
    }
    assert!(out.len() > 50, "found only {} metrics", out.len());
    out
}

/// Metric-like words of a text: `allocator_…`/`router_…` names, and `*_…` for both services.
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let is_name = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    for prefix in ["allocator_", "router_", "*_"] {
        for (i, _) in text.match_indices(prefix) {
            let before = text[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || "_/.-:".contains(c)) {
                continue;
            }
            let name: String = text[i + prefix.len()..]
                .chars()
                .take_while(|c| is_name(*c))
                .collect();
            if name.is_empty() || name.ends_with('_') {
                continue;
            }
            match prefix {
                "*_" => {
                    out.insert(format!("allocator_{name}"));
                    out.insert(format!("router_{name}"));
                }
                _ => {
                    out.insert(format!("{prefix}{name}"));
                }
            }
        }
    }
    out
}

/// Words that look like metric names but name something else.
const NOT_METRICS: [&str; 3] = ["allocator_demo", "allocator_client", "allocator_handoff"];

#[test]
fn every_metric_and_alert_the_documents_name_exists() {
    let metrics = declared_metrics();
    let mut alerts = BTreeSet::new();
    for entry in std::fs::read_dir(repo_root().join("ops/prometheus")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yml") && !name.contains("test") {
            let text = std::fs::read_to_string(&path).unwrap();
            alerts.extend(text.lines().filter_map(|l| {
                l.trim()
                    .strip_prefix("- alert: ")
                    .map(|a| a.trim().to_owned())
            }));
        }
    }
    let mut unknown = BTreeSet::new();
    for name in tracked_documents() {
        for span in code_spans(&read(&name)) {
            for word in metric_words(&span) {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .unwrap_or(&word);
                let both = span.contains("*_");
                if !metrics.contains(&word)
                    && !metrics.contains(base)
                    && !NOT_METRICS.contains(&word.as_str())
                    && !(both && word.starts_with("router_"))
                {
                    unknown.insert(format!("{name}: metric {word}"));
                }
            }
            for word in span.split(|c: char| !c.is_alphanumeric()) {
                let alert_like = ["Allocator", "Router"].iter().any(|p| {
                    word.strip_prefix(p)
                        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_uppercase()))
                });
                if alert_like && !alerts.contains(word) && word != "AllocatorConfig" {
                    unknown.insert(format!("{name}: alert {word}"));
                }
            }
        }
    }
    let unknown: Vec<_> = unknown.into_iter().collect();
    assert!(
        unknown.is_empty(),
        "named in the documents, declared nowhere:\n  {}",
        unknown.join("\n  ")
    );
}

#[test]
fn the_runbook_lists_every_exported_metric() {
    let listed = metric_words(&read("ops/README.md"));
    let missing: Vec<_> = declared_metrics()
        .into_iter()
        .filter(|m| !m.ends_with("_bucket") && !listed.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "ops/README.md's metric list misses:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn anchors_follow_github() {
    let a =
        anchors("# A b\n## Shards: partitions over several primaries\n## A b\n```\n# not\n```\n");
    assert!(a.contains("a-b") && a.contains("a-b-1"));
    assert!(a.contains("shards-partitions-over-several-primaries"));
    assert!(!a.contains("not"));
}
