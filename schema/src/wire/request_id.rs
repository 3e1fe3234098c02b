//! The id that correlates one client request across the router's and the allocators' logs
//! ([`super::HEADER_REQUEST_ID`]).

use std::fmt;

/// Longest request id accepted from a client; longer ones are replaced, not truncated, so an id
/// seen in a log is always exactly the one the client sent.
pub const REQUEST_ID_MAX_LEN: usize = 128;

/// 1 to 128 visible ASCII characters: safe to log and to put back into a header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// The client's id when it is acceptable; `None` means "make one".
    pub fn parse(value: &[u8]) -> Option<RequestId> {
        let acceptable = (1..=REQUEST_ID_MAX_LEN).contains(&value.len())
            && value.iter().all(u8::is_ascii_graphic);
        acceptable.then(|| RequestId(String::from_utf8_lossy(value).into_owned()))
    }

    /// A fresh id from 16 random bytes (32 hex digits); the caller supplies the randomness so
    /// this crate needs no random number generator.
    pub fn from_random(bytes: [u8; 16]) -> RequestId {
        RequestId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_visible_ascii_up_to_128() {
        assert_eq!(RequestId::parse(b"abc-123").unwrap().as_str(), "abc-123");
        assert!(RequestId::parse(&[b'x'; 128]).is_some());
        assert!(RequestId::parse(&[b'x'; 129]).is_none());
        assert!(RequestId::parse(b"").is_none());
        assert!(RequestId::parse(b"a b").is_none());
        assert!(RequestId::parse("é".as_bytes()).is_none());
        assert!(RequestId::parse(b"a\nb").is_none());
    }

    #[test]
    fn generated_ids_are_32_hex_digits() {
        let id = RequestId::from_random([0xab; 16]);
        assert_eq!(id.as_str().len(), 32);
        assert!(RequestId::parse(id.as_str().as_bytes()).is_some());
    }
}
