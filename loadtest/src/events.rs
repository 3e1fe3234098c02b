//! `loadtest events`: an example change-event consumer (DESIGN.md §14).
//!
//! It reads every partition's stream (and `events:settlement`) through a Redis consumer group,
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
//! * a group that vanished (Redis restarted empty) is created again from the stream's start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use schema::events::{Event, EventPage, Stream};
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
}

/// What the consumer saw, per stream and in total.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Last applied position per stream (`partition/P`, `settlement`).
    pub last_position: BTreeMap<String, i64>,
    pub applied: u64,
    pub duplicates: u64,
    /// Events fetched from `GET /v1/events` to close a gap.
    pub filled: u64,
    /// Gaps left open (no `--target`).
    pub gaps: u64,
    /// Duplicates whose key differed from the applied event's: must be 0.
    pub key_mismatches: u64,
}

pub async fn run(args: EventsArgs) -> anyhow::Result<Report> {
    let client = redis::Client::open(args.redis_url.as_str()).context("--redis-url")?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis")?;
    conn.set_response_timeout(Duration::from_secs(5));
    let http = reqwest::Client::new();
    let mut streams: Vec<Stream> = (0..args.partitions).map(Stream::Partition).collect();
    streams.push(Stream::Settlement);
    let keys: Vec<String> = streams.iter().map(|s| s.redis_key()).collect();
    let mut last: BTreeMap<Stream, i64> = streams.iter().map(|s| (*s, 0)).collect();
    let mut report = Report::default();
    create_groups(&mut conn, &keys, &args.group).await?;
    let mut idle_since = Instant::now();
    while idle_since.elapsed() < Duration::from_secs(args.idle_secs) {
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
                create_groups(&mut conn, &keys, &args.group).await?;
                continue;
            }
            Err(e) => return Err(anyhow::Error::from(e).context("XREADGROUP")),
        };
        for (key, entries) in reply.into_iter().flatten() {
            let index = keys
                .iter()
                .position(|k| *k == key)
                .context("unknown stream")?;
            let stream = streams[index];
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
                let position = event.position();
                let applied = last[&stream];
                if position <= applied {
                    report.duplicates += 1;
                    if field("key") != stream.key(position) {
                        report.key_mismatches += 1;
                    }
                } else {
                    if position > applied + 1 {
                        let filled = fill(&http, &args, stream, applied, position).await?;
                        match filled {
                            Some(n) => report.filled += n,
                            None => report.gaps += 1,
                        }
                    }
                    report.applied += 1;
                    last.insert(stream, position);
                }
                let _: i64 = redis::cmd("XACK")
                    .arg(&key)
                    .arg(&args.group)
                    .arg(&id)
                    .query_async(&mut conn)
                    .await
                    .context("XACK")?;
            }
        }
    }
    report.last_position = last
        .iter()
        .filter(|(_, p)| **p > 0)
        .map(|(s, p)| (s.name(), *p))
        .collect();
    Ok(report)
}

async fn create_groups(
    conn: &mut redis::aio::MultiplexedConnection,
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

/// Fetch the events between `applied` and `upto` (exclusive) from `GET /v1/events`; `None`
/// without `--target`. Counted as applied: they are, in order, before `upto`.
async fn fill(
    http: &reqwest::Client,
    args: &EventsArgs,
    stream: Stream,
    applied: i64,
    upto: i64,
) -> anyhow::Result<Option<u64>> {
    let Some(target) = &args.target else {
        return Ok(None);
    };
    let partition = match stream {
        Stream::Partition(p) => p.to_string(),
        Stream::Settlement => "settlement".to_owned(),
    };
    let mut after = applied;
    let mut filled = 0;
    while after + 1 < upto {
        let limit = (upto - after - 1).min(schema::events::PAGE_LIMIT_MAX);
        let url = format!("{target}/v1/events?partition={partition}&after={after}&limit={limit}");
        let mut request = http.get(url);
        if let Some(token) = &args.token {
            request = request.bearer_auth(token);
        }
        let page: EventPage = request.send().await?.error_for_status()?.json().await?;
        if page.events.is_empty() {
            bail!("{partition}: the database has nothing after {after}, Redis had {upto}");
        }
        filled += page.events.len() as u64;
        after = page.next_after;
    }
    Ok(Some(filled))
}
