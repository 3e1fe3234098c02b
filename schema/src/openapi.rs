//! The API document each service serves at `GET /openapi.json`, and the page at `GET /docs` that
//! renders it.
//!
//! There is one hand-written document, `schema/openapi.json` ([`SHARED`]): it describes both
//! services and marks with `x-served-by` every operation, response, media type, header and
//! parameter that only one of them produces or reads. A service publishes its *own* view of it,
//! derived here by [`document`] when the service starts, so there is no second copy to keep in
//! step:
//!
//! * operations: exactly the routes [`crate::routes`] says the service serves (the same table the
//!   service registers its handlers by);
//! * inside them, every member or list element marked (directly or through its `$ref`) as served
//!   only by the other service is dropped — a router's `421`, an allocator's `504`, the headers a
//!   router adds when it forwards;
//! * `components` keep only what the remaining operations reach through `$ref`s, `tags` only the
//!   ones still used;
//! * `info` and `servers` name the service.
//!
//! The shared document stays the one that is reviewed and conformance-tested in full; the
//! services' tests check that what they serve is this derivation and lists exactly their routes.
//!
//! [`DOCS_PAGE`] is a small self-contained viewer (HTML, CSS and script in one file, no external
//! resources) that fetches `/openapi.json` from the origin that served it, so it works on a
//! machine without internet access and always shows the document of the service it came from.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::routes::{self, Service};

/// The shared API document, as written.
pub const SHARED: &str = include_str!("../openapi.json");

/// The `/docs` page: HTML with its script and styles inline.
pub const DOCS_PAGE: &str = include_str!("../assets/docs.html");

/// `Content-Security-Policy` for the pages the services serve: everything from the same origin
/// (inline script and styles included), nothing from anywhere else, so a page that tried to load
/// a remote script would fail in the browser as well as in the tests.
pub const PAGE_CSP: &str = "default-src 'self'; script-src 'self' 'unsafe-inline'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The document `service` serves: [`SHARED`] reduced to what that service answers.
///
/// Panics if [`SHARED`] is not valid JSON; the conformance tests parse it on every run.
pub fn document(service: Service) -> Value {
    let shared: Value = serde_json::from_str(SHARED).expect("schema/openapi.json is JSON");
    derive(&shared, service)
}

/// [`document`] for an arbitrary shared document (tests feed it variations).
pub fn derive(shared: &Value, service: Service) -> Value {
    let mut doc = shared.clone();
    let Some(root) = doc.as_object_mut() else {
        return doc;
    };

    // Operations: the service's rows of the route table, nothing else.
    let mut paths = Map::new();
    for (path, item) in shared["paths"].as_object().into_iter().flatten() {
        let mut item = item.clone();
        if let Some(item_map) = item.as_object_mut() {
            item_map.retain(|key, _| {
                !METHODS.contains(&key.as_str())
                    || routes::served_by(service)
                        .any(|r| r.path == path.as_str() && r.method.eq_ignore_ascii_case(key))
            });
            if !item_map.keys().any(|k| METHODS.contains(&k.as_str())) {
                continue;
            }
        }
        prune(&mut item, shared, service);
        paths.insert(path.clone(), item);
    }
    root.insert("paths".into(), Value::Object(paths));

    // Components: only what the kept operations reach.
    if let Some(components) = shared.get("components") {
        let mut components = components.clone();
        prune(&mut components, shared, service);
        let reachable = reachable_components(root, &components);
        if let Some(sections) = components.as_object_mut() {
            for (section, entries) in sections.iter_mut() {
                if let Some(entries) = entries.as_object_mut() {
                    entries.retain(|name, _| {
                        reachable.contains(&format!("#/components/{section}/{name}"))
                    });
                }
            }
            sections.retain(|_, entries| entries.as_object().is_none_or(|e| !e.is_empty()));
        }
        root.insert("components".into(), components);
    }

    // Tags: only those an operation still uses.
    let used: BTreeSet<String> = operations(root)
        .flat_map(|op| op["tags"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    if let Some(Value::Array(tags)) = root.get_mut("tags") {
        tags.retain(|t| t["name"].as_str().is_some_and(|n| used.contains(n)));
    }

    let (title, server, scope) = match service {
        Service::Allocator => (
            "allocator replica",
            "An allocator replica (it answers writes only for the partitions it owns).",
            "an **allocator replica** serves: the reservation and inventory API for the \
             partitions it owns, reads for any partition, and the operational endpoints. It \
             leaves out what only a router serves (orders, the cluster overview and the \
             operations page) and router-only answers such as `504`.",
        ),
        Service::Router => (
            "router",
            "A router, the public entry point.",
            "a **router** serves: the whole public API including orders, the cluster overview \
             and the operations page. It leaves out what only an allocator answers (`421`) and \
             the headers a router itself adds when it forwards.",
        ),
    };
    if let Some(info) = root.get_mut("info").and_then(Value::as_object_mut) {
        let base = info["title"].as_str().unwrap_or("API").to_owned();
        info.insert("title".into(), Value::from(format!("{base} — {title}")));
        let description = info["description"].as_str().unwrap_or_default().to_owned();
        info.insert(
            "description".into(),
            Value::from(format!(
                "This document lists exactly what {scope}\n\n{description}"
            )),
        );
    }
    let host = shared
        .pointer("/servers/0/variables/host/default")
        .cloned()
        .unwrap_or_else(|| Value::from("127.0.0.1:8080"));
    root.insert(
        "servers".into(),
        serde_json::json!([{
            "url": "http://{host}",
            "description": server,
            "variables": { "host": { "default": host } },
        }]),
    );
    doc
}

/// Every operation object of a document root.
fn operations(root: &Map<String, Value>) -> impl Iterator<Item = &Value> {
    root.get("paths")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|paths| paths.values())
        .flat_map(|item| METHODS.iter().filter_map(move |m| item.get(*m)))
}

/// Whether `node` (or what its `$ref` points to) is marked as served only by other services.
fn foreign(node: &Value, shared: &Value, service: Service) -> bool {
    let marked = |n: &Value| {
        n.get("x-served-by")
            .and_then(Value::as_array)
            .is_some_and(|list| !list.iter().any(|s| s == service.name()))
    };
    if marked(node) {
        return true;
    }
    node.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|pointer| shared.pointer(pointer))
        .is_some_and(marked)
}

/// Drop, at any depth, the members and list elements that are foreign to `service`.
fn prune(node: &mut Value, shared: &Value, service: Service) {
    match node {
        Value::Object(map) => {
            map.retain(|_, v| !foreign(v, shared, service));
            map.values_mut().for_each(|v| prune(v, shared, service));
        }
        Value::Array(items) => {
            items.retain(|v| !foreign(v, shared, service));
            items.iter_mut().for_each(|v| prune(v, shared, service));
        }
        _ => {}
    }
}

/// The `#/components/...` references reachable from the paths, following references inside
/// components transitively.
fn reachable_components(root: &Map<String, Value>, components: &Value) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut pending: Vec<&Value> = root.get("paths").into_iter().collect();
    while let Some(node) = pending.pop() {
        match node {
            Value::Object(map) => {
                if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                    if let Some(rest) = reference.strip_prefix("#/components/") {
                        if seen.insert(reference.to_owned()) {
                            let target = components.pointer(&format!("/{rest}"));
                            pending.extend(target);
                        }
                    }
                }
                pending.extend(map.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn served_ops(doc: &Value) -> BTreeSet<String> {
        operations(doc.as_object().unwrap())
            .map(|op| op["operationId"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn each_service_gets_its_routes_and_only_its_answers() {
        let shared = json!({
            "openapi": "3.1.0",
            "info": { "title": "T", "version": "1", "description": "d" },
            "tags": [{ "name": "a" }, { "name": "orders" }],
            "paths": {
                "/v1/reservations": { "post": {
                    "operationId": "reserve", "tags": ["a"],
                    "parameters": [{ "$ref": "#/components/parameters/Forwarded" }],
                    "responses": {
                        "201": { "headers": { "X": { "$ref": "#/components/headers/RouterOnly" } } },
                        "421": { "x-served-by": ["allocator"] },
                        "504": { "x-served-by": ["router"] }
                    }
                } },
                "/v1/orders/{order_id}/reservations": { "post": {
                    "operationId": "order", "tags": ["orders"],
                    "responses": { "201": { "$ref": "#/components/responses/Placed" } }
                } },
                "/not/in/the/table": { "get": { "operationId": "ghost" } }
            },
            "components": {
                "parameters": { "Forwarded": { "x-served-by": ["allocator"] } },
                "headers": { "RouterOnly": { "x-served-by": ["router"] } },
                "responses": { "Placed": { "content": {} } },
                "schemas": { "Unused": { "type": "string" } }
            }
        });
        let allocator = derive(&shared, Service::Allocator);
        let router = derive(&shared, Service::Router);
        assert_eq!(served_ops(&allocator).len(), 1);
        assert_eq!(served_ops(&router).len(), 2);
        let reserve = "/paths/~1v1~1reservations/post";
        let a = allocator.pointer(reserve).unwrap();
        assert!(a.pointer("/responses/421").is_some());
        assert!(a.pointer("/responses/504").is_none());
        assert!(a.pointer("/responses/201/headers/X").is_none());
        assert_eq!(a["parameters"].as_array().unwrap().len(), 1);
        let r = router.pointer(reserve).unwrap();
        assert!(r.pointer("/responses/421").is_none());
        assert!(r.pointer("/responses/201/headers/X").is_some());
        assert!(r["parameters"].as_array().unwrap().is_empty());
        // Components: only what is reachable.
        assert_eq!(
            allocator["components"],
            json!({ "parameters": { "Forwarded": { "x-served-by": ["allocator"] } } })
        );
        assert!(router.pointer("/components/responses/Placed").is_some());
        assert!(router.pointer("/components/schemas").is_none());
        assert_eq!(allocator["tags"], json!([{ "name": "a" }]));
        assert!(allocator["info"]["title"]
            .as_str()
            .unwrap()
            .ends_with("allocator replica"));
    }

    #[test]
    fn the_shared_document_derives_for_both_services() {
        for service in [Service::Allocator, Service::Router] {
            let doc = document(service);
            let served: BTreeSet<(String, String)> = routes::served_by(service)
                .map(|r| (r.method.to_lowercase(), r.path.to_owned()))
                .collect();
            let documented: BTreeSet<(String, String)> = doc["paths"]
                .as_object()
                .unwrap()
                .iter()
                .flat_map(|(path, item)| {
                    METHODS
                        .iter()
                        .filter(|m| item.get(**m).is_some())
                        .map(move |m| (m.to_string(), path.clone()))
                })
                .collect();
            assert_eq!(documented, served, "{service:?}");
        }
    }
}
