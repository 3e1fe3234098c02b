//! The run's change-event consumer: the example consumer (`loadtest events`) as a real process,
//! started before the load and run through the whole fault schedule, so Redis restarts, relay
//! takeovers and database failovers happen under it. It logs every delivery to `events.jsonl`,
//! which `chaos-check`'s `event-delivery` rule compares with the dump.
//!
//! The end of a run: the harness waits for the relay to publish what the cluster committed
//! ([`wait_for_relay`]), dumps the database (with the relay's recorded progress), and only then
//! drains the consumer ([`EventConsumer::drain`]): everything the dump calls published is in
//! Redis by then, so the consumer must have it. Rows keep committing after the dump (expiries,
//! settled windows), so the streams' heads are read once more after the consumer stopped
//! ([`write_heads`]): nothing it received may lie beyond them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use testkit::ChildProcess;

use chaos::shards::{self, ShardDb};

/// Every stream's last position (`stream`, `head`), from the counters, which archival leaves
/// alone.
const STREAM_HEADS: &str = "SELECT 'partition/' || partition AS stream, last_position AS head
                              FROM ledger_positions
                            UNION ALL
                            SELECT 'settlement', max(position) FROM settlement_runs";

/// What each shard's relay recorded as published (`stream`, `published`).
const RELAY_PROGRESS: &str =
    "SELECT stream, published FROM event_relay_progress WHERE published > 0";

/// Seconds without a new event after which a draining consumer stops short of its targets.
const DRAIN_IDLE_SECS: u64 = 5;

/// The consumer process and its files.
pub struct EventConsumer {
    process: ChildProcess,
    /// Created to tell the consumer to stop once idle.
    drain_file: PathBuf,
}

impl EventConsumer {
    /// Starts `loadtest events` on every stream of `partitions` and of every shard in `shards`
    /// (none for one database), filling gaps from `target`
    /// (a router, with an `admin` token) and logging to `out/events.jsonl`.
    pub fn start(
        loadtest_bin: &Path,
        redis_url: &str,
        partitions: u32,
        target: &str,
        token: &str,
        shards: &[String],
        out: &Path,
    ) -> Result<EventConsumer> {
        let drain_file = out.join("events.drain");
        let _ = std::fs::remove_file(&drain_file);
        let log = out.join("events.jsonl");
        let mut args = vec![
            "events".to_owned(),
            "--redis-url".to_owned(),
            redis_url.to_owned(),
            "--partitions".to_owned(),
            partitions.to_string(),
            "--target".to_owned(),
            target.to_owned(),
            "--group".to_owned(),
            "chaos".to_owned(),
            "--idle-secs".to_owned(),
            DRAIN_IDLE_SECS.to_string(),
            "--log".to_owned(),
            log.display().to_string(),
            "--drain-when".to_owned(),
            drain_file.display().to_string(),
        ];
        // Over several shards, every shard's settlement stream (the catalog's is `settlement`).
        for shard in shards {
            args.extend(["--shard".to_owned(), shard.clone()]);
        }
        // The token goes through the environment, not the command line others can read.
        let env = [("LOADTEST_TOKEN".to_owned(), token.to_owned())];
        let process = ChildProcess::spawn(
            loadtest_bin,
            args,
            &env,
            &out.join("logs").join("events-consumer.log"),
        )
        .context("starting the change-event consumer")?;
        Ok(EventConsumer {
            process,
            drain_file,
        })
    }

    /// Tells the consumer to stop once it has every stream up to the relay's recorded progress
    /// (read now, after the dump, on every shard) and waits (at most `limit`) for it; a consumer
    /// that does not stop is killed, and what it logged is still judged.
    pub async fn drain(mut self, shards: &[ShardDb], limit: Duration) -> Result<()> {
        let progress = serde_json::to_string(&shards::by_stream(shards, RELAY_PROGRESS).await?)?;
        std::fs::write(&self.drain_file, progress).context("creating the drain file")?;
        match self.process.wait_exit(limit).await {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => {
                tracing::warn!(%status, log = %self.process.log_path().display(), "the event consumer failed");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "the event consumer did not stop; killing it");
                self.process.sigkill()
            }
        }
    }
}

/// Writes every stream's last position now ([`STREAM_HEADS`], each from the shard that holds
/// it) to `out/events.heads.json` (`{"partition/3": 812, …}`): read after the consumer stopped,
/// nothing it received may lie beyond.
pub async fn write_heads(shards: &[ShardDb], out: &Path) -> Result<()> {
    let heads = serde_json::to_string(&shards::by_stream(shards, STREAM_HEADS).await?)?;
    let path = out.join("events.heads.json");
    std::fs::write(&path, heads).with_context(|| format!("writing {}", path.display()))
}

/// Waits (at most `limit`) until every shard's relay recorded each of its streams as published
/// up to its head; a relay that lags is the checker's business, not a reason to stop.
pub async fn wait_for_relay(shards: &[ShardDb], limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let behind = async {
            let mut behind = Vec::new();
            for shard in shards {
                // Streams the relay keeps no progress for are not waited for.
                let published = shard
                    .by_stream("SELECT stream, published FROM event_relay_progress")
                    .await?;
                for (stream, head) in shard.by_stream(STREAM_HEADS).await? {
                    if published.get(&stream).is_some_and(|p| *p < head) {
                        behind.push(stream);
                    }
                }
            }
            anyhow::Ok(behind)
        }
        .await;
        match behind {
            Ok(b) if b.is_empty() => return,
            _ if Instant::now() >= deadline => {
                tracing::warn!(?behind, "the relay did not catch up before the dump");
                return;
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
