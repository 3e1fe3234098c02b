//! Percent-encoding of one URL path segment, and the one canonical form of a request's path.
//!
//! Reservation and adjustment ids may contain any non-control character, including `/`, `?`,
//! `%` and spaces; every client that puts one into a path (the router forwarding to an owner, the
//! load generator, the test harness) encodes it here so it reaches the server as the same id.
//!
//! A server must take every decision on the path its handler will see. actix-web dispatches on
//! the path percent-decoded (all but `%2F`, `%25`, `%2B`), while anything that reads the raw path
//! (a route template matched against it, an audit line, a metric label) would see `/v1/%69nventory`
//! as a path no route has. [`canonical`] removes the difference at the edge: escapes of unreserved
//! characters are decoded (RFC 3986 §6.2.2.2: `%69` and `i` are the same URI), so a route's fixed
//! segments, which are unreserved characters only, read the same raw and decoded; every other
//! escape is left as sent (its case too: actix keeps `%2f` as `%2f`), and a `%` that does not
//! start an escape is refused.

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

/// Why a path has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedEscape {
    /// Byte offset of the `%` that does not start an escape.
    pub at: usize,
}

impl std::fmt::Display for MalformedEscape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the path has a '%' at byte {} that is not followed by two hex digits",
            self.at
        )
    }
}

/// Whether `byte` is an RFC 3986 unreserved character (letters, digits, `-`, `.`, `_`, `~`).
fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// The canonical form of a request path: escapes of unreserved characters decoded, nothing else
/// changed. `Ok(None)` when the path is canonical
/// already (no allocation: the common case); an error for a `%` not followed by two hex digits.
///
/// One pass, so a decoded character never forms a new escape with its neighbours (it is never
/// `%`), and decoding the result the way a server does gives what decoding `path` gives.
pub fn canonical(path: &str) -> Result<Option<String>, MalformedEscape> {
    let bytes = path.as_bytes();
    let Some(first) = bytes.iter().position(|&b| b == b'%') else {
        return Ok(None);
    };
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..first]);
    let mut changed = false;
    let mut i = first;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte != b'%' {
            // Copy the run up to the next escape whole (it may hold multi-byte characters).
            let end = bytes[i..]
                .iter()
                .position(|&b| b == b'%')
                .map_or(bytes.len(), |n| i + n);
            out.push_str(&path[i..end]);
            i = end;
            continue;
        }
        let (Some(high), Some(low)) = (
            bytes.get(i + 1).copied().and_then(hex_value),
            bytes.get(i + 2).copied().and_then(hex_value),
        ) else {
            return Err(MalformedEscape { at: i });
        };
        let value = high << 4 | low;
        if unreserved(value) {
            out.push(value as char);
            changed = true;
        } else {
            out.push_str(&path[i..i + 3]);
        }
        i += 3;
    }
    Ok(changed.then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_paths_decode_unreserved_escapes_only() {
        let c = |p: &str| canonical(p).unwrap();
        assert_eq!(c("/v1/inventory/acme%3A1"), None);
        assert_eq!(c("/v1/inventory/a"), None);
        assert_eq!(c("/v1/%69nventory/x").as_deref(), Some("/v1/inventory/x"));
        assert_eq!(c("/v1/%49NVENTORY").as_deref(), Some("/v1/INVENTORY"));
        assert_eq!(c("/v1/%65vents").as_deref(), Some("/v1/events"));
        assert_eq!(c("/%2d%2E%5f%7E%30").as_deref(), Some("/-._~0"));
        // Reserved and protected escapes stay as sent, case and all.
        assert_eq!(c("/x%2fy%3a%25"), None);
        assert_eq!(c("/x%2Fy%3A%25%41").as_deref(), Some("/x%2Fy%3A%25A"));
        // `%25` is a `%`, not the start of an escape: `%2569` stays as it is.
        assert_eq!(c("/v1/%2569nventory"), None);
        assert_eq!(c("/é%c3%a9%6a").as_deref(), Some("/é%c3%a9j"));
    }

    #[test]
    fn a_percent_that_starts_no_escape_is_refused() {
        assert_eq!(canonical("/a%"), Err(MalformedEscape { at: 2 }));
        assert_eq!(canonical("/a%6"), Err(MalformedEscape { at: 2 }));
        assert_eq!(canonical("/a%zz"), Err(MalformedEscape { at: 2 }));
        // Decoding `%36%39` must not make `%69` an escape of `i` afterwards: refused whole.
        assert_eq!(
            canonical("/v1/%%36%39nventory"),
            Err(MalformedEscape { at: 4 })
        );
        assert_eq!(canonical("/ok%41%").unwrap_err().at, 6);
    }

    #[test]
    fn canonical_is_idempotent_and_keeps_the_decoded_path() {
        let decode = |p: &str| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        };
        for path in [
            "/v1/%69nventory/a%2Fb/h%69story",
            "/%7e%7E%2b%2B%25",
            "/a%C3%a9b",
        ] {
            let once = canonical(path).unwrap().unwrap_or_else(|| path.to_owned());
            assert_eq!(canonical(&once).unwrap(), None, "{path}");
            assert_eq!(decode(&once), decode(path), "{path}");
        }
    }

    #[test]
    fn encodes_reserved_characters_in_segments() {
        assert_eq!(encode_segment("abc-1.2_3~"), "abc-1.2_3~");
        assert_eq!(encode_segment("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
        assert_eq!(encode_segment("order:1:sku"), "order%3A1%3Asku");
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
