//! Stored functions kept whole, one file each, in `schema/functions/<name>.sql`.
//!
//! Up to V28 some migrations changed a stored function by editing its stored text
//! (`pg_get_functiondef`, `replace`, `EXECUTE`) or by replacing it whole, so the body in force
//! was written down in no file and could only be read from a migrated database. Every function
//! a migration changed after creating it now lives in a file of its own, whole and commented,
//! and the install step puts the files in force after the migrations, under the same advisory lock:
//!
//! * a file is installed when the database records no revision of it, or an older one;
//! * it is installed again when the stored text no longer is what was installed (someone or
//!   something edited the function outside this step);
//! * a database that records a newer revision is left alone: a replica of the previous release
//!   migrating during a rolling upgrade must not put its older text back;
//! * a file whose text differs from what the database recorded for the *same* revision is
//!   refused ([`crate::SchemaError::FunctionFileChanged`]): a changed text is a new revision.
//!
//! What was installed is recorded in `schema_functions` (name, revision, the file's SHA-256, the
//! SHA-256 of the stored definition right after installing, when). Migrations already applied
//! stay byte-identical (refinery refuses divergent ones), so the files start from what V28
//! leaves, and no migration after [`LAST_MIGRATION_WITH_FUNCTION_TEXT`] may edit a stored
//! function: a test refuses one that does.

#[cfg(feature = "postgres")]
mod install;
#[cfg(test)]
mod tests;

#[cfg(feature = "postgres")]
pub(crate) use install::install;

/// One stored function's file, embedded at compile time.
#[derive(Debug, Clone, Copy)]
pub struct FunctionFile {
    /// The function's name; the file is `functions/<name>.sql`.
    pub name: &'static str,
    /// Raised with every change of the text. Revision 1 is the function as V28 leaves it.
    pub revision: i32,
    /// The file: comments, then one `CREATE OR REPLACE FUNCTION <name>(…)` statement.
    pub sql: &'static str,
}

/// Every function kept in a file, in the order they are installed.
///
/// Changing a file: raise its revision here, keep its signature (arguments, their defaults and
/// the result), since the previous release's replicas call it during a rolling upgrade.
pub const FUNCTION_FILES: &[FunctionFile] = &[
    FunctionFile {
        name: "apply_fenced_batch",
        revision: 1,
        sql: include_str!("../../functions/apply_fenced_batch.sql"),
    },
    FunctionFile {
        name: "ledger_archive_detach",
        revision: 1,
        sql: include_str!("../../functions/ledger_archive_detach.sql"),
    },
];

/// The last migration that defines or edits a stored function's text: V2..V28 made the functions
/// whose revision 1 the files hold. A later migration that changes a function's behaviour
/// changes its file instead.
pub const LAST_MIGRATION_WITH_FUNCTION_TEXT: u32 = 28;

/// What the install step did with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FunctionOutcome {
    /// Already in force, as recorded.
    Unchanged,
    /// Installed; `replaced` is the revision recorded before (`None`: the first install, over the
    /// text the migrations left).
    Installed { replaced: Option<i32> },
    /// Installed again: the stored text was no longer the one this revision installed.
    Repaired,
    /// Left alone: the database records a newer revision (a newer release migrated it).
    Newer { recorded: i32 },
}

/// One line of `allocator migrate`'s report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionReport {
    pub name: &'static str,
    /// The file's revision.
    pub revision: i32,
    pub outcome: FunctionOutcome,
}

impl FunctionReport {
    /// Whether the stored function was written.
    pub fn changed(&self) -> bool {
        matches!(
            self.outcome,
            FunctionOutcome::Installed { .. } | FunctionOutcome::Repaired
        )
    }
}

impl std::fmt::Display for FunctionReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, revision) = (self.name, self.revision);
        match &self.outcome {
            FunctionOutcome::Unchanged => write!(f, "{name} revision {revision}: unchanged"),
            FunctionOutcome::Installed { replaced: None } => {
                write!(
                    f,
                    "{name} revision {revision}: installed (none recorded before)"
                )
            }
            FunctionOutcome::Installed {
                replaced: Some(old),
            } => write!(
                f,
                "{name} revision {revision}: installed over revision {old}"
            ),
            FunctionOutcome::Repaired => write!(
                f,
                "{name} revision {revision}: installed again (the stored text had changed)"
            ),
            FunctionOutcome::Newer { recorded } => write!(
                f,
                "{name}: the database holds revision {recorded}, newer than this build's \
                 {revision}; left as it is"
            ),
        }
    }
}
