//! One method per route an order service or an operator calls, each built from
//! [`schema::routes`].

use bytes::Bytes;
use http::Method;
use schema::events::{EventPage, Stream};
use schema::history::HistoryPage;
use schema::routes::{self, Route};
use schema::wire::{
    Adjustment, AdjustmentRequest, Delta, InvalidValue, Inventory, OrderRequest, PartitionMap,
    Quantity, Reservation, ReserveRequest, SettlementStatus, Sku,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::Call;
use crate::client::Client;
use crate::ids;
use crate::order::OrderPlaced;

/// A reserve of `quantity` units of `sku` under a fresh reservation id, held for the service's
/// default time (set `ttl_seconds` for another).
pub fn new_reservation(sku: &str, quantity: i64) -> Result<ReserveRequest, InvalidValue> {
    Ok(ReserveRequest {
        reservation_id: ids::reservation_id(),
        sku: Sku::try_from(sku)?,
        quantity: Quantity::try_from(quantity)?,
        ttl_seconds: None,
    })
}

/// A stock adjustment by `delta` (positive restocks, negative shrinks) under a fresh id.
pub fn new_adjustment(delta: i64) -> Result<AdjustmentRequest, InvalidValue> {
    Ok(AdjustmentRequest {
        adjustment_id: ids::adjustment_id(),
        delta: Delta::try_from(delta)?,
    })
}

/// The path of `route` with its `{placeholders}` filled by `segments` in order, each
/// percent-encoded.
///
/// # Panics
///
/// When `segments` does not have one value per placeholder: the route table is fixed, so that
/// is a bug of the caller.
pub fn route_path(route: &Route, segments: &[&str]) -> String {
    let mut path = String::with_capacity(route.path.len() + 40);
    let mut segments = segments.iter();
    for part in route.path.split('/').skip(1) {
        path.push('/');
        if part.starts_with('{') {
            let value = segments
                .next()
                .unwrap_or_else(|| panic!("{} needs a value for {part}", route.path));
            path.push_str(&schema::path::encode_segment(value));
        } else {
            path.push_str(part);
        }
    }
    assert!(
        segments.next().is_none(),
        "too many segments for {}",
        route.path
    );
    path
}

fn json(body: &impl Serialize) -> Option<Bytes> {
    // Wire types are plain data: serialising them cannot fail.
    Some(serde_json::to_vec(body).map_or_else(|_| Bytes::new(), Bytes::from))
}

fn method(route: &Route) -> Method {
    if route.method == "POST" {
        Method::POST
    } else {
        Method::GET
    }
}

impl Client {
    /// A call of `route` with its segments and body, sending `id` as the idempotency id if it
    /// changes something: for routes without a method here.
    pub fn call<T: DeserializeOwned>(
        &self,
        route: &Route,
        segments: &[&str],
        body: Option<Bytes>,
        id: Option<String>,
    ) -> Call<'_, T> {
        Call::new(self, method(route), route_path(route, segments), body, id)
    }

    /// `POST /v1/reservations`: hold stock under `request.reservation_id` (make one with
    /// [`new_reservation`]). `201` when held now, `200` replaying an earlier outcome of the id.
    pub fn reserve(&self, request: &ReserveRequest) -> Call<'_, Reservation> {
        let id = request.reservation_id.to_string();
        self.call(&routes::RESERVE, &[], json(request), Some(id))
    }

    /// `GET /v1/reservations/{reservation_id}`.
    pub fn reservation(&self, reservation_id: &str) -> Call<'_, Reservation> {
        self.call(&routes::GET_RESERVATION, &[reservation_id], None, None)
    }

    /// `POST /v1/reservations/{reservation_id}/confirm`: the hold becomes a sale.
    pub fn confirm(&self, reservation_id: &str) -> Call<'_, Reservation> {
        let id = Some(reservation_id.to_owned());
        self.call(&routes::CONFIRM, &[reservation_id], None, id)
    }

    /// `POST /v1/reservations/{reservation_id}/release`: the held units are available again.
    pub fn release(&self, reservation_id: &str) -> Call<'_, Reservation> {
        let id = Some(reservation_id.to_owned());
        self.call(&routes::RELEASE, &[reservation_id], None, id)
    }

    /// `GET /v1/inventory/{sku}`.
    pub fn inventory(&self, sku: &str) -> Call<'_, Inventory> {
        self.call(&routes::GET_INVENTORY, &[sku], None, None)
    }

    /// `POST /v1/inventory/{sku}/adjustments` (the `admin` scope): restock or shrink under
    /// `request.adjustment_id` (make one with [`new_adjustment`]).
    pub fn adjust(&self, sku: &str, request: &AdjustmentRequest) -> Call<'_, Adjustment> {
        let id = request.adjustment_id.to_string();
        self.call(&routes::ADJUST, &[sku], json(request), Some(id))
    }

    /// `POST /v1/orders/{order_id}/reservations` (routers only): every line held, or none
    /// ([`crate::Error::OrderFailed`]). A retry with the same `order_id` replays the decided
    /// answer; [`ids::order_id`] makes a fresh id.
    pub fn order(&self, order_id: &str, request: &OrderRequest) -> Call<'_, OrderPlaced> {
        let id = Some(order_id.to_owned());
        self.call(&routes::RESERVE_ORDER, &[order_id], json(request), id)
    }

    /// `GET /v1/partitions`: the partition → owner map.
    pub fn partitions(&self) -> Call<'_, PartitionMap> {
        self.call(&routes::PARTITIONS, &[], None, None)
    }

    /// `GET /v1/jobs/settlement`: the settlement job's holder and progress.
    pub fn settlement(&self) -> Call<'_, SettlementStatus> {
        self.call(&routes::SETTLEMENT_STATUS, &[], None, None)
    }

    /// `GET /v1/events` (the `admin` scope): one page of `stream` after position `after`, at
    /// most `limit` events (the service's default without). A settlement stream is asked by its
    /// name (`settlement`, `settlement/s1`).
    pub fn events(&self, stream: Stream, after: i64, limit: Option<i64>) -> Call<'_, EventPage> {
        let partition = match stream {
            Stream::Partition(p) => p.to_string(),
            settlement @ Stream::Settlement(_) => settlement.name(),
        };
        let mut path = format!(
            "{}?partition={partition}&after={after}",
            routes::EVENTS.path
        );
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        Call::new(self, Method::GET, path, None, None)
    }

    /// `GET /v1/inventory/{sku}/history` (the `admin` scope): one page of the SKU's ledger in
    /// commit order after position `after`, with the client of each movement; at most `limit`
    /// entries (the service's default without). Ask again from `next_after` for the next page.
    pub fn history(&self, sku: &str, after: i64, limit: Option<i64>) -> Call<'_, HistoryPage> {
        let mut path = format!(
            "{}?after={after}",
            route_path(&routes::INVENTORY_HISTORY, &[sku])
        );
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        Call::new(self, Method::GET, path, None, None)
    }

    /// `GET /healthz`: the process answers.
    pub fn health(&self) -> Call<'_, serde_json::Value> {
        self.call(&routes::HEALTHZ, &[], None, None)
    }

    /// `GET /readyz`: the service can serve (a `503` until then, retried like any other).
    pub fn ready(&self) -> Call<'_, serde_json::Value> {
        self.call(&routes::READYZ, &[], None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_come_from_the_route_table_with_encoded_segments() {
        assert_eq!(route_path(&routes::RESERVE, &[]), "/v1/reservations");
        assert_eq!(
            route_path(&routes::CONFIRM, &["a b/c"]),
            "/v1/reservations/a%20b%2Fc/confirm"
        );
        assert_eq!(
            route_path(&routes::ADJUST, &["sku:1"]),
            "/v1/inventory/sku%3A1/adjustments"
        );
    }

    #[test]
    #[should_panic(expected = "needs a value")]
    fn a_missing_segment_is_a_bug() {
        route_path(&routes::RELEASE, &[]);
    }

    #[tokio::test]
    async fn calls_that_change_something_carry_their_id() {
        let client = Client::new("http://h:1").unwrap();
        let request = new_reservation("a", 2).unwrap();
        assert_eq!(
            client.reserve(&request).id(),
            Some(request.reservation_id.as_str())
        );
        let adjustment = new_adjustment(5).unwrap();
        assert_eq!(
            client.adjust("a", &adjustment).id(),
            Some(adjustment.adjustment_id.as_str())
        );
        assert_eq!(client.release("r-1").id(), Some("r-1"));
        assert_eq!(
            client
                .order(
                    "o-1",
                    &OrderRequest {
                        lines: vec![],
                        ttl_seconds: None
                    }
                )
                .id(),
            Some("o-1")
        );
        assert_eq!(client.inventory("a").id(), None);
        assert!(new_reservation("bad sku", 1).is_err());
        assert!(new_adjustment(0).is_err());
        assert_ne!(
            new_reservation("a", 1).unwrap().reservation_id,
            request.reservation_id
        );
    }
}
