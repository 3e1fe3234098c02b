//! One live replica, asked every documented question it serves, and its answers checked.

use std::collections::{BTreeMap, BTreeSet};

use super::{served_by_allocator, Contract, Operation};
use crate::common::*;
use schema::routes;
use schema::wire::PROBLEM_CONTENT_TYPE;
use schema::wire::{HEADER_ASSIGNMENT_REVISION, HEADER_EPOCH, HEADER_REPLAYED};
use serde_json::{json, Value};

/// Response headers of the API; whenever a replica sends one, the document must declare it.
const API_HEADERS: [&str; 5] = [
    HEADER_REPLAYED,
    "Retry-After",
    HEADER_EPOCH,
    HEADER_ASSIGNMENT_REVISION,
    "X-Served-By",
];

type Params<'a> = BTreeMap<&'a str, String>;

/// The questions [`a_replica_answers_as_documented`] asks.
mod questions;

struct Probe<'a> {
    contract: &'a Contract,
    http: reqwest::Client,
    base: String,
    failures: Vec<String>,
    seen: BTreeMap<String, BTreeSet<u16>>,
    /// Sent as `Authorization: Bearer` when set.
    token: Option<String>,
}

impl Probe<'_> {
    /// The operation's URL with its path parameters replaced by `values` (else their examples).
    fn url(&self, op: &Operation, values: &Params) -> String {
        let mut path = op.path.to_owned();
        for parameter in op.path_parameters(self.contract) {
            let name = parameter["name"].as_str().expect("name");
            let value = values.get(name).cloned().unwrap_or_else(|| {
                let example = parameter["example"].as_str();
                example
                    .unwrap_or_else(|| panic!("{}: {name} has an example", op.name()))
                    .into()
            });
            path = path.replace(&format!("{{{name}}}"), &value);
        }
        format!("{}{path}", self.base)
    }

    async fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let mut request = self.http.request(method, url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (
            status,
            headers,
            response.bytes().await.expect("body").to_vec(),
        )
    }

    /// Send a request for `op` and check the answer against the document. Returns the status.
    async fn call(
        &mut self,
        op: &Operation<'_>,
        what: &str,
        params: &Params<'_>,
        body: Option<Value>,
    ) -> u16 {
        let body = body.map(|b| b.to_string().into_bytes());
        self.call_raw(op, what, params, body).await
    }

    async fn call_raw(
        &mut self,
        op: &Operation<'_>,
        what: &str,
        params: &Params<'_>,
        body: Option<Vec<u8>>,
    ) -> u16 {
        let url = self.url(op, params);
        let (status, headers, bytes) = self.send(op.method, &url, body).await;
        self.seen.entry(op.name()).or_default().insert(status);
        for error in self.check_answer(op, status, &headers, &bytes) {
            self.failures
                .push(format!("{} ({what}) → {status}: {error}", op.name()));
        }
        status
    }

    fn check_answer(
        &self,
        op: &Operation,
        status: u16,
        headers: &reqwest::header::HeaderMap,
        bytes: &[u8],
    ) -> Vec<String> {
        let contract = self.contract;
        let mut errors = Vec::new();
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let body: Option<Value> = serde_json::from_slice(bytes).ok();
        if status == 405 {
            errors.push("the replica does not serve this method on this path".into());
        }
        if status == 404
            && body
                .as_ref()
                .and_then(|b| b["detail"].as_str())
                .is_some_and(|d| d.starts_with("no route for"))
        {
            errors.push("the replica has no such route".into());
        }
        let Some(response) = op.responses().get(&status.to_string()) else {
            let documented: Vec<&String> = op.responses().keys().collect();
            let body = String::from_utf8_lossy(bytes);
            errors.push(format!(
                "undocumented status (documented: {documented:?}); body {body}"
            ));
            return errors;
        };
        let response = contract.resolve(response);
        if !served_by_allocator(response) {
            errors.push("documented as router-only".into());
        }
        if status >= 400 && content_type != PROBLEM_CONTENT_TYPE {
            errors.push(format!("an error answered as {content_type:?}"));
        }
        match response.pointer(&format!("/content/{}", content_type.replace('/', "~1"))) {
            None => errors.push(format!("undocumented media type {content_type:?}")),
            Some(media) if !served_by_allocator(media) => errors.push(format!(
                "media type {content_type} is documented as router-only"
            )),
            Some(_) if !content_type.ends_with("json") => {}
            Some(_) if body.is_none() => errors.push("body is not JSON".into()),
            Some(media) => {
                let body = body.as_ref().expect("JSON body");
                errors.extend(contract.strict_violations(&media["schema"], body));
                if content_type == PROBLEM_CONTENT_TYPE {
                    let listed = response["x-problem-types"].as_array().cloned();
                    if !listed.unwrap_or_default().contains(&body["type"]) {
                        errors.push(format!("problem type {} is not listed", body["type"]));
                    }
                    if body["status"] != status {
                        errors.push(format!("problem status {}", body["status"]));
                    }
                }
            }
        }
        // Headers: required ones are sent, sent ones are documented (and valid).
        let declared: BTreeMap<String, &Value> = response["headers"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, h)| (name.to_ascii_lowercase(), h))
            .collect();
        for (name, header) in &declared {
            let resolved = contract.resolve(header);
            let required =
                header.get("required").or(resolved.get("required")) == Some(&json!(true));
            if required && served_by_allocator(resolved) && !headers.contains_key(name.as_str()) {
                errors.push(format!("required header {name} is missing"));
            }
        }
        for name in API_HEADERS {
            let Some(value) = headers.get(name) else {
                continue;
            };
            let value = value.to_str().unwrap_or_default();
            let Some(header) = declared.get(&name.to_ascii_lowercase()) else {
                errors.push(format!("undocumented header {name}: {value}"));
                continue;
            };
            let header = contract.resolve(header);
            if !served_by_allocator(header) {
                errors.push(format!("header {name} is documented as router-only"));
            }
            let schema = &header["schema"];
            // Header values are text; an integer schema is about the number they spell.
            let value = match contract.resolve(schema)["type"].as_str() {
                Some("integer") => value
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or(json!(value)),
                _ => json!(value),
            };
            for e in contract.violations(schema, &value) {
                errors.push(format!("header {name}: {e}"));
            }
        }
        errors
    }
}

#[tokio::test]
async fn a_replica_answers_as_documented() {
    let contract = Contract::load();
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "openapi")).await;
    wait_owns_all(&replica).await;
    let mut probe = Probe {
        contract: &contract,
        http: http(),
        base: replica.url.clone(),
        failures: Vec::new(),
        seen: BTreeMap::new(),
        token: None,
    };
    // The route table says which operations a replica serves.
    let ops: Vec<Operation> = contract
        .operations()
        .into_iter()
        .filter(|op| {
            routes::ALL.iter().any(|r| {
                r.served_by_allocator()
                    && r.path == op.path
                    && r.method.eq_ignore_ascii_case(op.method)
            })
        })
        .collect();
    // The detector for "no route" works.
    let (status, _, body) = probe
        .send("get", &format!("{}/v1/no-such-route", replica.url), None)
        .await;
    let body: Value = serde_json::from_slice(&body).expect("problem body");
    assert_eq!(
        (status, body["detail"].as_str()),
        (404, Some("no route for /v1/no-such-route"))
    );

    questions::documented_examples(&mut probe, &ops).await;
    questions::documented_bounds(&mut probe, &ops).await;
    questions::scarce_stock(&mut probe, &ops).await;
    questions::undocumented_methods(&mut probe, &ops).await;

    for route in routes::ALL.iter().filter(|r| r.served_by_allocator()) {
        let name = format!("{} {}", route.method, route.path);
        assert!(probe.seen.contains_key(&name), "{name} was not exercised");
    }
    eprintln!("statuses seen per operation: {:#?}", probe.seen);
    let failures = std::mem::take(&mut probe.failures);
    replica.stop().await;
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// `GET /openapi.json` is the replica's own document, byte for byte what the derivation gives,
/// and `GET /docs` is a page that loads nothing from another origin.
#[tokio::test]
async fn a_replica_serves_its_own_document_and_page() {
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "openapi-doc")).await;
    let client = http();

    let response = client
        .get(format!("{}{}", replica.url, routes::OPENAPI.path))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let served: Value = response.json().await.expect("a JSON document");
    assert_eq!(
        served,
        schema::openapi::document(routes::Service::Allocator),
        "the served document is the allocator's derivation of the shared one"
    );
    let operations: BTreeSet<(String, String)> = Contract::from_document(served)
        .operations()
        .iter()
        .map(|op| (op.method.to_uppercase(), op.path.to_owned()))
        .collect();
    let table: BTreeSet<(String, String)> = routes::ALL
        .iter()
        .filter(|r| r.served_by_allocator())
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect();
    assert_eq!(operations, table, "served operations vs the route table");

    let response = client
        .get(format!("{}{}", replica.url, routes::DOCS.path))
        .send()
        .await
        .expect("GET /docs");
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let page = response.text().await.expect("page");
    assert!(
        page.contains(r#"fetch("/openapi.json""#),
        "the page reads the document"
    );
    let external = testkit::browser::external_references(&page);
    assert!(external.is_empty(), "{external:#?}");
    replica.stop().await;
}

#[tokio::test]
async fn refusals_answer_as_documented() {
    use access::table::hash_hex;
    use schema::routes::{Access, Scope};
    let contract = Contract::load();
    let db = migrated_database(PARTITIONS).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let auth = dir.path().join("auth");
    std::fs::write(
        &auth,
        format!(
            "shop reserve {}\nops reserve,admin {}\nlimited reserve,admin {} rate=0.01 burst=1\n",
            hash_hex(b"shop-token"),
            hash_hex(b"ops-token"),
            hash_hex(b"limited-token"),
        ),
    )
    .expect("auth file");
    let mut config = fast_config(&db, "openapi-auth");
    config.access.auth_file = Some(auth);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    let mut probe = Probe {
        contract: &contract,
        http: http(),
        base: replica.url.clone(),
        failures: Vec::new(),
        seen: BTreeMap::new(),
        token: None,
    };
    let no_params = Params::new();
    for route in routes::ALL.iter().filter(|r| r.served_by_allocator()) {
        let Some(op) = contract
            .operations()
            .into_iter()
            .find(|op| op.path == route.path && route.method.eq_ignore_ascii_case(op.method))
        else {
            panic!("{} {} is documented", route.method, route.path);
        };
        let body = op
            .request_examples(&contract)
            .first()
            .map(|(_, v)| (*v).clone());
        let Access::Requires(scope) = route.access() else {
            probe.token = None;
            let status = probe.call(&op, "open, no token", &no_params, None).await;
            if status != 200 {
                probe
                    .failures
                    .push(format!("{}: open route answered {status}", op.name()));
            }
            continue;
        };
        let expect = |what: &str, status: u16, expected: u16| {
            if status != expected {
                probe_failure(what, &op, status, expected)
            } else {
                None
            }
        };
        let mut failures = Vec::new();
        probe.token = None;
        let status = probe.call(&op, "no token", &no_params, body.clone()).await;
        failures.extend(expect("no token", status, 401));
        probe.token = Some("unknown-token".into());
        let status = probe
            .call(&op, "unknown token", &no_params, body.clone())
            .await;
        failures.extend(expect("unknown token", status, 401));
        if scope == Scope::Admin {
            probe.token = Some("shop-token".into());
            let status = probe
                .call(&op, "reserve token", &no_params, body.clone())
                .await;
            failures.extend(expect("reserve token", status, 403));
        }
        // The client's one-request burst is spent by the first route it calls; from then on
        // every request of it is over the rate.
        probe.token = Some("limited-token".into());
        probe
            .call(&op, "within the burst", &no_params, body.clone())
            .await;
        let status = probe
            .call(&op, "over the rate", &no_params, body.clone())
            .await;
        failures.extend(expect("over the rate", status, 429));
        probe.failures.extend(failures);
    }
    let failures = std::mem::take(&mut probe.failures);
    replica.stop().await;
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn probe_failure(what: &str, op: &Operation, status: u16, expected: u16) -> Option<String> {
    Some(format!(
        "{} ({what}): expected {expected}, got {status}",
        op.name()
    ))
}
