//! A singleton job's lease statements, by lease name (`job/settlement`, `job/retention`): no
//! assignment revision, because no job is routed to.

use std::time::Duration;

use tokio_postgres::GenericClient;

use crate::lease::take::{take_lease, LeaseTake, When};

fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// Take the job lease when nobody holds it, it expired, or this replica is the recorded holder
/// (a restart). Always a new, higher term. The partitions' statement ([`take_lease`]): its
/// `FOR UPDATE` waits for (or times out on) every step still holding the row `FOR KEY SHARE`
/// under the old term; no holder URL and no assignment revision, as no job is routed to.
pub async fn acquire<C: GenericClient>(
    client: &C,
    lease: &str,
    holder_id: &str,
    ttl: Duration,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let taken = take_lease(
        client,
        LeaseTake {
            name: lease,
            holder: holder_id,
            url: None,
            ttl,
            when: When::Vacant,
            new_revision: false,
        },
    )
    .await?;
    Ok(taken.map(|t| t.epoch))
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
