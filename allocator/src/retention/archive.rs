//! Archiving the ledger's oldest time partition (DESIGN.md §8a): export it to a file with its
//! SHA-256 beside it, then record, detach and drop it in one transaction; and restoring such a
//! file into a table of its own.
//!
//! Used by `allocator ledger archive` and, with `--ledger-archive-dir`, by the retention job.
//! What may go is decided in the database (`ledger_archive_refusal()`, V17): only the oldest
//! partition, only once its rows are past the idempotency horizon, every settlement window over
//! it is settled and, where change events are relayed, every position in it published; the
//! detaching statement checks all of it again under its own lock.
//!
//! Both steps lift the session's statement and idle-in-transaction timeouts for their own
//! transaction: an export is as long as a partition is large, and its file is synced to disk
//! before the transaction ends.
//!
//! 1. **Export**, in one `REPEATABLE READ` snapshot: the partition's row count, then
//!    `COPY (SELECT * FROM p ORDER BY entry_id) TO STDOUT (FORMAT csv, HEADER)` streamed into
//!    `DIR/<partition>.csv.partial` while hashing; fsync, rename to `<partition>.csv`, then
//!    `<partition>.csv.sha256` in `sha256sum` format (`sha256sum -c` verifies it).
//! 2. **Detach**: `ledger_archive_detach()` refuses if the partition may not go (nothing
//!    changes), fails if it does not hold exactly the exported rows, and otherwise records the
//!    archive (`ledger_archives`), adds its per-SKU sums to `ledger_archived_totals`, detaches
//!    and drops it. The detach needs the ledger's `ACCESS EXCLUSIVE` lock until commit (catalog
//!    changes only): inserts wait at most [`DETACH_LOCK_WAIT`] for it, then the attempt fails
//!    and is retried.
//!
//! A run that dies between the two steps leaves a complete file and the partition in place; the
//! next run writes the file again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use futures::{SinkExt, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::Client;

/// Longest wait for the ledger's lock when detaching; inserts queue behind the request that long.
pub const DETACH_LOCK_WAIT: Duration = Duration::from_millis(200);

/// What archiving needs to know.
#[derive(Debug, Clone)]
pub struct ArchiveSettings {
    /// Where the files go.
    pub dir: PathBuf,
    /// The idempotency horizon: no row younger than this goes.
    pub horizon: Duration,
    /// Every position must have been published (the cluster relays change events); also
    /// required whenever any stream was ever published.
    pub require_relay: bool,
}

/// The singleton job's fence, checked in the detaching transaction.
#[derive(Debug, Clone, Copy)]
pub struct JobFence<'a> {
    pub lease: &'a str,
    pub holder_id: &'a str,
    pub term: i64,
}

/// One archived partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedPartition {
    pub name: String,
    /// `None`: the first partition, which has no lower bound.
    pub range_start: Option<DateTime<Utc>>,
    pub range_end: DateTime<Utc>,
    pub rows: i64,
    pub file: PathBuf,
    /// 64 lower-case hex digits, as in the file beside it.
    pub sha256: String,
}

/// What one attempt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Archived {
    Done(ArchivedPartition),
    /// The oldest partition may not go yet: why.
    Refused {
        partition: String,
        reason: String,
    },
    /// The oldest partition ends after `before` (or there is none).
    Nothing,
    /// The job's lease no longer names this holder at this term; nothing changed.
    Fenced,
}

/// The oldest attached partition.
struct Oldest {
    name: String,
    range_start: Option<DateTime<Utc>>,
    range_end: DateTime<Utc>,
    /// Why it may not go; `None`: it may.
    refusal: Option<String>,
}

async fn oldest(client: &Client, settings: &ArchiveSettings) -> Result<Option<Oldest>> {
    let row = client
        .query_opt(
            "SELECT name, range_start, range_end,
                    ledger_archive_refusal(name, $1::bigint * interval '1 millisecond', $2)
               FROM ledger_partitions ORDER BY range_end LIMIT 1",
            &[&millis(settings.horizon), &settings.require_relay],
        )
        .await
        .context("reading the oldest ledger partition")?;
    Ok(row.map(|r| Oldest {
        name: r.get(0),
        range_start: r.get(1),
        range_end: r.get(2),
        refusal: r.get(3),
    }))
}

/// One line on the oldest partition: its range and whether it may be archived now, or why not.
pub async fn oldest_state(client: &Client, settings: &ArchiveSettings) -> Result<String> {
    Ok(match oldest(client, settings).await? {
        None => "no ledger partition".to_owned(),
        Some(o) => {
            let start = o
                .range_start
                .map_or_else(|| "the beginning".to_owned(), |t| t.to_rfc3339());
            let state = o.refusal.map_or_else(
                || "may be archived now".to_owned(),
                |r| format!("kept: {r}"),
            );
            format!(
                "{} (from {start} to {}): {state}",
                o.name,
                o.range_end.to_rfc3339()
            )
        }
    })
}

/// Archive the oldest partition if it ends no later than `before` (any, when `None`) and may go.
pub async fn archive_oldest(
    client: &Client,
    settings: &ArchiveSettings,
    before: Option<DateTime<Utc>>,
    fence: Option<JobFence<'_>>,
) -> Result<Archived> {
    let Some(Oldest {
        name,
        range_start,
        range_end,
        refusal,
    }) = oldest(client, settings).await?
    else {
        return Ok(Archived::Nothing);
    };
    if before.is_some_and(|b| range_end > b) {
        return Ok(Archived::Nothing);
    }
    if let Some(reason) = refusal {
        return Ok(Archived::Refused {
            partition: name,
            reason,
        });
    }
    let (rows, sha256, file) = export(client, &name, &settings.dir).await?;
    in_transaction(client, async {
        client
            .batch_execute(&format!(
                "SET LOCAL statement_timeout = 0;
                 SET LOCAL idle_in_transaction_session_timeout = 0;
                 SET LOCAL lock_timeout = {}",
                DETACH_LOCK_WAIT.as_millis()
            ))
            .await?;
        if let Some(f) = fence {
            let held = client
                .query_opt(
                    "SELECT 1 FROM leases
                      WHERE name = $1 AND holder_id = $2 AND epoch = $3 AND expires_at > now()
                        FOR KEY SHARE",
                    &[&f.lease, &f.holder_id, &f.term],
                )
                .await?;
            if held.is_none() {
                return Ok(Archived::Fenced);
            }
        }
        let row = client
            .query_one(
                "SELECT ledger_archive_detach($1, $2::bigint * interval '1 millisecond', $3, $4,
                                              $5, $6)",
                &[
                    &name,
                    &millis(settings.horizon),
                    &settings.require_relay,
                    &rows,
                    &file.display().to_string(),
                    &sha256,
                ],
            )
            .await?;
        Ok(match row.get::<_, Option<String>>(0) {
            Some(reason) => Archived::Refused {
                partition: name.clone(),
                reason,
            },
            None => Archived::Done(ArchivedPartition {
                name: name.clone(),
                range_start,
                range_end,
                rows,
                file: file.clone(),
                sha256: sha256.clone(),
            }),
        })
    })
    .await
    .with_context(|| format!("detaching ledger partition {name}"))
}

/// Run `body` between `BEGIN` and `COMMIT` on `client`; `ROLLBACK` when it fails (or is
/// [`Archived::Fenced`] or refused: nothing of it is kept).
async fn in_transaction<T, F>(client: &Client, body: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
    T: Committable,
{
    client.batch_execute("BEGIN").await?;
    match body.await {
        Ok(value) if value.commit() => {
            client.batch_execute("COMMIT").await?;
            Ok(value)
        }
        Ok(value) => {
            client.batch_execute("ROLLBACK").await?;
            Ok(value)
        }
        Err(error) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(error)
        }
    }
}

/// Whether a transaction's result is to be committed.
trait Committable {
    fn commit(&self) -> bool;
}

impl Committable for Archived {
    fn commit(&self) -> bool {
        matches!(self, Archived::Done(_))
    }
}

impl Committable for (i64, String) {
    fn commit(&self) -> bool {
        true
    }
}

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checksum file beside `file`.
pub fn checksum_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// Export partition `name` to `DIR/<name>.csv` with its checksum beside it: (rows, SHA-256, file).
async fn export(client: &Client, name: &str, dir: &Path) -> Result<(i64, String, PathBuf)> {
    tokio::fs::create_dir_all(dir)
        .await
        .with_context(|| format!("creating {}", dir.display()))?;
    let file_name = format!("{name}.csv");
    let file = dir.join(&file_name);
    let partial = dir.join(format!("{file_name}.partial"));
    let (rows, sha256) = in_transaction(client, async {
        client
            .batch_execute(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;
                 SET LOCAL statement_timeout = 0;
                 SET LOCAL idle_in_transaction_session_timeout = 0",
            )
            .await?;
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {}", quoted(name)), &[])
            .await?
            .get(0);
        let stream = client
            .copy_out(&format!(
                "COPY (SELECT * FROM {} ORDER BY entry_id) TO STDOUT WITH (FORMAT csv, HEADER true)",
                quoted(name)
            ))
            .await?;
        let mut stream = std::pin::pin!(stream);
        let mut out = tokio::io::BufWriter::new(
            tokio::fs::File::create(&partial)
                .await
                .with_context(|| format!("creating {}", partial.display()))?,
        );
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            out.write_all(&chunk).await?;
        }
        out.flush().await?;
        out.get_ref().sync_all().await?;
        Ok((rows, hex(&hasher.finalize())))
    })
    .await
    .with_context(|| format!("exporting ledger partition {name} to {}", partial.display()))?;
    tokio::fs::rename(&partial, &file).await?;
    write_synced(
        &checksum_path(&file),
        format!("{sha256}  {file_name}\n").as_bytes(),
    )
    .await?;
    // The renames are durable once the directory is.
    tokio::fs::File::open(dir).await?.sync_all().await?;
    Ok((rows, sha256, file))
}

async fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut out = tokio::fs::File::create(path)
        .await
        .with_context(|| format!("creating {}", path.display()))?;
    out.write_all(bytes).await?;
    out.sync_all().await?;
    Ok(())
}

/// The SHA-256 of `file`, checked against the checksum file beside it.
pub async fn verify(file: &Path) -> Result<String> {
    let recorded = tokio::fs::read_to_string(checksum_path(file))
        .await
        .with_context(|| format!("reading {}", checksum_path(file).display()))?;
    let recorded = recorded.split_whitespace().next().unwrap_or_default();
    let mut input = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = input.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual = hex(&hasher.finalize());
    if actual != recorded {
        bail!(
            "{}: SHA-256 is {actual}, its checksum file says {recorded}",
            file.display()
        );
    }
    Ok(actual)
}

/// What a restore loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub rows: i64,
    /// Sums of d_on_hand, d_available, d_held, d_confirmed.
    pub sums: [i64; 4],
}

/// Load an archive file into a new table `table` with the ledger's columns, after checking it
/// against its checksum; the ledger itself is not touched.
pub async fn restore(client: &Client, file: &Path, table: &str) -> Result<Restored> {
    verify(file).await?;
    let mut input = tokio::io::BufReader::new(tokio::fs::File::open(file).await?);
    let mut header = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut input, &mut header).await?;
    let columns = header.trim_end().to_owned();
    if columns.is_empty() {
        bail!("{}: no header line", file.display());
    }
    let table = quoted(table);
    client
        .batch_execute(&format!("CREATE TABLE {table} (LIKE ledger)"))
        .await
        .with_context(|| format!("creating {table}"))?;
    let sink = client
        .copy_in::<_, std::io::Cursor<Vec<u8>>>(&format!(
            "COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv, HEADER MATCH)"
        ))
        .await?;
    let mut sink = std::pin::pin!(sink);
    sink.send(std::io::Cursor::new(header.into_bytes())).await?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = input.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        sink.send(std::io::Cursor::new(buf[..n].to_vec())).await?;
    }
    sink.as_mut().finish().await?;
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), coalesce(sum(d_on_hand), 0)::bigint,
                        coalesce(sum(d_available), 0)::bigint, coalesce(sum(d_held), 0)::bigint,
                        coalesce(sum(d_confirmed), 0)::bigint
                   FROM {table}"
            ),
            &[],
        )
        .await?;
    Ok(Restored {
        rows: row.get(0),
        sums: [row.get(1), row.get(2), row.get(3), row.get(4)],
    })
}
