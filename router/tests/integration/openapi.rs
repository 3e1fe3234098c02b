//! The router's share of keeping `schema/openapi.json` honest; the allocator's integration
//! tests check the document itself against the route table, the problem types and the limits.
//!
//! Here: a live router answers every route of [`schema::routes::ALL`] (never "no route" or
//! `405`), and the one limit only the router enforces, the order id length, is the documented
//! one. It serves its own document (the router's derivation of the shared one, listing exactly
//! the router's routes) and pages that load nothing from another origin, and its cluster
//! overview matches the documented schema.

use crate::common::{http, serial, Cluster};
use router::orders::ORDER_ID_MAX_LEN;
use schema::routes;
use schema::wire::limits;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const DOCUMENT: &str = schema::openapi::SHARED;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_its_own_document_pages_and_overview() {
    let _serial = serial().await;
    let cluster = Cluster::start("openapi-doc", 2, 4).await;
    let router = cluster.router(|_| {}).await;
    let client = http();
    let get = |path: &str| client.get(format!("{}{path}", router.url)).send();

    let response = get(routes::OPENAPI.path).await.expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = response.json().await.expect("a JSON document");
    assert_eq!(
        served,
        schema::openapi::document(routes::Service::Router),
        "the served document is the router's derivation of the shared one"
    );
    let mut documented = BTreeSet::new();
    for (path, item) in served["paths"].as_object().expect("paths") {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_some() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let table: BTreeSet<(String, String)> = routes::ALL
        .iter()
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect();
    assert_eq!(
        documented, table,
        "the router serves every route of the table"
    );

    for (route, marker) in [
        (routes::DOCS, r#"fetch("/openapi.json""#),
        (routes::UI, r#"fetch("/v1/cluster/overview""#),
    ] {
        let response = get(route.path).await.expect("GET page");
        assert_eq!(response.status(), 200, "{}", route.path);
        let headers = response.headers().clone();
        let content_type = headers["content-type"].to_str().unwrap();
        assert!(content_type.starts_with("text/html"), "{content_type}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        let page = response.text().await.expect("page");
        assert!(page.contains(marker), "{} reads {marker}", route.path);
        let external = testkit::browser::external_references(&page);
        assert!(external.is_empty(), "{}: {external:#?}", route.path);
    }

    // Some traffic, so that the overview has seconds with requests in them.
    for _ in 0..5 {
        get("/v1/partitions").await.expect("partitions");
    }
    let response = get(routes::CLUSTER_OVERVIEW.path).await.expect("overview");
    assert_eq!(response.status(), 200);
    let overview: Value = response.json().await.expect("overview body");
    let schema = json!({
        "allOf": [{ "$ref": "#/components/schemas/ClusterOverview" }],
        "components": served["components"],
    });
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("ClusterOverview compiles");
    let errors: Vec<String> = validator
        .iter_errors(&overview)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{overview:#}");
    // Closed over the members the document declares: nothing undocumented is sent.
    let declared = served
        .pointer("/components/schemas/ClusterOverview/properties")
        .and_then(Value::as_object)
        .expect("properties");
    for member in overview.as_object().expect("object").keys() {
        assert!(
            declared.contains_key(member),
            "undocumented member {member}"
        );
    }
    assert_eq!(overview["partition_count"], 4);
    assert_eq!(overview["replicas"].as_array().map(Vec::len), Some(2));
    let owned: u64 = overview["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["partitions_owned"].as_u64().unwrap())
        .sum();
    assert_eq!(owned, 4, "every partition is owned by a listed replica");
    assert!(
        overview["traffic"]["requests"].as_u64() >= Some(5),
        "the API requests are counted: {}",
        overview["traffic"]
    );
    // Every shard with its settlement job, the partitions split between them; one database is
    // the one shard `main` with every partition.
    let shards = overview["shards"].as_array().expect("shards");
    assert_eq!(shards.len(), cluster.shard_count(), "{shards:?}");
    if cluster.shard_count() == 1 {
        assert_eq!(shards[0]["name"], "main");
    }
    let mut held: Vec<u64> = Vec::new();
    for shard in shards {
        assert!(shard["term"].is_i64(), "{shard}");
        held.extend(
            shard["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_u64().unwrap()),
        );
    }
    held.sort_unstable();
    assert_eq!(held, [0, 1, 2, 3], "{shards:?}");
    router.stop().await;
}
