//! A request's stage breakdown on the wire: the `Server-Timing` response header (W3C Server
//! Timing), one `name;dur=<milliseconds>` entry per stage, and the same list for a log line.
//!
//! Both services write it the same way, and a router puts its own stages before those of the
//! allocator's answer it passes on, so a client (or the benchmark) reads where one request's
//! time went from a single header.

use std::fmt;
use std::time::Duration;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

/// The header's name, lower-case as HTTP/2 and the router's pass-through list want it.
pub const HEADER: &str = "server-timing";

/// Stages as `name;dur=1.234, name;dur=0.056` (milliseconds, microsecond resolution).
pub struct Breakdown<'a>(pub &'a [(&'static str, Duration)]);

impl fmt::Display for Breakdown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, time)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let micros = time.as_micros();
            write!(f, "{name};dur={}.{:03}", micros / 1000, micros % 1000)?;
        }
        Ok(())
    }
}

/// Put `stages` first in the response's `Server-Timing` header, before whatever it carries
/// already (a forwarded allocator's stages).
pub fn append_header(headers: &mut HeaderMap, stages: &[(&'static str, Duration)]) {
    let name = HeaderName::from_static(HEADER);
    let ours = Breakdown(stages).to_string();
    let value = match headers.get(&name).and_then(|v| v.to_str().ok()) {
        Some(theirs) if !theirs.is_empty() => format!("{ours}, {theirs}"),
        _ => ours,
    };
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_with_microseconds_and_ours_first() {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static(HEADER),
            HeaderValue::from_static("queue;dur=0.500"),
        );
        let stages = [
            ("map", Duration::from_micros(12)),
            ("upstream", Duration::from_micros(2_345_678)),
        ];
        append_header(&mut headers, &stages);
        assert_eq!(
            headers.get(HEADER).unwrap(),
            "map;dur=0.012, upstream;dur=2345.678, queue;dur=0.500"
        );
    }
}
