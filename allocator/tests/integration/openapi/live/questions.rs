//! The questions a live replica is asked: every documented example, the documented bounds of
//! every parameter and body, a scenario for the answers examples do not reach, and the methods
//! the document does not list.

use std::collections::BTreeSet;

use schema::wire::PROBLEM_CONTENT_TYPE;
use serde_json::{json, Value};

use super::super::{Contract, Operation, METHODS};
use super::{Params, Probe};

/// Every operation with its documented examples, twice: first on a fresh database, then
/// again (replays, stocked SKUs); none is refused as invalid.
pub(super) async fn documented_examples(probe: &mut Probe<'_>, ops: &[Operation<'_>]) {
    let contract = probe.contract;
    let no_params = Params::new();
    for round in ["first", "repeat"] {
        for op in ops {
            let examples = op.request_examples(contract);
            if op.request_body(contract).is_some() {
                assert!(!examples.is_empty(), "{} has request examples", op.name());
            }
            if examples.is_empty() {
                probe.call(op, round, &no_params, None).await;
            }
            for (name, value) in examples {
                let what = format!("{round}, example {name}");
                if probe.call(op, &what, &no_params, Some(value.clone())).await == 400 {
                    probe
                        .failures
                        .push(format!("{}: example {name} refused as invalid", op.name()));
                }
            }
        }
    }
}

/// Unknown path values are answered, and values past a parameter's or a body member's
/// documented bounds, unknown members and oversized bodies are refused.
pub(super) async fn documented_bounds(probe: &mut Probe<'_>, ops: &[Operation<'_>]) {
    let contract = probe.contract;
    let no_params = Params::new();
    for op in ops {
        let example = op
            .request_examples(contract)
            .first()
            .map(|(_, v)| (*v).clone());
        for parameter in op.path_parameters(contract) {
            let name = parameter["name"].as_str().expect("name");
            let schema = contract.resolve(&parameter["schema"]);
            // A valid value nobody has used yet.
            let params = Params::from([(name, format!("unknown-{name}"))]);
            probe
                .call(op, &format!("unknown {name}"), &params, example.clone())
                .await;
            // Path parameters beyond their documented length are refused.
            let max = schema["maxLength"]
                .as_u64()
                .expect("path parameters have a maxLength");
            let params = Params::from([(name, "x".repeat(max as usize + 1))]);
            let status = probe
                .call(op, &format!("{name} too long"), &params, example.clone())
                .await;
            if status != 400 {
                probe
                    .failures
                    .push(format!("{}: {name} too long answered {status}", op.name()));
            }
        }
        let (Some(request), Some(example)) = (op.request_body(contract), example) else {
            continue;
        };
        // Unknown members are refused (additionalProperties: false).
        let mut unknown = example.clone();
        unknown["unexpected_member"] = json!(true);
        let status = probe
            .call(op, "unknown member", &no_params, Some(unknown))
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
            .call_raw(op, "oversized body", &no_params, Some(oversized))
            .await;
        if status != 413 {
            probe.failures.push(format!(
                "{}: an oversized body answered {status}",
                op.name()
            ));
        }
        // The documented bounds are the enforced ones.
        let schema = &request["content"]["application/json"]["schema"];
        for (i, (member, value, valid)) in boundary_values(contract, schema).into_iter().enumerate()
        {
            let mut body = example.clone();
            // Fresh ids, so that valid values reach the stock logic instead of a replay.
            for (name, id) in body.as_object_mut().expect("object example") {
                if name.ends_with("_id") {
                    *id = json!(format!("{}-bound-{i}", id.as_str().expect("string id")));
                }
            }
            body[member.as_str()] = value.clone();
            let what = format!("{member} = {value}");
            let status = probe.call(op, &what, &no_params, Some(body)).await;
            if (status == 400) == valid {
                let documented = if valid { "allowed" } else { "refused" };
                probe.failures.push(format!(
                    "{}: {what} is {documented} by the document but answered {status}",
                    op.name()
                ));
            }
        }
    }
}

/// A few scenarios that reach the remaining documented answers, as the descriptions say.
pub(super) async fn scarce_stock(probe: &mut Probe<'_>, ops: &[Operation<'_>]) {
    let no_params = Params::new();
    let by_id = |id: &str| {
        ops.iter()
            .find(|op| op.op["operationId"] == id)
            .unwrap_or_else(|| panic!("operation {id}"))
    };
    let sku = Params::from([("sku", "scarce-1".to_owned())]);
    let refused = Params::from([("reservation_id", "scarce-r".to_owned())]);
    let held = Params::from([("reservation_id", "scarce-h".to_owned())]);
    let reserve = |id: &str, quantity: i64| {
        Some(json!({"reservation_id": id, "sku": "scarce-1", "quantity": quantity}))
    };
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
            reserve("scarce-r", 2),
            409,
        ),
        (
            "createReservation",
            "refusal replayed",
            &no_params,
            reserve("scarce-r", 2),
            409,
        ),
        (
            "createReservation",
            "id reused",
            &no_params,
            reserve("scarce-r", 1),
            422,
        ),
        ("getReservation", "refused id", &refused, None, 409),
        ("confirmReservation", "refused id", &refused, None, 409),
        (
            "createReservation",
            "the one unit",
            &no_params,
            reserve("scarce-h", 1),
            201,
        ),
        ("releaseReservation", "held", &held, None, 200),
        ("confirmReservation", "released", &held, None, 409),
    ];
    for (id, what, params, body, expected) in steps {
        let status = probe.call(by_id(id), what, params, body).await;
        if status != expected {
            probe
                .failures
                .push(format!("{id} ({what}): expected {expected}, got {status}"));
        }
    }
}

/// Methods the document does not list for a path are refused with a 405 problem.
pub(super) async fn undocumented_methods(probe: &mut Probe<'_>, ops: &[Operation<'_>]) {
    let no_params = Params::new();
    let paths: BTreeSet<&str> = ops.iter().map(|op| op.path).collect();
    for path in paths {
        let op = ops.iter().find(|op| op.path == path).expect("an operation");
        for method in METHODS
            .into_iter()
            .filter(|m| op.path_item.get(m).is_none())
        {
            let (status, headers, _) = probe.send(method, &probe.url(op, &no_params), None).await;
            let content_type = headers.get("content-type").and_then(|v| v.to_str().ok());
            if status != 405 || content_type != Some(PROBLEM_CONTENT_TYPE) {
                probe.failures.push(format!(
                    "{} {path} is undocumented but answered {status} {content_type:?}",
                    method.to_uppercase()
                ));
            }
            // RFC 9110: a 405 names the methods that would have worked, and they are the
            // document's.
            let allow: BTreeSet<String> = headers
                .get("allow")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect();
            let documented: BTreeSet<String> = METHODS
                .into_iter()
                .filter(|m| op.path_item.get(m).is_some())
                .map(str::to_uppercase)
                .collect();
            if allow != documented {
                probe.failures.push(format!(
                    "{} {path}: 405 with Allow {allow:?}, the document lists {documented:?}",
                    method.to_uppercase()
                ));
            }
        }
    }
}

/// Integer bounds and string lengths of the top-level members of a request body schema, as
/// `(member, value, within bounds)`.
fn boundary_values(contract: &Contract, schema: &Value) -> Vec<(String, Value, bool)> {
    let schema = contract.resolve(schema);
    let mut out = Vec::new();
    for (name, member) in schema["properties"].as_object().into_iter().flatten() {
        let member = contract.resolve(member);
        let mut push = |value: Value, valid: bool| out.push((name.clone(), value, valid));
        if let Some(min) = member["minimum"].as_i64() {
            push(json!(min), true);
            push(json!(min - 1), false);
        }
        if let Some(max) = member["maximum"].as_i64() {
            push(json!(max), true);
            push(json!(max + 1), false);
        }
        if let Some(excluded) = member.pointer("/not/const") {
            push(excluded.clone(), false);
        }
        if let Some(max) = member["maxLength"].as_u64() {
            push(json!("x".repeat(max as usize)), true);
            push(json!("x".repeat(max as usize + 1)), false);
        }
        if member["minLength"].as_u64() == Some(1) {
            push(json!(""), false);
        }
    }
    out
}
