//! Lease statements against PostgreSQL: acquire, renew, release, replica heartbeats.
//!
//! Lock modes: a fenced batch holds its partition's lease row `FOR KEY SHARE`. Acquisition locks
//! the row `FOR UPDATE`, which conflicts with that fence; renewal and release are plain non-key
//! updates, which do not. So a takeover can never interleave with an old owner's batch, while a
//! batch stuck on a row lock never holds up a renewal.
//!
//! Every statement is a single conditional `UPDATE … RETURNING` judged by the database clock
//! (`now()`), so two replicas can never both succeed and no replica compares its own wall clock
//! with anybody's. Acquire bumps the epoch (`epoch = epoch + 1`) and takes a new assignment
//! revision; release and takeover take a new revision too. Acquisition is the statement every
//! lease taker shares ([`super::take`]).

use std::time::Duration;

use tokio_postgres::GenericClient;

use super::take::{take_lease, LeaseTake, When};
use super::token::FenceToken;
use schema::partition::lease_name;

/// PostgreSQL notification channel announcing that a partition lease was given up (released,
/// dropped) or that a replica left. Peers campaign at once instead of at their next period, so a
/// planned hand-off leaves the partition without an owner for milliseconds, not a campaign period.
pub const HANDOFF_CHANNEL: &str = "allocator_handoff";

/// A successful acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub partition: u32,
    pub epoch: i64,
    pub revision: i64,
    /// How long the partition had no live owner before this acquisition, by the database clock
    /// (zero when this replica took back its own unexpired lease).
    pub vacant: Duration,
}

impl Acquired {
    /// The tenure this acquisition started.
    pub fn token(&self) -> FenceToken {
        FenceToken::new(self.partition, self.epoch)
    }
}

/// A dropped lease that was still ours and is now given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub token: FenceToken,
    /// The assignment revision of the hand-back, published so routers can order it.
    pub revision: i64,
}

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// Try to take `partition`: succeeds when nobody holds it, the holder's lease expired, or this
/// replica is the recorded holder (a restart under the same id). Always a new, higher epoch and
/// a new assignment revision; the statement is [`take_lease`]'s (`When::Vacant`).
pub async fn acquire<C: GenericClient>(
    client: &C,
    partition: u32,
    replica_id: &str,
    advertise_url: &str,
    ttl: Duration,
) -> Result<Option<Acquired>, tokio_postgres::Error> {
    let taken = take_lease(
        client,
        LeaseTake {
            name: &lease_name(partition),
            holder: replica_id,
            url: Some(advertise_url),
            ttl,
            when: When::Vacant,
            new_revision: true,
        },
    )
    .await?;
    Ok(taken.map(|t| Acquired {
        partition,
        epoch: t.epoch,
        revision: t.revision,
        vacant: t.vacant,
    }))
}

/// Renew every given lease still held by this replica at its epoch and unexpired; returns the
/// partitions that were renewed. A partition missing from the answer is lost.
pub async fn renew<C: GenericClient>(
    client: &C,
    replica_id: &str,
    held: &[FenceToken],
    ttl: Duration,
) -> Result<Vec<u32>, tokio_postgres::Error> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = held.iter().map(|t| lease_name(t.partition)).collect();
    let epochs: Vec<i64> = held.iter().map(|t| t.epoch).collect();
    let rows = client
        .query(
            // A plain non-key UPDATE: it never waits for the FOR KEY SHARE fences of in-flight
            // batches. SKIP LOCKED leaves out a row an acquirer has locked FOR UPDATE (only an
            // expired lease can be), so one partition's trouble never delays the others.
            "WITH mine AS (
                 SELECT l.name
                   FROM leases AS l
                   JOIN unnest($1::text[], $2::bigint[]) AS h(name, epoch)
                     ON l.name = h.name AND l.epoch = h.epoch
                  WHERE l.holder_id = $4 AND l.expires_at > now()
                    FOR NO KEY UPDATE OF l SKIP LOCKED)
             UPDATE leases AS l
                SET renewed_at = now(), expires_at = now() + $3::bigint * interval '1 millisecond'
               FROM mine
              WHERE l.name = mine.name
          RETURNING l.partition",
            &[&names, &epochs, &millis(ttl), &replica_id],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect())
}

/// Give a partition back; conditional on holder and epoch. Returns the new revision, or `None`
/// when the lease was no longer ours.
pub async fn release<C: GenericClient>(
    client: &C,
    lease: FenceToken,
    replica_id: &str,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            // The notification is delivered when the release commits.
            "WITH released AS (
                 UPDATE leases
                    SET holder_id = NULL, holder_url = NULL, expires_at = now(),
                        revision = nextval('assignment_revision'), transitions = transitions + 1
                  WHERE name = $1 AND holder_id = $2 AND epoch = $3
              RETURNING revision, partition)
             SELECT revision, pg_notify($4, partition::text) FROM released",
            &[
                &lease_name(lease.partition),
                &replica_id,
                &lease.epoch,
                &HANDOFF_CHANNEL,
            ],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Give back several leases this replica dropped; each conditional on holder and epoch, in one
/// statement. Returns each lease that was still ours, with the revision of its hand-back.
pub async fn release_dropped<C: GenericClient>(
    client: &C,
    replica_id: &str,
    dropped: &[FenceToken],
) -> Result<Vec<Released>, tokio_postgres::Error> {
    if dropped.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = dropped.iter().map(|t| lease_name(t.partition)).collect();
    let epochs: Vec<i64> = dropped.iter().map(|t| t.epoch).collect();
    let rows = client
        .query(
            "WITH released AS (
                 UPDATE leases AS l
                    SET holder_id = NULL, holder_url = NULL, expires_at = now(),
                        revision = nextval('assignment_revision'), transitions = l.transitions + 1
                   FROM unnest($1::text[], $2::bigint[]) AS d(name, epoch)
                  WHERE l.name = d.name AND l.epoch = d.epoch AND l.holder_id = $3
              RETURNING l.partition, l.epoch, l.revision)
             SELECT partition, epoch, revision, pg_notify($4, partition::text) FROM released",
            &[&names, &epochs, &replica_id, &HANDOFF_CHANNEL],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Released {
            token: FenceToken::new(r.get::<_, i32>(0) as u32, r.get(1)),
            revision: r.get(2),
        })
        .collect())
}

/// What one campaign round learns from the database in a single round trip.
///
/// A lease row a move is bringing in (`moving_in`, V28) is not yet the shard's: it is neither
/// counted nor free, even after the mover's lease expires, so an interrupted move never lets
/// this shard's allocators serve or sweep a copy the catalog's map does not give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignView {
    pub live_replicas: u32,
    /// The partitions this shard holds (its partition lease rows), shared by its replicas.
    pub partition_count: u32,
    /// Partitions nobody holds right now (unheld or expired), by the database clock.
    pub free: Vec<u32>,
    /// Unexpired leases the database names this replica for. After a restart under the same id
    /// (or a dropped lease) the replica may take them back at once: acquire accepts its own
    /// holder id and always yields a new epoch, so nothing waits for the old lease to expire.
    pub named_for_me: Vec<u32>,
}

/// Record this replica's heartbeat and read what a campaign needs.
pub async fn heartbeat_and_view<C: GenericClient>(
    client: &C,
    replica_id: &str,
    advertise_url: &str,
    ttl: Duration,
) -> Result<CampaignView, tokio_postgres::Error> {
    client
        .execute(
            "INSERT INTO replicas (replica_id, advertise_url, heartbeat_at, expires_at)
             VALUES ($1, $2, now(), now() + $3::bigint * interval '1 millisecond')
             ON CONFLICT (replica_id) DO UPDATE
                SET advertise_url = EXCLUDED.advertise_url,
                    heartbeat_at = EXCLUDED.heartbeat_at, expires_at = EXCLUDED.expires_at",
            &[&replica_id, &advertise_url, &millis(ttl)],
        )
        .await?;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM replicas WHERE expires_at > now()),
                    (SELECT count(*)::int FROM leases
                      WHERE partition IS NOT NULL AND NOT moving_in),
                    (SELECT coalesce(array_agg(partition ORDER BY partition), '{}')
                       FROM leases
                      WHERE partition IS NOT NULL AND NOT moving_in
                        AND (holder_id IS NULL OR expires_at <= now())),
                    (SELECT coalesce(array_agg(partition ORDER BY partition), '{}')
                       FROM leases
                      WHERE partition IS NOT NULL
                        AND holder_id = $1 AND expires_at > now())",
            &[&replica_id],
        )
        .await?;
    let free: Vec<i32> = row.get(2);
    let named_for_me: Vec<i32> = row.get(3);
    Ok(CampaignView {
        live_replicas: row.get::<_, i64>(0).max(1) as u32,
        partition_count: row.get::<_, i32>(1) as u32,
        free: free.into_iter().map(|p| p as u32).collect(),
        named_for_me: named_for_me.into_iter().map(|p| p as u32).collect(),
    })
}

/// Remove this replica's heartbeat and announce it, so the others raise their fair share at once
/// after a graceful stop, before its leases are released.
pub async fn deregister<C: GenericClient>(
    client: &C,
    replica_id: &str,
) -> Result<(), tokio_postgres::Error> {
    client
        .query(
            "WITH gone AS (DELETE FROM replicas WHERE replica_id = $1 RETURNING replica_id)
             SELECT pg_notify($2, 'left') FROM gone",
            &[&replica_id, &HANDOFF_CHANNEL],
        )
        .await?;
    Ok(())
}

/// How many partitions a replica should hold: `ceil(P / live replicas)`.
pub fn fair_share(partition_count: u32, live_replicas: u32) -> u32 {
    partition_count.div_ceil(live_replicas.max(1))
}

#[cfg(test)]
mod tests {
    use super::fair_share;

    #[test]
    fn fair_share_rounds_up() {
        assert_eq!(fair_share(64, 3), 22);
        assert_eq!(fair_share(64, 1), 64);
        assert_eq!(fair_share(64, 64), 1);
        assert_eq!(fair_share(16, 0), 16);
        assert_eq!(fair_share(2, 3), 1);
    }
}
