//! `allocator shards move`: a fenced move of one partition to another shard, recorded in the
//! catalog as a state machine that any mover can resume or abort (DESIGN.md §12, I13).
//!
//! The steps, each recorded in the catalog's `shard_moves` (V28, [`record`]) after it commits:
//! 1. **Fence the source** (`fenced`). The mover takes the partition's lease on the source under
//!    its own holder id, live owner or not: a new epoch, the row locked `FOR UPDATE` first, which
//!    waits for every batch of the old owner (they hold it `FOR KEY SHARE`) and makes its later
//!    ones stale. The lease runs for [`MOVE_LEASE`], so no allocator campaigns for it meanwhile.
//! 2. **Copy** (`copied`) the partition's rows, from one snapshot of the source, into one
//!    transaction on the target (see [`steps::copy`] and [`ledger`]), with a lease row held by
//!    the mover at an epoch above the source's and marked incoming (`moving_in`): the target's
//!    allocators never campaign for it, however long it stays.
//! 3. **Retire the source** (`retired`): its lease row is deleted, so no owner can ever write
//!    the partition there again.
//! 4. **Flip the map** (`flipped`) in the catalog under a new revision.
//! 5. **Release** (`released`) the target's lease, no longer incoming, and announce it, so the
//!    target's allocators campaign at once.
//!
//! Every attempt holds the catalog's claim on the partition ([`record::claim`]) and writes
//! under its own holder id, `move/<partition>/<attempt>`. A re-run resumes from where the shards
//! stand (the recorded state, and whether the source's lease row is still there) at a new
//! epoch; [`abort_move`] gives the partition back to its source from any state before the flip.
//! Every refusal ([`ledger::check`], [`checks`]) comes before step 1.

use std::time::Duration;

use schema::shard::{self, ShardName, ShardTarget};
use tokio_postgres::Client;

mod checks;
mod ledger;
mod record;
mod rows;
mod steps;

pub use record::{in_flight, MoveRecord, MoveState};

/// How long the mover's lease runs on either shard: far longer than a copy takes, so nobody
/// campaigns for the partition while it moves. An abandoned move stays recorded in flight
/// (`allocator shards status`) and is finished by running it again, or aborted.
pub const MOVE_LEASE: Duration = Duration::from_secs(3600);

/// How a mover behaves; [`Default`] is the command's.
#[derive(Debug, Clone)]
pub struct MoveOptions {
    /// How long to wait for the source's event relay to publish rows the target would fold
    /// before refusing the move; `None` for a cluster that runs no relay (nothing to wait for).
    pub relay_wait: Option<Duration>,
    /// Stop with an error once this state is recorded, as a mover killed right after it would
    /// (tests, and the `fault-hooks` environment variable [`crate::faults::MOVE_STOP_ENV`]).
    pub stop_after: Option<MoveState>,
    /// Pause this long once the state is recorded: a slow mover, for a second one to meet.
    pub pause_after: Option<(MoveState, Duration)>,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            relay_wait: Some(Duration::from_secs(10)),
            stop_after: crate::faults::move_stop_after().and_then(|s| s.parse().ok()),
            pause_after: None,
        }
    }
}

/// What [`move_partition`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub partition: u32,
    pub from: ShardName,
    pub to: ShardName,
    /// The attempt that finished the move (1 for a move that ran through; 0: already there).
    pub attempt: i32,
    /// Ledger rows appended on the target.
    pub ledger_rows: u64,
    /// Positions the target lacked that it holds in its archived totals instead of as rows:
    /// archived on the source, or older than the target's oldest live time partition.
    pub ledger_rows_folded: u64,
    /// The catalog's map revision after the move.
    pub map_revision: i64,
}

/// The catalog, its map checked against `shards`, and the index of every shard name.
struct Cluster {
    names: Vec<ShardName>,
    catalog: Client,
    map: shard::ShardMap,
}

async fn open(shards: &[ShardTarget]) -> anyhow::Result<Cluster> {
    let names = shard::target_names(shards)?;
    let catalog = crate::sessions::connect(&shards[0].url).await?;
    let map = shard::store::read_map(&catalog)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the first --shard holds no shard map"))?;
    map.check_shards(&names)?;
    Ok(Cluster {
        names,
        catalog,
        map,
    })
}

impl Cluster {
    fn index(&self, name: &ShardName) -> anyhow::Result<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| anyhow::anyhow!("{name} is not one of the shards given"))
    }
}

/// Moves `partition` to shard `to`; `shards` are every shard, the catalog first.
pub async fn move_partition(
    shards: &[ShardTarget],
    partition: u32,
    to: &ShardName,
) -> anyhow::Result<Moved> {
    move_partition_with(shards, partition, to, &MoveOptions::default()).await
}

/// [`move_partition`] with `options`.
pub async fn move_partition_with(
    shards: &[ShardTarget],
    partition: u32,
    to: &ShardName,
    options: &MoveOptions,
) -> anyhow::Result<Moved> {
    let cluster = open(shards).await?;
    let from = cluster
        .map
        .shard_index(partition)
        .ok_or_else(|| anyhow::anyhow!("the cluster has no partition {partition}"))?;
    let to_index = cluster.index(to)?;
    record::claim(&cluster.catalog, partition).await?;
    let moved = claimed_move(&cluster, shards, partition, (from, to_index), to, options).await;
    record::release_claim(&cluster.catalog, partition).await;
    moved
}

/// [`move_partition_with`] once the partition is claimed: `indices` are the map's shard of the
/// partition and `to`'s.
async fn claimed_move(
    cluster: &Cluster,
    shards: &[ShardTarget],
    partition: u32,
    (from, to_index): (usize, usize),
    to: &ShardName,
    options: &MoveOptions,
) -> anyhow::Result<Moved> {
    let mut mv = match record::find(&cluster.catalog, partition).await? {
        Some(mv) if &mv.to != to => anyhow::bail!(
            "partition {partition} has a move from {} to {} in flight ({}): finish it with \
             --to {} or give it back to {} with --abort",
            mv.from,
            mv.to,
            mv.state,
            mv.to,
            mv.from
        ),
        Some(mv) => record::next_attempt(&cluster.catalog, &mv).await?,
        None if from == to_index => {
            return Ok(Moved {
                partition,
                from: to.clone(),
                to: to.clone(),
                attempt: 0,
                ledger_rows: 0,
                ledger_rows_folded: 0,
                map_revision: cluster.map.revision,
            })
        }
        None => {
            let mut source = crate::sessions::connect(&shards[from].url).await?;
            let target = crate::sessions::connect(&shards[to_index].url).await?;
            preflight(&mut source, &target, partition, options).await?;
            record::start(&cluster.catalog, partition, &cluster.names[from], to).await?
        }
    };
    let from = cluster.index(&mv.from)?;
    let mut source = crate::sessions::connect(&shards[from].url).await?;
    let mut target = crate::sessions::connect(&shards[to_index].url).await?;
    let step = |state| stop_or_pause(options, state);
    let (mut ledger_rows, mut ledger_rows_folded) = (0, 0);
    if mv.state < MoveState::Retired && steps::has_lease_row(&source, partition).await? {
        if mv.state > MoveState::Planned {
            // A re-run of a fenced move: the same checks, before this attempt's fence.
            preflight(&mut source, &target, partition, options).await?;
        }
        let epoch = steps::fence(&source, partition, &mv.holder).await?;
        record::advance(&cluster.catalog, &mut mv, MoveState::Fenced, Some(epoch)).await?;
        step(MoveState::Fenced).await?;
        let (copied, epoch) = steps::copy(
            &mut source,
            &mut target,
            partition,
            &mv.holder,
            epoch,
            &cluster.names[from],
        )
        .await?;
        (ledger_rows, ledger_rows_folded) = (copied.appended, copied.folded);
        record::advance(&cluster.catalog, &mut mv, MoveState::Copied, Some(epoch)).await?;
        step(MoveState::Copied).await?;
        steps::retire(&source, partition, &mv.holder).await?;
        record::advance(&cluster.catalog, &mut mv, MoveState::Retired, None).await?;
        step(MoveState::Retired).await?;
    } else if mv.state == MoveState::Flipped && !steps::has_incoming_row(&target, partition).await?
    {
        // Released by an earlier attempt that stopped before recording it.
        record::advance(&cluster.catalog, &mut mv, MoveState::Released, None).await?;
        return Ok(Moved {
            partition,
            from: cluster.names[from].clone(),
            to: to.clone(),
            attempt: mv.attempt,
            ledger_rows,
            ledger_rows_folded,
            map_revision: cluster.map.revision,
        });
    } else {
        // Retired by an earlier attempt: the copy is on the target, incoming, held by a mover.
        let epoch = steps::take_over_target(&target, partition, &mv.holder).await?;
        let state = mv.state.max(MoveState::Retired);
        record::advance(&cluster.catalog, &mut mv, state, Some(epoch)).await?;
    }
    let map_revision: i64 = cluster
        .catalog
        .query_one(
            "UPDATE shard_map SET shard = $2,
                    revision = CASE WHEN shard = $2 THEN revision
                                    ELSE nextval('shard_map_revision') END
              WHERE partition = $1 RETURNING revision",
            &[&(partition as i32), &to.as_str()],
        )
        .await?
        .get(0);
    if mv.state < MoveState::Flipped {
        record::advance(&cluster.catalog, &mut mv, MoveState::Flipped, None).await?;
        step(MoveState::Flipped).await?;
    }
    steps::release(&target, partition, &mv.holder).await?;
    record::advance(&cluster.catalog, &mut mv, MoveState::Released, None).await?;
    Ok(Moved {
        partition,
        from: cluster.names[from].clone(),
        to: to.clone(),
        attempt: mv.attempt,
        ledger_rows,
        ledger_rows_folded,
        map_revision,
    })
}

/// Everything refused before a fence: a copy that could not be made right ([`ledger::check`]),
/// an id on both sides, rows the target would fold that the source has not published.
async fn preflight(
    source: &mut Client,
    target: &Client,
    partition: u32,
    options: &MoveOptions,
) -> anyhow::Result<()> {
    // The wait first: the target's ledger partitions are then ensured after it.
    if let Some(wait) = options.relay_wait {
        checks::folded_rows_published(source, target, partition, wait).await?;
    }
    ledger::check(source, target, partition).await?;
    checks::no_id_collisions(source, target, partition).await?;
    Ok(())
}

/// After `state` is recorded: the fault a test or chaos run asked for there, if any.
async fn stop_or_pause(options: &MoveOptions, state: MoveState) -> anyhow::Result<()> {
    if let Some((at, pause)) = options.pause_after {
        if at == state {
            tokio::time::sleep(pause).await;
        }
    }
    anyhow::ensure!(
        options.stop_after != Some(state),
        "the mover stopped after the move was {state} (fault injected)"
    );
    Ok(())
}

/// What [`abort_move`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aborted {
    pub partition: u32,
    /// The shard that serves the partition again.
    pub source: ShardName,
    /// The state the move was in.
    pub was: MoveState,
}

/// `allocator shards move --abort`: gives `partition`'s move in flight back to its source from
/// any state before the flip. The target's incoming lease row is deleted first, then the
/// source's lease row is given back free (restored, when the move had retired it) at an epoch
/// above every epoch the move wrote, so the source's allocators take it at once.
pub async fn abort_move(shards: &[ShardTarget], partition: u32) -> anyhow::Result<Aborted> {
    let cluster = open(shards).await?;
    record::claim(&cluster.catalog, partition).await?;
    let aborted = claimed_abort(&cluster, shards, partition).await;
    record::release_claim(&cluster.catalog, partition).await;
    aborted
}

async fn claimed_abort(
    cluster: &Cluster,
    shards: &[ShardTarget],
    partition: u32,
) -> anyhow::Result<Aborted> {
    let found = record::find(&cluster.catalog, partition)
        .await?
        .ok_or_else(|| anyhow::anyhow!("partition {partition} has no move in flight"))?;
    anyhow::ensure!(
        found.state < MoveState::Flipped,
        "the move of partition {partition} to {} is past the map's flip ({}): run it again to \
         finish it",
        found.to,
        found.state
    );
    let mut mv = record::next_attempt(&cluster.catalog, &found).await?;
    let source = crate::sessions::connect(&shards[cluster.index(&mv.from)?].url).await?;
    let target = crate::sessions::connect(&shards[cluster.index(&mv.to)?].url).await?;
    let dropped = steps::drop_incoming(&target, partition).await?;
    let epoch = dropped.max(mv.epoch).unwrap_or(0) + 1;
    steps::give_back_source(&source, partition, epoch).await?;
    record::advance(&cluster.catalog, &mut mv, MoveState::Aborted, Some(epoch)).await?;
    Ok(Aborted {
        partition,
        source: mv.from,
        was: found.state,
    })
}
