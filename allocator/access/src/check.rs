//! The checks a client's [`Policy`] asks of one request: its SKUs against the client's
//! namespaces, its units against `max_quantity`. Where a route names its SKUs is
//! [`schema::routes::SKU_IN`]; a route that names them in its body is checked on the body the
//! handler will read, parsed into the same wire types, so nothing is reserved for a request
//! with any SKU outside (every line of an order is checked before any is sent on).

use schema::routes::{self, SkuIn};
use schema::wire::{validate, OrderRequest, ReserveRequest};

use crate::error::AccessError;
use crate::policy::{Policy, Quota};
use crate::request::Request;

/// A body still to be checked, by the route's body type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyCheck {
    Reserve,
    Order,
}

/// What the request line tells: a `{sku}` path segment outside the namespaces is refused here;
/// a route with SKUs in its body asks for [`body`]. A route missing from the table is refused
/// to a namespaced client (it fails closed).
pub(crate) fn before_body(
    policy: &Policy,
    client: &str,
    request: &Request<'_>,
) -> Result<Option<BodyCheck>, AccessError> {
    if !policy.checks_requests() {
        return Ok(None);
    }
    let outside = |sku: &str| AccessError::OutsideNamespace {
        client: client.to_owned(),
        sku: sku.to_owned(),
    };
    match routes::sku_in(request.method, request.template) {
        // Reservations by id: the allocator compares the stored SKU (`crate::sku_visible`).
        Some(SkuIn::Nowhere | SkuIn::StoredReservation) => Ok(None),
        Some(SkuIn::Path) => match path_sku(request) {
            // An invalid SKU is the handler's `400`, in the wire types' words.
            Some(sku) if validate::sku(&sku).is_ok() && !policy.permits(&sku) => Err(outside(&sku)),
            _ => Ok(None),
        },
        Some(SkuIn::ReserveBody) => Ok(Some(BodyCheck::Reserve)),
        Some(SkuIn::OrderBody) => Ok(Some(BodyCheck::Order)),
        None if policy.skus().is_empty() => Ok(None),
        None => Err(outside("(a route without a known SKU)")),
    }
}

/// The `{sku}` segment of the request's path, percent-decoded, when its route has one.
///
/// Read from the path by the route's template: an `App`-wide middleware runs before the router
/// fills the request's match info. actix decodes path parameters the same way except for `%2F`,
/// `%2B` and `%25`, which both leave out of any valid SKU (the handler's `400`).
pub fn path_sku(request: &Request<'_>) -> Option<String> {
    let template = request.template?;
    let index = template.split('/').position(|s| s == "{sku}")?;
    let segment = request.path.split('/').nth(index)?;
    Some(
        percent_encoding::percent_decode_str(segment)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// Check `body` as `check` says. A body the wire types refuse passes: the handler answers it.
/// A refusal comes with the SKU it is about, if any.
pub(crate) fn body(
    check: BodyCheck,
    policy: &Policy,
    client: &str,
    body: &[u8],
) -> Result<(), (Option<String>, AccessError)> {
    let (skus, units): (Vec<String>, i64) = match check {
        BodyCheck::Reserve => match serde_json::from_slice::<ReserveRequest>(body) {
            Ok(request) => (vec![request.sku.into_string()], request.quantity.get()),
            Err(_) => return Ok(()),
        },
        BodyCheck::Order => match serde_json::from_slice::<OrderRequest>(body) {
            Ok(order) => {
                let units = order.lines.iter().map(|l| l.quantity.get()).sum();
                let skus = order.lines.into_iter().map(|l| l.sku.into_string());
                (skus.collect(), units)
            }
            Err(_) => return Ok(()),
        },
    };
    if let Some(sku) = skus.into_iter().find(|sku| !policy.permits(sku)) {
        let error = AccessError::OutsideNamespace {
            client: client.to_owned(),
            sku: sku.clone(),
        };
        return Err((Some(sku), error));
    }
    match policy.max_quantity {
        Some(limit) if units > limit => Err((
            None,
            AccessError::QuotaExceeded {
                client: client.to_owned(),
                quota: Quota::MaxQuantity,
                limit,
                requested: units,
            },
        )),
        _ => Ok(()),
    }
}

/// The ids an administrative write's body carries (`adjustment_id=a-1 delta=-5`: its top-level
/// `*_id` strings and `delta`), for its audit line; empty for a body that is not a JSON object.
pub(crate) fn audited_ids(body: &[u8]) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(body) else {
        return String::new();
    };
    let mut parts = Vec::new();
    for (key, value) in &fields {
        match value {
            serde_json::Value::String(id) if key.ends_with("_id") => {
                parts.push(format!("{key}={id:?}"))
            }
            serde_json::Value::Number(n) if key == "delta" => parts.push(format!("{key}={n}")),
            _ => {}
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderMap;

    fn policy(text: &str) -> Policy {
        Policy::parse_options(text).unwrap()
    }

    fn request<'a>(
        method: &'a str,
        template: &'a str,
        path: &'a str,
        headers: &'a HeaderMap,
    ) -> Request<'a> {
        Request {
            method,
            path,
            template: Some(template),
            headers,
        }
    }

    #[test]
    fn the_path_sku_is_read_by_the_template_and_decoded() {
        let headers = HeaderMap::new();
        let at = |template: &str, path: &str| path_sku(&request("GET", template, path, &headers));
        let inventory = routes::GET_INVENTORY.path;
        assert_eq!(
            at(inventory, "/v1/inventory/acme:1").as_deref(),
            Some("acme:1")
        );
        assert_eq!(
            at(inventory, "/v1/inventory/acme%3A1").as_deref(),
            Some("acme:1")
        );
        assert_eq!(
            at(routes::ADJUST.path, "/v1/inventory/x%2Fy/adjustments").as_deref(),
            Some("x/y")
        );
        assert_eq!(at(routes::RESERVE.path, "/v1/reservations"), None);
    }

    #[test]
    fn the_request_line_decides_path_skus_and_asks_for_bodies() {
        let headers = HeaderMap::new();
        let acme = policy("skus=acme:*");
        let inventory = routes::GET_INVENTORY.path;
        let check = |p: &Policy, r: Request<'_>| before_body(p, "c", &r);
        let path = |sku: &str| format!("/v1/inventory/{sku}");
        let (acme1, other1, bad) = (path("acme:1"), path("other%3A1"), path("bad%20sku"));
        assert!(check(&acme, request("GET", inventory, &acme1, &headers)).is_ok());
        assert_eq!(
            check(&acme, request("GET", inventory, &other1, &headers)),
            Err(AccessError::OutsideNamespace {
                client: "c".into(),
                sku: "other:1".into()
            })
        );
        // An invalid SKU is left to the handler's 400.
        assert_eq!(
            check(&acme, request("GET", inventory, &bad, &headers)),
            Ok(None)
        );
        assert_eq!(
            check(
                &acme,
                request("POST", routes::RESERVE.path, "/v1/x", &headers)
            ),
            Ok(Some(BodyCheck::Reserve))
        );
        assert_eq!(
            check(
                &acme,
                request("POST", routes::RESERVE_ORDER.path, "/v1/x", &headers)
            ),
            Ok(Some(BodyCheck::Order))
        );
        assert_eq!(
            check(
                &acme,
                request("POST", routes::CONFIRM.path, "/v1/x", &headers)
            ),
            Ok(None)
        );
        // A route nobody classified fails closed for a namespaced client only.
        assert!(check(&acme, request("POST", "/v1/admin/new", "/v1/x", &headers)).is_err());
        let capped = policy("max_quantity=2");
        assert_eq!(
            check(&capped, request("POST", "/v1/admin/new", "/v1/x", &headers)),
            Ok(None)
        );
        // Held-unit quotas alone look at no request here.
        let held = policy("max_held_units=3");
        assert_eq!(
            check(
                &held,
                request("POST", routes::RESERVE.path, "/v1/x", &headers)
            ),
            Ok(None)
        );
    }

    #[test]
    fn bodies_are_checked_line_by_line_and_in_total() {
        let p = policy("skus=acme:* max_quantity=3");
        let reserve = |sku: &str, q: i64| {
            serde_json::to_vec(&serde_json::json!(
                {"reservation_id": "r", "sku": sku, "quantity": q}
            ))
            .unwrap()
        };
        assert!(body(BodyCheck::Reserve, &p, "c", &reserve("acme:1", 3)).is_ok());
        let (sku, error) = body(BodyCheck::Reserve, &p, "c", &reserve("x:1", 1)).unwrap_err();
        assert_eq!(sku.as_deref(), Some("x:1"));
        assert_eq!(error.outcome(), "namespace_forbidden");
        let (_, error) = body(BodyCheck::Reserve, &p, "c", &reserve("acme:1", 4)).unwrap_err();
        assert_eq!(
            error,
            AccessError::QuotaExceeded {
                client: "c".into(),
                quota: Quota::MaxQuantity,
                limit: 3,
                requested: 4
            }
        );
        let order = |lines: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({ "lines": lines })).unwrap()
        };
        let mixed = order(serde_json::json!([
            {"sku": "acme:1", "quantity": 1},
            {"sku": "other:1", "quantity": 1}
        ]));
        let (sku, _) = body(BodyCheck::Order, &p, "c", &mixed).unwrap_err();
        assert_eq!(sku.as_deref(), Some("other:1"));
        let big = order(serde_json::json!([
            {"sku": "acme:1", "quantity": 2},
            {"sku": "acme:2", "quantity": 2}
        ]));
        let (_, error) = body(BodyCheck::Order, &p, "c", &big).unwrap_err();
        assert_eq!(error.outcome(), "quota_exceeded");
        // What the wire types refuse is the handler's to answer.
        for bad in [&b"{"[..], b"[]", b"{\"sku\": \"x:1\"}", b"\xff"] {
            assert!(body(BodyCheck::Reserve, &p, "c", bad).is_ok());
            assert!(body(BodyCheck::Order, &p, "c", bad).is_ok());
        }
    }

    #[test]
    fn audited_ids_are_the_top_level_ids_and_delta() {
        assert_eq!(
            audited_ids(br#"{"adjustment_id": "a \"1\"", "delta": -5, "note": "x"}"#),
            r#"adjustment_id="a \"1\"" delta=-5"#
        );
        assert_eq!(audited_ids(b"not json"), "");
        assert_eq!(audited_ids(b"[1]"), "");
    }
}
