//! The router's side of one id, one command in the whole cluster (DESIGN.md §12, I3 across
//! shards), and of hold quotas over every shard.
//!
//! In a cluster of several shards a reservation id or an adjustment id is claimed, before the
//! write is forwarded, in the id directory (`V27__id_directory.sql`) on the shard that holds the
//! id's *home partition* (`partition_for(id)`): one statement that inserts the claim unless a
//! row is there and returns what is there. An id first used for another SKU, which lives on
//! another partition and maybe another shard, is answered here exactly as one database answers
//! it (`422`, or `404` for another client's id) and never reaches the SKU's owner; an id used for
//! the same SKU is forwarded, and the owner replays it or refuses it as it always does. One
//! database writes no claim at all. The router does this because it is what knows every shard;
//! an allocator knows only its own and the catalog.

use schema::partition::partition_for;

use crate::db;
use crate::error::RouterError;
use crate::state::AppState;

/// What a write names: the command an id is claimed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Reservation,
    Adjustment,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Reservation => "reservation",
            Kind::Adjustment => "adjustment",
        }
    }
}

/// A write about to be forwarded: its id and the command it is for.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    pub kind: Kind,
    pub id: &'a str,
    pub partition: u32,
    pub sku: &'a str,
    /// The reserve's quantity, or the adjustment's delta.
    pub amount: i64,
    /// A reserve's TTL in seconds (the default applied); `None` for an adjustment.
    pub ttl_seconds: Option<i64>,
}

/// What the directory holds for an id that another write claimed first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub owner: Option<String>,
    pub sku: String,
    pub amount: i64,
    pub ttl_seconds: Option<i64>,
}

/// The claim statement: the home partition's lease row read `FOR KEY SHARE` (a mover's fence
/// takes it `FOR UPDATE`; a partition whose lease a mover holds, or that this shard does not
/// hold, takes no claim), then the insert, then what was there before it in the same snapshot.
/// Columns: the shard holds the home partition, this statement claimed it, and the existing row.
const CLAIM: &str = "
WITH home AS (
    SELECT 1 FROM leases
     WHERE partition = $1
       AND (holder_id IS NULL OR holder_id NOT LIKE 'move/%' OR expires_at <= now())
       FOR KEY SHARE),
claimed AS (
    INSERT INTO id_claims
           (partition, kind, id, owner, sku_partition, sku, amount, ttl_seconds, settled_by)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8::bigint,
           now() + coalesce($8::bigint, 0) * interval '1 second'
     WHERE EXISTS (SELECT 1 FROM home)
    ON CONFLICT (partition, kind, id) DO NOTHING
    RETURNING 1)
SELECT EXISTS (SELECT 1 FROM home), EXISTS (SELECT 1 FROM claimed),
       c.owner, c.sku, c.amount, c.ttl_seconds
  FROM (SELECT 1) AS one
  LEFT JOIN id_claims AS c ON c.partition = $1 AND c.kind = $2 AND c.id = $3";

/// How often a claim is tried when it lost to a claim committed after its snapshot (the row is
/// then there for the next statement).
const ATTEMPTS: usize = 3;

/// Claims `claim.id` on its home shard; `Ok` means forward the write. A cluster of one shard
/// claims nothing.
pub async fn claim(state: &AppState, claim: &Claim<'_>) -> Result<(), RouterError> {
    if state.pools.len() < 2 {
        return Ok(());
    }
    let home = partition_for(claim.id, state.partition_count()?);
    let pool = state.pool_of(home)?;
    let owner = access::current_owner();
    for _ in 0..ATTEMPTS {
        // Prepared once per pooled connection: a claim is on every reserve's path, and
        // preparing it anew would cost a round trip and a plan each time.
        let row = db::bounded(state.db_timeout, async {
            let client = pool.get().await?;
            let statement = client.prepare_cached(CLAIM).await?;
            Ok(client
                .query_one(
                    &statement,
                    &[
                        &(home as i32),
                        &claim.kind.as_str(),
                        &claim.id,
                        &owner.client.as_deref(),
                        &(claim.partition as i32),
                        &claim.sku,
                        &claim.amount,
                        &claim.ttl_seconds,
                    ],
                )
                .await?)
        })
        .await
        .map_err(|e| RouterError::Storage(format!("claiming id {}: {e}", claim.id)))?;
        let (held, claimed): (bool, bool) = (row.get(0), row.get(1));
        if claimed {
            return Ok(());
        }
        if !held {
            return Err(RouterError::Storage(format!(
                "partition {home}, which keeps id {}, is moving or not on the shard the map \
                 names yet",
                claim.id
            )));
        }
        let Some(sku) = row.get::<_, Option<String>>(3) else {
            continue;
        };
        let existing = Existing {
            owner: row.get(2),
            sku,
            amount: row.get(4),
            ttl_seconds: row.get(5),
        };
        return decide(claim, &existing, &owner);
    }
    Err(RouterError::Storage(format!(
        "id {} is being claimed concurrently; retry",
        claim.id
    )))
}

/// The answer for an id the directory already holds: forward when it names the same SKU (the
/// SKU's owner replays it or refuses it exactly as one database does), else what one database
/// answers a reuse: `404` to a client that may not see the stored one, `422` otherwise.
fn decide(
    claim: &Claim<'_>,
    existing: &Existing,
    caller: &access::Owner,
) -> Result<(), RouterError> {
    let id = claim.id;
    match claim.kind {
        Kind::Reservation => {
            if !access::owner_visible(existing.owner.as_deref()) {
                return Err(RouterError::NotFound(format!(
                    "reservation {id} does not exist"
                )));
            }
            if existing.sku == claim.sku {
                return Ok(());
            }
            Err(RouterError::IdempotencyMismatch(format!(
                "reservation {id} already exists for sku {} quantity {} ttl_seconds {}",
                existing.sku,
                existing.amount,
                existing.ttl_seconds.unwrap_or_default()
            )))
        }
        Kind::Adjustment => {
            // Only the client that made an adjustment replays it (`V26`), `admin` or not.
            let other = matches!((&existing.owner, &caller.client), (Some(a), Some(b)) if a != b);
            if other {
                return Err(RouterError::NotFound(format!(
                    "adjustment {id} does not exist"
                )));
            }
            if existing.sku == claim.sku {
                return Ok(());
            }
            Err(RouterError::IdempotencyMismatch(format!(
                "adjustment {id} already exists with another sku or delta"
            )))
        }
    }
}

/// What the current client holds, unexpired, on every shard but `except` (the reserve's own,
/// whose owner counts it in its fenced batch), in partitions each shard holds: `None` on one
/// database or for a client without `max_held_units`. Every other shard must answer, or the
/// reserve cannot be decided (`503`).
pub async fn held_elsewhere(state: &AppState, except: u32) -> Result<Option<i64>, RouterError> {
    let owner = access::current_owner();
    let (Some(client), true) = (owner.client.as_deref(), owner.held_units_quota().is_some()) else {
        return Ok(None);
    };
    if state.pools.len() < 2 {
        return Ok(None);
    }
    let own = state.cache.shard_of(except);
    let reads = state
        .pools
        .iter()
        .enumerate()
        .filter(|(index, _)| Some(*index) != own)
        .map(|(_, pool)| {
            db::on_connection(pool, state.db_timeout, async |db| {
                db.query_one(
                    "SELECT coalesce(sum(r.quantity), 0)::bigint FROM reservations AS r
                      WHERE r.owner = $1 AND r.status = 'held' AND r.expires_at > now()
                        AND EXISTS (SELECT 1 FROM leases AS l WHERE l.partition = r.partition)",
                    &[&client],
                )
                .await
                .map(|row| row.get::<_, i64>(0))
            })
        });
    let mut total = 0;
    for held in futures::future::join_all(reads).await {
        total += held.map_err(|e| {
            RouterError::Storage(format!(
                "reading what the client holds on other shards: {e}"
            ))
        })?;
    }
    Ok(Some(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserve<'a>(id: &'a str, sku: &'a str) -> Claim<'a> {
        Claim {
            kind: Kind::Reservation,
            id,
            partition: 1,
            sku,
            amount: 1,
            ttl_seconds: Some(900),
        }
    }

    fn existing(owner: Option<&str>, sku: &str) -> Existing {
        Existing {
            owner: owner.map(str::to_owned),
            sku: sku.to_owned(),
            amount: 2,
            ttl_seconds: Some(60),
        }
    }

    #[test]
    fn the_same_sku_is_forwarded_another_is_refused_as_one_database_refuses_it() {
        let anyone = access::Owner::ANYONE;
        assert!(decide(&reserve("x", "a"), &existing(None, "a"), &anyone).is_ok());
        match decide(&reserve("x", "b"), &existing(None, "a"), &anyone) {
            Err(RouterError::IdempotencyMismatch(detail)) => assert_eq!(
                detail,
                "reservation x already exists for sku a quantity 2 ttl_seconds 60"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_clients_adjustment_id_does_not_exist() {
        let adjust = Claim {
            kind: Kind::Adjustment,
            ttl_seconds: None,
            ..reserve("adj", "b")
        };
        let bob = access::Owner::client("bob", true);
        match decide(&adjust, &existing(Some("alice"), "a"), &bob) {
            Err(RouterError::NotFound(detail)) => {
                assert_eq!(detail, "adjustment adj does not exist")
            }
            other => panic!("{other:?}"),
        }
        match decide(&adjust, &existing(Some("bob"), "a"), &bob) {
            Err(RouterError::IdempotencyMismatch(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}
