//! What the ledger partition and archive tests share: fenced batches written the way every
//! allocator writes them (`apply_fenced_batch` under a lease taken as a campaign takes it), a
//! digest of every ledger row, and a settled range written under the settlement job's term.

use std::path::Path;

use tokio_postgres::Client;

/// Take lease `name` for `holder` with the next epoch, unexpired for a minute.
pub(crate) async fn acquire(pg: &Client, name: &str, holder: &str) -> i64 {
    pg.query_one(
        "UPDATE leases SET holder_id = $2, epoch = epoch + 1, acquired_at = clock_timestamp(),
                renewed_at = clock_timestamp(),
                expires_at = clock_timestamp() + interval '1 minute'
          WHERE name = $1
      RETURNING epoch",
        &[&name, &holder],
    )
    .await
    .unwrap_or_else(|e| panic!("acquire {name}: {e}"))
    .get(0)
}

/// One fenced batch of `(op, id, sku, amount)` on `partition`; every command must succeed.
pub(crate) async fn batch(
    pg: &Client,
    holder: &str,
    partition: i32,
    epoch: i64,
    commands: &[(&str, &str, &str, i64)],
) {
    let n = commands.len();
    let ops: Vec<&str> = commands.iter().map(|c| c.0).collect();
    let ids: Vec<&str> = commands.iter().map(|c| c.1).collect();
    let skus: Vec<Option<&str>> = commands
        .iter()
        .map(|c| matches!(c.0, "reserve" | "adjust").then_some(c.2))
        .collect();
    let amounts: Vec<i64> = commands.iter().map(|c| c.3).collect();
    let ttls: Vec<Option<i32>> = commands
        .iter()
        .map(|c| (c.0 == "reserve").then_some(600))
        .collect();
    let rows = pg
        .query(
            "SELECT o_result FROM apply_fenced_batch($1, ARRAY[$2::integer], ARRAY[$3::bigint],
                                                     $4, $5, $6, $7, $8, $9)",
            &[
                &holder,
                &partition,
                &epoch,
                &vec![partition; n],
                &ops,
                &ids,
                &skus,
                &amounts,
                &ttls,
            ],
        )
        .await
        .expect("apply_fenced_batch");
    let results: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        results
            .iter()
            .all(|r| matches!(r.as_str(), "created" | "transitioned" | "adjusted")),
        "{commands:?} answered {results:?}"
    );
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
