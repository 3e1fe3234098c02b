//! Percent-encoding of one URL path segment.
//!
//! Reservation and adjustment ids may contain any non-control character, including `/`, `?`,
//! `%` and spaces; every client that puts one into a path (the router forwarding to an owner, the
//! load generator, the test harness) encodes it here so it reaches the server as the same id.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Everything but RFC 3986 unreserved characters (letters, digits, `-`, `.`, `_`, `~`).
const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode everything but RFC 3986 unreserved characters.
pub fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, RESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_reserved_characters_in_segments() {
        assert_eq!(encode_segment("abc-1.2_3~"), "abc-1.2_3~");
        assert_eq!(encode_segment("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
        assert_eq!(encode_segment("order:1:sku"), "order%3A1%3Asku");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
