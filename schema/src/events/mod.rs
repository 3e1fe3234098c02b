//! The change events: what the relay publishes to Redis Streams and `GET /v1/events` answers
//! (DESIGN.md §14).
//!
//! Every ledger row is one event of its partition's stream, every settled window one event of the
//! `settlement` stream. An event's `position` is its place in its stream: per stream gap-free and
//! in commit order (`V12__ledger_positions.sql`), so a consumer that remembers the last position
//! it applied per stream needs nothing else to apply each event exactly once, in order, whatever
//! was delivered twice. `key` (`"<partition>:<position>"`, `"settlement:<position>"`) is that
//! identity as one string; the Redis entry id is `<position>-0`.
//!
//! The contract is versioned (`version`); its JSON Schemas are `schema/events/*.schema.json`, one
//! per event type ([`SCHEMAS`]). A change that removes or retypes a field takes a new version;
//! adding an optional field does not.

#[cfg(feature = "postgres")]
pub mod read;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The contract's version, carried by every event.
pub const EVENT_VERSION: u32 = 1;

/// Prefix of every Redis stream key: `events:partition:17`, `events:settlement`.
pub const REDIS_KEY_PREFIX: &str = "events:";

/// The stream name of the settled windows.
pub const SETTLEMENT_STREAM: &str = "settlement";

/// The JSON Schema of each event type, by type name.
pub const SCHEMAS: [(&str, &str); 6] = [
    (
        "reservation.held",
        include_str!("../../events/reservation.held.schema.json"),
    ),
    (
        "reservation.confirmed",
        include_str!("../../events/reservation.confirmed.schema.json"),
    ),
    (
        "reservation.released",
        include_str!("../../events/reservation.released.schema.json"),
    ),
    (
        "reservation.expired",
        include_str!("../../events/reservation.expired.schema.json"),
    ),
    (
        "inventory.adjusted",
        include_str!("../../events/inventory.adjusted.schema.json"),
    ),
    (
        "settlement.window_settled",
        include_str!("../../events/settlement.window_settled.schema.json"),
    ),
];

/// A stream: one partition's ledger, or the settled windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    Partition(u32),
    Settlement,
}

impl Stream {
    /// The name stored in `event_relay_progress.stream`: `partition/17`, `settlement`.
    pub fn name(self) -> String {
        match self {
            Stream::Partition(p) => format!("partition/{p}"),
            Stream::Settlement => SETTLEMENT_STREAM.to_owned(),
        }
    }

    /// Parse [`Stream::name`].
    pub fn parse(name: &str) -> Option<Stream> {
        if name == SETTLEMENT_STREAM {
            return Some(Stream::Settlement);
        }
        name.strip_prefix("partition/")?
            .parse()
            .ok()
            .map(Stream::Partition)
    }

    /// The Redis stream key: `events:partition:17`, `events:settlement`.
    pub fn redis_key(self) -> String {
        match self {
            Stream::Partition(p) => format!("{REDIS_KEY_PREFIX}partition:{p}"),
            Stream::Settlement => format!("{REDIS_KEY_PREFIX}{SETTLEMENT_STREAM}"),
        }
    }

    /// The dedupe key of the event at `position`: `17:42`, `settlement:3`.
    pub fn key(self, position: i64) -> String {
        match self {
            Stream::Partition(p) => format!("{p}:{position}"),
            Stream::Settlement => format!("{SETTLEMENT_STREAM}:{position}"),
        }
    }
}

/// The four stock columns' change, as the ledger row records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    pub on_hand: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
}

/// One change event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Event {
    Ledger(LedgerEvent),
    Settlement(SettlementEvent),
}

impl Event {
    pub fn stream(&self) -> Stream {
        match self {
            Event::Ledger(e) => Stream::Partition(e.partition),
            Event::Settlement(_) => Stream::Settlement,
        }
    }

    pub fn position(&self) -> i64 {
        match self {
            Event::Ledger(e) => e.position,
            Event::Settlement(e) => e.position,
        }
    }

    pub fn event_type(&self) -> &str {
        match self {
            Event::Ledger(e) => &e.event_type,
            Event::Settlement(e) => &e.event_type,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            Event::Ledger(e) => &e.key,
            Event::Settlement(e) => &e.key,
        }
    }
}

/// A stock movement of one SKU: one ledger row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEvent {
    pub version: u32,
    /// `reservation.held|confirmed|released|expired` or `inventory.adjusted`.
    #[serde(rename = "type")]
    pub event_type: String,
    pub key: String,
    pub partition: u32,
    pub position: i64,
    /// The lease epoch of the owner that wrote the row.
    pub epoch: i64,
    pub sku: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustment_id: Option<String>,
    /// A reservation's quantity (`reservation.*` events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantity: Option<i64>,
    /// An adjustment's delta, negative for a shrink (`inventory.adjusted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<i64>,
    pub change: Delta,
    /// The writing transaction's start by the database clock.
    pub recorded_at: DateTime<Utc>,
}

/// A settlement window, settled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettlementEvent {
    pub version: u32,
    /// Always `settlement.window_settled`.
    #[serde(rename = "type")]
    pub event_type: String,
    pub key: String,
    pub position: i64,
    /// The settlement job's term that settled it.
    pub term: i64,
    pub window_start: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
    pub reservations: i64,
    pub total_quantity: i64,
    pub settled_at: DateTime<Utc>,
}

/// The event type of a ledger row's `kind`.
pub fn ledger_event_type(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "reserve" => "reservation.held",
        "confirm" => "reservation.confirmed",
        "release" => "reservation.released",
        "expire" => "reservation.expired",
        "restock" | "shrink" => "inventory.adjusted",
        _ => return None,
    })
}

/// One page of a stream, as `GET /v1/events` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventPage {
    /// `partition/17` or `settlement`.
    pub stream: String,
    pub events: Vec<Event>,
    /// The position to pass as `after` for the next page (the last event's, or `after` itself).
    pub next_after: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_round_trip() {
        for s in [
            Stream::Partition(0),
            Stream::Partition(63),
            Stream::Settlement,
        ] {
            assert_eq!(Stream::parse(&s.name()), Some(s));
        }
        assert_eq!(Stream::parse("partition/x"), None);
        assert_eq!(Stream::Partition(3).key(9), "3:9");
        assert_eq!(Stream::Partition(3).redis_key(), "events:partition:3");
    }

    #[test]
    fn every_ledger_kind_has_a_documented_type() {
        for kind in [
            "reserve", "confirm", "release", "expire", "restock", "shrink",
        ] {
            let t = ledger_event_type(kind).expect("known kind");
            assert!(SCHEMAS.iter().any(|(name, _)| *name == t), "{t}");
        }
    }
}

pub use crate::page::{PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX};

/// `GET /v1/events?partition=P|settlement&after=SEQ&limit=N`, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventQuery {
    pub stream: Stream,
    pub after: i64,
    pub limit: i64,
}

/// Why a `GET /v1/events` query is refused; the text is the problem's `detail`, worded alike
/// by both services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// Not a query this route understands: `400`.
    Invalid(String),
    /// A well-formed partition number this cluster does not have (the document cannot know
    /// the count): no such stream, `404`.
    NoStream(String),
}

impl EventQuery {
    /// Parse the query string.
    pub fn parse(query: &str, partition_count: u32) -> Result<EventQuery, QueryError> {
        let invalid = |detail: String| Err(QueryError::Invalid(detail));
        let (mut stream, mut after, mut limit) = (None, 0, PAGE_LIMIT_DEFAULT);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match name {
                "partition" if value == SETTLEMENT_STREAM => stream = Some(Stream::Settlement),
                "partition" => match value.parse::<u32>() {
                    Ok(p) if p < partition_count => stream = Some(Stream::Partition(p)),
                    // A number, however large: well-formed, but no such partition here.
                    _ if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                        return Err(QueryError::NoStream(format!(
                            "no stream for partition {value}: this cluster has partitions 0..{} \
                             and `{SETTLEMENT_STREAM}`",
                            partition_count.saturating_sub(1)
                        )))
                    }
                    _ => {
                        return invalid(format!(
                            "partition must be a partition number or `{SETTLEMENT_STREAM}`, \
                             got {value:?}"
                        ))
                    }
                },
                other => match crate::page::page_param(other, value, &mut after, &mut limit) {
                    Some(Ok(())) => {}
                    Some(Err(detail)) => return invalid(detail),
                    None => return invalid(format!("unknown query parameter {other:?}")),
                },
            }
        }
        let stream =
            stream.ok_or_else(|| QueryError::Invalid("partition is required".to_owned()))?;
        Ok(EventQuery {
            stream,
            after,
            limit,
        })
    }

    /// The page for `events`, read after `self.after`.
    pub fn page(&self, events: Vec<Event>) -> EventPage {
        EventPage {
            stream: self.stream.name(),
            next_after: events.last().map_or(self.after, Event::position),
            events,
        }
    }
}

#[cfg(test)]
mod query_tests {
    use super::*;

    #[test]
    fn queries_parse_or_say_what_is_wrong() {
        let q = EventQuery::parse("partition=3&after=10&limit=5", 8).unwrap();
        assert_eq!((q.stream, q.after, q.limit), (Stream::Partition(3), 10, 5));
        let q = EventQuery::parse("partition=settlement", 8).unwrap();
        assert_eq!((q.stream, q.after, q.limit), (Stream::Settlement, 0, 100));
        for none in ["partition=8", "partition=99999999999999999999"] {
            assert!(
                matches!(EventQuery::parse(none, 8), Err(QueryError::NoStream(_))),
                "{none}"
            );
        }
        for bad in [
            "",
            "partition=-1",
            "partition=1&after=-2",
            "partition=1&limit=0",
            "partition=1&limit=1001",
            "partition=1&after=x",
            "partition=1&foo=2",
        ] {
            assert!(
                matches!(EventQuery::parse(bad, 8), Err(QueryError::Invalid(_))),
                "{bad:?} not refused as invalid"
            );
        }
    }
}
