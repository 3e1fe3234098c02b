//! The relay's loop: read what each stream has after its cursor, append it to Redis, record it.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use deadpool_postgres::Pool;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{classify, describe, DbFailure};
use crate::metrics as m;
use schema::events::{read, Event, Stream};

pub use crate::singleton::TermSource;

#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub redis_url: String,
    /// Most entries read and appended per stream per round.
    pub batch: usize,
    /// Approximate bound of each Redis stream (`XADD … MAXLEN ~`).
    pub max_len: usize,
    /// Pause between rounds that found every stream caught up.
    pub interval: Duration,
    /// This shard's settlement stream ([`Stream::settlement_of`] its record): `settlement` on
    /// the catalog shard, `settlement/<shard>` on any other. Its progress row is `settlement`
    /// on every shard (the table is per database).
    pub settlement: Stream,
}

/// Successive rounds the relay runs without its pause while some stream still fills whole
/// batches (a hot partition commits faster than `batch` per `interval`); then it pauses once
/// anyway, which bounds the share of PostgreSQL and Redis a long backlog lets the relay take.
const CATCH_UP_ROUNDS: u32 = 50;

/// How often the relay asks PostgreSQL for its lag in entries: the gauge is for alerts that
/// look at minutes, not for every round.
const LAG_QUERY_EVERY: Duration = Duration::from_secs(1);

/// Appends one stream's entries. KEYS[1]: the stream. ARGV: the lowest last id the stream must
/// have (else nothing is appended and `{0, last}` comes back: Redis lost entries), MAXLEN, then
/// `position, key, type, json` per entry. Entries at or below the stream's last id are skipped
/// (published before a crash). Returns `{1, last id, entries appended}`.
const APPEND: &str = r"
local last = 0
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top > 0 then last = tonumber(string.match(top[1][1], '^(%d+)')) end
if last < tonumber(ARGV[1]) then return {0, last, 0} end
local added = 0
for i = 3, #ARGV, 4 do
  local position = tonumber(ARGV[i])
  if position > last then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], position .. '-0',
               'key', ARGV[i + 1], 'type', ARGV[i + 2], 'event', ARGV[i + 3])
    last = position
    added = added + 1
  end
end
return {1, last, added}
";

/// Where one stream stands, as this term's relay knows it.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    /// The next round reads entries after this position.
    after: i64,
    /// Redis must hold at least this id, or it lost entries.
    floor: i64,
    /// `published` in PostgreSQL.
    recorded: i64,
}

struct Relay {
    settings: RelaySettings,
    pool: Pool,
    redis: redis::Client,
    /// The connection and the SHA1 of [`APPEND`] loaded on it (`SCRIPT LOAD` on every new
    /// connection, so a restarted Redis gets the script again with the reconnect its failure
    /// causes; an `EVALSHA` answered `NOSCRIPT` fails the round and drops the connection).
    connection: Option<(MultiplexedConnection, String)>,
    /// When the lag in entries was last read from PostgreSQL.
    lag_read_at: Option<tokio::time::Instant>,
    /// The term the cursors were loaded under.
    term: Option<i64>,
    cursors: BTreeMap<Stream, Cursor>,
    /// When the streams were last looked for: a partition moved in from another shard
    /// (`allocator shards move`) brings its progress row mid-term.
    streams_read_at: Option<tokio::time::Instant>,
}

/// Start the relay; it works only while `term` grants authority and ends with `stop`.
pub fn spawn(
    settings: RelaySettings,
    pool: Pool,
    term: TermSource,
    stop: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let redis = redis::Client::open(settings.redis_url.as_str())?;
    let mut relay = Relay {
        settings,
        pool,
        redis,
        connection: None,
        lag_read_at: None,
        term: None,
        cursors: BTreeMap::new(),
        streams_read_at: None,
    };
    Ok(tokio::spawn(async move {
        let mut catching_up = 0;
        loop {
            if catching_up == 0 || catching_up >= CATCH_UP_ROUNDS {
                catching_up = 0;
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(relay.settings.interval) => {}
                }
            } else if stop.is_cancelled() {
                return;
            }
            match term() {
                Some(t) => {
                    let behind = relay.round(t).await;
                    catching_up = if behind { catching_up + 1 } else { 0 };
                }
                None => {
                    catching_up = 0;
                    relay.term = None;
                    metrics::gauge!(m::EVENTS_LAG_ENTRIES).set(0.0);
                    metrics::gauge!(m::EVENTS_LAG_SECONDS).set(0.0);
                }
            }
        }
    }))
}

#[derive(Debug)]
enum RoundError {
    Database(tokio_postgres::Error),
    Pool(String),
    Redis(String),
}

impl Relay {
    /// One round; true when some stream read a whole batch (more may be waiting).
    async fn round(&mut self, term: i64) -> bool {
        let failure = match self.try_round(term).await {
            Ok(behind) => return behind,
            Err(RoundError::Database(e)) if classify(&e) == DbFailure::StaleEpoch => {
                // A newer term exists; its relay carries on from the recorded progress.
                self.term = None;
                tracing::warn!(term, error = %describe(&e), "event relay fenced out");
                "stale_term"
            }
            Err(RoundError::Database(e)) => {
                tracing::warn!(term, error = %describe(&e), "event relay round failed");
                "database"
            }
            Err(RoundError::Pool(e)) => {
                tracing::debug!(term, error = %e, "event relay: no connection");
                "database"
            }
            Err(RoundError::Redis(e)) => {
                tracing::warn!(term, error = %e, "event relay: Redis failed");
                self.connection = None;
                "redis"
            }
        };
        metrics::counter!(m::EVENTS_RELAY_FAILURES, "cause" => failure).increment(1);
        false
    }

    async fn try_round(&mut self, term: i64) -> Result<bool, RoundError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| RoundError::Pool(e.to_string()))?;
        if self.term != Some(term) {
            self.cursors = load_progress(&**client, &self.settings.settlement)
                .await
                .map_err(RoundError::Database)?;
            self.term = Some(term);
            self.streams_read_at = Some(tokio::time::Instant::now());
        } else if self
            .streams_read_at
            .is_none_or(|at| at.elapsed() >= LAG_QUERY_EVERY)
        {
            // Only streams not followed yet: a followed stream's cursor is ahead of its row.
            for (stream, cursor) in load_progress(&**client, &self.settings.settlement)
                .await
                .map_err(RoundError::Database)?
            {
                self.cursors.entry(stream).or_insert(cursor);
            }
            self.streams_read_at = Some(tokio::time::Instant::now());
        }
        let limit = self.settings.batch as i64;
        let partitions: Vec<(u32, i64)> = self
            .cursors
            .iter()
            .filter_map(|(s, c)| match s {
                Stream::Partition(p) => Some((*p, c.after)),
                Stream::Settlement(_) => None,
            })
            .collect();
        let mut events = read::ledger_after(&**client, &partitions, limit)
            .await
            .map_err(RoundError::Database)?;
        let settlement = &self.settings.settlement;
        if let Some(c) = self.cursors.get(settlement) {
            events.extend(
                read::settlement_after(&**client, settlement, c.after, limit)
                    .await
                    .map_err(RoundError::Database)?,
            );
        }
        let behind = full_batch(events.iter().map(Event::stream), self.settings.batch);
        let oldest = events
            .iter()
            .map(|e| match e {
                Event::Ledger(l) => l.recorded_at,
                Event::Settlement(s) => s.settled_at,
            })
            .min();
        metrics::gauge!(m::EVENTS_LAG_SECONDS).set(oldest.map_or(0.0, |t| {
            (Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
        }));
        self.publish(events).await?;
        self.record(&**client, term).await?;
        if self
            .lag_read_at
            .is_none_or(|at| at.elapsed() >= LAG_QUERY_EVERY)
        {
            let lag = read_lag(&**client).await.map_err(RoundError::Database)?;
            metrics::gauge!(m::EVENTS_LAG_ENTRIES).set(lag as f64);
            self.lag_read_at = Some(tokio::time::Instant::now());
        }
        Ok(behind)
    }

    /// Append each stream's new entries (and check every stream that has any in Redis) in one
    /// pipelined round trip, then move the cursors.
    async fn publish(&mut self, events: Vec<Event>) -> Result<(), RoundError> {
        let mut by_stream: BTreeMap<Stream, Vec<Event>> = BTreeMap::new();
        for event in events {
            by_stream.entry(event.stream()).or_default().push(event);
        }
        let asked: Vec<(Stream, i64, Vec<Event>)> = self
            .cursors
            .iter()
            .map(|(stream, cursor)| {
                let entries = by_stream.remove(stream).unwrap_or_default();
                (stream.clone(), cursor.floor, entries)
            })
            .filter(|(_, floor, entries)| !entries.is_empty() || *floor > 0)
            .collect();
        if asked.is_empty() {
            return Ok(());
        }
        let (mut connection, sha) = self.connection().await?;
        let mut pipe = redis::pipe();
        for (stream, floor, entries) in &asked {
            let cmd = pipe
                .cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(stream.redis_key())
                .arg(*floor)
                .arg(self.settings.max_len);
            for event in entries {
                let json =
                    serde_json::to_string(event).map_err(|e| RoundError::Redis(e.to_string()))?;
                cmd.arg(event.position())
                    .arg(event.key())
                    .arg(event.event_type())
                    .arg(json);
            }
        }
        let answers: Vec<(i64, i64, u64)> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|e| RoundError::Redis(e.to_string()))?;
        for ((stream, _, _), (kept, last, added)) in asked.into_iter().zip(answers) {
            let kind = match stream {
                Stream::Partition(_) => "partition",
                Stream::Settlement(_) => "settlement",
            };
            metrics::counter!(m::EVENTS_PUBLISHED, "stream" => kind).increment(added);
            let Some(cursor) = self.cursors.get_mut(&stream) else {
                continue;
            };
            if kept == 1 {
                cursor.after = cursor.after.max(last);
                cursor.floor = last;
            } else {
                let bound = self.settings.max_len as i64;
                let from = last.max(cursor.recorded.max(cursor.after).saturating_sub(bound));
                tracing::warn!(
                    stream = %stream.name(),
                    redis_last = last,
                    published = cursor.recorded,
                    from,
                    "event stream missing or behind in Redis; publishing it again"
                );
                metrics::counter!(m::EVENTS_REPUBLISHES).increment(1);
                cursor.after = from;
                cursor.floor = last;
            }
        }
        Ok(())
    }

    /// The connection with [`APPEND`] loaded on it, connecting (and loading) when there is none.
    async fn connection(&mut self) -> Result<(MultiplexedConnection, String), RoundError> {
        if self.connection.is_none() {
            let connect = async {
                let mut connection = self.redis.get_multiplexed_async_connection().await?;
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(APPEND)
                    .query_async(&mut connection)
                    .await?;
                Ok::<_, redis::RedisError>((connection, sha))
            };
            let connected = tokio::time::timeout(Duration::from_secs(1), connect)
                .await
                .map_err(|_| RoundError::Redis("connect timed out".to_owned()))?
                .map_err(|e| RoundError::Redis(e.to_string()))?;
            self.connection = Some(connected);
        }
        self.connection
            .clone()
            .ok_or_else(|| RoundError::Redis("no connection".to_owned()))
    }

    /// Record, under this term, every stream whose acknowledged position passed the recorded one.
    async fn record<C: tokio_postgres::GenericClient>(
        &mut self,
        client: &C,
        term: i64,
    ) -> Result<(), RoundError> {
        let moved: Vec<(String, i64)> = self
            .cursors
            .iter()
            .filter(|(_, c)| c.floor > c.recorded)
            .map(|(s, c)| (s.progress_name(), c.floor))
            .collect();
        if moved.is_empty() {
            return Ok(());
        }
        crate::faults::before_relay_progress().await;
        let names: Vec<&str> = moved.iter().map(|(n, _)| n.as_str()).collect();
        let positions: Vec<i64> = moved.iter().map(|(_, p)| *p).collect();
        client
            .execute(
                "UPDATE event_relay_progress AS r
                    SET published = v.position, term = $3
                   FROM unnest($1::text[], $2::bigint[]) AS v(stream, position)
                  WHERE r.stream = v.stream AND r.published < v.position",
                &[&names, &positions, &term],
            )
            .await
            .map_err(RoundError::Database)?;
        for cursor in self.cursors.values_mut() {
            cursor.recorded = cursor.recorded.max(cursor.floor);
        }
        Ok(())
    }
}

/// Whether some stream's read filled `batch`: it may have more committed entries waiting.
fn full_batch(streams: impl IntoIterator<Item = Stream>, batch: usize) -> bool {
    let mut counts: BTreeMap<Stream, usize> = BTreeMap::new();
    streams.into_iter().any(|stream| {
        let n = counts.entry(stream).or_default();
        *n += 1;
        *n >= batch
    })
}

/// Every stream's recorded progress; a new term starts from it. The `settlement` row is the
/// progress of `settlement`, this shard's settlement stream.
async fn load_progress<C: tokio_postgres::GenericClient>(
    client: &C,
    settlement: &Stream,
) -> Result<BTreeMap<Stream, Cursor>, tokio_postgres::Error> {
    let rows = client
        .query("SELECT stream, published FROM event_relay_progress", &[])
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let published: i64 = r.get(1);
            Stream::parse(r.get(0)).map(|s| {
                let s = match s {
                    Stream::Settlement(_) => settlement.clone(),
                    partition => partition,
                };
                let cursor = Cursor {
                    after: published,
                    floor: published,
                    recorded: published,
                };
                (s, cursor)
            })
        })
        .collect())
}

/// Entries committed and not yet recorded as published, all streams.
async fn read_lag<C: tokio_postgres::GenericClient>(
    client: &C,
) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT (SELECT coalesce(sum(greatest(p.last_position - r.published, 0)), 0)::bigint
                       FROM ledger_positions AS p
                       JOIN event_relay_progress AS r ON r.stream = 'partition/' || p.partition)
                  + (SELECT greatest(coalesce((SELECT max(position) FROM settlement_runs), 0)
                                     - coalesce(max(published), 0), 0)
                       FROM event_relay_progress WHERE stream = 'settlement')",
            &[],
        )
        .await?;
    Ok(row.get::<_, Option<i64>>(0).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_filled_its_batch_means_more_may_wait() {
        let p = Stream::Partition;
        assert!(!full_batch([], 3));
        let s = Stream::CATALOG_SETTLEMENT;
        assert!(!full_batch([p(1), p(1), p(2), p(2), s.clone()], 3));
        assert!(full_batch([p(1), p(2), p(1), p(1)], 3));
        assert!(full_batch([s], 1));
    }
}
