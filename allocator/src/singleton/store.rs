//! A singleton job's lease statements, by lease name (`job/settlement`, `job/retention`): no
//! assignment revision, because no job is routed to.

use std::time::Duration;

use tokio_postgres::GenericClient;

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// Take the job lease when nobody holds it, it expired, or this replica is the recorded holder
/// (a restart). Always a new, higher term.
pub async fn acquire<C: GenericClient>(
    client: &C,
    lease: &str,
    holder_id: &str,
    ttl: Duration,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            // FOR UPDATE first, as for partitions: it waits for (or times out on) every step
            // still holding the row FOR KEY SHARE under the old term.
            "WITH target AS (
                 SELECT name FROM leases
                  WHERE name = $1 AND (holder_id IS NULL OR expires_at <= now() OR holder_id = $2)
                    FOR UPDATE)
             UPDATE leases AS l
                SET holder_id = $2, holder_url = NULL, epoch = l.epoch + 1,
                    acquired_at = now(), renewed_at = now(),
                    expires_at = now() + $3::bigint * interval '1 millisecond',
                    transitions = l.transitions + 1
               FROM target
              WHERE l.name = target.name
          RETURNING l.epoch",
            &[&lease, &holder_id, &millis(ttl)],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Extend the job lease; `false` means it is no longer this replica's at this term.
pub async fn renew<C: GenericClient>(
    client: &C,
    lease: &str,
    holder_id: &str,
    term: i64,
    ttl: Duration,
) -> Result<bool, tokio_postgres::Error> {
    let rows = client
        .execute(
            "UPDATE leases
                SET renewed_at = now(), expires_at = now() + $4::bigint * interval '1 millisecond'
              WHERE name = $1 AND holder_id = $2 AND epoch = $3 AND expires_at > now()",
            &[&lease, &holder_id, &term, &millis(ttl)],
        )
        .await?;
    Ok(rows == 1)
}

/// Give the job lease back so a peer can take it at once; conditional on holder and term.
pub async fn release<C: GenericClient>(
    client: &C,
    lease: &str,
    holder_id: &str,
    term: i64,
) -> Result<bool, tokio_postgres::Error> {
    let rows = client
        .execute(
            "UPDATE leases SET holder_id = NULL, expires_at = now(), transitions = transitions + 1
              WHERE name = $1 AND holder_id = $2 AND epoch = $3",
            &[&lease, &holder_id, &term],
        )
        .await?;
    Ok(rows == 1)
}
