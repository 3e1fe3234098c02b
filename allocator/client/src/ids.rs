//! Idempotency ids made for callers that bring none: 128 random bits as 32 lower-case hex digits.
//!
//! An id names one intended change (one hold, one adjustment, one order) for as long as its
//! outcome matters, so it must not repeat by chance: 128 bits from the operating system's seeded
//! generator make a collision negligible among any number of ids a cluster keeps. The digits are
//! RFC 3986 unreserved characters, so an id is also its own path segment, and they never start
//! with `order:`, the prefix reserved for order lines.

/// A fresh random id.
pub fn fresh() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A fresh reservation id.
#[cfg(feature = "http")]
pub fn reservation_id() -> schema::wire::ReservationId {
    checked(fresh())
}

/// A fresh adjustment id.
#[cfg(feature = "http")]
pub fn adjustment_id() -> schema::wire::AdjustmentId {
    checked(fresh())
}

/// A fresh order id (the path segment of [`crate::Client::order`]).
pub fn order_id() -> String {
    fresh()
}

/// A fresh id always passes the id rules (1..=255 bytes, no control characters).
#[cfg(feature = "http")]
fn checked<T: TryFrom<String, Error = schema::wire::InvalidValue>>(id: String) -> T {
    T::try_from(id).unwrap_or_else(|e| unreachable!("a hex id was refused: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_32_hex_digits_and_do_not_repeat() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(|_| fresh()).collect();
        assert_eq!(ids.len(), 10_000);
        for id in &ids {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
    }

    #[cfg(feature = "http")]
    #[test]
    fn ids_are_valid_wire_ids_and_their_own_path_segment() {
        let id = reservation_id();
        assert!(!schema::wire::is_order_line_id(id.as_str()));
        assert_eq!(schema::path::encode_segment(id.as_str()), id.as_str());
        assert_ne!(adjustment_id().as_str(), order_id());
    }
}
