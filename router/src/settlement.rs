//! Every shard's settlement job as the router sees it. Each shard runs a job of its own (the
//! lease `job/settlement` in its own database) over its own rows, with its own windows.
//!
//! * [`read_all`] and [`answer`]: `GET /v1/jobs/settlement` reads every shard at once, each
//!   within `db_timeout`; the catalog's status is the answer's top level (what a one-database
//!   cluster always answered) and every shard's is listed in `shards`. A shard that cannot be read
//!   is listed with its `error` instead of failing the answer; only the catalog's failure fails
//!   it, as before.
//! * [`watch`]: once per poll interval, one cheap read per shard ([`schema::settlement::read_lag`],
//!   one index probe) sets [`crate::metrics::SETTLEMENT_LAG_SECONDS`] for that shard; a failed read
//!   counts [`crate::metrics::SETTLEMENT_READ_FAILURES_TOTAL`] and leaves the gauge at its last
//!   value.

use std::time::Duration;

use deadpool_postgres::Pool;
use schema::shard::ShardName;
use schema::wire::{
    SettlementStatus, ShardSettlement, ShardSettlementRead, ShardedSettlementStatus,
};
use tokio_util::sync::CancellationToken;

use crate::db::{self, DbError};

/// Every shard's status (or why it could not be read), in the order of `shards`; all read at
/// once, each bounded by `timeout`.
pub async fn read_all(
    shards: &[(ShardName, Pool)],
    timeout: Duration,
) -> Vec<(String, Result<SettlementStatus, DbError>)> {
    futures::future::join_all(shards.iter().map(|(name, pool)| async move {
        (name.to_string(), db::settlement_status(pool, timeout).await)
    }))
    .await
}

/// The answer from every shard's read, the catalog's first: the catalog's status with every
/// shard's listed, or the catalog's error (there is no answer without the catalog's status).
pub fn answer(
    reads: Vec<(String, Result<SettlementStatus, DbError>)>,
) -> Result<ShardedSettlementStatus, DbError> {
    let mut catalog = None;
    let mut shards = Vec::with_capacity(reads.len());
    for (index, (name, read)) in reads.into_iter().enumerate() {
        let status = match read {
            Ok(status) => {
                if index == 0 {
                    catalog = Some(status.clone());
                }
                ShardSettlementRead::Status(status)
            }
            Err(e) if index == 0 => return Err(e),
            Err(e) => ShardSettlementRead::Unreadable {
                error: format!("storage unavailable: {e}"),
            },
        };
        shards.push(ShardSettlement { name, status });
    }
    // A configuration names at least one shard, the catalog first.
    let catalog = catalog.ok_or(DbError::Timeout(Duration::ZERO))?;
    Ok(ShardedSettlementStatus { catalog, shards })
}

/// Sets every shard's settlement lag gauge once per `interval` until `shutdown`.
pub async fn watch(
    shards: Vec<(ShardName, Pool)>,
    interval: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {
                futures::future::join_all(shards.iter().map(|(name, pool)| async move {
                    match read_lag(pool, timeout).await {
                        Ok(lag) => crate::metrics::set_settlement_lag(name.as_str(), lag),
                        Err(e) => {
                            tracing::debug!(shard = %name, error = %e, "settlement lag not read");
                            crate::metrics::record_settlement_read_failure(name.as_str());
                        }
                    }
                }))
                .await;
            }
        }
    }
    tracing::debug!("settlement watch stopped");
}

async fn read_lag(pool: &Pool, timeout: Duration) -> Result<f64, DbError> {
    db::bounded(timeout, async {
        let client = pool.get().await?;
        Ok(schema::settlement::read_lag(&**client).await?)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(holder: &str, windows: i64) -> SettlementStatus {
        SettlementStatus {
            holder_id: Some(holder.to_owned()),
            term: 3,
            lease_remaining_ms: Some(1200),
            last_settled: None,
            settled_windows: windows,
            lag_seconds: 1.5,
        }
    }

    fn down() -> DbError {
        DbError::Timeout(Duration::from_secs(2))
    }

    #[test]
    fn the_catalog_is_the_top_level_and_every_shard_is_listed() {
        let answer = answer(vec![
            ("s0".to_owned(), Ok(status("a", 4))),
            ("s1".to_owned(), Ok(status("b", 9))),
        ])
        .unwrap();
        assert_eq!(answer.catalog, status("a", 4));
        assert_eq!(
            answer.shards,
            vec![
                ShardSettlement {
                    name: "s0".to_owned(),
                    status: ShardSettlementRead::Status(status("a", 4)),
                },
                ShardSettlement {
                    name: "s1".to_owned(),
                    status: ShardSettlementRead::Status(status("b", 9)),
                },
            ]
        );
    }

    #[test]
    fn an_unreadable_shard_is_listed_with_its_error_and_the_catalogs_fails_the_answer() {
        let answer = answer(vec![
            ("s0".to_owned(), Ok(status("a", 4))),
            ("s1".to_owned(), Err(down())),
        ])
        .unwrap();
        assert_eq!(
            answer.shards[1].status,
            ShardSettlementRead::Unreadable {
                error: "storage unavailable: database did not answer within 2s".to_owned()
            }
        );
        let failed = super::answer(vec![
            ("s0".to_owned(), Err(down())),
            ("s1".to_owned(), Ok(status("b", 9))),
        ]);
        assert!(matches!(failed, Err(DbError::Timeout(_))), "{failed:?}");
    }

    #[test]
    fn the_json_keeps_the_one_shard_fields_and_adds_shards() {
        let answer = answer(vec![
            ("s0".to_owned(), Ok(status("a", 4))),
            ("s1".to_owned(), Err(down())),
        ])
        .unwrap();
        let json = serde_json::to_value(&answer).unwrap();
        let mut alone = serde_json::to_value(status("a", 4)).unwrap();
        alone["shards"] = serde_json::json!([
            {
                "name": "s0", "holder_id": "a", "term": 3, "lease_remaining_ms": 1200,
                "last_settled": null, "settled_windows": 4, "lag_seconds": 1.5
            },
            {"name": "s1", "error": "storage unavailable: database did not answer within 2s"}
        ]);
        assert_eq!(json, alone);
        // Read back, each shard is what it was; an allocator's client reads the top level.
        let back: ShardedSettlementStatus = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, answer);
        let top: SettlementStatus = serde_json::from_value(json).unwrap();
        assert_eq!(top, status("a", 4));
    }
}
