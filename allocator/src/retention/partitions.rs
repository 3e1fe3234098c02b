//! The ledger's time partitions (`V17__ledger_partitioned_by_time.sql`): keeping partitions
//! ahead of the clock, and what the replicas export about them.
//!
//! An insert whose `recorded_at` falls after the last partition fails, so partitions must
//! always exist ahead of now. `ledger_ensure_partitions()` creates them up to three spans (at
//! least a minute) ahead; every replica calls it at start and on every tick of the retention job
//! (holder or not), so no single replica is needed for it. The function lets one caller work at
//! a time and returns at once for the others.

use tokio_postgres::GenericClient;

/// The partitions after an upkeep round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upkeep {
    /// Partitions this round created.
    pub created: i32,
    /// Partitions attached to the ledger now.
    pub attached: i64,
    /// How far past now (database clock) the last partition ends: inserts stamped later fail.
    pub ahead_secs: f64,
    /// The span of partitions created from now on.
    pub span_secs: f64,
}

/// Create the partitions that are due, then read where the partitions stand.
pub async fn upkeep<C: GenericClient>(client: &C) -> Result<Upkeep, tokio_postgres::Error> {
    let created: i32 = client
        .query_one("SELECT ledger_ensure_partitions()", &[])
        .await?
        .get(0);
    let row = client
        .query_one(
            "SELECT count(*),
                    coalesce(extract(epoch FROM max(range_end) - now()), 0)::float8,
                    (SELECT extract(epoch FROM span)::float8 FROM ledger_partitioning)
               FROM ledger_partitions",
            &[],
        )
        .await?;
    Ok(Upkeep {
        created,
        attached: row.get(0),
        ahead_secs: row.get(1),
        span_secs: row.get(2),
    })
}
