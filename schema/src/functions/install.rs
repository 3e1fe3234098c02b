//! The install step `allocator migrate` runs after refinery's migrations, under its advisory lock.

use tokio_postgres::{Client, Transaction};

use super::{FunctionFile, FunctionOutcome, FunctionReport, FUNCTION_FILES};
use crate::error::SchemaError;

/// What the step installed, one row per function. Created here rather than by a migration, as
/// refinery creates its own history table: a migration would make the previous release's
/// `allocator migrate` refuse the database (it refuses applied migrations it does not know),
/// while this table is simply not read by it.
const CREATE_RECORD: &str = "CREATE TABLE IF NOT EXISTS schema_functions (
    name              text PRIMARY KEY,
    revision          integer NOT NULL CHECK (revision >= 1),
    sha256            text NOT NULL,
    definition_sha256 text NOT NULL,
    installed_at      timestamptz NOT NULL DEFAULT now()
)";

/// The digest of a text's UTF-8 bytes, as `sha256sum` prints it for the file.
const TEXT_SHA256: &str = "SELECT encode(sha256(convert_to($1::text, 'UTF8')), 'hex')";

/// The digest of the stored definition as PostgreSQL prints it, or no row when no single
/// function of that name is visible.
const DEFINITION_SHA256: &str =
    "SELECT encode(sha256(convert_to(pg_get_functiondef(f), 'UTF8')), 'hex')
   FROM to_regproc($1::text) AS f
  WHERE f IS NOT NULL";

const RECORD: &str = "INSERT INTO schema_functions (name, revision, sha256, definition_sha256)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE
   SET revision = EXCLUDED.revision, sha256 = EXCLUDED.sha256,
       definition_sha256 = EXCLUDED.definition_sha256, installed_at = now()";

/// Put every file of [`FUNCTION_FILES`] in force that is not (module documentation for the
/// rules), in one transaction: the functions and their record change together or not at all.
/// Call it holding the migration lock, after the migrations, as [`crate::initialise_with`] does.
pub(crate) async fn install(client: &mut Client) -> Result<Vec<FunctionReport>, SchemaError> {
    let tx = client.transaction().await?;
    tx.batch_execute(CREATE_RECORD).await?;
    let mut reports = Vec::with_capacity(FUNCTION_FILES.len());
    for file in FUNCTION_FILES {
        reports.push(install_one(&tx, file).await?);
    }
    tx.commit().await?;
    Ok(reports)
}

async fn install_one(
    tx: &Transaction<'_>,
    file: &FunctionFile,
) -> Result<FunctionReport, SchemaError> {
    let file_sha256: String = tx.query_one(TEXT_SHA256, &[&file.sql]).await?.get(0);
    let recorded = tx
        .query_opt(
            "SELECT revision, sha256, definition_sha256 FROM schema_functions WHERE name = $1",
            &[&file.name],
        )
        .await?;
    let outcome = match recorded {
        None => FunctionOutcome::Installed { replaced: None },
        Some(row) => {
            let revision: i32 = row.get(0);
            let sha256: String = row.get(1);
            let definition: String = row.get(2);
            if revision > file.revision {
                FunctionOutcome::Newer { recorded: revision }
            } else if revision < file.revision {
                FunctionOutcome::Installed {
                    replaced: Some(revision),
                }
            } else if sha256 != file_sha256 {
                return Err(SchemaError::FunctionFileChanged {
                    name: file.name,
                    revision,
                });
            } else if definition_sha256(tx, file.name).await? == Some(definition) {
                FunctionOutcome::Unchanged
            } else {
                FunctionOutcome::Repaired
            }
        }
    };
    let report = FunctionReport {
        name: file.name,
        revision: file.revision,
        outcome,
    };
    if report.changed() {
        tx.batch_execute(file.sql).await?;
        let definition = definition_sha256(tx, file.name)
            .await?
            .ok_or(SchemaError::FunctionFileDefinesNothing { name: file.name })?;
        tx.execute(
            RECORD,
            &[&file.name, &file.revision, &file_sha256, &definition],
        )
        .await?;
    }
    Ok(report)
}

async fn definition_sha256(
    tx: &Transaction<'_>,
    name: &str,
) -> Result<Option<String>, SchemaError> {
    Ok(tx
        .query_opt(DEFINITION_SHA256, &[&name])
        .await?
        .map(|row| row.get(0)))
}
