//! The request parsers of `schema::wire` on arbitrary bytes, as both services read bodies and
//! path segments: a body refuses or yields values inside every documented limit, never panics,
//! and what it yields survives a round trip through JSON; a path segment encoded for a URL
//! decodes to itself; a request id is accepted only within its rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use schema::wire::{validate, AdjustmentRequest, OrderRequest, RequestId, ReserveRequest};

fn round_trip<T>(value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_vec(value).expect("serialises");
    let back: T = serde_json::from_slice(&json).expect("what was accepted parses again");
    assert_eq!(&back, value);
}

fuzz_target!(|data: &[u8]| {
    if let Ok(reserve) = serde_json::from_slice::<ReserveRequest>(data) {
        validate::sku(reserve.sku.as_str()).expect("sku within its rules");
        validate::quantity(reserve.quantity.get()).expect("quantity within its bounds");
        round_trip(&reserve);
    }
    if let Ok(order) = serde_json::from_slice::<OrderRequest>(data) {
        // The line count is the router's to check (an order of 0 or 101 lines is its 400).
        for line in &order.lines {
            validate::sku(line.sku.as_str()).expect("sku within its rules");
            validate::quantity(line.quantity.get()).expect("quantity within its bounds");
        }
        round_trip(&order);
    }
    if let Ok(adjustment) = serde_json::from_slice::<AdjustmentRequest>(data) {
        validate::delta(adjustment.delta.get()).expect("delta within its bounds");
        round_trip(&adjustment);
    }
    if let Some(id) = RequestId::parse(data) {
        assert!(!id.as_str().is_empty() && id.as_str().len() <= schema::wire::REQUEST_ID_MAX_LEN);
        assert!(id.as_str().bytes().all(|b| b.is_ascii_graphic()));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let encoded = schema::path::encode_segment(text);
        assert!(!encoded.contains('/') && !encoded.contains('?') && !encoded.contains('#'));
        assert_eq!(decode(&encoded), text.as_bytes(), "{text:?} → {encoded:?}");
    }
});

/// Percent-decoding, for the round trip of [`schema::path::encode_segment`].
fn decode(encoded: &str) -> Vec<u8> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("two hex digits");
            out.push(u8::from_str_radix(hex, 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}
