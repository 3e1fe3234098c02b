//! The catalog's record of moves (`shard_moves`, V28): one row per move of a partition, in the
//! states of [`MoveState`], at most one in flight per partition.
//!
//! A mover claims the partition for as long as its catalog session lives (a session advisory
//! lock keyed by the partition), so two movers of one partition never run at once and a mover
//! that dies frees the claim with its connection; every attempt, the first, a re-run and an
//! abort, writes under a holder id of its own, `move/<partition>/<attempt>`.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, ensure, Context};
use schema::shard::ShardName;
use tokio_postgres::{Client, Row};

/// The advisory lock class of a mover's claim ("MOVE"); the partition is the second key.
const CLAIM_CLASS: i32 = 0x4D4F_5645;

/// Where a move stands; each state is recorded after the step it names has committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MoveState {
    /// Recorded, every check passed; nothing changed on the shards yet.
    Planned,
    /// The source's lease is the mover's.
    Fenced,
    /// The target holds the copy and an incoming lease row held by the mover.
    Copied,
    /// The source's lease row is gone.
    Retired,
    /// The catalog's map names the target.
    Flipped,
    /// The target's lease is free for its allocators: the move is done.
    Released,
    /// Given back to the source before the flip.
    Aborted,
}

impl MoveState {
    pub const ALL: [MoveState; 7] = [
        MoveState::Planned,
        MoveState::Fenced,
        MoveState::Copied,
        MoveState::Retired,
        MoveState::Flipped,
        MoveState::Released,
        MoveState::Aborted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MoveState::Planned => "planned",
            MoveState::Fenced => "fenced",
            MoveState::Copied => "copied",
            MoveState::Retired => "retired",
            MoveState::Flipped => "flipped",
            MoveState::Released => "released",
            MoveState::Aborted => "aborted",
        }
    }
}

impl fmt::Display for MoveState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MoveState {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        MoveState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| anyhow::anyhow!("unknown move state {s:?}"))
    }
}

/// One move as the catalog records it.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveRecord {
    pub move_id: i64,
    pub partition: u32,
    pub from: ShardName,
    pub to: ShardName,
    pub state: MoveState,
    pub attempt: i32,
    /// The holder id of the latest attempt.
    pub holder: String,
    /// The highest epoch a mover of this move wrote.
    pub epoch: Option<i64>,
    /// Whether a mover holds the claim right now.
    pub claimed: bool,
    /// Seconds since the last recorded step, by the catalog's clock.
    pub idle_secs: f64,
}

/// The holder id of attempt `attempt` of a move of `partition`.
pub fn holder(partition: u32, attempt: i32) -> String {
    format!("move/{partition}/{attempt}")
}

/// A regular expression matching every mover holder id of `partition`: any attempt's, and the
/// one holder id of moves recorded before V28.
pub(super) fn holder_pattern(partition: u32) -> String {
    format!("^move/{partition}(/[0-9]+)?$")
}

const COLUMNS: &str = "move_id, partition, from_shard, to_shard, state, attempt, holder_id, epoch,
        EXISTS (SELECT 1 FROM pg_locks
                 WHERE locktype = 'advisory' AND classid::bigint = 1297045061
                   AND objid::bigint = m.partition AND objsubid = 2 AND granted) AS claimed,
        extract(epoch FROM now() - updated_at)::float8 AS idle_secs";

fn from_row(row: &Row) -> anyhow::Result<MoveRecord> {
    let partition: i32 = row.get("partition");
    Ok(MoveRecord {
        move_id: row.get("move_id"),
        partition: partition as u32,
        from: row.get::<_, String>("from_shard").parse()?,
        to: row.get::<_, String>("to_shard").parse()?,
        state: row.get::<_, String>("state").parse()?,
        attempt: row.get("attempt"),
        holder: row.get("holder_id"),
        epoch: row.get("epoch"),
        claimed: row.get("claimed"),
        idle_secs: row.get("idle_secs"),
    })
}

/// Claims `partition` for this catalog session; refused while another mover holds it.
pub(super) async fn claim(catalog: &Client, partition: u32) -> anyhow::Result<()> {
    let got: bool = catalog
        .query_one(
            "SELECT pg_try_advisory_lock($1, $2)",
            &[&CLAIM_CLASS, &(partition as i32)],
        )
        .await?
        .get(0);
    ensure!(
        got,
        "another mover is moving partition {partition} right now; `allocator shards status` \
         lists it"
    );
    Ok(())
}

/// Gives the claim on `partition` back (a mover that dies gives it back with its connection).
pub(super) async fn release_claim(catalog: &Client, partition: u32) {
    let _ = catalog
        .execute(
            "SELECT pg_advisory_unlock($1, $2)",
            &[&CLAIM_CLASS, &(partition as i32)],
        )
        .await;
}

/// Every move not yet released or aborted, by partition.
pub async fn in_flight(catalog: &Client) -> anyhow::Result<Vec<MoveRecord>> {
    catalog
        .query(
            &format!(
                "SELECT {COLUMNS} FROM shard_moves AS m
                  WHERE state NOT IN ('released', 'aborted') ORDER BY partition"
            ),
            &[],
        )
        .await?
        .iter()
        .map(from_row)
        .collect()
}

/// The move of `partition` in flight, if any.
pub(super) async fn find(catalog: &Client, partition: u32) -> anyhow::Result<Option<MoveRecord>> {
    catalog
        .query_opt(
            &format!(
                "SELECT {COLUMNS} FROM shard_moves AS m
                  WHERE partition = $1 AND state NOT IN ('released', 'aborted')"
            ),
            &[&(partition as i32)],
        )
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
}

/// Records a new move of `partition`, planned, as attempt 1.
pub(super) async fn start(
    catalog: &Client,
    partition: u32,
    from: &ShardName,
    to: &ShardName,
) -> anyhow::Result<MoveRecord> {
    let row = catalog
        .query_one(
            "INSERT INTO shard_moves (partition, from_shard, to_shard, state, holder_id)
             VALUES ($1, $2, $3, 'planned', $4) RETURNING move_id",
            &[
                &(partition as i32),
                &from.as_str(),
                &to.as_str(),
                &holder(partition, 1),
            ],
        )
        .await
        .context("recording the move")?;
    let id: i64 = row.get(0);
    find(catalog, partition)
        .await?
        .filter(|m| m.move_id == id)
        .context("the move just recorded is gone")
}

/// A new attempt at `record`: the next attempt number and its holder id.
pub(super) async fn next_attempt(
    catalog: &Client,
    record: &MoveRecord,
) -> anyhow::Result<MoveRecord> {
    let attempt = record.attempt + 1;
    let updated = catalog
        .execute(
            "UPDATE shard_moves SET attempt = $2, holder_id = $3, updated_at = now()
              WHERE move_id = $1 AND attempt = $4",
            &[
                &record.move_id,
                &attempt,
                &holder(record.partition, attempt),
                &record.attempt,
            ],
        )
        .await?;
    ensure!(updated == 1, "the move's record changed under this mover");
    Ok(MoveRecord {
        attempt,
        holder: holder(record.partition, attempt),
        ..record.clone()
    })
}

/// Records that `record`'s attempt reached `state` (and wrote `epoch`, when given).
pub(super) async fn advance(
    catalog: &Client,
    record: &mut MoveRecord,
    state: MoveState,
    epoch: Option<i64>,
) -> anyhow::Result<()> {
    let done = matches!(state, MoveState::Released | MoveState::Aborted);
    let updated = catalog
        .execute(
            "UPDATE shard_moves
                SET state = $3, epoch = greatest(epoch, $4), updated_at = now(),
                    finished_at = CASE WHEN $5 THEN now() END
              WHERE move_id = $1 AND holder_id = $2",
            &[
                &record.move_id,
                &record.holder,
                &state.as_str(),
                &epoch,
                &done,
            ],
        )
        .await?;
    if updated != 1 {
        bail!(
            "the move of partition {} is no longer held by {}",
            record.partition,
            record.holder
        );
    }
    record.state = state;
    record.epoch = record.epoch.max(epoch);
    Ok(())
}
