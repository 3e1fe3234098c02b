//! Writing the database as an allocator writes it, for tests that build a history without a
//! replica: a lease taken as a campaign takes it (the next epoch, so the lease history records
//! it), and fenced batches through `apply_fenced_batch`, the statement every allocator sends.

use tokio_postgres::Client;

/// Take lease `name` for `holder` with the next epoch, unexpired for a minute.
pub async fn acquire(pg: &Client, name: &str, holder: &str) -> i64 {
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

/// One fenced batch of `(op, id, sku, amount)` on `partition` under `holder` at `epoch`; panics
/// unless every command is `created`, `transitioned` or `adjusted`. The SKU is sent for reserves
/// and adjustments only, as the allocator sends it.
pub async fn batch(
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
