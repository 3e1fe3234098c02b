//! Hostile input against a live router and a live allocator: seeded random bodies and path
//! segments (arbitrary bytes, invalid and odd UTF-8, deep nesting, huge and tiny numbers,
//! oversized bodies, mutated valid requests). Every answer must be a well-formed problem or a
//! documented success, never a 5xx or a hang, and afterwards the limits must hold in the database:
//! nothing stored exceeds a documented bound, and the ledger still sums to every inventory row.
//!
//! The seed is printed; `HOSTILE_INPUT_SEED=N` replays one run, `HOSTILE_INPUT_CASES=N` sets how
//! many cases each service gets.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use schema::wire::limits::{BODY_MAX_BYTES, ID_MAX_LEN, QUANTITY_MAX, SKU_MAX_LEN};
use schema::wire::PROBLEM_CONTENT_TYPE;
use serde_json::{json, Value};

use crate::common::{serial, Cluster};

const PARTITIONS: u32 = 4;
const STOCKED_SKU: &str = "fuzz-sku";

/// Strings that have broken parsers and databases before: control characters, a NUL, lone
/// surrogate escapes, byte-order marks, right-to-left overrides, combining marks, emoji, and
/// characters whose lower/upper case change length.
const ODD_STRINGS: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "a\u{0}b",
    "\u{feff}sku",
    "\u{202e}kus",
    "e\u{301}\u{301}\u{301}",
    "🦀🦀",
    "İstanbul",
    "ß",
    "\\ud800",
    "..",
    "../../etc/passwd",
    "a/b",
    "%00",
    "' OR 1=1 --",
    "$1",
    "{sku}",
];

/// Numbers at and past every edge JSON and the limits have.
const ODD_NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1.5",
    "2.0",
    "1e2",
    "1e400",
    "-1e400",
    "1e-400",
    "9007199254740993",
    "18446744073709551616",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "1000001",
    "86401",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_never_breaks_a_service_or_a_limit() {
    let _serial = serial().await;
    let cluster = Cluster::start("hostile_input", 1, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    cluster.restock(&router.url, STOCKED_SKU, 1_000).await;

    let seed = std::env::var("HOSTILE_INPUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let cases: usize = std::env::var("HOSTILE_INPUT_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    println!(
        "hostile input: seed {seed} (HOSTILE_INPUT_SEED={seed} replays), {cases} cases per service"
    );

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let targets = [
        ("router", router.url.clone()),
        ("allocator", cluster.allocators[0].url.clone()),
    ];
    let mut failures = Vec::new();
    for (name, base) in &targets {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut tally = std::collections::BTreeMap::<u16, usize>::new();
        for case in 0..cases {
            let request = hostile_request(&mut rng, case);
            let url = format!("{base}{}", request.path);
            let mut builder = client
                .request(request.method.clone(), &url)
                .header("content-type", "application/json");
            if let Some(body) = &request.body {
                builder = builder.body(body.clone());
            }
            let described = request.describe();
            let response = match builder.send().await {
                Ok(response) => response,
                Err(e) => {
                    failures.push(format!("{name}: {described}: no answer: {e}"));
                    continue;
                }
            };
            let status = response.status().as_u16();
            *tally.entry(status).or_default() += 1;
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = response.bytes().await.unwrap_or_default();
            if let Some(problem) = check_answer(status, content_type.as_deref(), &body, &request) {
                failures.push(format!("{name}: {described}: {problem}"));
            }
        }
        println!("hostile input: {name} answered {tally:?}");
    }

    // The services are still up and still serve.
    for (name, base) in &targets {
        let ready = client.get(format!("{base}/readyz")).send().await;
        assert!(
            ready.is_ok_and(|r| r.status().is_success()),
            "{name} is not ready after the hostile input"
        );
    }

    // The limits hold in what was stored.
    let db = cluster.db().await;
    let row = db
        .query_one(
            "SELECT
                 (SELECT count(*) FROM reservations
                   WHERE quantity > $1 OR quantity < 1 OR length(sku) > $2
                      OR length(reservation_id) > $3),
                 (SELECT count(*) FROM inventory WHERE available < 0 OR held < 0
                      OR held + confirmed > on_hand),
                 (SELECT count(*) FROM inventory i,
                         LATERAL (SELECT coalesce(sum(d_on_hand), 0) AS on_hand,
                                         coalesce(sum(d_available), 0) AS available,
                                         coalesce(sum(d_held), 0) AS held,
                                         coalesce(sum(d_confirmed), 0) AS confirmed
                                    FROM ledger l WHERE l.sku = i.sku) s
                   WHERE (i.on_hand, i.available, i.held, i.confirmed)
                         IS DISTINCT FROM (s.on_hand, s.available, s.held, s.confirmed))",
            &[&QUANTITY_MAX, &(SKU_MAX_LEN as i32), &(ID_MAX_LEN as i32)],
        )
        .await
        .expect("limits query");
    let (beyond_limits, broken_rows, unbalanced): (i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        beyond_limits, 0,
        "reservations stored beyond a documented limit"
    );
    assert_eq!(
        broken_rows, 0,
        "inventory rows that break the stock invariant"
    );
    assert_eq!(
        unbalanced, 0,
        "inventory rows that the ledger does not sum to"
    );

    assert!(
        failures.is_empty(),
        "{} bad answers (seed {seed}):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

struct HostileRequest {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    /// The body exceeds the documented size limit and must be refused as such.
    oversized: bool,
}

impl HostileRequest {
    fn describe(&self) -> String {
        let body = self.body.as_ref().map(|b| {
            let shown = String::from_utf8_lossy(&b[..b.len().min(120)]).into_owned();
            format!(" body[{}] {shown:?}", b.len())
        });
        format!("{} {}{}", self.method, self.path, body.unwrap_or_default())
    }
}

/// What a good answer looks like: below 500, and every refusal a problem document whose `status`
/// matches; an oversized body is a `413`.
fn check_answer(
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
    request: &HostileRequest,
) -> Option<String> {
    if status >= 500 {
        return Some(format!(
            "answered {status}: {}",
            String::from_utf8_lossy(body)
        ));
    }
    // A route the service does not have (orders on an allocator) is refused before its body is
    // read; everywhere else the size limit answers first.
    let text = String::from_utf8_lossy(body);
    let no_such_route = status == 404 && text.contains("no route for");
    if request.oversized && status != 413 && !no_such_route {
        return Some(format!("an oversized body was answered {status}, not 413"));
    }
    if status >= 400 {
        if content_type != Some(PROBLEM_CONTENT_TYPE) {
            return Some(format!("{status} with content type {content_type:?}"));
        }
        let problem: Value = match serde_json::from_slice(body) {
            Ok(problem) => problem,
            Err(e) => return Some(format!("{status} with an unreadable problem: {e}")),
        };
        if problem["status"] != json!(status) || !problem["type"].is_string() {
            return Some(format!("{status} with a malformed problem {problem}"));
        }
    }
    None
}

fn hostile_request(rng: &mut StdRng, case: usize) -> HostileRequest {
    let post = |path: String, body: Vec<u8>| HostileRequest {
        method: Method::POST,
        path,
        oversized: body.len() > BODY_MAX_BYTES,
        body: Some(body),
    };
    match case % 8 {
        0 => post("/v1/reservations".into(), random_bytes(rng)),
        1 => post("/v1/reservations".into(), deep_nesting(rng)),
        2 => post("/v1/reservations".into(), mutated_reserve(rng)),
        3 => post(
            format!("/v1/inventory/{}/adjustments", hostile_segment(rng)),
            mutated_adjustment(rng),
        ),
        4 => post(
            format!("/v1/orders/{}/reservations", hostile_segment(rng)),
            mutated_order(rng),
        ),
        5 => HostileRequest {
            method: if rng.random_bool(0.5) {
                Method::GET
            } else {
                Method::POST
            },
            path: format!(
                "/v1/reservations/{}{}",
                hostile_segment(rng),
                ["", "/confirm", "/release"][rng.random_range(0..3)]
            ),
            body: None,
            oversized: false,
        },
        6 => HostileRequest {
            method: Method::GET,
            path: format!("/v1/inventory/{}", hostile_segment(rng)),
            body: None,
            oversized: false,
        },
        _ => {
            // Just past the size limit, padded inside an otherwise valid request.
            let padding = "x".repeat(BODY_MAX_BYTES + rng.random_range(1..1024));
            post(
                "/v1/reservations".into(),
                serde_json::to_vec(&json!({
                    "reservation_id": "big", "sku": STOCKED_SKU, "quantity": 1, "pad": padding
                }))
                .unwrap(),
            )
        }
    }
}

fn random_bytes(rng: &mut StdRng) -> Vec<u8> {
    let len = rng.random_range(0..512);
    (0..len).map(|_| rng.random()).collect()
}

fn deep_nesting(rng: &mut StdRng) -> Vec<u8> {
    let depth = rng.random_range(100..20_000);
    let (open, close) = if rng.random_bool(0.5) {
        ("[", "]")
    } else {
        ("{\"a\":", "}")
    };
    let mut body = open.repeat(depth);
    body.push('1');
    body.push_str(&close.repeat(depth));
    body.into_bytes()
}

fn odd_string(rng: &mut StdRng) -> String {
    match rng.random_range(0..4) {
        0 => ODD_STRINGS[rng.random_range(0..ODD_STRINGS.len())].to_owned(),
        1 => "x".repeat(rng.random_range(SKU_MAX_LEN..ID_MAX_LEN + 64)),
        2 => (0..rng.random_range(1..24))
            .map(|_| char::from_u32(rng.random_range(1..0x11_0000)).unwrap_or('\u{fffd}'))
            .collect(),
        _ => format!("ok-{}", rng.random::<u16>()),
    }
}

/// A JSON value that is wrong for an integer field more often than not, as raw JSON text so that
/// numbers serde would never produce (`1e400`, 30 digits) reach the service as written.
fn odd_number(rng: &mut StdRng) -> String {
    match rng.random_range(0..5) {
        0..=2 => ODD_NUMBERS[rng.random_range(0..ODD_NUMBERS.len())].to_owned(),
        3 => ["null", "true", "\"7\"", "[1]", "{}"][rng.random_range(0..5)].to_owned(),
        _ => rng.random_range(1..20).to_string(),
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A valid reservation with one field (or the field set) replaced by something hostile.
fn mutated_reserve(rng: &mut StdRng) -> Vec<u8> {
    let mut id = json_string(&format!("fz-{}", rng.random::<u32>()));
    let mut sku = json_string(STOCKED_SKU);
    let mut quantity = "1".to_owned();
    let mut ttl = "30".to_owned();
    let mut extra = String::new();
    match rng.random_range(0..6) {
        0 => id = json_string(&odd_string(rng)),
        1 => sku = json_string(&odd_string(rng)),
        2 => quantity = odd_number(rng),
        3 => ttl = odd_number(rng),
        4 => extra = format!(",\"reservation_id\":{}", json_string(&odd_string(rng))),
        _ => extra = format!(",{}:1", json_string(&odd_string(rng))),
    }
    format!(
        "{{\"reservation_id\":{id},\"sku\":{sku},\"quantity\":{quantity},\"ttl_seconds\":{ttl}{extra}}}"
    )
    .into_bytes()
}

fn mutated_adjustment(rng: &mut StdRng) -> Vec<u8> {
    let id = if rng.random_bool(0.7) {
        json_string(&format!("fz-adj-{}", rng.random::<u32>()))
    } else {
        json_string(&odd_string(rng))
    };
    format!("{{\"adjustment_id\":{id},\"delta\":{}}}", odd_number(rng)).into_bytes()
}

fn mutated_order(rng: &mut StdRng) -> Vec<u8> {
    let lines: Vec<String> = (0..rng.random_range(0..6))
        .map(|_| {
            let sku = if rng.random_bool(0.5) {
                json_string(STOCKED_SKU)
            } else {
                json_string(&odd_string(rng))
            };
            format!("{{\"sku\":{sku},\"quantity\":{}}}", odd_number(rng))
        })
        .collect();
    if rng.random_bool(0.1) {
        // Far more lines than the limit allows.
        let line = format!("{{\"sku\":{},\"quantity\":1}}", json_string(STOCKED_SKU));
        let many = vec![line; 5_000].join(",");
        return format!("{{\"lines\":[{many}]}}").into_bytes();
    }
    format!(
        "{{\"lines\":[{}],\"ttl_seconds\":{}}}",
        lines.join(","),
        odd_number(rng)
    )
    .into_bytes()
}

/// A path segment: percent-encoded random bytes, odd strings, or lengths past every limit.
fn hostile_segment(rng: &mut StdRng) -> String {
    let raw: Vec<u8> = match rng.random_range(0..4) {
        0 => random_bytes(rng).into_iter().take(64).collect(),
        1 => odd_string(rng).into_bytes(),
        2 => vec![b'y'; rng.random_range(ID_MAX_LEN..4_096)],
        _ => format!("fz-{}", rng.random::<u16>()).into_bytes(),
    };
    if raw.is_empty() {
        return "%20".into();
    }
    raw.iter().map(|b| format!("%{b:02X}")).collect()
}
