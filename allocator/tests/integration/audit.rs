//! The audit trail's log side on a real replica process: refused authentications and
//! authorisations and administrative writes each leave one JSON line of target `audit` with the
//! client, route, SKU, ids, outcome, status and the request id.

use std::time::{Duration, Instant};

use crate::auth::write_auth_file;
use crate::common::*;
use crate::processes::spawn_replica_with;
use reqwest::StatusCode;
use serde_json::{json, Value};

const OPS: &str = "ops-token-audit-1a2b3c4d";
const SHOP: &str = "shop-token-audit-5e6f7a8b";

/// The `audit` lines of a log, parsed.
fn audit_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "audit")
        .collect()
}

/// The last audit line of the request with id `request_id`.
fn line_of<'a>(lines: &'a [Value], request_id: &str, log: &str) -> &'a Value {
    lines
        .iter()
        .rev()
        .find(|l| l["span"]["request_id"] == request_id)
        .unwrap_or_else(|| panic!("no audit line for {request_id}:\n{log}"))
}

async fn send(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    request_id: &str,
    body: Option<Value>,
) -> StatusCode {
    let mut request = http()
        .request(method, url)
        .header("x-request-id", request_id);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.expect("request").status()
}

#[tokio::test]
async fn refusals_and_admin_writes_leave_audit_lines() {
    let db = migrated_database(PARTITIONS).await;
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("auth");
    write_auth_file(
        &auth,
        &[
            ("ops", "reserve,admin", OPS, ""),
            ("shop", "reserve", SHOP, "skus=shop:*"),
        ],
    );
    let mut replica = spawn_replica_with(
        &db,
        "audit",
        2000,
        vec![("ALLOCATOR_AUTH_FILE".into(), auth.display().to_string())],
    );
    let base = replica.url.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = http().get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica not ready: {}",
            replica.process.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    use reqwest::Method;
    let adjust = format!("{base}/v1/inventory/shop:1/adjustments");
    let body = |id: &str| Some(json!({"adjustment_id": id, "delta": 7}));
    // An admin write that is applied; one under an unknown token; one without the scope; a
    // read outside the client's namespaces; a probe and a read that need no audit.
    let deadline = Instant::now() + Duration::from_secs(15);
    while send(Method::POST, &adjust, Some(OPS), "rq-write", body("adj-1")).await
        != StatusCode::CREATED
    {
        assert!(Instant::now() < deadline, "the restock kept failing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unknown = send(
        Method::POST,
        &adjust,
        Some("nope"),
        "rq-unknown",
        body("adj-2"),
    )
    .await;
    assert_eq!(unknown, StatusCode::UNAUTHORIZED);
    let scope = send(Method::POST, &adjust, Some(SHOP), "rq-scope", body("adj-3")).await;
    assert_eq!(scope, StatusCode::FORBIDDEN);
    let outside = format!("{base}/v1/inventory/other:1");
    let outside = send(Method::GET, &outside, Some(SHOP), "rq-outside", None).await;
    assert_eq!(outside, StatusCode::FORBIDDEN);
    let read = format!("{base}/v1/inventory/shop:1");
    assert_eq!(
        send(Method::GET, &read, Some(SHOP), "rq-read", None).await,
        StatusCode::OK
    );

    // Lines are written as the answers go out; give the writer a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (log, lines) = loop {
        let log = replica.process.log_tail(usize::MAX);
        let lines = audit_lines(&log);
        if lines.len() >= 4 || Instant::now() > deadline {
            break (log, lines);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let write = &line_of(&lines, "rq-write", &log)["fields"];
    assert_eq!(write["event"], "admin_write", "{write}");
    assert_eq!(write["client"], "ops");
    assert_eq!(write["route"], "/v1/inventory/{sku}/adjustments");
    assert_eq!(write["sku"], "shop:1");
    assert_eq!(write["ids"], "adjustment_id=\"adj-1\" delta=7");
    assert_eq!(write["outcome"], "applied");
    assert_eq!(write["status"], 201);
    let unknown = &line_of(&lines, "rq-unknown", &log)["fields"];
    assert_eq!(unknown["event"], "refused", "{unknown}");
    assert_eq!(unknown["client"], "(none)");
    assert_eq!(unknown["outcome"], "unauthenticated");
    assert_eq!(unknown["status"], 401);
    let scope = &line_of(&lines, "rq-scope", &log)["fields"];
    assert_eq!(scope["client"], "shop", "{scope}");
    assert_eq!(scope["outcome"], "forbidden");
    assert_eq!(scope["sku"], "shop:1");
    let outside = &line_of(&lines, "rq-outside", &log)["fields"];
    assert_eq!(outside["outcome"], "namespace_forbidden", "{outside}");
    assert_eq!(outside["sku"], "other:1");
    assert!(
        lines.iter().all(|l| l["span"]["request_id"] != "rq-read"),
        "a served read is not audited: {log}"
    );
    // The token itself never reaches the log.
    assert!(!log.contains(OPS) && !log.contains(SHOP));
    replica.process.sigterm().unwrap();
    replica
        .process
        .wait_exit(Duration::from_secs(10))
        .await
        .unwrap();
}
