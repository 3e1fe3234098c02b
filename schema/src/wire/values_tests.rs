use super::super::{validate, OrderRequest, ReserveRequest};
use super::*;

#[test]
fn delta_bounds_do_not_overflow() {
    assert!(validate::delta(i64::MIN).is_err());
    assert!(validate::delta(i64::MAX).is_err());
    assert!(validate::delta(0).is_err());
    assert!(validate::delta(-1_000_000_000).is_ok());
    assert!(validate::delta(1_000_000_001).is_err());
    assert!(Delta::try_from(i64::MIN).is_err());
    assert_eq!(Delta::try_from(-5).unwrap().get(), -5);
}

#[test]
fn sku_and_id_rules() {
    assert!(validate::sku("a.b_c:d-9").is_ok());
    assert!(validate::sku("a b").is_err());
    assert!(validate::sku("é").is_err());
    assert!(validate::id("reservation_id", &"x".repeat(255)).is_ok());
    assert!(validate::id("reservation_id", &"x".repeat(256)).is_err());
    assert!(validate::id("reservation_id", "tab\there").is_err());
    assert_eq!(Sku::try_from("a.b_c:d-9").unwrap().as_str(), "a.b_c:d-9");
    assert!("a b".parse::<Sku>().is_err());
    assert!(ReservationId::try_from("x".repeat(256)).is_err());
    let err = AdjustmentId::try_from("").unwrap_err().to_string();
    assert!(err.starts_with("adjustment_id must be"), "{err}");
}

#[test]
fn quantity_and_ttl_rules() {
    assert!(Quantity::try_from(0).is_err());
    assert_eq!(Quantity::try_from(1_000_000).unwrap(), Quantity::MAX);
    assert!(Quantity::try_from(1_000_001).is_err());
    assert!(TtlSeconds::try_from(0).is_err());
    assert!(TtlSeconds::try_from(86_401).is_err());
    assert_eq!(TtlSeconds::or_default(None).get(), 900);
    assert_eq!("12".parse::<Quantity>().unwrap().get(), 12);
}

#[test]
fn wire_format_is_the_plain_value() {
    let json = r#"{"reservation_id":"r-1","sku":"a","quantity":2,"ttl_seconds":30}"#;
    let request: ReserveRequest = serde_json::from_str(json).unwrap();
    assert_eq!(request.quantity.get(), 2);
    assert_eq!(serde_json::to_string(&request).unwrap(), json);
    let json = r#"{"reservation_id":"r-1","sku":"a","quantity":2}"#;
    let request: ReserveRequest = serde_json::from_str(json).unwrap();
    assert_eq!(serde_json::to_string(&request).unwrap(), json);
}

#[test]
fn a_refused_value_reports_the_rule_words() {
    let json = r#"{"reservation_id":"r-1","sku":"a b","quantity":2}"#;
    let err = serde_json::from_str::<ReserveRequest>(json)
        .unwrap_err()
        .to_string();
    assert_eq!(
        rule_violation(&err),
        Some("sku may contain only A-Z a-z 0-9 . _ : -"),
        "{err}"
    );
    let json = r#"{"reservation_id":"r-1","sku":"a","quantity":0}"#;
    let err = serde_json::from_str::<ReserveRequest>(json)
        .unwrap_err()
        .to_string();
    assert_eq!(
        rule_violation(&err),
        Some("quantity must be between 1 and 1000000")
    );
    // Malformed input is not a rule violation.
    let err = serde_json::from_str::<ReserveRequest>(r#"{"sku":1}"#)
        .unwrap_err()
        .to_string();
    assert_eq!(rule_violation(&err), None, "{err}");
}

#[test]
fn a_refused_order_line_is_named() {
    let json = r#"{"lines":[{"sku":"a","quantity":1},{"sku":"a","quantity":0}]}"#;
    let err = serde_json::from_str::<OrderRequest>(json)
        .unwrap_err()
        .to_string();
    assert_eq!(
        rule_violation(&err),
        Some("lines[1]: quantity must be between 1 and 1000000"),
        "{err}"
    );
    let json = r#"{"lines":[{"sku":"a","quantity":1}],"ttl_seconds":7}"#;
    let order: OrderRequest = serde_json::from_str(json).unwrap();
    assert_eq!(serde_json::to_string(&order).unwrap(), json);
}

#[test]
fn position_is_stripped_only_when_it_is_one() {
    assert_eq!(strip_position("sku x at line 1 column 9"), "sku x");
    assert_eq!(strip_position("sku at line one"), "sku at line one");
}

#[test]
fn integral_numbers_are_integers_however_they_are_spelled() {
    let body = |s: &str| serde_json::from_str::<Quantity>(s).map(Quantity::get);
    assert_eq!(body("2").unwrap(), 2);
    assert_eq!(body("2.0").unwrap(), 2);
    assert_eq!(body("2e0").unwrap(), 2);
    let ttl: TtlSeconds = serde_json::from_str("1.2e2").unwrap();
    assert_eq!(ttl.get(), 120);
}

#[test]
fn fractional_and_out_of_range_numbers_are_refused_in_the_rules_words() {
    let refusal = |s: &str| serde_json::from_str::<Quantity>(s).unwrap_err().to_string();
    assert!(refusal("1.5").starts_with("quantity must be an integer"));
    assert!(refusal("1e30").starts_with("quantity must be between"));
    assert!(refusal("-1e30").starts_with("quantity must be between"));
    assert!(refusal("99999999999999999999").starts_with("quantity must be between"));
    let ttl = serde_json::from_str::<TtlSeconds>("-1")
        .unwrap_err()
        .to_string();
    assert!(ttl.starts_with("ttl_seconds must be between"), "{ttl}");
    let delta = serde_json::from_str::<Delta>("0.0")
        .unwrap_err()
        .to_string();
    assert!(delta.starts_with("delta must be non-zero"), "{delta}");
    assert!(serde_json::from_str::<Delta>("\"5\"").is_err());
}
