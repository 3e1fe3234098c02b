//! The reservation ids of order lines: a namespace single reservations cannot use.
//!
//! A router reserves line `i` of order `o` as `order:{o}:{i}` ([`order_line_id`]). The id must
//! depend only on the order id and the line's position, so that a retry of the order reserves the
//! same ids and gets the stored outcomes back instead of taking stock twice. If any client could
//! create a single reservation under such an id, it could occupy a line of someone else's order
//! (the order would be refused with `422` for a line it never held). So ids that start with
//! [`ORDER_LINE_PREFIX`] are refused on `POST /v1/reservations` — by routers always, by
//! allocators unless the request is an order line a router forwards (it carries
//! [`HEADER_ORDER_LINE`] and comes from a caller holding the `router` scope, or authentication is
//! off). Reading, confirming and releasing an order line by its id stay open to clients.
//!
//! Why a prefix: one `starts_with` decides it, the form reads as what it is in logs and in the
//! database, and it fits the id limit (6 + 200-byte order id + `:` + two digits ≤ 255). The index
//! after the last `:` keeps the mapping injective even for order ids containing `:` and digits.

/// Reservation ids starting with this belong to order lines.
pub const ORDER_LINE_PREFIX: &str = "order:";

/// Set (to `true`) by a router on the reserve of an order line. An allocator accepts an id in the
/// order-line namespace only with this header and only from a caller it trusts as a router.
pub const HEADER_ORDER_LINE: &str = "x-order-line";

/// The reservation id of line `index` of order `order_id`.
pub fn order_line_id(order_id: &str, index: usize) -> String {
    format!("{ORDER_LINE_PREFIX}{order_id}:{index}")
}

/// Whether `reservation_id` is in the order-line namespace.
pub fn is_order_line_id(reservation_id: &str) -> bool {
    reservation_id.starts_with(ORDER_LINE_PREFIX)
}

/// The `detail` of the `400` that refuses such an id on `POST /v1/reservations`; the same words in
/// both services.
pub fn reserved_id_refusal(reservation_id: &str) -> String {
    format!(
        "reservation_id {reservation_id:?} is in the namespace of order lines (ids starting with \
         {ORDER_LINE_PREFIX:?}), which only orders may create (POST \
         /v1/orders/{{order_id}}/reservations); choose another id"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::limits::{ID_MAX_LEN, ORDER_LINES_MAX};

    #[test]
    fn line_ids_are_in_the_namespace_deterministic_and_distinct() {
        assert_eq!(order_line_id("o-7", 12), "order:o-7:12");
        assert!(is_order_line_id(&order_line_id("o-7", 0)));
        assert!(!is_order_line_id("o-7:0"));
        assert!(!is_order_line_id("Order:o-7:0"));
        let mut seen = std::collections::HashSet::new();
        for order in ["a", "a:1", "a:10", "a:1:0", "1", "order:a"] {
            for i in 0..ORDER_LINES_MAX {
                assert!(seen.insert(order_line_id(order, i)), "{order}/{i} collides");
            }
        }
    }

    #[test]
    fn the_longest_line_id_fits_the_id_limit() {
        // The router's longest order id.
        let id = order_line_id(&"x".repeat(200), ORDER_LINES_MAX - 1);
        assert!(id.len() <= ID_MAX_LEN, "{}", id.len());
    }

    #[test]
    fn the_refusal_names_the_prefix() {
        assert!(reserved_id_refusal("order:x:0").contains("\"order:\""));
    }
}
