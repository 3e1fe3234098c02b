//! One SKU's stock movements in commit order, with the client that made each one:
//! `GET /v1/inventory/{sku}/history` (allocator/README.md "Security", DESIGN.md §9).
//!
//! Every ledger row of the SKU is one entry. A SKU lives in one partition, and a partition's
//! ledger positions are gap-free and in commit order (`V12__ledger_positions.sql`), so `position`
//! orders a SKU's entries and a reader resumes after the last one it saw (`after`). An entry's
//! `client` is the owner recorded on the reservation (`V18__owners.sql`) or the adjustment
//! (`V20__adjustment_owner.sql`) it belongs to: `null` for the anonymous or unknown client, and
//! for a reservation the retention job has removed (its movements stay in the ledger). Only the
//! ledger still in the database is answered; archived partitions are not.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::events::Delta;

pub use crate::page::{PAGE_LIMIT_DEFAULT, PAGE_LIMIT_MAX};

/// `?after=POSITION&limit=N`, parsed. Both services parse it the same way, so a router refuses
/// what an allocator would, with the same words, before forwarding anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Answer entries after this position (0: from the start).
    pub after: i64,
    pub limit: i64,
}

impl Default for HistoryQuery {
    fn default() -> Self {
        HistoryQuery {
            after: 0,
            limit: PAGE_LIMIT_DEFAULT,
        }
    }
}

impl HistoryQuery {
    /// Parse the query string; the error is the `400` problem's `detail`.
    pub fn parse(query: &str) -> Result<HistoryQuery, String> {
        let mut parsed = HistoryQuery::default();
        for (name, value) in crate::page::query_pairs(query)? {
            crate::page::page_param(&name, &value, &mut parsed.after, &mut parsed.limit)
                .unwrap_or_else(|| Err(format!("unknown query parameter {name:?}")))?;
        }
        Ok(parsed)
    }

    /// The query string that parses back to `self` (what a router forwards).
    pub fn query_string(&self) -> String {
        format!("after={}&limit={}", self.after, self.limit)
    }
}

/// One ledger row of the SKU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Its place in the partition's ledger (and so in the SKU's history).
    pub position: i64,
    /// The writing transaction's start by the database clock.
    pub recorded_at: DateTime<Utc>,
    /// `reserve`, `confirm`, `release`, `expire`, `restock` or `shrink`.
    pub kind: String,
    /// The four stock columns' change, as the ledger row records it.
    pub change: Delta,
    /// The reservation a `reserve`, `confirm`, `release` or `expire` belongs to (else `null`).
    pub reservation_id: Option<String>,
    /// The adjustment a `restock` or `shrink` is (else `null`).
    pub adjustment_id: Option<String>,
    /// The client that made the reservation or the adjustment; `null`: anonymous or unknown.
    pub client: Option<String>,
    /// The lease epoch of the owner that wrote the row.
    pub epoch: i64,
}

/// One page of a SKU's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub sku: String,
    pub entries: Vec<HistoryEntry>,
    /// The `after` of the next page (the last entry's position), or `null` when no entry
    /// followed this page when it was read. Entries written later come after the last
    /// position a reader saw, so it can ask again from there.
    pub next_after: Option<i64>,
}

#[cfg(feature = "postgres")]
pub use read::read;

#[cfg(feature = "postgres")]
mod read {
    use tokio_postgres::GenericClient;

    use super::{HistoryEntry, HistoryPage, HistoryQuery};
    use crate::events::Delta;

    /// The page is read through `ledger_sku_position` (sku, position) in order, stopping at the
    /// page's end; each row's client through the reservation's or adjustment's primary key.
    const PAGE: &str = "
        SELECT l.position, l.recorded_at, l.kind, l.d_on_hand, l.d_available, l.d_held,
               l.d_confirmed, l.reservation_id, l.adjustment_id, coalesce(r.owner, a.owner),
               l.epoch
          FROM ledger l
          LEFT JOIN reservations r ON r.reservation_id = l.reservation_id
          LEFT JOIN adjustments a ON a.adjustment_id = l.adjustment_id
         WHERE l.sku = $1 AND l.position > $2
         ORDER BY l.position
         LIMIT $3";

    /// One page of `sku`'s history after `query.after`; `None` when the SKU was never stocked.
    pub async fn read<C: GenericClient>(
        client: &C,
        sku: &str,
        query: HistoryQuery,
    ) -> Result<Option<HistoryPage>, tokio_postgres::Error> {
        // One row more than the page tells whether another page follows.
        let rows = client
            .query(PAGE, &[&sku, &query.after, &(query.limit + 1)])
            .await?;
        // A SKU with ledger rows has its inventory row (its first restock made both); only an
        // empty page needs to ask whether the SKU exists.
        if rows.is_empty()
            && client
                .query_opt("SELECT 1 FROM inventory WHERE sku = $1", &[&sku])
                .await?
                .is_none()
        {
            return Ok(None);
        }
        let more = rows.len() as i64 > query.limit;
        let entries: Vec<HistoryEntry> = rows
            .iter()
            .take(query.limit as usize)
            .map(|r| HistoryEntry {
                position: r.get(0),
                recorded_at: r.get(1),
                kind: r.get(2),
                change: Delta {
                    on_hand: r.get(3),
                    available: r.get(4),
                    held: r.get(5),
                    confirmed: r.get(6),
                },
                reservation_id: r.get(7),
                adjustment_id: r.get(8),
                client: r.get(9),
                epoch: r.get(10),
            })
            .collect();
        Ok(Some(HistoryPage {
            sku: sku.to_owned(),
            next_after: if more {
                entries.last().map(|e| e.position)
            } else {
                None
            },
            entries,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_or_say_what_is_wrong() {
        assert_eq!(HistoryQuery::parse("").unwrap(), HistoryQuery::default());
        let q = HistoryQuery::parse("after=10&limit=5").unwrap();
        assert_eq!((q.after, q.limit), (10, 5));
        assert_eq!(HistoryQuery::parse(&q.query_string()).unwrap(), q);
        assert_eq!(HistoryQuery::parse("limit=1000").unwrap().limit, 1000);
        for (bad, detail) in [
            ("after=-1", "after must be a position >= 0, got \"-1\""),
            ("after=x", "after must be a position >= 0, got \"x\""),
            ("after", "after must be a position >= 0, got \"\""),
            ("limit=0", "limit must be 1..1000, got \"0\""),
            ("limit=1001", "limit must be 1..1000, got \"1001\""),
            (
                "limit=99999999999999999999",
                "limit must be 1..1000, got \"99999999999999999999\"",
            ),
            ("partition=3", "unknown query parameter \"partition\""),
        ] {
            assert_eq!(HistoryQuery::parse(bad).unwrap_err(), detail, "{bad}");
        }
    }
}
