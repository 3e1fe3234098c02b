//! `GET /v1/jobs/settlement` through a router over two shards (DESIGN.md §12): each shard runs a
//! settlement job of its own, and the router lists every shard's next to the catalog's (the top
//! level, what one database always answered); a stopped shard is listed with its `error` while
//! the answer stays `200`. The router's per-shard series (the settlement lag, the storage
//! fences') carry both shard labels. On one database the answer only gains `shards`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::{balanced, http, metric, serial, Cluster};

const PARTITIONS: u32 = 4;
/// The settlement job's flags for every allocator: one-second windows, a grace above the test
/// allocators' one-second statement timeout.
fn settlement_env() -> Vec<(String, String)> {
    vec![
        ("ALLOCATOR_SETTLEMENT_WINDOW_SECS".into(), "1".into()),
        ("ALLOCATOR_SETTLEMENT_GRACE_MS".into(), "1500".into()),
    ]
}

/// The members of the status of one shard's job (and of the top level).
const STATUS_FIELDS: [&str; 6] = [
    "holder_id",
    "term",
    "lease_remaining_ms",
    "last_settled",
    "settled_windows",
    "lag_seconds",
];

async fn settlement(base: &str) -> (StatusCode, Value) {
    let response = http()
        .get(format!("{base}/v1/jobs/settlement"))
        .send()
        .await
        .expect("settlement status");
    let status = response.status();
    (status, response.json().await.expect("json body"))
}

/// Polls the router's answer (every one must be `200`) until `done` holds for it.
async fn wait_answer(base: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (status, body) = settlement(base).await;
        assert_eq!(status, StatusCode::OK, "{what}: {body}");
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Violations of the router's documented `SettlementStatus` (its own document, `shards` and all).
fn undocumented(body: &Value) -> Vec<String> {
    let served = schema::openapi::document(schema::routes::Service::Router);
    let root = serde_json::json!({
        "allOf": [{ "$ref": "#/components/schemas/SettlementStatus" }],
        "components": served["components"],
    });
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&root)
        .expect("SettlementStatus compiles");
    let mut errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    let declared = served
        .pointer("/components/schemas/SettlementStatus/properties")
        .and_then(Value::as_object)
        .expect("properties");
    errors.extend(
        body.as_object()
            .expect("object")
            .keys()
            .filter(|member| !declared.contains_key(*member))
            .map(|member| format!("undocumented member {member}")),
    );
    errors
}

fn shard<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["shards"]
        .as_array()
        .and_then(|shards| shards.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Settled at least twice by `holder`, its job's holder.
fn settled_by(entry: &Value, holder: &str) -> bool {
    entry["holder_id"] == holder
        && entry["last_settled"]["holder_id"] == holder
        && entry["settled_windows"].as_i64().is_some_and(|n| n >= 2)
}

#[tokio::test]
async fn the_router_lists_every_shards_settlement_and_a_stopped_shard_with_its_error() {
    let _serial = serial().await;
    let mut cluster = Cluster::start_sharded("settle-shards", 2, 0, PARTITIONS).await;
    cluster.allocator_env = settlement_env();
    // alloc-0 serves s0 (the catalog), alloc-1 serves s1: each shard's job has its own holder.
    for id in ["alloc-0", "alloc-1"] {
        cluster.spawn_allocator(id);
    }
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            balanced(m, &["alloc-0", "alloc-1"], PARTITIONS as usize / 2)
        })
        .await;
    let router = cluster.router(|_| {}).await;

    let body = wait_answer(&router.url, "both shards settling", |b| {
        settled_by(shard(b, "s0"), "alloc-0") && settled_by(shard(b, "s1"), "alloc-1")
    })
    .await;
    let names: Vec<&Value> = body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["name"])
        .collect();
    assert_eq!(names, ["s0", "s1"], "{body}");
    assert_eq!(undocumented(&body), Vec::<String>::new(), "{body}");
    // The top level is the catalog's job, as before; s1's windows are its own rows, settled by
    // its own job (read again from its database: it may have settled more since).
    for field in STATUS_FIELDS {
        assert!(body.get(field).is_some(), "top-level {field}: {body}");
    }
    assert_eq!(body["holder_id"], "alloc-0", "{body}");
    assert_eq!(body["term"], shard(&body, "s0")["term"], "{body}");
    let s1 = schema::settlement::read_status(&cluster.shard_db(1).await.unwrap())
        .await
        .unwrap();
    let listed = shard(&body, "s1");
    assert_eq!(listed["term"], s1.term, "{body}");
    assert!(listed["settled_windows"].as_i64().unwrap() <= s1.settled_windows);
    assert!(listed.get("error").is_none(), "{body}");

    // Both shards' series: the settlement lag, and the storage fences' (one fence per shard).
    let deadline = Instant::now() + Duration::from_secs(10);
    for name in ["s0", "s1"] {
        for series in [
            format!("router_settlement_lag_seconds{{shard=\"{name}\"}}"),
            format!("router_storage_timeline{{shard=\"{name}\"}}"),
        ] {
            while metric(&router.url, &series).await <= 0.0 {
                assert!(Instant::now() < deadline, "{series} missing");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    // Shard 1 stopped: still 200, the catalog's job at the top level, s1 listed with its error.
    cluster.shard_mut(1).unwrap().server.stop().await.unwrap();
    let body = wait_answer(&router.url, "s1 stopped", |b| {
        shard(b, "s1")["error"].is_string()
    })
    .await;
    assert_eq!(undocumented(&body), Vec::<String>::new(), "{body}");
    let listed = shard(&body, "s1");
    assert!(
        STATUS_FIELDS.iter().all(|f| listed.get(f).is_none()),
        "{body}"
    );
    assert_eq!(body["holder_id"], "alloc-0", "{body}");
    assert!(shard(&body, "s0")["error"].is_null(), "{body}");
    let failures = "router_settlement_read_failures_total{shard=\"s1\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&router.url, failures).await < 1.0 {
        assert!(Instant::now() < deadline, "{failures} not counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Back: s1's job is listed again.
    cluster
        .shard_mut(1)
        .unwrap()
        .server
        .restart()
        .await
        .unwrap();
    wait_answer(&router.url, "s1 back", |b| {
        shard(b, "s1")["settled_windows"].is_i64()
    })
    .await;
    router.stop().await;
}

#[tokio::test]
async fn on_one_database_the_settlement_answer_only_gains_shards() {
    let _serial = serial().await;
    let cluster = Cluster::start("settle-one", 1, 2).await;
    let router = cluster.router(|_| {}).await;
    let (status, body) = settlement(&router.url).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut keys: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = STATUS_FIELDS.iter().copied().chain(["shards"]).collect();
    expected.sort_unstable();
    assert_eq!(keys, expected, "{body}");
    let shards = body["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 1, "{body}");
    assert_eq!(shards[0]["name"], schema::shard::DEFAULT_SHARD, "{body}");
    assert_eq!(shards[0]["term"], body["term"], "{body}");
    // The allocator's own answer is unchanged: no `shards`.
    let (status, own) = settlement(&cluster.allocators[0].url).await;
    assert_eq!(status, StatusCode::OK, "{own}");
    assert!(own.get("shards").is_none(), "{own}");
    router.stop().await;
}
