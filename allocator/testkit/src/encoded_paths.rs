//! Every route of a service asked with one character of a fixed path segment percent-encoded, as
//! both services' tests check it: the answer must be the canonical request's, token by token.
//!
//! An escape of an unreserved character names the same URI (RFC 3986 §6.2.2.2), so
//! `/v1/%69nventory/x/adjustments` is `/v1/inventory/x/adjustments` to the router that dispatches
//! it, and must be to every decision taken before: scope, namespace, body checks. The check walks
//! the route table ([`schema::routes::served_by`]), so a route added later is covered too.

use reqwest::{Method, StatusCode};
use schema::routes::{self, Route, Service};
use serde_json::{json, Value};

/// The SKU, ids and order every request names; the SKU should be stocked first.
pub const SKU: &str = "enc-1";
const RESERVATION: &str = "enc-r1";
const ORDER: &str = "enc-o1";

/// The route's template with its placeholders filled, plus the query it needs.
fn concrete(route: &Route) -> String {
    let path = route
        .path
        .replace("{sku}", SKU)
        .replace("{reservation_id}", RESERVATION)
        .replace("{order_id}", ORDER);
    if *route == routes::EVENTS {
        format!("{path}?partition=0")
    } else {
        path
    }
}

/// A body the route's handler accepts.
fn body(route: &Route) -> Option<Value> {
    match *route {
        routes::RESERVE => Some(json!({"reservation_id": RESERVATION, "sku": SKU, "quantity": 1})),
        routes::ADJUST => Some(json!({"adjustment_id": "enc-a1", "delta": 1})),
        routes::RESERVE_ORDER => Some(json!({"lines": [{"sku": SKU, "quantity": 1}]})),
        _ => None,
    }
}

/// `path` with each character of each fixed segment (no `{…}` placeholder in the template) encoded
/// in turn, in upper- and lower-case hex; the query is left as it is.
pub fn encoded_variants(template: &str, path: &str) -> Vec<String> {
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, format!("?{query}")),
        None => (path, String::new()),
    };
    let fixed: Vec<bool> = template.split('/').map(|s| !s.contains('{')).collect();
    let segments: Vec<&str> = path.split('/').collect();
    let mut variants = Vec::new();
    for (index, segment) in segments.iter().enumerate() {
        if !fixed.get(index).copied().unwrap_or(false) {
            continue;
        }
        for (at, ch) in segment.char_indices() {
            for hex in [format!("%{:02X}", ch as u32), format!("%{:02x}", ch as u32)] {
                let encoded = format!("{}{hex}{}", &segment[..at], &segment[at + ch.len_utf8()..]);
                let mut whole = segments.clone();
                whole[index] = &encoded;
                let variant = format!("{}{query}", whole.join("/"));
                if !variants.contains(&variant) {
                    variants.push(variant);
                }
            }
        }
    }
    variants
}

/// An answer as compared: its status and its problem type, if it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub problem: Option<String>,
}

async fn ask(
    http: &reqwest::Client,
    method: &Method,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    let mut request = http.request(method.clone(), url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let problem = response
        .json::<Value>()
        .await
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
    Answer { status, problem }
}

/// Ask every route `service` serves at `base` with each of `tokens` (`(label, token)`), first as
/// written (twice: the second answer, after any first write, is the reference) and then in every
/// encoded variant; panics naming the first variant answered differently. Returns how many
/// variants were compared.
pub async fn every_route_answers_as_its_canonical_path(
    base: &str,
    service: Service,
    tokens: &[(&str, Option<&str>)],
) -> usize {
    let http = reqwest::Client::new();
    let mut compared = 0;
    for route in routes::served_by(service) {
        let method = Method::from_bytes(route.method.as_bytes()).expect("a method");
        let path = concrete(route);
        let body = body(route);
        for (label, token) in tokens {
            let url = format!("{base}{path}");
            ask(&http, &method, &url, *token, body.as_ref()).await;
            let reference = ask(&http, &method, &url, *token, body.as_ref()).await;
            for variant in encoded_variants(route.path, &path) {
                let url = format!("{base}{variant}");
                let answer = ask(&http, &method, &url, *token, body.as_ref()).await;
                assert_eq!(
                    answer, reference,
                    "{} {variant} as {label} answered unlike {} {path}",
                    route.method, route.method
                );
                compared += 1;
            }
        }
    }
    compared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_encode_one_fixed_character_at_a_time() {
        let variants = encoded_variants("/v1/inventory/{sku}", "/v1/inventory/a");
        assert!(variants.contains(&"/v1/%69nventory/a".to_owned()));
        assert!(variants.contains(&"/v1/i%6Eventory/a".to_owned()));
        assert!(variants.contains(&"/v1/i%6eventory/a".to_owned()));
        assert!(variants.contains(&"/%761/inventory/a".to_owned()));
        assert!(variants.contains(&"/v%31/inventory/a".to_owned()));
        assert!(variants.iter().all(|v| v.ends_with("/a")));
        // `v`, `1`, and `inventory`'s letters, with two spellings where the hex has a letter.
        let hex_letters = "v1inventory"
            .chars()
            .filter(|c| {
                format!("{:02X}", *c as u32)
                    .chars()
                    .any(|h| h.is_ascii_alphabetic())
            })
            .count();
        assert_eq!(variants.len(), 11 + hex_letters);
        let events = encoded_variants("/v1/events", "/v1/events?partition=0");
        assert!(events.iter().all(|v| v.ends_with("?partition=0")));
    }
}
