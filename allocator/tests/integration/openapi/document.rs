//! Static checks of the document's shape against the code's declarations: it is OpenAPI 3.1 and
//! every schema compiles; its operations are the route table and well-formed (errors are
//! problem documents listing their problem types); every example matches its schema; each
//! service's document lists exactly its routes; security follows the access table. The problem
//! types and limits it states are checked in [`super::problems_and_limits`].

use std::collections::{BTreeMap, BTreeSet};

use super::{served_by, served_by_allocator, walk, Contract};
use schema::routes::{self, Served, Service};
use schema::wire::{problem_type, validate};
use schema::wire::{HEADER_EXPECTED_EPOCH, PROBLEM_CONTENT_TYPE};
use serde_json::{json, Value};

const SERVERS: [&str; 2] = ["allocator", "router"];

#[test]
fn document_is_openapi_3_1_and_every_schema_compiles() {
    let contract = Contract::load();
    let doc = &contract.doc;
    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3.1"), "openapi is {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    walk(doc, &mut |node| {
        contract.resolve(node);
    });
    // Building a validator checks a schema against the 2020-12 meta-schema.
    for schema in doc["components"]["schemas"]
        .as_object()
        .expect("schemas")
        .values()
    {
        contract.validator(schema, true);
    }
}

#[test]
fn operations_are_the_route_table() {
    let contract = Contract::load();
    type Routes<'a> = BTreeMap<(String, String), BTreeSet<&'a str>>;
    let documented: Routes = contract
        .operations()
        .iter()
        .map(|op| {
            let servers = served_by(op.op).unwrap_or_else(|| panic!("{} x-served-by", op.name()));
            for server in &servers {
                assert!(SERVERS.contains(server), "{}: server {server}", op.name());
            }
            let key = (op.method.to_uppercase(), op.path.to_owned());
            (key, servers.into_iter().collect())
        })
        .collect();
    let table: Routes = routes::ALL
        .iter()
        .map(|route| {
            let servers = match route.served {
                Served::Both => BTreeSet::from(["allocator", "router"]),
                Served::Router => BTreeSet::from(["router"]),
            };
            ((route.method.to_owned(), route.path.to_owned()), servers)
        })
        .collect();
    assert_eq!(
        documented, table,
        "the document's operations and x-served-by vs schema::routes::ALL"
    );
}

#[test]
fn operations_are_well_formed() {
    let contract = Contract::load();
    let mut operation_ids = BTreeSet::new();
    let mut failures = Vec::new();
    for op in contract.operations() {
        let mut fail = |message: String| failures.push(format!("{}: {message}", op.name()));
        let id = op.op["operationId"].as_str().unwrap_or_default();
        if id.is_empty() || !operation_ids.insert(id.to_owned()) {
            fail(format!("operationId {id:?} missing or not unique"));
        }
        // Path parameters and the path template agree.
        let mut in_template: Vec<&str> = op
            .path
            .split('{')
            .skip(1)
            .map(|s| s.split('}').next().unwrap_or_default())
            .collect();
        let path_parameters = op.path_parameters(&contract);
        let mut declared: Vec<&str> = path_parameters
            .iter()
            .map(|p| p["name"].as_str().expect("parameter name"))
            .collect();
        in_template.sort();
        declared.sort();
        if in_template != declared {
            fail(format!("path parameters {declared:?} vs {in_template:?}"));
        }
        let responses = op.responses();
        let has = |status: &str| responses.contains_key(status);
        if has("default") {
            fail("a `default` response would document every status".into());
        }
        for (status, response) in responses {
            let Ok(code) = status.parse::<u16>() else {
                fail(format!("response key {status} is not a status code"));
                continue;
            };
            let response = contract.resolve(response);
            let content = response["content"].as_object().cloned().unwrap_or_default();
            if content.is_empty() {
                fail(format!("{status} has no content"));
            }
            let problem_types = response.get("x-problem-types").and_then(Value::as_array);
            if code < 400 {
                if problem_types.is_some() {
                    fail(format!("{status} is not an error but lists problem types"));
                }
            } else {
                if !content.contains_key(PROBLEM_CONTENT_TYPE) {
                    fail(format!("{status} is not {PROBLEM_CONTENT_TYPE}"));
                }
                for (media_type, media) in &content {
                    if media_type != PROBLEM_CONTENT_TYPE && served_by_allocator(media) {
                        fail(format!("{status} {media_type} must be router-only"));
                    }
                }
                match problem_types {
                    Some(types) if !types.is_empty() => {
                        for t in types {
                            if !problem_type::ALL.iter().any(|known| t == known) {
                                fail(format!("{status} lists unknown problem type {t}"));
                            }
                        }
                    }
                    _ => fail(format!("{status} lacks x-problem-types")),
                }
            }
            if code == 503 && response.pointer("/headers/Retry-After").is_none() {
                fail("503 does not document Retry-After".into());
            }
        }
        if responses
            .get("421")
            .is_some_and(|r| served_by(r) != Some(vec!["allocator"]))
        {
            fail("421 must be marked allocator-only".into());
        }
        if responses
            .get("504")
            .is_some_and(|r| served_by(r) != Some(vec!["router"]))
        {
            fail("504 must be marked router-only".into());
        }
        if !path_parameters.is_empty() && !has("400") {
            fail("path parameters but no 400".into());
        }
        if let Some(body) = op.request_body(&contract) {
            for status in ["400", "413"] {
                if !has(status) {
                    fail(format!("a request body but no {status}"));
                }
            }
            let content = body["content"].as_object().expect("request content");
            if content.keys().collect::<Vec<_>>() != ["application/json"] {
                fail("request bodies are application/json".into());
            }
            // Every object in a request body refuses unknown members.
            let mut pending = vec![&body["content"]["application/json"]["schema"]];
            while let Some(node) = pending.pop() {
                let node = contract.resolve(node);
                if node["type"] == "object" && node["additionalProperties"] != json!(false) {
                    fail(format!(
                        "request object lacks additionalProperties: false: {node}"
                    ));
                }
                if let Some(properties) = node.get("properties").and_then(Value::as_object) {
                    pending.extend(properties.values());
                }
                pending.extend(node.get("items"));
            }
        }
        // Writes routed by partition can meet a replica that does not own it.
        let routed = op
            .parameters(&contract)
            .iter()
            .any(|p| p["name"] == HEADER_EXPECTED_EPOCH);
        if routed && served_by_allocator(op.op) && !(has("421") && has("503")) {
            fail("a partition-routed write must document 421 and 503".into());
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn examples_match_their_schemas() {
    let contract = Contract::load();
    let mut errors = Vec::new();
    let mut count = 0;
    walk(&contract.doc, &mut |node| {
        let Some(schema) = node.get("schema") else {
            return;
        };
        // Media type objects: `schema` next to `examples`.
        for (name, example) in node["examples"].as_object().into_iter().flatten() {
            count += 1;
            let value = &contract.resolve(example)["value"];
            for e in contract.strict_violations(schema, value) {
                errors.push(format!("example {name}: {e}"));
            }
        }
        // Parameters: `schema` next to `example`, which validation accepts too.
        if let (Some(example), Some(name)) = (node.get("example"), node["name"].as_str()) {
            count += 1;
            for e in contract.violations(schema, example) {
                errors.push(format!("parameter example {name}: {e}"));
            }
            let text = example.as_str().unwrap_or_default();
            let valid = match name {
                "sku" => validate::sku(text),
                other => validate::id(other, text),
            };
            if let Err(e) = valid {
                errors.push(format!("parameter example {name}: {e}"));
            }
        }
    });
    // Schemas' own `examples` arrays.
    for (name, schema) in contract.doc["components"]["schemas"]
        .as_object()
        .expect("schemas")
    {
        for example in schema["examples"].as_array().into_iter().flatten() {
            count += 1;
            for e in contract.violations(schema, example) {
                errors.push(format!("{name} example {example}: {e}"));
            }
        }
    }
    assert!(count >= 10, "only {count} examples found");
    assert!(errors.is_empty(), "{errors:#?}");
}

/// The documents the services serve: each is the shared document reduced to one service.
#[test]
fn each_service_document_lists_exactly_its_routes() {
    for service in [Service::Allocator, Service::Router] {
        let contract = Contract::served(service);
        let doc = &contract.doc;
        let name = service.name();
        let documented: BTreeSet<(String, String)> = contract
            .operations()
            .iter()
            .map(|op| (op.method.to_uppercase(), op.path.to_owned()))
            .collect();
        let table: BTreeSet<(String, String)> = routes::ALL
            .iter()
            .filter(|r| match service {
                Service::Allocator => r.served == Served::Both,
                Service::Router => true,
            })
            .map(|r| (r.method.to_owned(), r.path.to_owned()))
            .collect();
        assert_eq!(documented, table, "{name}: operations vs the route table");

        // Nothing the other service alone produces or reads is left, directly or via a $ref.
        let mut foreign = Vec::new();
        walk(doc, &mut |node| {
            let resolved = contract.resolve(node);
            for n in [node, resolved] {
                if served_by(n).is_some_and(|servers| !servers.contains(&name)) {
                    foreign.push(n.to_string());
                }
            }
        });
        assert!(foreign.is_empty(), "{name}: {foreign:#?}");

        // As well-formed as the shared one: OpenAPI 3.1, references resolve, schemas compile,
        // examples match, and the document names the service.
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        let title = doc["info"]["title"].as_str().expect("title");
        let server = doc["servers"][0]["description"].as_str().expect("server");
        let expected = match service {
            Service::Allocator => ("allocator replica", "allocator replica"),
            Service::Router => ("router", "router"),
        };
        assert!(title.ends_with(expected.0), "{name}: title {title}");
        assert!(server.contains(expected.1), "{name}: server {server}");
        for schema in doc["components"]["schemas"]
            .as_object()
            .expect("schemas")
            .values()
        {
            contract.validator(schema, true);
        }
        walk(doc, &mut |node| {
            let Some(schema) = node.get("schema") else {
                return;
            };
            for (example, value) in node["examples"].as_object().into_iter().flatten() {
                let value = &contract.resolve(value)["value"];
                let errors = contract.strict_violations(schema, value);
                assert!(errors.is_empty(), "{name}: example {example}: {errors:#?}");
            }
        });
        // Every component left is used, every tag left names an operation.
        let text = doc.to_string();
        for (section, entries) in doc["components"].as_object().expect("components") {
            for entry in entries.as_object().expect("section").keys() {
                let reference = format!("\"#/components/{section}/{entry}\"");
                assert!(text.contains(&reference), "{name}: unused {reference}");
            }
        }
        for tag in doc["tags"].as_array().expect("tags") {
            let tag = &tag["name"];
            assert!(
                contract
                    .operations()
                    .iter()
                    .any(|op| op.op["tags"].as_array().is_some_and(|t| t.contains(tag))),
                "{name}: unused tag {tag}"
            );
        }
    }
    // What tells them apart is there: the router's 504 and orders, the allocator's 421.
    let allocator = Contract::served(Service::Allocator);
    let router = Contract::served(Service::Router);
    let reserve = "/paths/~1v1~1reservations/post/responses";
    assert!(allocator.doc.pointer(&format!("{reserve}/421")).is_some());
    assert!(allocator.doc.pointer(&format!("{reserve}/504")).is_none());
    assert!(router.doc.pointer(&format!("{reserve}/504")).is_some());
    assert!(router.doc.pointer(&format!("{reserve}/421")).is_none());
    assert!(allocator
        .doc
        .pointer("/components/schemas/OrderRequest")
        .is_none());
    assert!(router
        .doc
        .pointer("/components/schemas/ClusterOverview")
        .is_some());
}

#[test]
fn security_follows_the_access_table() {
    let contract = Contract::load();
    let scheme = contract
        .doc
        .pointer("/components/securitySchemes/bearer")
        .expect("components.securitySchemes.bearer");
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    let mut failures = Vec::new();
    for op in contract.operations() {
        let Some(route) = routes::ALL
            .iter()
            .find(|r| r.method.eq_ignore_ascii_case(op.method) && r.path == op.path)
        else {
            failures.push(format!("{}: not in the route table", op.name()));
            continue;
        };
        let security = op.op.get("security");
        let responses = op.responses();
        let guarded = ["401", "403", "429"].map(|s| responses.contains_key(s));
        match route.access() {
            routes::Access::Open => {
                if security != Some(&json!([])) {
                    failures.push(format!("{}: open, but security is {security:?}", op.name()));
                }
                if guarded.iter().any(|g| *g) {
                    failures.push(format!("{}: open, but documents 401/403/429", op.name()));
                }
                if !routes::is_open_path(op.path) {
                    failures.push(format!("{}: open but not in OPEN_PATHS", op.name()));
                }
            }
            routes::Access::Requires(scope) => {
                let expected = json!([{ "bearer": [scope.as_str()] }]);
                if security != Some(&expected) {
                    failures.push(format!(
                        "{}: security is {security:?}, not {expected}",
                        op.name()
                    ));
                }
                if guarded != [true; 3] {
                    failures.push(format!("{}: lacks one of 401, 403, 429", op.name()));
                }
            }
        }
    }
    // What refusals carry: a challenge on 401, a wait on 429.
    let resolved = |name: &str| {
        contract
            .doc
            .pointer(&format!("/components/responses/{name}"))
            .unwrap_or_else(|| panic!("components.responses.{name}"))
    };
    assert!(resolved("Unauthenticated")
        .pointer("/headers/WWW-Authenticate")
        .is_some());
    assert!(resolved("TooManyRequests")
        .pointer("/headers/Retry-After")
        .is_some());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
