//! `loadtest events`: an example change-event consumer (DESIGN.md §14).
//!
//! It reads every partition's stream and the settlement streams (`events:settlement`, and with
//! `--shard` every other shard's `events:settlement:<shard>`) through a Redis consumer group,
//! applies each event once by position, acknowledges it, and reports what it saw. The pattern a
//! real consumer follows:
//!
//! * remember the last applied position per stream (here in memory; a real consumer stores it
//!   with what it applies, in one transaction);
//! * an event at or below it is a duplicate (a redelivery, a republish after a Redis restart):
//!   acknowledge and skip it, after checking it carries the same key;
//! * an event beyond the next position means entries are missing from Redis (trimmed by `MAXLEN`,
//!   or lost with a Redis restart before the relay republished them): fill the gap from
//!   `GET /v1/events` (with `--target`), then go on;
//! * a group that vanished (Redis restarted empty) is created again from the stream's start;
//! * Redis or the gap-filling target being down is waited out (reconnect with backoff), never
//!   a reason to skip ahead.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use allocator_client::backoff::Backoff;
use anyhow::{bail, Context};
use clap::Args;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use schema::events::{Event, EventPage, Stream};
use schema::shard::ShardName;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Redis the allocators relay to (`--redis-url` of the allocators).
    #[arg(
        long,
        env = "LOADTEST_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis_url: String,
    /// The cluster's partition count.
    #[arg(long, env = "LOADTEST_PARTITIONS")]
    partitions: u32,
    /// A shard of the cluster, repeated in the catalog's order (the catalog first): each shard
    /// after the first settles its own windows into `settlement/<NAME>`, read as well. Without
    /// it only `settlement` (the catalog shard's, a one-database cluster's only one) is read.
    #[arg(long = "shard", value_name = "NAME")]
    shards: Vec<ShardName>,
    /// Consumer group name.
    #[arg(long, env = "LOADTEST_EVENTS_GROUP", default_value = "loadtest")]
    group: String,
    /// Consumer name inside the group.
    #[arg(long, env = "LOADTEST_EVENTS_CONSUMER", default_value = "consumer-1")]
    consumer: String,
    /// Router or allocator base URL to fill gaps from (`GET /v1/events`, admin scope); without
    /// it a gap is reported, not filled.
    #[arg(long, env = "LOADTEST_TARGET")]
    target: Option<String>,
    /// Bearer token for `--target`.
    #[arg(long, env = "LOADTEST_TOKEN")]
    token: Option<String>,
    /// Stop after this many seconds without a new event.
    #[arg(long, env = "LOADTEST_EVENTS_IDLE_SECS", default_value_t = 5)]
    idle_secs: u64,
    /// Write every delivery (applied, duplicate, filled from the API) as a JSON line to this
    /// file, in the order the consumer saw them: what the chaos run's `event-delivery` rule judges.
    #[arg(long, env = "LOADTEST_EVENTS_LOG")]
    log: Option<PathBuf>,
    /// Keep consuming, however long no event arrives (Redis down, the relay moving), until this
    /// file exists; then stop once every stream the file names (a JSON object of stream name →
    /// position, `{"partition/3": 812}`) is applied up to that position, or after `--idle-secs`
    /// without news.
    #[arg(long, env = "LOADTEST_EVENTS_DRAIN_WHEN")]
    drain_when: Option<PathBuf>,
}

/// What the consumer saw, per stream and in total.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Last applied position per stream (`partition/P`, `settlement`, `settlement/<shard>`).
    pub last_position: BTreeMap<String, i64>,
    pub applied: u64,
    pub duplicates: u64,
    /// Events fetched from `GET /v1/events` to close a gap.
    pub filled: u64,
    /// Gaps left open (no `--target`).
    pub gaps: u64,
    /// Duplicates whose key differed from the applied event's: must be 0.
    pub key_mismatches: u64,
    /// Redis commands that failed (Redis stopped or restarting) and were retried.
    pub redis_errors: u64,
    /// `GET /v1/events` pages that failed (the target down) and were retried.
    pub fill_errors: u64,
}

/// How long a gap may stay unfillable (the target down) before the consumer gives up.
const FILL_DEADLINE: Duration = Duration::from_secs(90);

/// Where a delivery came from, as the log records it.
#[derive(Debug, Clone, Copy)]
enum Source {
    Redis,
    Api,
}

/// The consumer's state: last applied position per stream, counts, and the delivery log.
struct Consumer {
    last: BTreeMap<Stream, i64>,
    report: Report,
    log: Option<std::io::BufWriter<std::fs::File>>,
}

impl Consumer {
    /// Record one delivery; true when it is applied (the next position), false for a duplicate.
    fn deliver(&mut self, stream: &Stream, event: &Event, key: &str, source: Source) -> bool {
        let position = event.position();
        let applied = self.last[stream];
        let duplicate = position <= applied;
        if duplicate {
            self.report.duplicates += 1;
            if key != stream.key(position) {
                self.report.key_mismatches += 1;
            }
        } else {
            match source {
                Source::Redis => self.report.applied += 1,
                Source::Api => self.report.filled += 1,
            }
            self.last.insert(stream.clone(), position);
        }
        if let Some(log) = &mut self.log {
            let id = match event {
                Event::Ledger(e) => e.reservation_id.clone().or(e.adjustment_id.clone()),
                Event::Settlement(_) => None,
            };
            let line = serde_json::json!({
                "stream": stream.name(), "position": position, "key": key,
                "type": event.event_type(), "id": id, "duplicate": duplicate,
                "source": match source { Source::Redis => "redis", Source::Api => "api" },
            });
            // The log is the chaos checker's evidence: losing a line would be a false alarm.
            writeln!(log, "{line}").expect("writing the delivery log");
        }
        !duplicate
    }
}

async fn connect(url: &str) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).context("--redis-url")?;
    // The manager reconnects by itself after Redis restarts; each command still fails while
    // Redis is away, and the loop below waits that out.
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config)
        .await
        .context("connecting to Redis")
}

pub async fn run(args: EventsArgs) -> anyhow::Result<Report> {
    let mut conn = connect(&args.redis_url).await?;
    let http = reqwest::Client::new();
    let streams = streams_of(args.partitions, &args.shards)?;
    let keys: Vec<String> = streams.iter().map(|s| s.redis_key()).collect();
    let log = match &args.log {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => None,
    };
    let mut consumer = Consumer {
        last: streams.iter().map(|s| (s.clone(), 0)).collect(),
        report: Report::default(),
        log,
    };
    let mut groups_ready = false;
    let mut failures = 0u32;
    let mut idle_since = Instant::now();
    let mut drain: Option<BTreeMap<Stream, i64>> = None;
    loop {
        if drain.is_none() {
            drain = match &args.drain_when {
                None => Some(BTreeMap::new()),
                Some(path) if path.exists() => Some(drain_targets(path)?),
                Some(_) => None,
            };
        }
        if let Some(targets) = &drain {
            let reached = !targets.is_empty()
                && targets
                    .iter()
                    .all(|(s, p)| consumer.last.get(s).is_some_and(|l| l >= p));
            if reached || idle_since.elapsed() >= Duration::from_secs(args.idle_secs) {
                break;
            }
        }
        if !groups_ready {
            match create_groups(&mut conn, &keys, &args.group).await {
                Ok(()) => groups_ready = true,
                Err(e) => {
                    wait_out(&mut consumer.report, &mut failures, &e).await;
                    continue;
                }
            }
        }
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP").arg(&args.group).arg(&args.consumer);
        read.arg("COUNT")
            .arg(500)
            .arg("BLOCK")
            .arg(500)
            .arg("STREAMS");
        read.arg(&keys);
        read.arg(vec![">"; keys.len()]);
        type Reply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;
        let reply: Reply = match read.query_async(&mut conn).await {
            Ok(reply) => reply,
            Err(e) if e.code() == Some("NOGROUP") => {
                // Redis restarted empty: the group went with the streams.
                groups_ready = false;
                continue;
            }
            Err(e) => {
                wait_out(&mut consumer.report, &mut failures, &e.into()).await;
                continue;
            }
        };
        failures = 0;
        for (key, entries) in reply.into_iter().flatten() {
            let index = keys
                .iter()
                .position(|k| *k == key)
                .context("unknown stream")?;
            let stream = &streams[index];
            for (id, fields) in entries {
                idle_since = Instant::now();
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| kv[0] == name)
                        .map(|kv| kv[1].clone())
                        .unwrap_or_default()
                };
                let event: Event = serde_json::from_str(&field("event"))
                    .with_context(|| format!("{key} {id}: not an event"))?;
                let applied = consumer.last[stream];
                if event.position() > applied + 1 {
                    fill(&http, &args, &mut consumer, stream, event.position()).await?;
                }
                consumer.deliver(stream, &event, &field("key"), Source::Redis);
                let acked: redis::RedisResult<i64> = redis::cmd("XACK")
                    .arg(&key)
                    .arg(&args.group)
                    .arg(&id)
                    .query_async(&mut conn)
                    .await;
                // An entry left unacknowledged stays pending in the group; nothing reads it
                // twice, so a failed acknowledgement is only counted.
                if acked.is_err() {
                    consumer.report.redis_errors += 1;
                }
            }
        }
        if let Some(log) = &mut consumer.log {
            log.flush().context("writing the delivery log")?;
        }
    }
    if let Some(log) = &mut consumer.log {
        log.flush().context("writing the delivery log")?;
    }
    let mut report = consumer.report;
    report.last_position = consumer
        .last
        .iter()
        .filter(|(_, p)| **p > 0)
        .map(|(s, p)| (s.name(), *p))
        .collect();
    Ok(report)
}

/// The streams to read: every partition's, `settlement`, and `settlement/<shard>` of every
/// shard after the first of `shards` (the catalog's order; the first is the catalog).
fn streams_of(partitions: u32, shards: &[ShardName]) -> anyhow::Result<Vec<Stream>> {
    if let Some(twice) = shards
        .iter()
        .enumerate()
        .find(|(i, s)| shards[..*i].contains(s))
    {
        bail!("--shard {} is given twice", twice.1);
    }
    let mut streams: Vec<Stream> = (0..partitions).map(Stream::Partition).collect();
    streams.push(Stream::CATALOG_SETTLEMENT);
    streams.extend(
        shards
            .iter()
            .skip(1)
            .map(|s| Stream::Settlement(Some(s.clone()))),
    );
    Ok(streams)
}

/// The positions to reach before stopping, from a `--drain-when` file (empty: none).
fn drain_targets(path: &std::path::Path) -> anyhow::Result<BTreeMap<Stream, i64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let named: BTreeMap<String, i64> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not an object of positions", path.display()))?;
    named
        .into_iter()
        .map(|(name, p)| {
            let stream = Stream::parse(&name).with_context(|| format!("no stream {name}"))?;
            Ok((stream, p))
        })
        .collect()
}

/// A failed Redis command: count it and wait before the next try.
async fn wait_out(report: &mut Report, failures: &mut u32, error: &anyhow::Error) {
    report.redis_errors += 1;
    if *failures == 0 {
        eprintln!("loadtest events: Redis: {error:#}; retrying");
    }
    tokio::time::sleep(Backoff::RECONNECT.delay(*failures)).await;
    *failures = failures.saturating_add(1);
}

async fn create_groups(
    conn: &mut ConnectionManager,
    keys: &[String],
    group: &str,
) -> anyhow::Result<()> {
    for key in keys {
        let created: redis::RedisResult<String> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match created {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(anyhow::Error::from(e).context("XGROUP CREATE")),
        }
    }
    Ok(())
}

/// Apply the events between the last applied one and `upto` (exclusive) from `GET /v1/events`;
/// without `--target` the gap is counted and left open. A target that does not answer is
/// retried for [`FILL_DEADLINE`].
async fn fill(
    http: &reqwest::Client,
    args: &EventsArgs,
    consumer: &mut Consumer,
    stream: &Stream,
    upto: i64,
) -> anyhow::Result<()> {
    let Some(target) = &args.target else {
        consumer.report.gaps += 1;
        return Ok(());
    };
    let partition = match stream {
        Stream::Partition(p) => p.to_string(),
        settlement @ Stream::Settlement(_) => settlement.name(),
    };
    let started = Instant::now();
    let mut failures = 0u32;
    while consumer.last[stream] + 1 < upto {
        let after = consumer.last[stream];
        let limit = (upto - after - 1).min(schema::events::PAGE_LIMIT_MAX);
        let url = format!("{target}/v1/events?partition={partition}&after={after}&limit={limit}");
        let mut request = http.get(url).timeout(Duration::from_secs(5));
        if let Some(token) = &args.token {
            request = request.bearer_auth(token);
        }
        let page: Result<EventPage, reqwest::Error> =
            async { request.send().await?.error_for_status()?.json().await }.await;
        let page = match page {
            Ok(page) => page,
            Err(e) => {
                consumer.report.fill_errors += 1;
                if started.elapsed() > FILL_DEADLINE {
                    bail!(
                        "{partition}: no events page after {after} within {FILL_DEADLINE:?}: {e}"
                    );
                }
                tokio::time::sleep(Backoff::RECONNECT.delay(failures)).await;
                failures = failures.saturating_add(1);
                continue;
            }
        };
        if page.events.is_empty() {
            bail!("{partition}: the database has nothing after {after}, Redis had {upto}");
        }
        for event in &page.events {
            if event.position() != consumer.last[stream] + 1 {
                bail!(
                    "{partition}: the page after {after} skips to {}",
                    event.position()
                );
            }
            consumer.deliver(stream, event, event.key(), Source::Api);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<ShardName> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn every_shard_after_the_catalog_adds_its_settlement_stream() {
        let named = |shards: &[&str]| -> Vec<String> {
            let streams = streams_of(2, &names(shards)).unwrap();
            streams.iter().map(Stream::name).collect()
        };
        let plain = ["partition/0", "partition/1", "settlement"];
        assert_eq!(named(&[]), plain);
        assert_eq!(named(&["main"]), plain);
        assert_eq!(
            named(&["s0", "s1", "s2"]),
            [&plain[..], &["settlement/s1", "settlement/s2"]].concat()
        );
        assert!(streams_of(2, &names(&["s0", "s1", "s1"])).is_err());
    }
}
