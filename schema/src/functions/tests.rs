//! The files and the migrations, read from the source tree: every file is listed and defines
//! the function it is named after, and no migration after the cutoff edits a stored function.

use std::path::PathBuf;

use super::{FUNCTION_FILES, LAST_MIGRATION_WITH_FUNCTION_TEXT};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `text` without `--` comments, lowercased, its whitespace runs one space: what the checks
/// below search, so neither a comment nor a line break hides or fakes a statement.
fn statements(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect();
    code.join(" ")
        .to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a migration's text edits a stored function, if it does: it reads a stored definition to
/// rewrite it, replaces a function, or defines, drops or alters one that has a file.
fn edits_of_functions(text: &str) -> Vec<String> {
    let code = statements(text);
    let mut found = Vec::new();
    for needle in [
        "pg_get_functiondef",
        "create or replace function",
        "create or replace procedure",
    ] {
        if code.contains(needle) {
            found.push(needle.to_string());
        }
    }
    for file in FUNCTION_FILES {
        for qualified in ["", "public."] {
            let named = format!("function {qualified}{}", file.name);
            let mut rest = code.as_str();
            while let Some(at) = rest.find(&named) {
                rest = &rest[at + named.len()..];
                // The whole name: `function apply_fenced_batch(` or `… apply_fenced_batch (`.
                if rest.starts_with('(') || rest.starts_with(" (") || rest.is_empty() {
                    found.push(named.clone());
                    break;
                }
            }
        }
    }
    found
}

/// Every `V<n>__*.sql` with its version.
fn migrations() -> Vec<(u32, PathBuf)> {
    let dir = crate_dir().join("migrations");
    let mut all: Vec<(u32, PathBuf)> = std::fs::read_dir(&dir)
        .expect("schema/migrations")
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            let version = name.strip_prefix('V')?.split("__").next()?.parse().ok()?;
            Some((version, path))
        })
        .collect();
    all.sort();
    all
}

#[test]
fn no_migration_after_the_cutoff_edits_a_stored_function() {
    let later: Vec<String> = migrations()
        .into_iter()
        .filter(|(version, _)| *version > LAST_MIGRATION_WITH_FUNCTION_TEXT)
        .filter_map(|(_, path)| {
            let found = edits_of_functions(&std::fs::read_to_string(&path).unwrap());
            (!found.is_empty()).then(|| format!("{}: {}", path.display(), found.join(", ")))
        })
        .collect();
    assert!(
        later.is_empty(),
        "a migration after V{LAST_MIGRATION_WITH_FUNCTION_TEXT} edits a stored function; change \
         its file in schema/functions/ and raise its revision instead:\n{}",
        later.join("\n")
    );
}

#[test]
fn the_cutoff_check_finds_the_edits_the_old_migrations_made() {
    // The check above would have refused every migration that patched a function's text.
    let named = |version: u32| {
        let (_, path) = migrations()
            .into_iter()
            .find(|(v, _)| *v == version)
            .unwrap();
        edits_of_functions(&std::fs::read_to_string(path).unwrap())
    };
    for version in [7, 12, 18, 19, 20, 21, 22, 25, 26, 27] {
        assert!(!named(version).is_empty(), "V{version} not caught");
    }
    assert!(named(2).contains(&"function apply_fenced_batch".to_string()));
    assert!(named(17).contains(&"function ledger_archive_detach".to_string()));
    // A migration that only calls the functions, or names them in a comment, is not an edit.
    assert!(named(28).is_empty());
    assert!(edits_of_functions("-- CREATE OR REPLACE FUNCTION apply_fenced_batch(\n").is_empty());
    assert!(edits_of_functions("SELECT ledger_archive_detach_all();").is_empty());
    assert_eq!(
        edits_of_functions("DROP   FUNCTION\n  apply_fenced_batch (text)"),
        vec!["function apply_fenced_batch".to_string()]
    );
    assert!(edits_of_functions("CREATE FUNCTION apply_fenced_batch_v2()").is_empty());
}

#[test]
fn every_file_is_listed_once_and_defines_its_function() {
    let dir = crate_dir().join("functions");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("schema/functions")
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FUNCTION_FILES
        .iter()
        .map(|f| format!("{}.sql", f.name))
        .collect();
    listed.sort();
    listed.dedup();
    assert_eq!(
        listed.len(),
        FUNCTION_FILES.len(),
        "a function listed twice"
    );
    assert_eq!(on_disk, listed, "schema/functions/ and FUNCTION_FILES");
    for file in FUNCTION_FILES {
        assert!(
            file.revision >= 1,
            "{}: revision {}",
            file.name,
            file.revision
        );
        let on_disk = std::fs::read_to_string(dir.join(format!("{}.sql", file.name))).unwrap();
        assert_eq!(file.sql, on_disk, "{} embedded as on disk", file.name);
        let code = statements(file.sql);
        let create = format!("create or replace function {}(", file.name);
        assert!(
            code.starts_with(&create),
            "{} starts with {create}",
            file.name
        );
        assert_eq!(
            code.matches("create ").count(),
            1,
            "{}: one statement",
            file.name
        );
        assert!(
            file.sql.is_ascii(),
            "{}: its digest is sha256sum's",
            file.name
        );
    }
}
