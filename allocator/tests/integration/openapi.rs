//! Keeps `allocator/openapi.json` honest.
//!
//! * The document is OpenAPI 3.1, every `$ref` resolves, every error is `application/problem+json`
//!   and lists the problem types it can carry.
//! * Every problem type URI and every input limit of [`schema::wire`] is stated, with the
//!   value the code enforces (the code's own declarations are read, so a new constant fails here
//!   until it is documented).
//! * The routes the allocator and the router register are exactly the documented ones.
//! * The examples match their schemas.
//! * A live allocator replica answers every documented operation it serves (never "no such
//!   route" or `405`), only with documented statuses, media types, headers and bodies, and
//!   refuses out-of-bounds input where the document says it would.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;
use schema::wire::{
    limits, problem_type, validate, HEADER_ASSIGNMENT_REVISION, HEADER_EPOCH, HEADER_REPLAYED,
    PROBLEM_CONTENT_TYPE,
};
use serde_json::{json, Value};

const DOCUMENT: &str = include_str!("../../openapi.json");
const WIRE_SOURCE: &str = include_str!("../../../schema/src/wire.rs");
const ALLOCATOR_ROUTES_SOURCE: &str = include_str!("../../src/api/mod.rs");
const ROUTER_ROUTES_SOURCE: &str = include_str!("../../../router/src/routes/mod.rs");
const ROUTER_ORDERS_SOURCE: &str = include_str!("../../../router/src/orders.rs");

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];
const SERVERS: [&str; 2] = ["allocator", "router"];
const HEADER_SERVED_BY: &str = "X-Served-By";
/// Response headers of the API; whenever a replica sends one, the document must declare it.
const API_HEADERS: [&str; 5] = [
    HEADER_REPLAYED,
    "Retry-After",
    HEADER_EPOCH,
    HEADER_ASSIGNMENT_REVISION,
    HEADER_SERVED_BY,
];
const PROBLEM_TYPES: [&str; 12] = [
    problem_type::INVALID_REQUEST,
    problem_type::INSUFFICIENT_STOCK,
    problem_type::IDEMPOTENCY_MISMATCH,
    problem_type::INVALID_STATE,
    problem_type::NOT_FOUND,
    problem_type::NOT_OWNER,
    problem_type::PARTITION_UNAVAILABLE,
    problem_type::SHRINK_BELOW_HELD,
    problem_type::STORAGE_UNAVAILABLE,
    problem_type::UPSTREAM_UNAVAILABLE,
    problem_type::ORDER_FAILED,
    problem_type::INTERNAL,
];

// ---------------------------------------------------------------------------------------------
// Reading the document

fn document() -> Value {
    serde_json::from_str(DOCUMENT).expect("openapi.json is valid JSON")
}

/// Follow local `$ref`s.
fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let Some(reference) = value.get("$ref").and_then(Value::as_str) else {
            return value;
        };
        let pointer = reference
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("only local references are used: {reference}"));
        value = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("dangling $ref {reference}"));
    }
    panic!("$ref cycle")
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc.pointer(&format!("/components/schemas/{name}"))
        .unwrap_or_else(|| panic!("components.schemas.{name} is documented"))
}

/// The resolved schema of property `property` of component schema `name`.
fn property<'a>(doc: &'a Value, name: &str, property: &str) -> &'a Value {
    let object = resolve(doc, schema(doc, name));
    let value = object
        .pointer(&format!("/properties/{property}"))
        .unwrap_or_else(|| panic!("{name}.{property} is documented"));
    resolve(doc, value)
}

fn int(schema: &Value, keyword: &str) -> i64 {
    schema
        .get(keyword)
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("schema states an integer `{keyword}`: {schema}"))
}

/// `x-served-by` of a document node; `None` means both servers.
fn served_by(value: &Value) -> Option<Vec<&str>> {
    value.get("x-served-by").map(|list| {
        list.as_array()
            .expect("x-served-by is an array")
            .iter()
            .map(|s| s.as_str().expect("x-served-by lists names"))
            .collect()
    })
}

fn served_by_allocator(value: &Value) -> bool {
    served_by(value).is_none_or(|servers| servers.contains(&"allocator"))
}

struct Operation<'a> {
    path: &'a str,
    method: &'a str,
    path_item: &'a Value,
    op: &'a Value,
}

impl<'a> Operation<'a> {
    fn name(&self) -> String {
        format!("{} {}", self.method.to_uppercase(), self.path)
    }

    /// Path-level and operation-level parameters, resolved.
    fn parameters(&self, doc: &'a Value) -> Vec<&'a Value> {
        [self.path_item, self.op]
            .iter()
            .filter_map(|node| node.get("parameters").and_then(Value::as_array))
            .flatten()
            .map(|p| resolve(doc, p))
            .collect()
    }

    fn path_parameters(&self, doc: &'a Value) -> Vec<&'a Value> {
        self.parameters(doc)
            .into_iter()
            .filter(|p| p["in"] == "path")
            .collect()
    }

    fn request_body(&self, doc: &'a Value) -> Option<&'a Value> {
        self.op.get("requestBody").map(|body| resolve(doc, body))
    }

    fn responses(&self) -> &'a serde_json::Map<String, Value> {
        self.op["responses"]
            .as_object()
            .expect("responses is an object")
    }
}

fn operations(doc: &Value) -> Vec<Operation<'_>> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut out = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            if let Some(op) = item.get(method) {
                out.push(Operation {
                    path,
                    method,
                    path_item: item,
                    op,
                });
            }
        }
    }
    out
}

/// Every node of a JSON tree.
fn walk<'a>(value: &'a Value, visit: &mut impl FnMut(&'a Value)) {
    visit(value);
    match value {
        Value::Object(map) => map.values().for_each(|v| walk(v, visit)),
        Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
        _ => {}
    }
}

/// `/v1/reservations/{reservation_id}` → `/v1/reservations/{}`.
fn normalise_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_parameter = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_parameter = true;
                out.push_str("{}");
            }
            '}' => in_parameter = false,
            _ if in_parameter => {}
            _ => out.push(c),
        }
    }
    out
}

fn media_type_essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

// ---------------------------------------------------------------------------------------------
// Reading the code's own declarations

/// The body of `pub mod {name} {` ... `}` in `source`.
fn module_block<'a>(source: &'a str, name: &str) -> &'a str {
    let start = source
        .find(&format!("pub mod {name} {{"))
        .unwrap_or_else(|| panic!("`pub mod {name}` in the source"));
    let block = &source[start..];
    &block[..block.find("\n}").expect("end of module")]
}

/// String literals of `source`, skipping `//` comments.
fn string_literals(source: &str) -> Vec<(usize, String)> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            i += source[i..].find('\n').unwrap_or(source.len() - i);
        } else if bytes[i] == b'"' {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            out.push((i, source[start..end].to_owned()));
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// `(METHOD, normalised path)` of every route registered in the `pub fn configure` of an actix
/// routes module: each `web::get()`-style guard belongs to the last path literal before it.
fn configured_routes(source: &str) -> BTreeSet<(String, String)> {
    let start = source
        .find("pub fn configure(")
        .expect("`pub fn configure` in the routes source");
    let body = &source[start..];
    let body = &body[..body.find("\n}\n").expect("end of configure")];
    let paths: Vec<(usize, String)> = string_literals(body)
        .into_iter()
        .filter(|(_, s)| s.starts_with('/'))
        .collect();
    let mut routes = BTreeSet::new();
    for method in METHODS {
        for (at, _) in body.match_indices(&format!("web::{method}()")) {
            let (_, path) = paths
                .iter()
                .rev()
                .find(|(p, _)| *p < at)
                .unwrap_or_else(|| panic!("a path literal before web::{method}()"));
            routes.insert((method.to_uppercase(), normalise_path(path)));
        }
    }
    assert!(
        routes.len() >= 5,
        "the routes source was not understood: {routes:?}"
    );
    routes
}

fn usize_constant(source: &str, name: &str) -> usize {
    let marker = format!("pub const {name}: usize = ");
    let start = source.find(&marker).unwrap_or_else(|| panic!("{name}")) + marker.len();
    let literal = &source[start..start + source[start..].find(';').expect("`;`")];
    literal.replace('_', "").parse().expect("integer literal")
}

// ---------------------------------------------------------------------------------------------
// A small JSON Schema checker, stricter than JSON Schema in one way: an object member that no
// `properties` (of the schema or its `allOf` branches) declares is an error, so the replica
// cannot send anything undocumented. `pattern` is not evaluated (no regex engine here); the
// patterns are checked against the code separately.

fn check(doc: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    check_level(doc, schema, value, at, true, errors)
}

fn conforms(doc: &Value, schema: &Value, value: &Value) -> bool {
    let mut errors = Vec::new();
    check(doc, schema, value, "", &mut errors);
    errors.is_empty()
}

fn check_level(
    doc: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    strict: bool,
    errors: &mut Vec<String>,
) {
    let schema = resolve(doc, schema);
    let fail = |errors: &mut Vec<String>, message: String| errors.push(format!("{at}: {message}"));
    if let Some(branches) = schema.get("allOf").and_then(Value::as_array) {
        for branch in branches {
            check_level(doc, branch, value, at, false, errors);
        }
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(branches) = schema.get(keyword).and_then(Value::as_array) {
            let matching = branches
                .iter()
                .filter(|branch| {
                    let mut e = Vec::new();
                    check_level(doc, branch, value, at, strict, &mut e);
                    e.is_empty()
                })
                .count();
            if matching == 0 || (keyword == "oneOf" && matching > 1) {
                fail(
                    errors,
                    format!("{matching} branches of {keyword} match {value}"),
                );
            }
        }
    }
    if let Some(not) = schema.get("not") {
        if conforms(doc, not, value) {
            fail(errors, format!("{value} matches `not` {not}"));
        }
    }
    if let Some(expected) = schema.get("const") {
        if expected != value {
            fail(errors, format!("{value} is not the constant {expected}"));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            fail(errors, format!("{value} is not one of {allowed:?}"));
        }
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            other => panic!("bad `type` {other}"),
        };
        let matches = |t: &str| match t {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "string" => value.is_string(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            other => panic!("unknown type {other}"),
        };
        if !types.iter().any(|t| matches(t)) {
            fail(errors, format!("{value} is not of type {types:?}"));
            return;
        }
    }
    match value {
        Value::Number(n) => {
            let n = n.as_f64().expect("finite");
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if n < min {
                    fail(errors, format!("{n} < minimum {min}"));
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if n > max {
                    fail(errors, format!("{n} > maximum {max}"));
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                if len < min {
                    fail(errors, format!("{s:?} is shorter than {min}"));
                }
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if len > max {
                    fail(errors, format!("{s:?} is longer than {max}"));
                }
            }
            if schema.get("format").and_then(Value::as_str) == Some("date-time")
                && chrono::DateTime::parse_from_rfc3339(s).is_err()
            {
                fail(errors, format!("{s:?} is not an RFC 3339 date-time"));
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    fail(errors, format!("fewer than {min} items"));
                }
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    fail(errors, format!("more than {max} items"));
                }
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_level(doc, item_schema, item, &format!("{at}[{i}]"), true, errors);
                }
            }
        }
        Value::Object(members) => {
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let required = required.as_str().expect("required lists names");
                if !members.contains_key(required) {
                    fail(errors, format!("required member `{required}` is missing"));
                }
            }
            let mut declared = BTreeSet::new();
            let has_properties = declared_properties(doc, schema, &mut declared);
            for (name, member) in members {
                if let Some(member_schema) = schema.pointer(&format!("/properties/{name}")) {
                    check_level(
                        doc,
                        member_schema,
                        member,
                        &format!("{at}.{name}"),
                        true,
                        errors,
                    );
                } else if (strict && has_properties && !declared.contains(name))
                    || schema.get("additionalProperties") == Some(&Value::Bool(false))
                {
                    errors.push(format!("{at}: undocumented member `{name}`"));
                }
            }
        }
        _ => {}
    }
}

/// Collect the property names declared by `schema` and its `allOf` branches.
fn declared_properties(doc: &Value, schema: &Value, out: &mut BTreeSet<String>) -> bool {
    let schema = resolve(doc, schema);
    let mut found = false;
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        out.extend(properties.keys().cloned());
        found = true;
    }
    for branch in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        found |= declared_properties(doc, branch, out);
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Static checks

#[test]
fn document_is_openapi_3_1() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3.1"), "openapi is {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    // Every reference resolves.
    walk(&doc, &mut |node| {
        resolve(&doc, node);
    });
}

#[test]
fn operations_are_well_formed() {
    let doc = document();
    let problem_enum = resolve(&doc, &doc["components"]["schemas"]["Problem"])["properties"]
        ["type"]["enum"]
        .as_array()
        .expect("Problem.type enumerates the problem types")
        .clone();
    let mut operation_ids = BTreeSet::new();
    let mut failures = Vec::new();
    let mut fail =
        |op: &Operation, message: String| failures.push(format!("{}: {message}", op.name()));
    let ops = operations(&doc);
    assert!(ops.len() >= 11, "only {} operations", ops.len());
    for op in &ops {
        let id = op.op["operationId"].as_str().unwrap_or_default();
        if id.is_empty() || !operation_ids.insert(id.to_owned()) {
            fail(op, format!("operationId {id:?} missing or not unique"));
        }
        match served_by(op.op) {
            Some(servers) if !servers.is_empty() && servers.iter().all(|s| SERVERS.contains(s)) => {
            }
            other => fail(op, format!("x-served-by must list servers, got {other:?}")),
        }
        // Path parameters and the path template agree.
        let mut in_template: Vec<&str> = op
            .path
            .split('{')
            .skip(1)
            .map(|s| s.split('}').next().unwrap_or_default())
            .collect();
        let mut declared: Vec<&str> = op
            .path_parameters(&doc)
            .iter()
            .map(|p| p["name"].as_str().expect("parameter name"))
            .collect();
        in_template.sort();
        declared.sort();
        if in_template != declared {
            fail(
                op,
                format!("path parameters {declared:?} vs template {in_template:?}"),
            );
        }
        let responses = op.responses();
        if responses.contains_key("default") {
            fail(
                op,
                "a `default` response would document every status".into(),
            );
        }
        for (status, response) in responses {
            let Ok(code) = status.parse::<u16>() else {
                fail(op, format!("response key {status} is not a status code"));
                continue;
            };
            let response = resolve(&doc, response);
            let content = response
                .get("content")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if code >= 400 {
                if !content.contains_key(PROBLEM_CONTENT_TYPE) {
                    fail(op, format!("{status} is not {PROBLEM_CONTENT_TYPE}"));
                }
                for (media_type, media) in &content {
                    if media_type != PROBLEM_CONTENT_TYPE && served_by_allocator(media) {
                        fail(
                            op,
                            format!(
                                "{status} {media_type}: not problem+json, so must be router-only"
                            ),
                        );
                    }
                }
                match response.get("x-problem-types").and_then(Value::as_array) {
                    Some(types) if !types.is_empty() => {
                        for t in types {
                            if !problem_enum.contains(t) {
                                fail(op, format!("{status} lists unknown problem type {t}"));
                            }
                        }
                    }
                    _ => fail(op, format!("{status} lacks x-problem-types")),
                }
            } else if response.get("x-problem-types").is_some() {
                fail(
                    op,
                    format!("{status} is not an error but lists problem types"),
                );
            }
            if content.is_empty() {
                fail(op, format!("{status} has no content"));
            }
            let retry_after = response
                .pointer("/headers/Retry-After")
                .map(|h| resolve(&doc, h));
            if code == 503 && retry_after.is_none() {
                fail(op, "503 does not document Retry-After".into());
            }
        }
        let has = |status: &str| responses.contains_key(status);
        if let Some(status) = responses.get("421") {
            if served_by(status) != Some(vec!["allocator"]) {
                fail(op, "421 must be marked allocator-only".into());
            }
        }
        if let Some(status) = responses.get("504") {
            if served_by(status) != Some(vec!["router"]) {
                fail(op, "504 must be marked router-only".into());
            }
        }
        if !op.path_parameters(&doc).is_empty() && !has("400") {
            fail(op, "path parameters but no 400".into());
        }
        if let Some(body) = op.request_body(&doc) {
            for status in ["400", "413"] {
                if !has(status) {
                    fail(op, format!("a request body but no {status}"));
                }
            }
            let content = body["content"].as_object().expect("request content");
            if content.keys().collect::<Vec<_>>() != ["application/json"] {
                fail(op, "request bodies are application/json".into());
            }
            // Every object in a request body refuses unknown members.
            let schema = &body["content"]["application/json"]["schema"];
            let mut seen = BTreeSet::new();
            let mut pending = vec![schema];
            while let Some(node) = pending.pop() {
                let node = resolve(&doc, node);
                if !seen.insert(node.to_string()) {
                    continue;
                }
                if node["type"] == "object"
                    && node.get("additionalProperties") != Some(&json!(false))
                {
                    fail(
                        op,
                        format!("request object without additionalProperties: false: {node}"),
                    );
                }
                if let Some(properties) = node.get("properties").and_then(Value::as_object) {
                    pending.extend(properties.values());
                }
                pending.extend(node.get("items"));
            }
        }
        // Writes routed by partition can meet a replica that does not own it.
        let routed = op
            .parameters(&doc)
            .iter()
            .any(|p| p["name"] == schema::wire::HEADER_EXPECTED_EPOCH);
        if routed && served_by_allocator(op.op) && !(has("421") && has("503")) {
            fail(
                op,
                "a partition-routed write must document 421 and 503".into(),
            );
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn every_problem_type_is_documented() {
    let doc = document();
    // The declarations in wire.rs are read, so a new constant must be added above (and to the
    // document) before this passes.
    let declared: BTreeSet<String> = string_literals(module_block(WIRE_SOURCE, "problem_type"))
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    let listed: BTreeSet<String> = PROBLEM_TYPES.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        declared, listed,
        "PROBLEM_TYPES must list every problem_type constant"
    );

    let documented: BTreeSet<String> = resolve(&doc, schema(&doc, "Problem"))["properties"]["type"]
        ["enum"]
        .as_array()
        .expect("Problem.type enum")
        .iter()
        .map(|v| v.as_str().expect("string").to_owned())
        .collect();
    assert_eq!(
        documented, listed,
        "Problem.type enumerates exactly the problem types"
    );

    let mut used = BTreeSet::new();
    for op in operations(&doc) {
        for response in op.responses().values() {
            for t in resolve(&doc, response)
                .get("x-problem-types")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                used.insert(t.as_str().expect("string").to_owned());
            }
        }
    }
    for t in PROBLEM_TYPES {
        assert!(DOCUMENT.contains(t), "{t} does not appear in the document");
        assert!(used.contains(t), "no response lists {t} in x-problem-types");
    }

    // The Problem schema documents every member the wire type can carry.
    let all_members = serde_json::to_value(schema::wire::Problem {
        kind: problem_type::NOT_OWNER.into(),
        title: "t".into(),
        status: 421,
        detail: Some("d".into()),
        partition: Some(1),
        owner_url: Some("http://127.0.0.1:1".into()),
        owner_id: Some("o".into()),
        epoch: Some(2),
        revision: Some(3),
        available: Some(4),
        current_status: Some(schema::wire::ReservationStatus::Held),
        outcome_unknown: Some(false),
    })
    .expect("problem serialises");
    let mut errors = Vec::new();
    check(
        &doc,
        schema(&doc, "Problem"),
        &all_members,
        "Problem",
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn documented_limits_match_the_code() {
    let doc = document();
    // Every limit declared in wire.rs is checked below.
    let declared: BTreeSet<&str> = module_block(WIRE_SOURCE, "limits")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub const "))
        .map(|rest| rest.split(':').next().expect("name").trim())
        .collect();
    let checked: BTreeSet<&str> = [
        "SKU_MAX_LEN",
        "ID_MAX_LEN",
        "QUANTITY_MAX",
        "ADJUSTMENT_DELTA_MAX",
        "TTL_SECONDS_MIN",
        "TTL_SECONDS_MAX",
        "TTL_SECONDS_DEFAULT",
        "ORDER_LINES_MAX",
        "BODY_MAX_BYTES",
    ]
    .into();
    assert_eq!(
        declared, checked,
        "a limit in wire.rs is not checked against the document"
    );

    // SKU_MAX_LEN: the SKU schema, used by every SKU in requests and paths.
    let sku_pattern = format!("^[A-Za-z0-9._:-]{{1,{}}}$", limits::SKU_MAX_LEN);
    for sku in [
        property(&doc, "ReserveRequest", "sku"),
        property(&doc, "OrderLine", "sku"),
        resolve(&doc, &doc["components"]["parameters"]["Sku"]["schema"]),
    ] {
        assert_eq!(int(sku, "maxLength"), limits::SKU_MAX_LEN as i64);
        assert_eq!(int(sku, "minLength"), 1);
        assert_eq!(sku["pattern"], sku_pattern.as_str());
    }
    // The pattern's character class is the one validate::sku accepts.
    for byte in 0u8..128 {
        let c = byte as char;
        let in_class = c.is_ascii_alphanumeric() || "._:-".contains(c);
        assert_eq!(validate::sku(&c.to_string()).is_ok(), in_class, "{c:?}");
    }

    // ID_MAX_LEN.
    for id in [
        property(&doc, "ReserveRequest", "reservation_id"),
        property(&doc, "AdjustmentRequest", "adjustment_id"),
        resolve(
            &doc,
            &doc["components"]["parameters"]["ReservationId"]["schema"],
        ),
    ] {
        assert_eq!(int(id, "maxLength"), limits::ID_MAX_LEN as i64);
        assert_eq!(int(id, "minLength"), 1);
    }

    // QUANTITY_MAX.
    for quantity in [
        property(&doc, "ReserveRequest", "quantity"),
        property(&doc, "OrderLine", "quantity"),
    ] {
        assert_eq!(int(quantity, "minimum"), 1);
        assert_eq!(int(quantity, "maximum"), limits::QUANTITY_MAX);
    }

    // ADJUSTMENT_DELTA_MAX: non-zero, |delta| <= max.
    let delta = property(&doc, "AdjustmentRequest", "delta");
    assert_eq!(int(delta, "minimum"), -limits::ADJUSTMENT_DELTA_MAX);
    assert_eq!(int(delta, "maximum"), limits::ADJUSTMENT_DELTA_MAX);
    assert_eq!(delta["not"], json!({ "const": 0 }));
    assert!(validate::delta(0).is_err());

    // TTL_SECONDS_*.
    for ttl in [
        property(&doc, "ReserveRequest", "ttl_seconds"),
        property(&doc, "OrderRequest", "ttl_seconds"),
    ] {
        assert_eq!(int(ttl, "minimum"), i64::from(limits::TTL_SECONDS_MIN));
        assert_eq!(int(ttl, "maximum"), i64::from(limits::TTL_SECONDS_MAX));
        assert_eq!(int(ttl, "default"), i64::from(limits::TTL_SECONDS_DEFAULT));
    }

    // ORDER_LINES_MAX.
    let lines = property(&doc, "OrderRequest", "lines");
    assert_eq!(int(lines, "minItems"), 1);
    assert_eq!(int(lines, "maxItems"), limits::ORDER_LINES_MAX as i64);
    assert_eq!(
        int(property(&doc, "LineReport", "index"), "maximum"),
        limits::ORDER_LINES_MAX as i64 - 1
    );

    // BODY_MAX_BYTES: stated on every request body.
    for op in operations(&doc) {
        if let Some(body) = op.request_body(&doc) {
            assert_eq!(
                body["x-max-bytes"].as_u64(),
                Some(limits::BODY_MAX_BYTES as u64),
                "{}",
                op.name()
            );
        }
    }

    // The router's order id limit, and that `{order_id}:{line}` fits a reservation id.
    let order_id_max = usize_constant(ROUTER_ORDERS_SOURCE, "ORDER_ID_MAX_LEN");
    for order_id in [
        resolve(&doc, &doc["components"]["parameters"]["OrderId"]["schema"]),
        property(&doc, "OrderPlaced", "order_id"),
    ] {
        assert_eq!(int(order_id, "maxLength"), order_id_max as i64);
        assert_eq!(int(order_id, "minLength"), 1);
    }
    let longest_line_id = order_id_max + 1 + (limits::ORDER_LINES_MAX - 1).to_string().len();
    assert!(longest_line_id <= limits::ID_MAX_LEN);

    // No drifting copies: every property or parameter with one of these names, anywhere in the
    // document, refers to the one bounded schema checked above.
    let canonical = BTreeMap::from([
        ("sku", "Sku"),
        ("quantity", "Quantity"),
        ("ttl_seconds", "TtlSeconds"),
        ("delta", "Delta"),
        ("reservation_id", "Id"),
        ("adjustment_id", "Id"),
        ("order_id", "OrderId"),
    ]);
    let mut drifted = Vec::new();
    walk(&doc, &mut |node| {
        let named: Vec<(&str, &Value)> = match node.get("properties").and_then(Value::as_object) {
            Some(properties) => properties.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            None => match (node.get("name").and_then(Value::as_str), node.get("schema")) {
                (Some(name), Some(schema)) => vec![(name, schema)],
                _ => vec![],
            },
        };
        for (name, value) in named {
            if let Some(target) = canonical.get(name) {
                let expected = format!("#/components/schemas/{target}");
                if value.get("$ref").and_then(Value::as_str) != Some(expected.as_str()) {
                    drifted.push(format!("{name}: {value}"));
                }
            }
        }
    });
    assert!(
        drifted.is_empty(),
        "not a $ref to the bounded schema: {drifted:#?}"
    );
}

#[test]
fn documented_routes_are_the_registered_routes() {
    let doc = document();
    let documented = |server: &str| -> BTreeSet<(String, String)> {
        operations(&doc)
            .iter()
            .filter(|op| served_by(op.op).is_none_or(|s| s.contains(&server)))
            .map(|op| (op.method.to_uppercase(), normalise_path(op.path)))
            .collect()
    };
    assert_eq!(
        configured_routes(ALLOCATOR_ROUTES_SOURCE),
        documented("allocator"),
        "allocator routes (src/api/mod.rs) vs operations served by the allocator"
    );
    assert_eq!(
        configured_routes(ROUTER_ROUTES_SOURCE),
        documented("router"),
        "router routes (router/src/routes/mod.rs) vs operations served by the router"
    );
}

#[test]
fn examples_match_their_schemas() {
    let doc = document();
    let mut errors = Vec::new();
    let mut count = 0;
    walk(&doc, &mut |node| {
        // Media type objects: `schema` next to `examples`.
        if let (Some(schema), Some(examples)) = (
            node.get("schema"),
            node.get("examples").and_then(Value::as_object),
        ) {
            for (name, example) in examples {
                count += 1;
                let value = &resolve(&doc, example)["value"];
                check(&doc, schema, value, name, &mut errors);
            }
        }
        // Parameters: `schema` next to `example`.
        if let (Some(schema), Some(example), Some(name)) = (
            node.get("schema"),
            node.get("example"),
            node.get("name").and_then(Value::as_str),
        ) {
            count += 1;
            check(&doc, schema, example, name, &mut errors);
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
    assert!(count >= 10, "only {count} examples found");
    assert!(errors.is_empty(), "{errors:#?}");
}

// ---------------------------------------------------------------------------------------------
// Live check against one replica

struct Probe<'a> {
    doc: &'a Value,
    http: reqwest::Client,
    base: String,
    failures: Vec<String>,
    seen: BTreeMap<String, BTreeSet<u16>>,
}

impl Probe<'_> {
    /// The operation's URL with its path parameters replaced by `values` (else their examples).
    fn url(&self, op: &Operation, values: &BTreeMap<&str, String>) -> String {
        let mut path = op.path.to_owned();
        for parameter in op.path_parameters(self.doc) {
            let name = parameter["name"].as_str().expect("name");
            let value = values.get(name).cloned().unwrap_or_else(|| {
                parameter["example"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{}: parameter {name} has an example", op.name()))
                    .to_owned()
            });
            path = path.replace(&format!("{{{name}}}"), &value);
        }
        format!("{}{path}", self.base)
    }

    async fn send(
        &mut self,
        method: &str,
        url: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
        let mut request = self.http.request(method, url);
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
        let body = response.bytes().await.expect("body").to_vec();
        (status, headers, body)
    }

    /// Send a request for `op` and check the answer against the document. Returns the status.
    async fn call(
        &mut self,
        op: &Operation<'_>,
        what: &str,
        params: &BTreeMap<&str, String>,
        body: Option<Vec<u8>>,
    ) -> u16 {
        let url = self.url(op, params);
        let (status, headers, bytes) = self.send(op.method, &url, body).await;
        self.seen.entry(op.name()).or_default().insert(status);
        let errors = self.check_answer(op, status, &headers, &bytes);
        for error in errors {
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
        let doc = self.doc;
        let mut errors = Vec::new();
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(media_type_essence)
            .unwrap_or_default();
        let body: Option<Value> = serde_json::from_slice(bytes).ok();
        if status == 405 {
            errors.push("the replica does not serve this method on this path".into());
        }
        if status == 404
            && body.as_ref().and_then(|b| b["detail"].as_str()) == Some("no such route")
        {
            errors.push("the replica has no such route".into());
        }
        let Some(response) = op.responses().get(&status.to_string()) else {
            let documented: Vec<&String> = op.responses().keys().collect();
            errors.push(format!(
                "undocumented status (documented: {documented:?}); body {}",
                String::from_utf8_lossy(bytes)
            ));
            return errors;
        };
        let response = resolve(doc, response);
        if !served_by_allocator(response) {
            errors.push("documented as router-only".into());
        }
        if status >= 400 && content_type != PROBLEM_CONTENT_TYPE {
            errors.push(format!("an error answered as {content_type:?}"));
        }
        match response.pointer(&format!("/content/{}", content_type.replace('/', "~1"))) {
            None => errors.push(format!("undocumented media type {content_type:?}")),
            Some(media) => {
                if !served_by_allocator(media) {
                    errors.push(format!(
                        "media type {content_type} is documented as router-only"
                    ));
                }
                if content_type.ends_with("json") {
                    match &body {
                        None => errors.push("body is not JSON".into()),
                        Some(body) => {
                            check(doc, &media["schema"], body, "body", &mut errors);
                            if content_type == PROBLEM_CONTENT_TYPE {
                                let listed = response["x-problem-types"]
                                    .as_array()
                                    .cloned()
                                    .unwrap_or_default();
                                if !listed.contains(&body["type"]) {
                                    errors.push(format!(
                                        "problem type {} is not in x-problem-types {listed:?}",
                                        body["type"]
                                    ));
                                }
                                if body["status"] != status {
                                    errors.push(format!("problem status {}", body["status"]));
                                }
                            }
                        }
                    }
                }
            }
        }
        // Headers: required ones are sent, sent ones are documented (and valid).
        let declared: BTreeMap<String, &Value> = response
            .get("headers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(name, h)| (name.to_ascii_lowercase(), h))
            .collect();
        for (name, header) in &declared {
            let resolved = resolve(doc, header);
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
            match declared.get(&name.to_ascii_lowercase()) {
                None => errors.push(format!("undocumented header {name}: {value}")),
                Some(header) => {
                    let header = resolve(doc, header);
                    if !served_by_allocator(header) {
                        errors.push(format!("header {name} is documented as router-only"));
                    }
                    let schema = &header["schema"];
                    let value = match resolve(doc, schema)["type"].as_str() {
                        Some("integer") => value
                            .parse::<i64>()
                            .map(Value::from)
                            .unwrap_or(json!(value)),
                        _ => json!(value),
                    };
                    check(doc, schema, &value, name, &mut errors);
                }
            }
        }
        errors
    }
}

fn request_examples<'a>(doc: &'a Value, op: &Operation<'a>) -> Vec<(&'a String, &'a Value)> {
    op.request_body(doc)
        .and_then(|b| b.pointer("/content/application~1json/examples"))
        .and_then(Value::as_object)
        .map(|examples| {
            examples
                .iter()
                .map(|(name, e)| (name, &resolve(doc, e)["value"]))
                .collect()
        })
        .unwrap_or_default()
}

/// Integer bounds and string lengths of the top-level members of a request body schema, as
/// `(member, value, within bounds)`.
fn boundary_values(doc: &Value, schema: &Value) -> Vec<(String, Value, bool)> {
    let schema = resolve(doc, schema);
    let mut out = Vec::new();
    for (name, member) in schema["properties"].as_object().into_iter().flatten() {
        let member = resolve(doc, member);
        let mut push = |value: Value, valid: bool| out.push((name.clone(), value, valid));
        if let Some(min) = member.get("minimum").and_then(Value::as_i64) {
            push(json!(min), true);
            push(json!(min - 1), false);
        }
        if let Some(max) = member.get("maximum").and_then(Value::as_i64) {
            push(json!(max), true);
            push(json!(max + 1), false);
        }
        if let Some(excluded) = member.pointer("/not/const") {
            push(excluded.clone(), false);
        }
        if let Some(max) = member.get("maxLength").and_then(Value::as_u64) {
            push(json!("x".repeat(max as usize)), true);
            push(json!("x".repeat(max as usize + 1)), false);
        }
        if member.get("minLength").and_then(Value::as_u64) == Some(1) {
            push(json!(""), false);
        }
    }
    out
}

#[tokio::test]
async fn a_replica_answers_as_documented() {
    let doc = document();
    let db = migrated_database(PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&db, "openapi")).await;
    wait_owns_all(&replica).await;
    let mut probe = Probe {
        doc: &doc,
        http: http(),
        base: replica.url.clone(),
        failures: Vec::new(),
        seen: BTreeMap::new(),
    };
    let ops: Vec<Operation> = operations(&doc)
        .into_iter()
        .filter(|op| served_by_allocator(op.op))
        .collect();
    let no_params = BTreeMap::new();

    // The detector for "no such route" works.
    let (status, _, body) = probe
        .send("get", &format!("{}/v1/no-such-route", replica.url), None)
        .await;
    let body: Value = serde_json::from_slice(&body).expect("problem body");
    assert_eq!(
        (status, body["detail"].as_str()),
        (404, Some("no such route"))
    );

    // Every operation with its documented examples, twice: first on a fresh database, then
    // again (replays, stocked SKUs).
    for round in ["first", "repeat"] {
        for op in &ops {
            let examples = request_examples(&doc, op);
            if op.request_body(&doc).is_some() {
                assert!(!examples.is_empty(), "{} has request examples", op.name());
            }
            if examples.is_empty() {
                probe.call(op, round, &no_params, None).await;
            }
            for (name, value) in examples {
                let what = format!("{round}, example {name}");
                let status = probe
                    .call(op, &what, &no_params, Some(value.to_string().into_bytes()))
                    .await;
                if status == 400 {
                    probe
                        .failures
                        .push(format!("{}: example {name} refused as invalid", op.name()));
                }
            }
        }
    }

    for op in &ops {
        for parameter in op.path_parameters(&doc) {
            let name = parameter["name"].as_str().expect("name");
            let schema = resolve(&doc, &parameter["schema"]);
            // A valid value nobody has used yet.
            let params = BTreeMap::from([(name, format!("unknown-{name}"))]);
            let body = request_examples(&doc, op)
                .first()
                .map(|(_, v)| v.to_string().into_bytes());
            probe
                .call(op, &format!("unknown {name}"), &params, body)
                .await;
            // Path parameters beyond their documented length are refused.
            let too_long = "x".repeat(int(schema, "maxLength") as usize + 1);
            let body = request_examples(&doc, op)
                .first()
                .map(|(_, v)| v.to_string().into_bytes());
            let params = BTreeMap::from([(name, too_long)]);
            let status = probe
                .call(op, &format!("{name} too long"), &params, body)
                .await;
            if status != 400 {
                probe
                    .failures
                    .push(format!("{}: {name} too long answered {status}", op.name()));
            }
        }
        let Some(request) = op.request_body(&doc) else {
            continue;
        };
        let (_, example) = request_examples(&doc, op)[0];
        // Unknown members are refused (additionalProperties: false).
        let mut unknown = example.clone();
        unknown["unexpected_member"] = json!(true);
        let status = probe
            .call(
                op,
                "unknown member",
                &no_params,
                Some(unknown.to_string().into_bytes()),
            )
            .await;
        if status != 400 {
            probe.failures.push(format!(
                "{}: an unknown member answered {status}",
                op.name()
            ));
        }
        // Bodies over the limit are refused.
        let max = request["x-max-bytes"].as_u64().expect("x-max-bytes") as usize;
        let oversized = format!("{{\"pad\":\"{}\"}}", "x".repeat(max)).into_bytes();
        let status = probe
            .call(op, "oversized body", &no_params, Some(oversized))
            .await;
        if status != 413 {
            probe.failures.push(format!(
                "{}: an oversized body answered {status}",
                op.name()
            ));
        }
        // The documented bounds are the enforced ones.
        let schema = &request["content"]["application/json"]["schema"];
        for (i, (member, value, valid)) in boundary_values(&doc, schema).into_iter().enumerate() {
            let mut body = example.clone();
            // Fresh ids, so that valid values reach the stock logic instead of a replay.
            for (name, id) in body.as_object_mut().expect("object example") {
                if name.ends_with("_id") {
                    *id = json!(format!("{}-bound-{i}", id.as_str().expect("string id")));
                }
            }
            body[member.as_str()] = value.clone();
            let what = format!("{member} = {value}");
            let status = probe
                .call(op, &what, &no_params, Some(body.to_string().into_bytes()))
                .await;
            if (status == 400) == valid {
                probe.failures.push(format!(
                    "{}: {what} is {} by the document but answered {status}",
                    op.name(),
                    if valid { "allowed" } else { "refused" }
                ));
            }
        }
    }

    // A few scenarios that reach the remaining documented answers, as the descriptions say.
    let by_id = |id: &str| {
        ops.iter()
            .find(|op| op.op["operationId"] == id)
            .unwrap_or_else(|| panic!("operation {id}"))
    };
    let sku = BTreeMap::from([("sku", "scarce-1".to_owned())]);
    let refused = BTreeMap::from([("reservation_id", "scarce-r".to_owned())]);
    let held = BTreeMap::from([("reservation_id", "scarce-h".to_owned())]);
    let steps = [
        (
            "adjustInventory",
            "stock one unit",
            &sku,
            Some(json!({"adjustment_id": "scarce-a", "delta": 1})),
            201,
        ),
        (
            "createReservation",
            "more than available",
            &no_params,
            Some(json!({"reservation_id": "scarce-r", "sku": "scarce-1", "quantity": 2})),
            409,
        ),
        (
            "createReservation",
            "refusal replayed",
            &no_params,
            Some(json!({"reservation_id": "scarce-r", "sku": "scarce-1", "quantity": 2})),
            409,
        ),
        (
            "createReservation",
            "id reused",
            &no_params,
            Some(json!({"reservation_id": "scarce-r", "sku": "scarce-1", "quantity": 1})),
            422,
        ),
        ("getReservation", "refused id", &refused, None, 409),
        ("confirmReservation", "refused id", &refused, None, 409),
        (
            "createReservation",
            "the one unit",
            &no_params,
            Some(json!({"reservation_id": "scarce-h", "sku": "scarce-1", "quantity": 1})),
            201,
        ),
        ("releaseReservation", "held", &held, None, 200),
        ("confirmReservation", "released", &held, None, 409),
    ];
    for (id, what, params, body, expected) in steps {
        let body = body.map(|b| b.to_string().into_bytes());
        let status = probe.call(by_id(id), what, params, body).await;
        if status != expected {
            probe
                .failures
                .push(format!("{id} ({what}): expected {expected}, got {status}"));
        }
    }

    // Methods the document does not list for a path are refused with a 405 problem.
    let paths: BTreeSet<&str> = ops.iter().map(|op| op.path).collect();
    for path in paths {
        for method in METHODS {
            if doc["paths"][path].get(method).is_some() {
                continue;
            }
            let example_op = ops.iter().find(|op| op.path == path).expect("an operation");
            let url = probe.url(example_op, &no_params);
            let (status, headers, _) = probe.send(method, &url, None).await;
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
            if status != 405 || content_type != Some(PROBLEM_CONTENT_TYPE) {
                probe.failures.push(format!(
                    "{} {path} is undocumented but answered {status} {content_type:?}",
                    method.to_uppercase()
                ));
            }
        }
    }

    for op in &ops {
        assert!(
            probe.seen.contains_key(&op.name()),
            "{} was not exercised",
            op.name()
        );
    }
    eprintln!("statuses seen per operation: {:#?}", probe.seen);
    let failures = std::mem::take(&mut probe.failures);
    replica.stop().await;
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
