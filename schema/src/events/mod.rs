//! The change events: what the relay publishes to Redis Streams and `GET /v1/events` answers
//! (DESIGN.md §14).
//!
//! Every ledger row is one event of its partition's stream, every settled window one event of its
//! shard's settlement stream (`settlement` for the catalog shard, `settlement/<shard>` for any
//! other: [`Stream`]). An event's `position` is its place in its stream: per stream gap-free and
//! in commit order (`V12__ledger_positions.sql`), so a consumer that remembers the last position
//! it applied per stream needs nothing else to apply each event exactly once, in order, whatever
//! was delivered twice. `key` (`"<partition>:<position>"`, `"settlement:<position>"`,
//! `"settlement/<shard>:<position>"`) is that identity as one string; the Redis entry id is
//! `<position>-0`.
//!
//! The contract is versioned (`version`); its JSON Schemas are `schema/events/*.schema.json`, one
//! per event type ([`SCHEMAS`]). A change that removes or retypes a field takes a new version;
//! adding an optional field does not.

mod query;
#[cfg(feature = "postgres")]
pub mod read;

pub use query::{EventQuery, QueryError, PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::shard::{ShardName, ShardRecord};

/// The contract's version, carried by every event.
pub const EVENT_VERSION: u32 = 1;

/// Prefix of every Redis stream key: `events:partition:17`, `events:settlement`,
/// `events:settlement:s1`.
pub const REDIS_KEY_PREFIX: &str = "events:";

/// The name of the catalog shard's settled windows; another shard's are `settlement/<shard>`.
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

/// A stream: one partition's ledger, or one shard's settled windows.
///
/// Every shard settles its own windows and numbers them in its own `settlement_runs`, so each
/// shard has a settlement stream of its own. The catalog shard's keeps the plain name
/// (`settlement`; a one-database cluster has only that one); any other shard's is qualified by
/// the shard's name (`settlement/s1`). A partition lives on one shard at a time and a move
/// carries its positions, so partition streams need no shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    Partition(u32),
    /// `None`: the catalog shard's windows; `Some(shard)`: another shard's.
    Settlement(Option<ShardName>),
}

impl Stream {
    /// The catalog shard's settlement stream, `settlement`: a one-database cluster's only one.
    pub const CATALOG_SETTLEMENT: Stream = Stream::Settlement(None);

    /// The settlement stream of the shard `record` describes.
    pub fn settlement_of(record: &ShardRecord) -> Stream {
        Stream::Settlement((!record.catalog).then(|| record.shard.clone()))
    }

    /// The stream's name: `partition/17`, `settlement`, `settlement/s1`.
    pub fn name(&self) -> String {
        match self {
            Stream::Partition(p) => format!("partition/{p}"),
            Stream::Settlement(None) => SETTLEMENT_STREAM.to_owned(),
            Stream::Settlement(Some(shard)) => format!("{SETTLEMENT_STREAM}/{shard}"),
        }
    }

    /// Parse [`Stream::name`].
    pub fn parse(name: &str) -> Option<Stream> {
        if name == SETTLEMENT_STREAM {
            return Some(Stream::Settlement(None));
        }
        if let Some(shard) = name
            .strip_prefix(SETTLEMENT_STREAM)
            .and_then(|rest| rest.strip_prefix('/'))
        {
            return shard.parse().ok().map(|s| Stream::Settlement(Some(s)));
        }
        name.strip_prefix("partition/")?
            .parse()
            .ok()
            .map(Stream::Partition)
    }

    /// The row of `event_relay_progress` that records how far the stream is published. That
    /// table is per database and a database holds one shard, so every shard's settlement
    /// stream is recorded as `settlement`.
    pub fn progress_name(&self) -> String {
        match self {
            Stream::Partition(_) => self.name(),
            Stream::Settlement(_) => SETTLEMENT_STREAM.to_owned(),
        }
    }

    /// The Redis stream key: `events:partition:17`, `events:settlement`,
    /// `events:settlement:s1`.
    pub fn redis_key(&self) -> String {
        match self {
            Stream::Partition(p) => format!("{REDIS_KEY_PREFIX}partition:{p}"),
            Stream::Settlement(None) => format!("{REDIS_KEY_PREFIX}{SETTLEMENT_STREAM}"),
            Stream::Settlement(Some(shard)) => {
                format!("{REDIS_KEY_PREFIX}{SETTLEMENT_STREAM}:{shard}")
            }
        }
    }

    /// The dedupe key of the event at `position`: `17:42`, `settlement:3`, `settlement/s1:3`.
    pub fn key(&self, position: i64) -> String {
        match self {
            Stream::Partition(p) => format!("{p}:{position}"),
            Stream::Settlement(_) => format!("{}:{position}", self.name()),
        }
    }

    /// The shard a settlement stream belongs to, by name (`None`: the catalog's, or a partition
    /// stream).
    pub fn shard(&self) -> Option<&ShardName> {
        match self {
            Stream::Settlement(shard) => shard.as_ref(),
            Stream::Partition(_) => None,
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
            Event::Settlement(e) => Stream::Settlement(e.shard.clone()),
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
    /// The shard that settled the window, on every shard but the catalog (whose windows are the
    /// `settlement` stream): the stream is `settlement/<shard>`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_shard_name"
    )]
    pub shard: Option<ShardName>,
}

/// A shard name in an event: its text, refused when it is not a valid [`ShardName`].
mod optional_shard_name {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    use crate::shard::ShardName;

    pub fn serialize<S: Serializer>(shard: &Option<ShardName>, s: S) -> Result<S::Ok, S::Error> {
        match shard {
            Some(name) => s.serialize_str(name.as_str()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ShardName>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| text.parse().map_err(D::Error::custom))
            .transpose()
    }
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
    /// `partition/17`, `settlement` or `settlement/s1`.
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
            Stream::Settlement(None),
            Stream::Settlement(Some("s1".parse().unwrap())),
        ] {
            assert_eq!(Stream::parse(&s.name()), Some(s));
        }
        for bad in [
            "partition/x",
            "settlement/",
            "settlement/S1",
            "settlement:s1",
            "settlements",
        ] {
            assert_eq!(Stream::parse(bad), None, "{bad}");
        }
        assert_eq!(Stream::Partition(3).key(9), "3:9");
        assert_eq!(Stream::Partition(3).redis_key(), "events:partition:3");
        assert_eq!(Stream::Partition(3).progress_name(), "partition/3");
    }

    #[test]
    fn each_shard_has_its_settlement_stream_and_the_catalog_keeps_the_plain_one() {
        let record = |name: &str, catalog| ShardRecord {
            shard: name.parse().unwrap(),
            catalog,
            partitions: vec![],
        };
        // A one-database cluster's shard `main` is its own catalog: nothing changes.
        let main = Stream::settlement_of(&record("main", true));
        assert_eq!(main, Stream::CATALOG_SETTLEMENT);
        assert_eq!(
            (main.name(), main.redis_key(), main.key(3)),
            (
                "settlement".into(),
                "events:settlement".into(),
                "settlement:3".into()
            )
        );
        let s1 = Stream::settlement_of(&record("s1", false));
        assert_eq!(
            (s1.name(), s1.redis_key(), s1.key(3)),
            (
                "settlement/s1".into(),
                "events:settlement:s1".into(),
                "settlement/s1:3".into()
            )
        );
        assert_eq!(s1.shard().map(ShardName::as_str), Some("s1"));
        // Progress rows are per database: `settlement` on every shard.
        assert_eq!(s1.progress_name(), "settlement");
        assert_eq!(main.progress_name(), "settlement");
    }

    #[test]
    fn a_settlement_event_names_its_shard_only_off_the_catalog() {
        let event = |shard: Option<&str>| {
            let stream = Stream::Settlement(shard.map(|s| s.parse().unwrap()));
            Event::Settlement(SettlementEvent {
                version: EVENT_VERSION,
                event_type: "settlement.window_settled".into(),
                key: stream.key(1),
                position: 1,
                term: 1,
                window_start: DateTime::UNIX_EPOCH,
                window_end: DateTime::UNIX_EPOCH,
                reservations: 0,
                total_quantity: 0,
                settled_at: DateTime::UNIX_EPOCH,
                shard: stream.shard().cloned(),
            })
        };
        let catalog = serde_json::to_value(event(None)).unwrap();
        assert!(catalog.get("shard").is_none(), "{catalog}");
        let other = event(Some("s1"));
        let json = serde_json::to_value(&other).unwrap();
        assert_eq!(json["shard"], "s1");
        let back: Event = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.stream().name(), "settlement/s1");
        assert_eq!(back, other);
        let mut invalid = json;
        invalid["shard"] = "Not A Shard".into();
        assert!(serde_json::from_value::<SettlementEvent>(invalid).is_err());
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
