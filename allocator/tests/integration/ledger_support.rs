//! What the ledger partition and archive tests share: a digest of every ledger row, counts and
//! sums, a settled range and relay progress written under the settlement job's term, and a
//! load whose every hold is resolved at once. Fenced batches are `testkit::fenced`'s.

use std::path::Path;
use std::time::{Duration, Instant};

use schema::wire::ReserveRequest;
pub(crate) use testkit::fenced::{acquire, batch};
use tokio_postgres::Client;

use crate::common::TestReplica;

/// Reserves of 1–3 units over `skus` for `duration`, every one confirmed (two in three) or
/// released at once, so no hold is left to expire and the ledger stops growing with the load.
pub(crate) async fn resolved_load(
    replica: &TestReplica,
    prefix: &str,
    skus: &[&str],
    duration: Duration,
) {
    let end = Instant::now() + duration;
    let mut i = 0;
    while Instant::now() < end {
        i += 1;
        let id = format!("{prefix}-{i}");
        let request = ReserveRequest {
            reservation_id: id.parse().expect("valid id"),
            sku: skus[i % skus.len()].parse().expect("valid sku"),
            quantity: (1 + (i % 3) as i64).try_into().expect("valid quantity"),
            ttl_seconds: None,
        };
        let answer = replica.api.reserve(&request).await;
        assert_eq!(answer.status.as_u16(), 201, "{answer:?}");
        let next = if i % 3 == 0 {
            replica.api.release(&id).await
        } else {
            replica.api.confirm(&id).await
        };
        assert!(next.status.is_success(), "{next:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The first partition (the one without a lower bound).
pub(crate) async fn first_partition(pg: &Client) -> String {
    pg.query_one(
        "SELECT name FROM ledger_partitions WHERE range_start IS NULL",
        &[],
    )
    .await
    .expect("the first partition")
    .get(0)
}

/// Row count and an MD5 of every row of `table` (all columns, in entry order).
pub(crate) async fn digest(pg: &Client, table: &str) -> (i64, String) {
    let row = pg
        .query_one(
            &format!(
                "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY entry_id), ''))
                   FROM {table} AS t"
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("digest of {table}: {e}"));
    (row.get(0), row.get(1))
}

/// Count and column sums (on_hand, available, held, confirmed) of the rows `from` names.
pub(crate) async fn sums(pg: &Client, from: &str) -> (i64, [i64; 4]) {
    let row = pg
        .query_one(
            &format!(
                "SELECT count(*), coalesce(sum(d_on_hand), 0)::bigint,
                        coalesce(sum(d_available), 0)::bigint, coalesce(sum(d_held), 0)::bigint,
                        coalesce(sum(d_confirmed), 0)::bigint
                   FROM {from}"
            ),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("sums of {from}: {e}"));
    (row.get(0), [row.get(1), row.get(2), row.get(3), row.get(4)])
}

/// Mark everything before now settled: one window from the beginning of time to now, written
/// under a freshly taken `job/settlement` term, as the settlement job's claim and settle write.
pub(crate) async fn settle_until_now(pg: &Client) {
    let term = acquire(pg, "job/settlement", "test-settler").await;
    pg.execute(
        "INSERT INTO settlement_runs (window_start, window_end, status, term, holder_id)
         VALUES ('2000-01-01', now(), 'running', $1, 'test-settler')",
        &[&term],
    )
    .await
    .expect("claim");
    pg.execute(
        "UPDATE settlement_runs SET status = 'settled', finished_at = now(), reservations = 0,
                quantity = 0, term = $1
          WHERE status = 'running'",
        &[&term],
    )
    .await
    .expect("settle");
}

/// Record every stream as published up to its last position, under the settlement job's term
/// (the relay's progress is fenced by it).
pub(crate) async fn publish_everything(pg: &Client) {
    let term = acquire(pg, "job/settlement", "test-relay").await;
    pg.execute(
        "UPDATE event_relay_progress AS e SET published = p.last_position, term = $1
           FROM ledger_positions AS p
          WHERE e.stream = 'partition/' || p.partition",
        &[&term],
    )
    .await
    .expect("publish");
}

/// `sha256sum -c` on the checksum file beside `file`, run in its directory: the file format is
/// the tool's, and the tool checks it independently of the allocator's own code.
pub(crate) fn sha256sum_accepts(file: &Path) -> bool {
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    std::process::Command::new("sha256sum")
        .arg("-c")
        .arg(format!("{name}.sha256"))
        .current_dir(file.parent().unwrap())
        .output()
        .expect("run sha256sum")
        .status
        .success()
}
