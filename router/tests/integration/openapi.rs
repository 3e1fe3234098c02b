//! The router's share of keeping `allocator/openapi.json` honest; the allocator's integration
//! tests check the document itself against the route table, the problem types and the limits.
//!
//! Here: a live router answers every route of [`schema::routes::ALL`] (never "no route" or
//! `405`), and the one limit only the router enforces, the order id length, is the documented
//! one.

use crate::common::{http, serial, Cluster};
use router::orders::ORDER_ID_MAX_LEN;
use schema::routes;
use schema::wire::limits;
use serde_json::{json, Value};

const DOCUMENT: &str = include_str!("../../../allocator/openapi.json");

#[test]
fn the_order_id_limit_is_documented() {
    let doc: Value = serde_json::from_str(DOCUMENT).expect("openapi.json is valid JSON");
    assert_eq!(
        doc.pointer("/components/schemas/OrderId/maxLength"),
        Some(&json!(ORDER_ID_MAX_LEN))
    );
    // Line `i` of an order is reserved as `{order_id}:{i}`, which must be a valid reservation id.
    let longest_line_id = ORDER_ID_MAX_LEN + 1 + (limits::ORDER_LINES_MAX - 1).to_string().len();
    assert!(longest_line_id <= limits::ID_MAX_LEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_answers_every_route_of_the_table() {
    let _serial = serial().await;
    let cluster = Cluster::start("openapi", 1, 4).await;
    let router = cluster.router(|_| {}).await;
    let client = http();
    let no_route = |status: u16, body: &Value| {
        status == 405
            || (status == 404
                && body["detail"]
                    .as_str()
                    .is_some_and(|d| d.starts_with("no route for")))
    };
    // The detector for "no route" works.
    let response = client
        .get(format!("{}/v2/nothing", router.url))
        .send()
        .await
        .expect("unknown route");
    let status = response.status().as_u16();
    assert!(no_route(status, &response.json().await.expect("problem")));

    let mut failures = Vec::new();
    for route in routes::ALL {
        let placeholders = route.path.matches('{').count();
        let url = router.api.url(route, &vec!["x-1"; placeholders]);
        let method = reqwest::Method::from_bytes(route.method.as_bytes()).expect("method");
        let mut request = client.request(method, &url);
        if route.method == "POST" {
            // Refused as invalid (or served): either way the route exists.
            request = request
                .header("content-type", "application/json")
                .body("{}");
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if no_route(status, &body) {
            failures.push(format!("{} {}: {status} {body}", route.method, route.path));
        }
    }
    router.stop().await;
    assert!(failures.is_empty(), "{failures:#?}");
}
