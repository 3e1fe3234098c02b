//! The allocator's side of shards (DESIGN.md §12): `allocator migrate` over every shard, and the
//! check that refuses to serve a shard whose record disagrees with the catalog's map.
//!
//! An allocator serves one shard: its `--database-url` is that shard's primary, it campaigns for
//! the partitions whose lease rows the shard holds, and its jobs (settlement, retention, the event
//! relay) run on that shard's rows. A cluster over several shards runs a group of allocators per
//! shard, the way a per-shard tablet serves one database behind a router that knows them all; a
//! stopped or slow shard then stops only its own partitions.

use clap::{Args, Subcommand};
use schema::shard::{self, ShardMap, ShardName, ShardTarget};
use schema::{InitOptions, MigrationReport, ShardRole};

mod moving;

pub use moving::{
    abort_move, in_flight, move_partition, move_partition_with, Aborted, MoveOptions, MoveRecord,
    MoveState, Moved, MOVE_LEASE,
};

/// `allocator migrate`: every shard of the cluster, or its one database.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// The one database of a one-shard cluster (the default shard `main`).
    #[arg(long, env = "DATABASE_URL", required_unless_present = "shards")]
    pub database_url: Option<String>,
    /// A shard of a cluster over several databases, as `NAME=URL`; repeat it for every shard,
    /// the catalog (which stores the shard map) first. Replaces `--database-url`.
    #[arg(long = "shard", value_name = "NAME=URL")]
    pub shards: Vec<schema::shard::ShardTarget>,
    /// Partition count for a new cluster (default 64); must match an existing cluster's.
    #[arg(long, env = "ALLOCATOR_PARTITIONS")]
    pub partitions: Option<u32>,
    /// Span of each ledger time partition (default 1 day); on a cluster that has partitions,
    /// applies to those created after the last one.
    #[arg(long, env = "ALLOCATOR_LEDGER_PARTITION_SPAN_SECS")]
    pub ledger_partition_span_secs: Option<u64>,
}

/// `allocator shards …`: operations on a cluster's shards.
#[derive(Debug, Clone, Args)]
pub struct ShardsArgs {
    #[command(subcommand)]
    pub command: ShardsCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ShardsCommand {
    /// Move one partition to another shard under a fence (safe under load). A move that was
    /// interrupted is finished by running it again, or given back to its source with --abort.
    Move {
        #[arg(long)]
        partition: u32,
        /// The shard to move it to.
        #[arg(long, required_unless_present = "abort", conflicts_with = "abort")]
        to: Option<ShardName>,
        /// Give the partition's move in flight back to its source (any state before the flip).
        #[arg(long)]
        abort: bool,
        /// The cluster runs no event relay: do not wait for the source's relay to publish the
        /// rows the target would fold into archived totals.
        #[arg(long)]
        no_event_relay: bool,
        /// Every shard as `NAME=URL`, the catalog first (as for `allocator migrate`).
        #[arg(long = "shard", value_name = "NAME=URL", required = true)]
        shards: Vec<ShardTarget>,
    },
    /// The catalog's shard map per shard and the moves in flight.
    Status {
        /// Every shard as `NAME=URL`, the catalog first (only the catalog is read).
        #[arg(long = "shard", value_name = "NAME=URL", required = true)]
        shards: Vec<ShardTarget>,
    },
}

/// Runs `allocator shards …`, printing what was done.
pub async fn run(args: ShardsArgs) -> anyhow::Result<()> {
    match args.command {
        ShardsCommand::Move {
            partition,
            abort: true,
            shards,
            ..
        } => {
            let aborted = abort_move(&shards, partition).await?;
            tracing::info!(?aborted, "move aborted");
            println!(
                "partition {} back on shard {} (the move was {})",
                aborted.partition, aborted.source, aborted.was
            );
            Ok(())
        }
        ShardsCommand::Move {
            partition,
            to,
            no_event_relay,
            shards,
            ..
        } => {
            let to = to.ok_or_else(|| anyhow::anyhow!("give --to or --abort"))?;
            let mut options = MoveOptions::default();
            if no_event_relay {
                options.relay_wait = None;
            }
            let moved = move_partition_with(&shards, partition, &to, &options).await?;
            tracing::info!(?moved, "partition moved");
            println!(
                "partition {} on shard {} (from {}, attempt {}; {} ledger rows copied, {} carried \
                 in archived totals; map revision {})",
                moved.partition,
                moved.to,
                moved.from,
                moved.attempt,
                moved.ledger_rows,
                moved.ledger_rows_folded,
                moved.map_revision
            );
            Ok(())
        }
        ShardsCommand::Status { shards } => {
            let catalog = crate::sessions::connect(&shards[0].url).await?;
            let map = shard::store::read_map(&catalog)
                .await?
                .ok_or_else(|| anyhow::anyhow!("the first --shard holds no shard map"))?;
            println!("map revision {}", map.revision);
            for (index, name) in map.shards().iter().enumerate() {
                let held: Vec<String> = (0..map.partition_count())
                    .filter(|p| map.shard_index(*p) == Some(index))
                    .map(|p| p.to_string())
                    .collect();
                println!(
                    "shard {name}: {} partitions [{}]",
                    held.len(),
                    held.join(" ")
                );
            }
            let moves = in_flight(&catalog).await?;
            println!("moves in flight: {}", moves.len());
            for m in moves {
                println!(
                    "partition {} {} -> {}: {} (attempt {}, {}, {}, last step {:.0} s ago)",
                    m.partition,
                    m.from,
                    m.to,
                    m.state,
                    m.attempt,
                    m.holder,
                    if m.claimed {
                        "a mover is at work"
                    } else {
                        "no mover"
                    },
                    m.idle_secs
                );
            }
            Ok(())
        }
    }
}

/// `allocator migrate`: one database (`--database-url`, the default shard `main`), or every
/// `--shard NAME=URL` in order, the first being the catalog. A new catalog's map gives each shard
/// a contiguous range of partitions; an existing one must name the shards given, in order, and
/// shards given after its own are added to it empty (moves then give them partitions).
pub async fn migrate(args: &MigrateArgs) -> anyhow::Result<Vec<(ShardName, MigrationReport)>> {
    let options = |shard| InitOptions {
        partitions: args.partitions,
        ledger_partition_span: args
            .ledger_partition_span_secs
            .map(std::time::Duration::from_secs),
        shard,
    };
    if args.shards.is_empty() {
        let url = args
            .database_url
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("give --database-url or at least one --shard"))?;
        let mut client = crate::sessions::connect(url).await?;
        let report = schema::initialise_with(&mut client, options(None)).await?;
        let name = match shard::store::read_record(&client).await? {
            Some(record) => record.shard,
            None => ShardName::default_shard(),
        };
        return Ok(vec![(name, report)]);
    }
    let names = shard::target_names(&args.shards)?;
    let mut catalog = crate::sessions::connect(&args.shards[0].url).await?;
    if let Ok(Some(record)) = shard::store::read_record(&catalog).await {
        if !record.catalog {
            anyhow::bail!(
                "{} is shard {}, not the catalog: give the catalog's --shard first",
                args.shards[0].name,
                record.shard
            );
        }
    }
    let map = match shard::store::read_map_if_migrated(&catalog).await? {
        // Shards named after the catalog's are added, holding no partition until moves give
        // them some; any other difference is refused.
        Some(map) if names.len() > map.shards().len() && names.starts_with(map.shards()) => {
            shard::store::add_shards(&catalog, &names[map.shards().len()..]).await?;
            shard::store::read_map(&catalog)
                .await?
                .ok_or(schema::SchemaError::NotInitialised)?
        }
        Some(map) => {
            map.check_shards(&names)?;
            map
        }
        None => {
            let count = args.partitions.unwrap_or(schema::DEFAULT_PARTITIONS);
            ShardMap::plan(names.clone(), count)?
        }
    };
    let mut reports = Vec::with_capacity(args.shards.len());
    for (index, ShardTarget { name, url }) in args.shards.iter().enumerate() {
        let role = ShardRole {
            name: name.clone(),
            map: map.clone(),
            catalog: index == 0,
        };
        let mut opts = options(Some(role));
        opts.partitions = Some(map.partition_count());
        let report = if index == 0 {
            schema::initialise_with(&mut catalog, opts).await?
        } else {
            let mut client = crate::sessions::connect(url).await?;
            schema::initialise_with(&mut client, opts).await?
        };
        reports.push((name.clone(), report));
    }
    Ok(reports)
}

/// At start: this shard's record, checked against the catalog's map (on this database when it
/// is the catalog, else on `catalog_url`). Returns the shard's name and its partitions.
pub async fn check_at_start(
    shard_db: &tokio_postgres::Client,
    catalog_url: Option<&str>,
) -> anyhow::Result<schema::shard::ShardRecord> {
    let record = shard::store::read_record(shard_db)
        .await?
        .ok_or(schema::SchemaError::NotInitialised)?;
    let map = if record.catalog {
        shard::store::read_map(shard_db).await?
    } else {
        let url = catalog_url.ok_or_else(|| {
            anyhow::anyhow!(
                "this database is shard {}, not the catalog: give --catalog-url",
                record.shard
            )
        })?;
        let catalog = crate::sessions::connect(url).await?;
        shard::store::read_map(&catalog).await?
    };
    let map = map.ok_or_else(|| {
        anyhow::anyhow!("the catalog holds no shard map: run `allocator migrate` first")
    })?;
    map.check_record(&record)?;
    Ok(record)
}
