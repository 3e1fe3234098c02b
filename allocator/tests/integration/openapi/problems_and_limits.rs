//! The document states what the code declares, with the values the code enforces: every problem
//! type of [`schema::wire::problem_type::ALL`] is in `Problem.type` and listed by some response,
//! and the `Problem` schema covers every member the wire type can carry; every limit of
//! [`schema::wire::limits::ALL`] is stated where a client would look for it, the documented
//! patterns accept exactly what validation accepts, and every field with a bounded name refers to
//! its one bounded schema rather than a drifting copy.

use std::collections::{BTreeMap, BTreeSet};

use super::{walk, Contract};
use schema::wire::{limits, problem_type, validate, Problem, ReservationStatus};
use serde_json::{json, Value};

#[test]
fn every_problem_type_is_documented() {
    let contract = Contract::load();
    let code: BTreeSet<&str> = problem_type::ALL.iter().copied().collect();
    let documented: BTreeSet<&str> = contract.schema("Problem")["properties"]["type"]["enum"]
        .as_array()
        .expect("Problem.type enumerates the problem types")
        .iter()
        .map(|v| v.as_str().expect("string"))
        .collect();
    assert_eq!(documented, code, "Problem.type vs problem_type::ALL");
    let mut listed = BTreeSet::new();
    for op in contract.operations() {
        for response in op.responses().values() {
            let types = contract.resolve(response).get("x-problem-types");
            let types = types.and_then(Value::as_array).into_iter().flatten();
            listed.extend(types.filter_map(Value::as_str));
        }
    }
    for t in problem_type::ALL {
        assert!(listed.contains(t), "no response lists {t}");
    }

    // The Problem schema documents every member the wire type can carry.
    let all_members = serde_json::to_value(Problem {
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
        current_status: Some(ReservationStatus::Held),
        outcome_unknown: Some(false),
        quota: Some("max_quantity".into()),
        limit: Some(2),
    })
    .expect("problem serialises");
    let errors = contract.strict_violations(contract.schema("Problem"), &all_members);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Where the document states limit `name` of value `value`: `(JSON pointer, expected value)`.
/// A limit this does not know fails the test until its place in the document is named here.
fn statements(contract: &Contract, name: &str, value: i64) -> Vec<(String, Value)> {
    let at = |schema: &str, keyword: &str, expected: Value| {
        (format!("/components/schemas/{schema}/{keyword}"), expected)
    };
    match name {
        "SKU_MAX_LEN" => vec![
            at("Sku", "maxLength", json!(value)),
            at(
                "Sku",
                "pattern",
                json!(format!("^[A-Za-z0-9._:-]{{1,{value}}}$")),
            ),
        ],
        "ID_MAX_LEN" => vec![at("Id", "maxLength", json!(value))],
        "QUANTITY_MAX" => vec![at("Quantity", "maximum", json!(value))],
        "ADJUSTMENT_DELTA_MAX" => vec![
            at("Delta", "minimum", json!(-value)),
            at("Delta", "maximum", json!(value)),
        ],
        "TTL_SECONDS_MIN" => vec![at("TtlSeconds", "minimum", json!(value))],
        "TTL_SECONDS_MAX" => vec![at("TtlSeconds", "maximum", json!(value))],
        "TTL_SECONDS_DEFAULT" => vec![at("TtlSeconds", "default", json!(value))],
        "ORDER_LINES_MAX" => vec![
            at("OrderRequest", "properties/lines/maxItems", json!(value)),
            at("LineReport", "properties/index/maximum", json!(value - 1)),
        ],
        "BODY_MAX_BYTES" => contract
            .operations()
            .iter()
            .filter(|op| op.op.get("requestBody").is_some())
            .map(|op| {
                let path = op.path.replace('~', "~0").replace('/', "~1");
                let pointer = format!("/paths/{path}/{}/requestBody/x-max-bytes", op.method);
                (pointer, json!(value))
            })
            .collect(),
        other => panic!("limits::{other} is not known to be stated anywhere in the document"),
    }
}

#[test]
fn documented_limits_match_the_code() {
    let contract = Contract::load();
    let mut failures = Vec::new();
    for &(name, value) in limits::ALL {
        for (pointer, expected) in statements(&contract, name, value) {
            let stated = contract.doc.pointer(&pointer);
            if stated != Some(&expected) {
                failures.push(format!("{name}: {pointer} is {stated:?}, not {expected}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    // Lower bounds that are not named limits.
    for (schema, keyword, expected) in [
        ("Sku", "minLength", 1),
        ("Id", "minLength", 1),
        ("OrderId", "minLength", 1),
        ("Quantity", "minimum", 1),
    ] {
        assert_eq!(
            contract.schema(schema)[keyword],
            json!(expected),
            "{schema}"
        );
    }
    assert_eq!(contract.schema("Delta")["not"], json!({ "const": 0 }));
    assert!(validate::delta(0).is_err());

    // The documented patterns accept exactly what validation accepts.
    let sku = contract.validator(contract.schema("Sku"), false);
    let id = contract.validator(contract.schema("Id"), false);
    for c in (0u32..0x250).filter_map(char::from_u32) {
        let text = json!(c.to_string());
        let sku_ok = sku.is_valid(&text);
        assert_eq!(sku_ok, validate::sku(&c.to_string()).is_ok(), "sku {c:?}");
        let id_ok = id.is_valid(&text);
        assert_eq!(
            id_ok,
            validate::id("id", &c.to_string()).is_ok(),
            "id {c:?}"
        );
    }

    // A client's reservation id may not be an order line's: the document's narrowing refuses
    // exactly the ids in the order-line namespace.
    let client_id = contract.schema("ReserveRequest")["properties"]["reservation_id"].clone();
    let client_id = contract.validator(&client_id, false);
    let line = schema::wire::order_line_id("o-1", 0);
    assert!(line.starts_with(schema::wire::ORDER_LINE_PREFIX));
    assert!(
        !client_id.is_valid(&json!(line)),
        "{line} is documented as a client id"
    );
    assert!(client_id.is_valid(&json!("o-1:0")));
    assert!(client_id.is_valid(&json!("my-order:1")));

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
    walk(&contract.doc, &mut |node| {
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
                // An optional field may also be `null` (the default): `anyOf: [$ref, null]`;
                // a field may narrow the schema with exclusions: `allOf: [$ref, {not: …}…]`.
                let narrowed = value
                    .get("allOf")
                    .and_then(Value::as_array)
                    .filter(|all| all.iter().skip(1).all(|part| part.get("not").is_some()));
                let bounded = value
                    .pointer("/anyOf/0")
                    .filter(|_| value.pointer("/anyOf/1/type") == Some(&Value::from("null")))
                    .or_else(|| narrowed.and_then(|all| all.first()))
                    .unwrap_or(value);
                if bounded.get("$ref").and_then(Value::as_str) != Some(expected.as_str()) {
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
