//! Keeps `schema/openapi.json` honest.
//!
//! The document is checked against the code's own declarations, not against its source text:
//!
//! * [`document`]: the document is OpenAPI 3.1, every `$ref` resolves, every schema compiles,
//!   every error is `application/problem+json` and lists the problem types it can carry; its
//!   operations are exactly [`schema::routes::ALL`]; every example matches its schema.
//! * [`problems_and_limits`]: every problem type of [`schema::wire::problem_type::ALL`] and
//!   every limit of [`schema::wire::limits::ALL`] is stated with the value the code enforces.
//! * [`document`] also checks the documents the services serve (derived from the shared one by
//!   [`schema::openapi`]): each lists exactly its service's routes, keeps nothing marked for the
//!   other service, and is as well-formed as the shared one.
//! * [`live`]: a replica answers every route it serves (never "no route" or `405`), only
//!   with documented statuses, media types, headers and bodies, and refuses out-of-bounds input
//!   where the document says it would.
//!
//! Schemas are evaluated by the `jsonschema` crate (JSON Schema 2020-12, the dialect of OpenAPI
//! 3.1) over a root that carries the document's `components`, so `$ref`s resolve as they would
//! for any client. Answers are checked against a *closed* copy of the schemas (see [`close`]):
//! a member that no schema declares is an error, so a replica cannot send anything undocumented
//! while the published document still lets clients tolerate additions.

mod document;
mod live;
mod problems_and_limits;

use serde_json::{json, Map, Value};

const DOCUMENT: &str = schema::openapi::SHARED;

/// The methods an OpenAPI path item can hold that this API could use.
const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// The API document and a closed copy of its components.
pub struct Contract {
    pub doc: Value,
    closed_components: Value,
}

/// One operation of the document.
pub struct Operation<'a> {
    pub path: &'a str,
    pub method: &'a str,
    pub path_item: &'a Value,
    pub op: &'a Value,
}

impl Contract {
    pub fn load() -> Self {
        Self::from_document(serde_json::from_str(DOCUMENT).expect("openapi.json is valid JSON"))
    }

    /// The document `service` serves, derived from the shared one.
    pub fn served(service: schema::routes::Service) -> Self {
        Self::from_document(schema::openapi::document(service))
    }

    pub fn from_document(doc: Value) -> Self {
        let mut closed_components = doc["components"].clone();
        let schemas = closed_components["schemas"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for schema in closed_components["schemas"]
            .as_object_mut()
            .into_iter()
            .flat_map(|s| s.values_mut())
        {
            close(schema, &schemas, false);
        }
        Self {
            doc,
            closed_components,
        }
    }

    /// Follow local `$ref`s; a dangling or remote reference fails the test.
    pub fn resolve<'a>(&'a self, mut value: &'a Value) -> &'a Value {
        for _ in 0..32 {
            let Some(reference) = value.get("$ref").and_then(Value::as_str) else {
                return value;
            };
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("only local references are used: {reference}"));
            value = self
                .doc
                .pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {reference}"));
        }
        panic!("$ref cycle")
    }

    /// The component schema `name`.
    pub fn schema(&self, name: &str) -> &Value {
        self.doc
            .pointer(&format!("/components/schemas/{name}"))
            .unwrap_or_else(|| panic!("components.schemas.{name} is documented"))
    }

    pub fn operations(&self) -> Vec<Operation<'_>> {
        let paths = self.doc["paths"].as_object().expect("paths is an object");
        let mut out = Vec::new();
        for (path, path_item) in paths {
            for method in METHODS {
                if let Some(op) = path_item.get(method) {
                    out.push(Operation {
                        path,
                        method,
                        path_item,
                        op,
                    });
                }
            }
        }
        out
    }

    /// Why `value` does not match `schema` (a schema node of the document); empty if it does.
    pub fn violations(&self, schema: &Value, value: &Value) -> Vec<String> {
        errors(&self.validator(schema, false), value)
    }

    /// As [`Self::violations`], and also every object member no schema declares.
    pub fn strict_violations(&self, schema: &Value, value: &Value) -> Vec<String> {
        errors(&self.validator(schema, true), value)
    }

    /// A validator for `schema`, a schema node of the document; `strict` closes it (and every
    /// component it refers to) against undeclared members. Building it checks the schema against
    /// the 2020-12 meta-schema.
    pub fn validator(&self, schema: &Value, strict: bool) -> jsonschema::Validator {
        let mut schema = schema.clone();
        let components = if strict {
            let schemas = self.doc["components"]["schemas"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            close(&mut schema, &schemas, false);
            &self.closed_components
        } else {
            &self.doc["components"]
        };
        // The schema is wrapped rather than copied into, so that a bare `$ref` or a boolean
        // schema works too; the root carries `components` so `#/components/...` resolves.
        let root = json!({ "allOf": [schema], "components": components });
        jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("schema {schema} does not compile: {e}"))
    }
}

fn errors(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

impl<'a> Operation<'a> {
    pub fn name(&self) -> String {
        format!("{} {}", self.method.to_uppercase(), self.path)
    }

    /// Path-level and operation-level parameters, resolved.
    pub fn parameters(&self, contract: &'a Contract) -> Vec<&'a Value> {
        [self.path_item, self.op]
            .iter()
            .filter_map(|node| node.get("parameters").and_then(Value::as_array))
            .flatten()
            .map(|p| contract.resolve(p))
            .collect()
    }

    pub fn path_parameters(&self, contract: &'a Contract) -> Vec<&'a Value> {
        self.parameters(contract)
            .into_iter()
            .filter(|p| p["in"] == "path")
            .collect()
    }

    pub fn request_body(&self, contract: &'a Contract) -> Option<&'a Value> {
        self.op
            .get("requestBody")
            .map(|body| contract.resolve(body))
    }

    pub fn responses(&self) -> &'a Map<String, Value> {
        self.op["responses"]
            .as_object()
            .expect("responses is an object")
    }

    /// The named examples of the JSON request body.
    pub fn request_examples(&self, contract: &'a Contract) -> Vec<(&'a String, &'a Value)> {
        self.request_body(contract)
            .and_then(|b| b.pointer("/content/application~1json/examples"))
            .and_then(Value::as_object)
            .map(|examples| {
                examples
                    .iter()
                    .map(|(name, e)| (name, &contract.resolve(e)["value"]))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `x-served-by` of a document node; `None` means both servers.
pub fn served_by(value: &Value) -> Option<Vec<&str>> {
    value.get("x-served-by").map(|list| {
        list.as_array()
            .expect("x-served-by is an array")
            .iter()
            .map(|s| s.as_str().expect("x-served-by lists names"))
            .collect()
    })
}

pub fn served_by_allocator(value: &Value) -> bool {
    served_by(value).is_none_or(|servers| servers.contains(&"allocator"))
}

/// Every node of a JSON tree.
pub fn walk<'a>(value: &'a Value, visit: &mut impl FnMut(&'a Value)) {
    visit(value);
    match value {
        Value::Object(map) => map.values().for_each(|v| walk(v, visit)),
        Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
        _ => {}
    }
}

/// Refuse undeclared members: every object schema that declares `properties` (or combines
/// branches with `allOf`) and says nothing about other members gets
/// `unevaluatedProperties: false`. A referenced schema used as an `allOf` branch is inlined and
/// left open there, because a branch only sees its own members (`Problem` inside
/// `OrderProblem`); the combining schema closes over all of them.
fn close(node: &mut Value, schemas: &Map<String, Value>, branch: bool) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    let composite = object.contains_key("properties") || object.contains_key("allOf");
    if composite && !branch && !object.contains_key("additionalProperties") {
        object.insert("unevaluatedProperties".into(), Value::Bool(false));
    }
    if let Some(Value::Array(branches)) = object.get_mut("allOf") {
        for part in branches {
            let target = part
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .map(str::to_owned);
            if let Some(target) = target {
                *part = schemas[&target].clone();
            }
            close(part, schemas, true);
        }
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = object.get_mut(keyword) {
            branches.iter_mut().for_each(|b| close(b, schemas, false));
        }
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        properties
            .values_mut()
            .for_each(|p| close(p, schemas, false));
    }
    if let Some(items) = object.get_mut("items") {
        close(items, schemas, false);
    }
}
