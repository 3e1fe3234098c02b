//! The stored functions kept in `schema/functions/`: after migrating, every one of them is its
//! file as PostgreSQL stores it; on a database the migrations alone brought to V28 (every
//! cluster before the files existed) revision 1 of each file changes no behaviour; and the
//! install step's record decides what a later `allocator migrate` does.

use schema::functions::{FunctionOutcome, FUNCTION_FILES};
use schema::SchemaError;
use testkit::shared::fresh_database;
use tokio_postgres::Client;

use crate::common::*;

mod migrations_only {
    // Every migration, applied by the same runner (and so with the same recorded checksums) as
    // `allocator migrate`, without the install step that follows them there.
    refinery::embed_migrations!("../schema/migrations");
}

/// The schema a file is installed into, in a transaction rolled back, to read it back as
/// PostgreSQL stores it.
const SCRATCH: &str = "function_files";

/// `pg_get_functiondef` of `name` in `schema`, the schema written as `public`.
async fn definition(pg: &Client, schema: &str, name: &str) -> String {
    let row = pg
        .query_one(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = $1 AND p.proname = $2",
            &[&schema, &name],
        )
        .await
        .unwrap_or_else(|e| panic!("{schema}.{name}: {e}"));
    let text: String = row.get(0);
    text.replacen(&format!("FUNCTION {schema}."), "FUNCTION public.", 1)
}

/// The file's definition as PostgreSQL stores it.
async fn filed_definition(pg: &Client, sql: &str, name: &str) -> String {
    pg.batch_execute(&format!(
        "BEGIN; CREATE SCHEMA {SCRATCH}; SET LOCAL search_path = {SCRATCH}, public;"
    ))
    .await
    .unwrap();
    pg.batch_execute(sql).await.expect(name);
    let text = definition(pg, SCRATCH, name).await;
    pg.batch_execute("ROLLBACK").await.unwrap();
    text
}

/// The functions whose stored definition is not their file's, compared whole.
async fn functions_unlike_their_files(pg: &Client) -> Vec<&'static str> {
    let mut unlike = Vec::new();
    for file in FUNCTION_FILES {
        if definition(pg, "public", file.name).await
            != filed_definition(pg, file.sql, file.name).await
        {
            unlike.push(file.name);
        }
    }
    unlike
}

async fn migrate_report(pg: &mut Client) -> Result<schema::MigrationReport, SchemaError> {
    schema::initialise(pg, Some(2)).await
}

fn outcome_of(report: &schema::MigrationReport, name: &str) -> FunctionOutcome {
    let function = report.functions.iter().find(|f| f.name == name).unwrap();
    function.outcome.clone()
}

/// Change one character of the fence function's stored text, as the migrations up to V28
/// edited it (`pg_get_functiondef`, `replace`, `EXECUTE`).
async fn edit_fence_function(pg: &Client) {
    let row = pg
        .query_one(
            "SELECT pg_get_functiondef('apply_fenced_batch'::regproc)",
            &[],
        )
        .await
        .unwrap();
    let text: String = row.get(0);
    let edited = text.replacen("does not exist'", "does not exist!'", 1);
    assert_ne!(edited, text);
    pg.batch_execute(&edited)
        .await
        .expect("edit the stored text");
}

/// A function body without its comments and layout: string literals kept whole, whitespace
/// kept only between two word characters (as one space), the declarations in one order.
fn normalised(body: &str) -> String {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "_$#".contains(c));
    let chars: Vec<char> = body.chars().collect();
    let (mut out, mut i, mut space) = (String::new(), 0, false);
    while i < chars.len() {
        let c = chars[i];
        if c == '-' && chars.get(i + 1) == Some(&'-') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c.is_whitespace() {
            space = true;
            i += 1;
            continue;
        }
        if space && word(out.chars().last()) && word(Some(c)) {
            out.push(' ');
        }
        space = false;
        out.push(c);
        i += 1;
        if c == '\'' {
            // The literal as written, '' included.
            loop {
                let d = chars[i];
                out.push(d);
                i += 1;
                if d == '\'' && chars.get(i) == Some(&'\'') {
                    out.push('\'');
                    i += 1;
                } else if d == '\'' {
                    break;
                }
            }
        }
    }
    let (Some(declare), Some(begin)) = (out.find("DECLARE"), out.find("BEGIN")) else {
        return out;
    };
    let start = declare + "DECLARE".len();
    let mut declarations: Vec<&str> = out[start..begin]
        .split(';')
        .filter(|d| !d.is_empty())
        .collect();
    declarations.sort_unstable();
    format!(
        "{}{};{}",
        &out[..start],
        declarations.join(";"),
        &out[begin..]
    )
}

/// What PostgreSQL prints before the body (name, arguments and their defaults, result,
/// language, settings), and the body.
async fn header_and_body(pg: &Client, name: &str) -> (String, String) {
    let text = definition(pg, "public", name).await;
    let header = text.split("\nAS ").next().unwrap().to_string();
    let row = pg
        .query_one(
            "SELECT prosrc FROM pg_proc WHERE oid = $1::text::regproc",
            &[&name],
        )
        .await
        .unwrap();
    (header, row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_installs_every_function_file_as_written() {
    let url = fresh_database("functions").await.expect("create database");
    let mut pg = client(&url).await;
    let report = migrate_report(&mut pg).await.expect("migrate");
    assert_eq!(report.functions.len(), FUNCTION_FILES.len());
    for file in FUNCTION_FILES {
        assert_eq!(
            outcome_of(&report, file.name),
            FunctionOutcome::Installed { replaced: None }
        );
    }
    assert_eq!(functions_unlike_their_files(&pg).await, Vec::<&str>::new());

    // What was installed is recorded: the revision and the file's SHA-256.
    for file in FUNCTION_FILES {
        let row = pg
            .query_one(
                "SELECT revision, sha256 = encode(sha256(convert_to($2::text, 'UTF8')), 'hex')
                   FROM schema_functions WHERE name = $1",
                &[&file.name, &file.sql],
            )
            .await
            .expect(file.name);
        assert_eq!(row.get::<_, i32>(0), file.revision, "{}", file.name);
        assert!(row.get::<_, bool>(1), "{}: recorded digest", file.name);
    }

    // Nothing to do the second time.
    let again = migrate_report(&mut pg).await.expect("migrate again");
    assert!(again
        .functions
        .iter()
        .all(|f| f.outcome == FunctionOutcome::Unchanged));

    // One character of the stored text changed outside the step is told apart from the file,
    // and the next migrate puts the file back.
    edit_fence_function(&pg).await;
    assert_eq!(
        functions_unlike_their_files(&pg).await,
        vec!["apply_fenced_batch"]
    );
    let repaired = migrate_report(&mut pg)
        .await
        .expect("migrate after the edit");
    assert_eq!(
        outcome_of(&repaired, "apply_fenced_batch"),
        FunctionOutcome::Repaired
    );
    assert_eq!(
        outcome_of(&repaired, "ledger_archive_detach"),
        FunctionOutcome::Unchanged
    );
    assert_eq!(functions_unlike_their_files(&pg).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_database_the_migrations_alone_made_changes_no_behaviour() {
    let url = fresh_database("functions").await.expect("create database");
    let mut pg = client(&url).await;
    migrations_only::migrations::runner()
        .set_abort_divergent(true)
        .run_async(&mut pg)
        .await
        .expect("V1..V28");
    let mut before = Vec::new();
    for file in FUNCTION_FILES {
        before.push(header_and_body(&pg, file.name).await);
    }
    let report = migrate_report(&mut pg).await.expect("migrate");
    for (file, (header, body)) in FUNCTION_FILES.iter().zip(before) {
        assert_eq!(
            outcome_of(&report, file.name),
            FunctionOutcome::Installed { replaced: None }
        );
        let (new_header, new_body) = header_and_body(&pg, file.name).await;
        // The signature never changes: the previous release's replicas call it.
        assert_eq!(header, new_header, "{}: the signature", file.name);
        // Revision 1 is the text the migrations left, commented and laid out for reading.
        if file.revision == 1 {
            assert_ne!(body, new_body, "{}: the file's own text", file.name);
            assert_eq!(
                normalised(&body),
                normalised(&new_body),
                "{}: revision 1 differs from what V28 left beyond comments and layout",
                file.name
            );
        }
    }
    assert_eq!(functions_unlike_their_files(&pg).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_decides_what_a_later_migrate_does() {
    let url = fresh_database("functions").await.expect("create database");
    let mut pg = client(&url).await;
    migrate_report(&mut pg).await.expect("migrate");

    // A newer release installed revision 2 (stood in for by an edit): an older build's
    // migrate, during a rolling upgrade, leaves it as it is.
    edit_fence_function(&pg).await;
    pg.execute(
        "UPDATE schema_functions SET revision = 2 WHERE name = 'apply_fenced_batch'",
        &[],
    )
    .await
    .unwrap();
    let report = migrate_report(&mut pg).await.expect("migrate, older build");
    assert_eq!(
        outcome_of(&report, "apply_fenced_batch"),
        FunctionOutcome::Newer { recorded: 2 }
    );
    assert_eq!(
        functions_unlike_their_files(&pg).await,
        vec!["apply_fenced_batch"]
    );

    // The file differs from the text its revision installed: refused, nothing written.
    pg.execute(
        "UPDATE schema_functions SET revision = 1, sha256 = repeat('0', 64)
          WHERE name = 'apply_fenced_batch'",
        &[],
    )
    .await
    .unwrap();
    let refused = migrate_report(&mut pg)
        .await
        .expect_err("a changed file, same revision");
    assert!(
        matches!(
            refused,
            SchemaError::FunctionFileChanged {
                name: "apply_fenced_batch",
                revision: 1
            }
        ),
        "{refused}"
    );
    assert_eq!(
        functions_unlike_their_files(&pg).await,
        vec!["apply_fenced_batch"]
    );

    // No record (a database from before the step): the file is installed over what is there.
    pg.execute(
        "DELETE FROM schema_functions WHERE name = 'apply_fenced_batch'",
        &[],
    )
    .await
    .unwrap();
    let report = migrate_report(&mut pg).await.expect("migrate, no record");
    assert_eq!(
        outcome_of(&report, "apply_fenced_batch"),
        FunctionOutcome::Installed { replaced: None }
    );
    assert_eq!(functions_unlike_their_files(&pg).await, Vec::<&str>::new());
}
