//! The answers of `POST /v1/orders/{order_id}/reservations` (router only): the placed order, and
//! the per-line report of a failed one, as the API document describes them.

use schema::wire::{Problem, Reservation, ReservationStatus};
use serde::Deserialize;

/// `201` (placed now) or `200` (replayed): every line held, in line order.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub reservations: Vec<Reservation>,
}

/// `409 order-failed` and `503 upstream-unavailable` of an order: the problem and every line's
/// outcome.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OrderFailure {
    #[serde(flatten)]
    pub problem: Problem,
    pub order_id: String,
    pub lines: Vec<OrderLineReport>,
}

/// One line of a failed order.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OrderLineReport {
    pub index: usize,
    pub sku: String,
    pub quantity: i64,
    /// `order:{order_id}:{index}`.
    pub reservation_id: String,
    /// `held`, `replayed`, `inactive`, `refused`, `unavailable` or `unknown`.
    pub outcome: String,
    #[serde(default)]
    pub status: Option<ReservationStatus>,
    /// Why the line was not held.
    #[serde(default)]
    pub problem: Option<Problem>,
    /// `released`, `not_held`, `failed` or `unsettled`.
    #[serde(default)]
    pub compensation: Option<String>,
}
