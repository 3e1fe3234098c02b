//! Binary `COPY` of rows from one shard's snapshot into another shard's transaction: the one
//! way a move carries rows, for the partition's tables ([`super::steps`]) and its ledger
//! ([`super::ledger`]).

use futures::{SinkExt, StreamExt};
use tokio_postgres::Transaction;

/// `COPY` the rows `select` yields on `from` into `into` on `to`, in binary (both shards run the
/// same migrations, so the columns match); how many.
pub(super) async fn copy_rows(
    from: &Transaction<'_>,
    to: &Transaction<'_>,
    select: &str,
    into: &str,
) -> anyhow::Result<u64> {
    let out = from
        .copy_out(&format!("COPY ({select}) TO STDOUT (FORMAT binary)"))
        .await?;
    let sink = to
        .copy_in(&format!("COPY {into} FROM STDIN (FORMAT binary)"))
        .await?;
    let mut sink = std::pin::pin!(sink);
    let mut out = std::pin::pin!(out);
    while let Some(chunk) = out.next().await {
        sink.feed(chunk?).await?;
    }
    Ok(sink.as_mut().finish().await?)
}
