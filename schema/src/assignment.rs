//! The partition → owner assignment map, read from the lease table.
//!
//! Both the allocator (`GET /v1/partitions`, the body of a `421`) and the router (its routing
//! cache) read the map with [`read_map`], so there is one query and one meaning of "owner": a
//! holder whose lease has not expired by the database clock.
//!
//! Changes are announced on Redis as [`crate::hint::AssignmentHint`]s; a hint is never state, a
//! receiver re-reads the map here.

use tokio_postgres::GenericClient;

use crate::wire::{PartitionAssignment, PartitionMap};

const MAP_QUERY: &str = "
    SELECT partition, holder_id, holder_url, epoch, revision,
           CASE WHEN holder_id IS NOT NULL AND expires_at > now()
                THEN (extract(epoch FROM expires_at - now()) * 1000)::bigint END AS remaining_ms
      FROM leases
     WHERE partition IS NOT NULL";

fn assignment_from_row(row: &tokio_postgres::Row) -> PartitionAssignment {
    let remaining: Option<i64> = row.get("remaining_ms");
    let live = remaining.is_some();
    PartitionAssignment {
        partition: row.get::<_, i32>("partition") as u32,
        // An expired lease names nobody, whatever the row still says.
        owner_id: if live { row.get("holder_id") } else { None },
        owner_url: if live { row.get("holder_url") } else { None },
        epoch: row.get("epoch"),
        revision: row.get("revision"),
        lease_remaining_ms: remaining,
    }
}

/// Read the whole map, ordered by partition.
pub async fn read_map<C: GenericClient>(client: &C) -> Result<PartitionMap, tokio_postgres::Error> {
    let rows = client
        .query(&format!("{MAP_QUERY} ORDER BY partition"), &[])
        .await?;
    let partitions: Vec<PartitionAssignment> = rows.iter().map(assignment_from_row).collect();
    let revision = partitions.iter().map(|p| p.revision).max().unwrap_or(0);
    // The cluster's count, not the rows': a shard holds the lease rows of its partitions only.
    let count = client
        .query_opt("SELECT partition_count FROM cluster_settings", &[])
        .await?
        .map_or(partitions.len() as u32, |r| r.get::<_, i32>(0) as u32);
    Ok(PartitionMap {
        partition_count: count,
        revision,
        partitions,
    })
}

/// Read one partition's entry.
pub async fn read_partition<C: GenericClient>(
    client: &C,
    partition: u32,
) -> Result<Option<PartitionAssignment>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            &format!("{MAP_QUERY} AND partition = $1"),
            &[&(partition as i32)],
        )
        .await?;
    Ok(row.as_ref().map(assignment_from_row))
}

/// Where an existing reservation lives and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationPlace {
    pub partition: u32,
    pub sku: String,
    /// The client that made it; `None` for the anonymous or unknown owner (`V18__owners.sql`).
    pub owner: Option<String>,
}

/// The partition (with the SKU and the owner) of an existing reservation; confirm/release/get
/// carry only the id, so routers look it up to know where the reservation lives, and whether
/// their client may see it at all.
pub async fn reservation_partition<C: GenericClient>(
    client: &C,
    reservation_id: &str,
) -> Result<Option<ReservationPlace>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT partition, sku, owner FROM reservations WHERE reservation_id = $1",
            &[&reservation_id],
        )
        .await?;
    Ok(row.map(|r| ReservationPlace {
        partition: r.get::<_, i32>(0) as u32,
        sku: r.get(1),
        owner: r.get(2),
    }))
}
