//! One decision per order id: submissions are serialised through the order's `orders` row
//! (schema `V3__orders.sql`) and the decided answer is stored there.
//!
//! A submission opens a transaction, inserts the row if it is new and locks it
//! (`SELECT ... FOR UPDATE`) for as long as it works on the order; a concurrent submission of the
//! same order id (another router, or a client retry racing the first) waits on that lock. When
//! the lock is granted:
//!
//! * the order is another client's (`orders.owner`, `V18__owners.sql`) → `404`, nothing is
//!   reserved and nothing tells the order exists;
//! * the stored request differs → `422` at once, nothing is reserved;
//! * the order was decided (`placed`, `failed`, `refused`) → its stored answer is replayed;
//! * otherwise (`pending`: new, or the previous attempt's outcome was unknown) this submission
//!   runs [`super::place`] and records the result in the same transaction.
//!
//! Why a lock held across the HTTP calls and not a claim with an expiry: a lock lives exactly as
//! long as the session. A router that crashes loses its session at once (the kernel closes the
//! socket), so the order is free for the retry; a router that is merely slow or paused keeps it,
//! so nobody decides the order behind its back. The decision only counts if the final `COMMIT`
//! succeeds, which proves the lock was held throughout; otherwise the answer is "not decided"
//! (`503`, `outcome_unknown`) and the retry decides. `idle_in_transaction_session_timeout` (two
//! lock waits) ends the session of a router that vanished without closing its socket (host
//! lost), so it does not block the order id forever; a live submission keeps its session from
//! idling that long, however long it works, and stops sending the moment it may have lost the
//! lock ([`super::lock`]).
//!
//! Each submission that waits holds a connection of the orders pool
//! (`ROUTER_ORDERS_DB_POOL_SIZE`), which bounds the orders one router works on at once.
//!
//! **Shards.** An order spans partitions, so it is not placed by one: its row, lock and stored
//! answer live on the shard [`schema::shard::order_shard`] names for its id, the same for every
//! router, through that shard's own orders pool (a shard that is down stops only the orders
//! stored on it). The check for lines under the earlier id form ([`LineIds::Legacy`]) looks at
//! the order's shard only: that form predates shards, so its orders are all on a cluster's one
//! database.

use std::time::Duration;

use deadpool_postgres::Pool;
use schema::wire::{OrderRequest, Problem, ProblemType, TtlSeconds};
use tokio_postgres::error::SqlState;

use super::lock::{self, KeepAlive, Tenure};
use super::{LineIds, OrderProblem, OrderResult};
use crate::db::{bounded, DbError};
use crate::forward::Forwarder;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// Another submission of the order held its lock for longer than the wait allows.
    #[error("another submission of this order is still in progress")]
    Busy,
    /// The stored row cannot be read back (never written by this code).
    #[error("stored order is unreadable: {0}")]
    Corrupt(String),
}

/// What a submission came to.
#[derive(Debug)]
pub enum Submission {
    /// An earlier submission decided the order; its stored answer.
    Replay {
        status: u16,
        body: serde_json::Value,
    },
    /// The order id is stored with another request.
    Mismatch(OrderProblem),
    /// The order id is another client's ([`access::Owner`]): answered `404`, as an unknown id.
    NotFound,
    /// This submission ran the order (if it could not record a decision, the result says
    /// "not decided").
    Ran(OrderResult),
}

/// The orders tables, through each shard's orders pool.
pub struct OrderStore {
    /// One per configured shard, in order (never empty).
    pools: Vec<Pool>,
    db_timeout: Duration,
    /// How long a submission waits for another one of the same order id.
    lock_wait: Duration,
}

impl OrderStore {
    pub fn new(pools: Vec<Pool>, db_timeout: Duration, lock_wait: Duration) -> Self {
        OrderStore {
            pools,
            db_timeout,
            lock_wait,
        }
    }

    /// The order session's idle timeout, and how it is kept from expiring ([`lock`]). Two lock
    /// waits: long enough that a vanished router is noticed without keeping every other
    /// submission busy for much longer than one wait.
    fn keep_alive(&self) -> KeepAlive {
        KeepAlive {
            idle_timeout: self.lock_wait * 2,
            db_timeout: self.db_timeout,
        }
    }

    /// The orders pool of the shard storing `order_id`.
    fn pool_of(&self, order_id: &str) -> &Pool {
        &self.pools[schema::shard::order_shard(order_id, self.pools.len())]
    }

    /// Run or replay `order` under `order_id`, one submission at a time.
    pub async fn submit(
        &self,
        forwarder: &Forwarder,
        order_id: &str,
        order: &OrderRequest,
        partition_of: impl Fn(&str) -> u32,
    ) -> Result<Submission, StoreError> {
        let t = self.db_timeout;
        let mut client = bounded(t, async { Ok(self.pool_of(order_id).get().await?) }).await?;
        let tx = bounded(t, async { Ok(client.transaction().await?) }).await?;
        let settings = format!(
            "SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {}",
            self.lock_wait.as_millis(),
            self.keep_alive().idle_timeout.as_millis()
        );
        bounded(t, async { Ok(tx.batch_execute(&settings).await?) }).await?;
        let request =
            serde_json::to_string(order).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // The client the order is recorded for, and whose orders it may replay.
        let owner = access::current_owner();
        let wait = self.lock_wait + t;
        let row = bounded(wait, async {
            // Waits (up to lock_timeout) if a concurrent submission inserted the row and has not
            // committed yet, then for the row lock of whoever works on it.
            tx.execute(
                "INSERT INTO orders (order_id, request, owner) VALUES ($1, $2::text::jsonb, $3) \
                 ON CONFLICT (order_id) DO NOTHING",
                &[&order_id, &request, &owner.client],
            )
            .await?;
            Ok(tx
                .query_one(
                    "SELECT request::text, status, response_status, response::text, attempts, \
                            owner \
                       FROM orders WHERE order_id = $1 FOR UPDATE",
                    &[&order_id],
                )
                .await?)
        })
        .await
        .map_err(|e| match e {
            DbError::Query(q) if q.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                StoreError::Busy
            }
            DbError::Timeout(_) => StoreError::Busy,
            other => StoreError::Db(other),
        })?;

        // Another client's order is answered as an unknown one would be, before anything tells
        // it apart (not even a mismatch); the transaction rolls back, nothing changes.
        if !access::owner_visible(row.get::<_, Option<&str>>(5)) {
            return Ok(Submission::NotFound);
        }
        let stored: OrderRequest = serde_json::from_str(row.get::<_, &str>(0))
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        if !same_order(&stored, order) {
            tracing::info!(order_id, "order id reused with different lines");
            return Ok(Submission::Mismatch(mismatch(order_id)));
        }
        let status: &str = row.get(1);
        if status != "pending" {
            let code: Option<i16> = row.get(2);
            let body: Option<&str> = row.get(3);
            let (Some(code), Some(body)) = (code, body) else {
                return Err(StoreError::Corrupt(format!(
                    "{status} order without an answer"
                )));
            };
            let body =
                serde_json::from_str(body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tracing::info!(order_id, status, "order replayed from its stored answer");
            return Ok(Submission::Replay {
                status: code as u16,
                body,
            });
        }

        let attempts: i32 = row.get(4);
        let stored_owner: Option<&str> = row.get(5);
        let ids = if attempts > 0 && stored_owner.is_none() {
            bounded(t, line_ids(&tx, order_id, order.lines.len())).await?
        } else {
            LineIds::Namespaced
        };
        let result = {
            let tenure = Tenure::default();
            let placing = super::place(
                forwarder,
                order_id,
                order,
                ids,
                partition_of,
                &tenure,
                || {
                    // Before releasing anything: is the lock still ours?
                    let tx = &tx;
                    async move {
                        bounded(t, async { Ok(tx.query_one("SELECT 1", &[]).await?) })
                            .await
                            .is_ok()
                    }
                },
            );
            let keeper = lock::keep_alive(&tx, &tenure, self.keep_alive());
            tokio::pin!(placing, keeper);
            tokio::select! {
                result = &mut placing => result,
                // Lost: `placing` sends nothing more and ends soon.
                () = &mut keeper => placing.await,
            }
        };

        let (status, code, body) = match &result {
            OrderResult::Placed { body, .. } => ("placed", Some(201i16), to_json(body)),
            OrderResult::Failed(p) => ("failed", Some(409), to_json(p)),
            OrderResult::Mismatch(p) => ("refused", Some(422), to_json(p)),
            OrderResult::Unknown(_) => ("pending", None, None),
        };
        let record = bounded(t, async {
            tx.execute(
                "UPDATE orders SET status = $2, response_status = $3, \
                        response = $4::text::jsonb, attempts = attempts + 1, updated_at = now() \
                  WHERE order_id = $1",
                &[&order_id, &status, &code, &body],
            )
            .await?;
            Ok(tx.commit().await?)
        })
        .await;
        match record {
            Ok(()) => Ok(Submission::Ran(result)),
            Err(e) => {
                // Without a committed record the lock may have been lost on the way, so another
                // submission may have decided differently: this one must not claim a decision.
                tracing::warn!(order_id, error = %e, outcome = result.outcome_label(), "order decision not recorded; answering outcome unknown");
                Ok(Submission::Ran(unrecorded(order_id, result)))
            }
        }
    }
}

/// The line ids to use for an order earlier attempts left undecided: the form of an earlier
/// version ([`LineIds::Legacy`]) if that attempt left any reservation under it, so that this
/// attempt replays and compensates those holds rather than holding the lines a second time.
///
/// Only an order without an owner can have been begun under that form: owners were recorded
/// (`V18__owners.sql`) only by versions that already placed lines under `order:`, so the caller
/// asks only for orders whose stored owner is `NULL`. Such an order's own lines have no owner
/// either, so only reservations without an owner count here: a reservation some authenticated
/// client made under one of those ids (any client may use an id outside `order:`) is never
/// taken for the order's line, and cannot turn the order to ids that are not its own.
async fn line_ids(
    tx: &deadpool_postgres::Transaction<'_>,
    order_id: &str,
    lines: usize,
) -> Result<LineIds, DbError> {
    let legacy: Vec<String> = (0..lines)
        .map(|i| LineIds::Legacy.id(order_id, i))
        .collect();
    let found: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM reservations \
                             WHERE reservation_id = ANY($1) AND owner IS NULL)",
            &[&legacy],
        )
        .await?
        .get(0);
    if found {
        tracing::info!(
            order_id,
            "finishing an order begun under the earlier line-id form"
        );
    }
    Ok(if found {
        LineIds::Legacy
    } else {
        LineIds::Namespaced
    })
}

/// Same lines, and the same effective ttl (an omitted ttl is the default one, as for a single
/// reservation).
fn same_order(a: &OrderRequest, b: &OrderRequest) -> bool {
    let ttl = |o: &OrderRequest| TtlSeconds::or_default(o.ttl_seconds);
    a.lines == b.lines && ttl(a) == ttl(b)
}

fn to_json<T: serde::Serialize>(value: &T) -> Option<String> {
    serde_json::to_string(value).ok()
}

fn mismatch(order_id: &str) -> OrderProblem {
    OrderProblem {
        problem: Problem {
            outcome_unknown: Some(false),
            ..Problem::new(
                ProblemType::IdempotencyMismatch,
                "this order id was first submitted with other lines or another ttl; the \
                 original order is left as it was",
            )
        },
        order_id: order_id.to_owned(),
        lines: Vec::new(),
    }
}

/// The answer when a decision could not be recorded: not decided, retry with the same id.
fn unrecorded(order_id: &str, result: OrderResult) -> OrderResult {
    let lines = match result {
        OrderResult::Failed(p) | OrderResult::Mismatch(p) | OrderResult::Unknown(p) => p.lines,
        OrderResult::Placed { .. } => Vec::new(),
    };
    OrderResult::Unknown(OrderProblem {
        problem: Problem {
            outcome_unknown: Some(true),
            ..Problem::new(
                ProblemType::UpstreamUnavailable,
                "the order's outcome could not be recorded; retry the order with the same order \
                 id",
            )
        },
        order_id: order_id.to_owned(),
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::wire::{limits, OrderLine};

    #[test]
    fn an_omitted_ttl_is_the_default_one() {
        let order = |quantity: i64, ttl_seconds: Option<u32>| OrderRequest {
            lines: vec![OrderLine {
                sku: "a".parse().unwrap(),
                quantity: quantity.try_into().unwrap(),
            }],
            ttl_seconds: ttl_seconds.map(|t| t.try_into().unwrap()),
        };
        let default = Some(limits::TTL_SECONDS_DEFAULT);
        assert!(same_order(&order(1, None), &order(1, default)));
        assert!(!same_order(&order(1, None), &order(2, None)));
        assert!(!same_order(&order(1, None), &order(1, Some(60))));
    }
}
