//! The canonical form of a request path (`schema::path::canonical`) on arbitrary strings, against
//! the decoding actix-web dispatches on (`actix_router::Quoter`, all but `%2F`, `%25`, `%2B`):
//! a canonical path is a fixed point, decodes to exactly what the path as sent decodes to (so the
//! handler is served what the client meant), contains no escape of an unreserved character (so a
//! route template reads the same on the raw and the decoded path), and a refusal points at a `%`
//! that really starts no escape.
#![no_main]

use actix_router::Quoter;
use libfuzzer_sys::fuzz_target;
use schema::path::canonical;

fn hex(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// The path the router matches routes on.
fn dispatched(quoter: &Quoter, path: &str) -> Vec<u8> {
    quoter
        .requote(path.as_bytes())
        .unwrap_or_else(|| path.as_bytes().to_vec())
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let quoter = Quoter::new(b"", b"%/+");
    match canonical(path) {
        Err(error) => {
            let bytes = path.as_bytes();
            assert_eq!(bytes[error.at], b'%');
            let escape = bytes.get(error.at + 1).copied().and_then(hex).is_some()
                && bytes.get(error.at + 2).copied().and_then(hex).is_some();
            assert!(!escape, "{path:?}: refused a valid escape at {}", error.at);
        }
        Ok(result) => {
            let canonical_path = result.as_deref().unwrap_or(path);
            assert_eq!(canonical(canonical_path).unwrap(), None, "{path:?}: not a fixed point");
            assert_eq!(
                dispatched(&quoter, canonical_path),
                dispatched(&quoter, path),
                "{path:?}: decodes unlike the path as sent"
            );
            let bytes = canonical_path.as_bytes();
            for (i, _) in canonical_path.match_indices('%') {
                let (high, low) = (bytes[i + 1], bytes[i + 2]);
                let value = hex(high).unwrap() << 4 | hex(low).unwrap();
                let unreserved =
                    value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~');
                assert!(!unreserved, "{path:?}: left an escape of {:?}", value as char);
            }
        }
    }
});
