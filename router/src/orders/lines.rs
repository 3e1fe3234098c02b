//! What an order may be (its id and its lines) and the reservation ids of its lines.

use schema::wire::{limits, validate, OrderRequest};

/// Longest order id; leaves room for `order:` and `:{index}` within the 255-byte reservation id
/// limit.
pub const ORDER_ID_MAX_LEN: usize = 200;

/// The reservation id of line `index` of order `order_id`: `order:{order_id}:{index}`
/// ([`schema::wire::order_line_id`]), in the namespace single reservations cannot use.
///
/// Injective: the index is the decimal suffix after the last `:`, so two (order, line) pairs never
/// share an id.
pub fn line_reservation_id(order_id: &str, index: usize) -> String {
    schema::wire::order_line_id(order_id, index)
}

/// Which form an order's line ids take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineIds {
    /// `order:{order_id}:{i}` ([`line_reservation_id`]): every order placed by this version.
    Namespaced,
    /// `{order_id}:{i}`, the form of earlier versions, outside the namespace. Used only to finish
    /// an order that an earlier version left undecided with lines under it ([`super::store`] decides),
    /// so that the retry replays and compensates those holds instead of holding the lines a
    /// second time.
    Legacy,
}

impl LineIds {
    pub fn id(self, order_id: &str, index: usize) -> String {
        match self {
            LineIds::Namespaced => line_reservation_id(order_id, index),
            LineIds::Legacy => format!("{order_id}:{index}"),
        }
    }
}

/// Check what the order's types cannot: the order id and the number of lines (each line's SKU
/// and quantity, and the ttl, were parsed with the body). Returns the first problem found.
pub fn validate_order(order_id: &str, order: &OrderRequest) -> Result<(), String> {
    validate::id("order_id", order_id)?;
    if order_id.len() > ORDER_ID_MAX_LEN {
        return Err(format!("order_id must be at most {ORDER_ID_MAX_LEN} bytes"));
    }
    if order.lines.is_empty() || order.lines.len() > limits::ORDER_LINES_MAX {
        return Err(format!(
            "an order must have 1..={} lines",
            limits::ORDER_LINES_MAX
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::wire::{OrderLine, Quantity, Sku};

    #[test]
    fn line_ids_are_deterministic_and_distinct() {
        assert_eq!(line_reservation_id("order-7", 0), "order:order-7:0");
        assert_eq!(line_reservation_id("order-7", 12), "order:order-7:12");
        assert_eq!(LineIds::Namespaced.id("o", 3), line_reservation_id("o", 3));
        assert_eq!(LineIds::Legacy.id("o", 3), "o:3");
        assert!(!schema::wire::is_order_line_id(&LineIds::Legacy.id("o", 3)));
        assert_eq!(
            line_reservation_id("order-7", 3),
            line_reservation_id("order-7", 3)
        );
        // Injective even when order ids themselves contain ':' and digits.
        let mut seen = std::collections::HashSet::new();
        for order in ["a", "a:1", "a:10", "a:1:0", "1"] {
            for i in 0..limits::ORDER_LINES_MAX {
                assert!(
                    seen.insert(line_reservation_id(order, i)),
                    "{order}/{i} collides"
                );
            }
        }
    }

    #[test]
    fn longest_line_id_fits_the_reservation_id_limit() {
        let order_id = "x".repeat(ORDER_ID_MAX_LEN);
        let id = line_reservation_id(&order_id, limits::ORDER_LINES_MAX - 1);
        assert!(validate::id("reservation_id", &id).is_ok(), "{}", id.len());
    }

    #[test]
    fn validates_order_bounds() {
        let line = |sku: &str, quantity: i64| OrderLine {
            sku: Sku::try_from(sku).unwrap(),
            quantity: Quantity::try_from(quantity).unwrap(),
        };
        let order = |lines| OrderRequest {
            lines,
            ttl_seconds: None,
        };
        assert!(validate_order("o", &order(vec![line("a", 1), line("a", 2)])).is_ok());
        assert!(validate_order("o", &order(vec![])).is_err());
        assert!(
            validate_order("o", &order(vec![line("a", 1); limits::ORDER_LINES_MAX + 1])).is_err()
        );
        assert!(validate_order("o", &order(vec![line("a", 1); limits::ORDER_LINES_MAX])).is_ok());
        assert!(validate_order(&"o".repeat(201), &order(vec![line("a", 1)])).is_err());
        assert!(validate_order(&"o".repeat(200), &order(vec![line("a", 1)])).is_ok());
        assert!(validate_order("", &order(vec![line("a", 1)])).is_err());
        // A bad SKU, quantity or ttl cannot get this far: the body is refused as it is parsed.
        let body = r#"{"lines":[{"sku":"a","quantity":1},{"sku":"bad sku","quantity":1}]}"#;
        let err = serde_json::from_str::<OrderRequest>(body)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("lines[1]: sku"), "{err}");
        let body = r#"{"lines":[{"sku":"a","quantity":0}]}"#;
        assert!(serde_json::from_str::<OrderRequest>(body).is_err());
        let body = r#"{"lines":[{"sku":"a","quantity":1}],"ttl_seconds":0}"#;
        assert!(serde_json::from_str::<OrderRequest>(body).is_err());
    }
}
