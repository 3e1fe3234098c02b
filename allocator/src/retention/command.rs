//! `allocator ledger …`: the operator's commands for the ledger's time partitions.
//!
//! * `allocator ledger archive --to DIR [--before TIME]` archives the oldest partitions, one at a
//!   time, for as long as the next one may go ([`super::archive`]); `--dry-run` only says what
//!   the oldest partition's state is.
//! * `allocator ledger restore --from FILE --into TABLE` checks an archive file against its
//!   checksum and loads it into a new table with the ledger's columns.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use super::archive::{self, ArchiveSettings, Archived};

#[derive(Debug, Clone, Args)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum LedgerCommand {
    /// Export the oldest time partitions of the ledger to files with SHA-256 checksums, then
    /// detach and drop them, for as long as the next may go (past the horizon, settled,
    /// relayed).
    Archive(ArchiveArgs),
    /// Load an archive file into a new table with the ledger's columns, after checking it
    /// against its checksum file; the ledger itself is not changed.
    Restore(RestoreArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ArchiveArgs {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// Directory the archive files (`<partition>.csv`, `<partition>.csv.sha256`) are written to.
    #[arg(long, env = "ALLOCATOR_LEDGER_ARCHIVE_DIR")]
    pub to: PathBuf,
    /// Archive only partitions that end no later than this time (RFC 3339); a partition before
    /// it that may not go yet is an error. Default: every partition that may go.
    #[arg(long, value_parser = parse_time)]
    pub before: Option<DateTime<Utc>>,
    /// The idempotency horizon the replicas run with: no partition with a younger row goes.
    #[arg(
        long,
        env = "ALLOCATOR_IDEMPOTENCY_HORIZON_SECS",
        default_value_t = 604_800
    )]
    pub idempotency_horizon_secs: u64,
    /// The cluster relays change events: a partition goes only once every position in it is
    /// published (required anyway once any stream was ever published).
    #[arg(long, env = "ALLOCATOR_EVENTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub events: bool,
    /// Print the oldest partition and whether it may go; change nothing.
    #[arg(long, default_value_t = false)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: String,
    /// The archive file (`<partition>.csv`); its `.sha256` file must be beside it.
    #[arg(long)]
    pub from: PathBuf,
    /// The table to create and load; it must not exist.
    #[arg(long)]
    pub into: String,
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}), e.g. 2025-01-31T00:00:00Z"))
}

pub async fn run(args: LedgerArgs) -> Result<()> {
    match args.command {
        LedgerCommand::Archive(a) => run_archive(a).await,
        LedgerCommand::Restore(r) => {
            let client = crate::sessions::connect(&r.database_url).await?;
            let restored = archive::restore(&client, &r.from, &r.into).await?;
            let [on_hand, available, held, confirmed] = restored.sums;
            println!(
                "restored {} rows into {}: sums on_hand {on_hand} available {available} held \
                 {held} confirmed {confirmed}",
                restored.rows, r.into
            );
            Ok(())
        }
    }
}

async fn run_archive(a: ArchiveArgs) -> Result<()> {
    if a.idempotency_horizon_secs == 0 {
        bail!(
            "--idempotency-horizon-secs (ALLOCATOR_IDEMPOTENCY_HORIZON_SECS) must be positive, got 0"
        );
    }
    let client = crate::sessions::connect(&a.database_url).await?;
    let settings = ArchiveSettings {
        dir: a.to,
        horizon: Duration::from_secs(a.idempotency_horizon_secs),
        require_relay: a.events,
    };
    if a.dry_run {
        let state = archive::oldest_state(&client, &settings).await?;
        println!("{state}");
        return Ok(());
    }
    let mut archived = 0;
    loop {
        match archive::archive_oldest(&client, &settings, a.before, None).await? {
            Archived::Done(p) => {
                archived += 1;
                println!(
                    "archived {} (to {}): {} rows in {} (sha256 {})",
                    p.name,
                    p.range_end.to_rfc3339(),
                    p.rows,
                    p.file.display(),
                    p.sha256
                );
            }
            Archived::Refused { partition, reason } if a.before.is_some() => {
                bail!("{partition} ends before --before but may not go yet: {reason}")
            }
            Archived::Refused { partition, reason } => {
                println!("kept {partition}: {reason}");
                break;
            }
            Archived::Nothing | Archived::Fenced => break,
        }
    }
    println!("{archived} partition(s) archived");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::{Cli, Command};

    use super::*;

    fn ledger(args: &[&str]) -> Result<LedgerCommand, clap::Error> {
        let argv = ["allocator", "ledger"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Ledger(l) => Ok(l.command),
            other => panic!("ledger expected, got {other:?}"),
        }
    }

    /// `allocator ledger archive` to `/archive` with `--before` as given.
    fn archive_before(before: &str) -> Result<LedgerCommand, clap::Error> {
        ledger(&[
            "archive",
            "--database-url",
            "postgres://x/y",
            "--to",
            "/archive",
            "--before",
            before,
        ])
    }

    #[test]
    fn archive_takes_a_time_bound_and_the_replicas_settings() {
        let LedgerCommand::Archive(a) = archive_before("2025-01-31T01:00:00+01:00").unwrap() else {
            panic!("archive expected")
        };
        assert_eq!(a.to, PathBuf::from("/archive"));
        assert_eq!(
            a.before.map(|t| t.to_rfc3339()).as_deref(),
            Some("2025-01-31T00:00:00+00:00")
        );
        assert_eq!(a.idempotency_horizon_secs, 604_800, "the replicas' default");
        assert!(!a.events && !a.dry_run);
    }

    #[test]
    fn a_time_that_is_not_rfc_3339_is_refused() {
        let err = archive_before("yesterday").unwrap_err().to_string();
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn restore_needs_a_file_and_a_table() {
        assert!(ledger(&["restore", "--database-url", "postgres://x/y"]).is_err());
        let LedgerCommand::Restore(r) = ledger(&[
            "restore",
            "--database-url",
            "postgres://x/y",
            "--from",
            "/a/ledger_x.csv",
            "--into",
            "t",
        ])
        .unwrap() else {
            panic!("restore expected")
        };
        assert_eq!(
            (r.from, r.into),
            (PathBuf::from("/a/ledger_x.csv"), "t".into())
        );
    }
}
