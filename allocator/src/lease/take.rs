//! The one statement that takes a lease row: a partition's (campaign), a job's (singleton), and
//! the mover's on either shard (fence, take-over of an incoming row).
//!
//! Every taker needs the same three things, and getting any of them wrong in one copy breaks
//! fencing for that taker only, which is why they are written once:
//!
//! * the row is locked `FOR UPDATE` first, in a CTE: that is the lock mode that conflicts with
//!   the `FOR KEY SHARE` fence of an in-flight batch or job step, so a taker waits for (or, on its
//!   lock timeout, gives up on) every transaction still writing under the old epoch. A plain
//!   `UPDATE` of these non-key columns would not conflict with the fence;
//! * the epoch goes up (the fence tokens of the old holder stop matching), judged with the
//!   database clock (`now()`), so no replica compares its own wall clock with anybody's;
//! * `acquired_at`, `renewed_at`, `expires_at` and `transitions` are set alike.
//!
//! What differs between takers is a parameter ([`LeaseTake`]): which rows may be taken
//! ([`When`]), whether a holder URL is advertised, whether a new assignment revision is taken
//! (routers order partition hand-overs by it; jobs are not routed to).

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

/// Which rows a take succeeds on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When<'a> {
    /// Nobody holds it, the holder's lease expired, or the taker is the recorded holder (a
    /// restart under the same id); always a new, higher epoch. A row a move is bringing in
    /// (`moving_in`) is never vacant, even after the mover's lease expires. Job rows are never
    /// marked so (only the mover marks, and only partition rows), so the test is the same for
    /// them. The condition is checked again in the `UPDATE` itself, as partition acquisition
    /// always did; with the row already locked by the CTE the second check sees the same row.
    Vacant,
    /// Whoever holds it (the mover's fence on the source). The epoch stays when the taker
    /// already holds the row unexpired (a repeated fence of the same attempt), and goes up
    /// otherwise.
    Always,
    /// A row a move brought in (`moving_in`) and still held by a mover whose holder id matches
    /// `held_by` (a regular expression): a re-run taking over from an earlier attempt; always a
    /// new, higher epoch.
    Incoming { held_by: &'a str },
}

/// One take of a lease row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseTake<'a> {
    /// The row's `name` (`partition/<n>`, `job/<name>`).
    pub name: &'a str,
    /// The taker's holder id.
    pub holder: &'a str,
    /// The URL routers forward to (`holder_url`); `None` clears it.
    pub url: Option<&'a str>,
    pub ttl: Duration,
    pub when: When<'a>,
    /// Take a new `revision` from `assignment_revision`.
    pub new_revision: bool,
}

/// A successful take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub epoch: i64,
    /// The row's revision after the take (a new one with [`LeaseTake::new_revision`]).
    pub revision: i64,
    /// How long the row had no live holder before the take, by the database clock (zero when
    /// its lease had not expired).
    pub vacant: Duration,
}

/// The vacancy test, on the CTE's unqualified columns or on the updated row `l`.
fn vacant(row: &str) -> String {
    format!("({row}holder_id IS NULL OR {row}expires_at <= now() OR {row}holder_id = $2)")
}

impl LeaseTake<'_> {
    /// The statement and its parameters: `$1` name, `$2` holder, `$3` TTL in milliseconds, then
    /// the URL and the holder pattern when there are.
    fn statement<'s>(&'s self, ttl_ms: &'s i64) -> (String, Vec<&'s (dyn ToSql + Sync)>) {
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&self.name, &self.holder, ttl_ms];
        let url = match &self.url {
            Some(url) => {
                params.push(url);
                format!("${}", params.len())
            }
            None => "NULL".to_owned(),
        };
        let (lock_if, update_if, epoch) = match &self.when {
            When::Vacant => (
                format!(" AND NOT moving_in AND {}", vacant("")),
                format!(" AND {}", vacant("l.")),
                "l.epoch + 1".to_owned(),
            ),
            When::Always => (
                String::new(),
                String::new(),
                "CASE WHEN l.holder_id = $2 AND l.expires_at > now() \
                 THEN l.epoch ELSE l.epoch + 1 END"
                    .to_owned(),
            ),
            When::Incoming { held_by } => {
                params.push(held_by);
                (
                    format!(" AND moving_in AND holder_id ~ ${}", params.len()),
                    String::new(),
                    "l.epoch + 1".to_owned(),
                )
            }
        };
        let revision = if self.new_revision {
            "revision = nextval('assignment_revision'), "
        } else {
            ""
        };
        let sql = format!(
            "WITH target AS (
                 SELECT name, expires_at AS vacant_since FROM leases
                  WHERE name = $1{lock_if}
                    FOR UPDATE)
             UPDATE leases AS l
                SET holder_id = $2, holder_url = {url}, epoch = {epoch},
                    {revision}acquired_at = now(), renewed_at = now(),
                    expires_at = now() + $3::bigint * interval '1 millisecond',
                    transitions = l.transitions + 1
               FROM target
              WHERE l.name = target.name{update_if}
          RETURNING l.epoch, l.revision,
                    greatest(0, (extract(epoch FROM now() - target.vacant_since) * 1000)::bigint)"
        );
        (sql, params)
    }
}

/// Take a lease row as `take` says; `None` when the row is missing or not takeable.
pub(crate) async fn take_lease<C: GenericClient>(
    client: &C,
    take: LeaseTake<'_>,
) -> Result<Option<Taken>, tokio_postgres::Error> {
    let ttl_ms = take.ttl.as_millis() as i64;
    let (sql, params) = take.statement(&ttl_ms);
    let row = client.query_opt(sql.as_str(), &params).await?;
    Ok(row.map(|r| Taken {
        epoch: r.get(0),
        revision: r.get(1),
        vacant: Duration::from_millis(r.get::<_, Option<i64>>(2).unwrap_or(0) as u64),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(url: Option<&str>, when: When<'_>, new_revision: bool) -> (String, usize) {
        let take = LeaseTake {
            name: "partition/1",
            holder: "r1",
            url,
            ttl: Duration::from_secs(1),
            when,
            new_revision,
        };
        let (sql, params) = take.statement(&1000);
        (sql, params.len())
    }

    #[test]
    fn each_taker_gets_its_conditions_and_columns() {
        let (s, n) = sql(Some("http://a"), When::Vacant, true);
        assert_eq!(n, 4);
        assert!(s.contains("holder_url = $4"));
        assert!(s.contains("WHERE name = $1 AND NOT moving_in AND (holder_id IS NULL"));
        assert!(
            s.contains("AND (l.holder_id IS NULL OR l.expires_at <= now() OR l.holder_id = $2)")
        );
        assert!(s.contains("revision = nextval('assignment_revision')"));
        assert!(s.contains("epoch = l.epoch + 1,"));

        let (s, n) = sql(None, When::Vacant, false);
        assert_eq!(n, 3);
        assert!(s.contains("holder_url = NULL"));
        assert!(!s.contains("nextval"));

        let (s, n) = sql(None, When::Always, true);
        assert_eq!(n, 3);
        assert!(s.contains("WHERE name = $1\n"));
        assert!(s.contains("THEN l.epoch ELSE l.epoch + 1 END"));
        assert!(s.contains("WHERE l.name = target.name\n"));

        let (s, n) = sql(
            None,
            When::Incoming {
                held_by: "^move/1/",
            },
            true,
        );
        assert_eq!(n, 4);
        assert!(s.contains("WHERE name = $1 AND moving_in AND holder_id ~ $4\n"));
        assert!(s.contains("FOR UPDATE"));
    }
}
