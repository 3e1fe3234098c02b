//! `GET /v1/events`' query, parsed alike by both services.

pub use crate::page::{PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX};

use super::{Event, EventPage, Stream, SETTLEMENT_STREAM};

/// `GET /v1/events?partition=P|settlement|settlement/SHARD&after=SEQ&limit=N`, parsed. Whether
/// a `settlement/SHARD` stream exists is for the service to say (it knows the shards).
#[derive(Debug, Clone, PartialEq, Eq)]
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
        // Clients encode the `/` of `settlement/<shard>` as `%2F`.
        let pairs = crate::page::query_pairs(query).map_err(QueryError::Invalid)?;
        for (name, value) in &pairs {
            let value = value.as_str();
            match name.as_str() {
                "partition" if value == SETTLEMENT_STREAM => {
                    stream = Some(Stream::CATALOG_SETTLEMENT)
                }
                "partition" if value.starts_with(SETTLEMENT_STREAM) => match Stream::parse(value) {
                    Some(s) => stream = Some(s),
                    None => {
                        return invalid(format!(
                            "partition must be a partition number, `{SETTLEMENT_STREAM}` or \
                             `{SETTLEMENT_STREAM}/<shard>`, got {value:?}"
                        ))
                    }
                },
                "partition" => match value.parse::<u32>() {
                    Ok(p) if p < partition_count => stream = Some(Stream::Partition(p)),
                    // A number, however large: well-formed, but no such partition here.
                    _ if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                        return Err(QueryError::NoStream(format!(
                            "no stream for partition {value}: this cluster has partitions 0..{} \
                             and settlement streams",
                            partition_count.saturating_sub(1)
                        )))
                    }
                    _ => {
                        return invalid(format!(
                            "partition must be a partition number, `{SETTLEMENT_STREAM}` or \
                             `{SETTLEMENT_STREAM}/<shard>`, got {value:?}"
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
mod tests {
    use super::*;

    #[test]
    fn a_percent_encoded_shard_stream_parses_like_the_plain_one() {
        let plain = EventQuery::parse("partition=settlement/w-06m7wpt10b", 8).unwrap();
        let encoded = EventQuery::parse("partition=settlement%2Fw-06m7wpt10b", 8).unwrap();
        assert_eq!(plain, encoded);
        assert!(matches!(
            EventQuery::parse("partition=settlement%2F%FF", 8),
            Err(QueryError::Invalid(_))
        ));
    }

    #[test]
    fn queries_parse_or_say_what_is_wrong() {
        let q = EventQuery::parse("partition=3&after=10&limit=5", 8).unwrap();
        assert_eq!((q.stream, q.after, q.limit), (Stream::Partition(3), 10, 5));
        let q = EventQuery::parse("partition=settlement", 8).unwrap();
        assert_eq!(
            (q.stream, q.after, q.limit),
            (Stream::CATALOG_SETTLEMENT, 0, 100)
        );
        let q = EventQuery::parse("partition=settlement/s-1&after=2", 8).unwrap();
        assert_eq!((q.stream.name(), q.after), ("settlement/s-1".to_owned(), 2));
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
            "partition=settlement/",
            "partition=settlement/Big",
            "partition=settlements",
        ] {
            assert!(
                matches!(EventQuery::parse(bad, 8), Err(QueryError::Invalid(_))),
                "{bad:?} not refused as invalid"
            );
        }
    }
}
