//! Bearer-token authentication, scopes and per-client limits of a replica, over real HTTP: who
//! may do what with which token, routers standing in for the clients they name, replicas that
//! accept routers only, and a client's rate and concurrency caps answered with `429`. Reloading
//! and refusing the auth file itself is in [`crate::auth_file`].

use std::io::Write;
use std::num::NonZeroUsize;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use access::table::hash_hex;
use reqwest::StatusCode;
use schema::wire::{problem_type, Problem, HEADER_CLIENT, PROBLEM_CONTENT_TYPE};
use serde_json::json;

pub const SHOP: &str = "shop-token-8c1f0e2d4b6a";
pub const OPS: &str = "ops-token-5e7d9c1b3a2f";
pub const ROUTER: &str = "router-token-2b4d6f8a0c1e";

/// An auth file of `(name, scopes, token, options)` lines, hashes only.
pub fn write_auth_file(path: &Path, clients: &[(&str, &str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    writeln!(file, "# name scopes sha256(token) [options]").unwrap();
    for (name, scopes, token, options) in clients {
        writeln!(
            file,
            "{name} {scopes} {} {options}",
            hash_hex(token.as_bytes())
        )
        .unwrap();
    }
}

fn standard_clients(path: &Path) {
    write_auth_file(
        path,
        &[
            ("shop", "reserve", SHOP, ""),
            ("ops", "reserve,admin", OPS, ""),
            ("router-1", "router", ROUTER, ""),
        ],
    );
}

async fn replica_with(
    dir: &Path,
    name: &str,
    tweak: impl FnOnce(&mut access::Settings),
) -> (TestReplica, String) {
    let db = migrated_database(PARTITIONS).await;
    let auth = dir.join("auth");
    standard_clients(&auth);
    let mut config = fast_config(&db, name);
    config.access.auth_file = Some(auth);
    tweak(&mut config.access);
    let replica = TestReplica::start(config).await;
    wait_owns_all_locally(&replica).await;
    (replica, db)
}

/// One answer: its status, headers and problem document (if it is one).
pub struct Call {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub problem: Option<Problem>,
}

/// `method` on `url` with an optional bearer `token`, `extra` headers and a JSON `body`.
pub async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    extra: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Call {
    let mut request = http().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let headers = response.headers().clone();
    let is_problem = headers
        .get("content-type")
        .is_some_and(|v| v == PROBLEM_CONTENT_TYPE);
    let problem = if is_problem {
        response.json().await.ok()
    } else {
        None
    };
    Call {
        status,
        headers,
        problem,
    }
}

fn adjust(id: &str, delta: i64) -> serde_json::Value {
    json!({"adjustment_id": id, "delta": delta})
}

fn reserve(id: &str, sku: &str) -> serde_json::Value {
    json!({"reservation_id": id, "sku": sku, "quantity": 1})
}

/// Value of one series in `/metrics`, 0 when absent.
pub async fn metric(base: &str, series: &str) -> f64 {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn tokens_and_scopes_decide_who_may_do_what() {
    let dir = tempfile::tempdir().unwrap();
    let (replica, _db) = replica_with(dir.path(), "auth-scopes", |_| {}).await;
    let base = &replica.url;
    let adjust_url = format!("{base}/v1/inventory/auth-sku/adjustments");
    let reserve_url = format!("{base}/v1/reservations");
    use reqwest::Method;

    // Probes and the scrape stay open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = call(Method::GET, &format!("{base}{path}"), None, &[], None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
    }

    // No token, a malformed header, an unknown token: 401 with a Bearer challenge.
    let none = call(
        Method::POST,
        &reserve_url,
        None,
        &[],
        Some(reserve("r-0", "auth-sku")),
    )
    .await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    let challenge = none.headers.get("www-authenticate").expect("challenge");
    assert!(
        challenge.to_str().unwrap().starts_with("Bearer"),
        "{challenge:?}"
    );
    assert_eq!(none.problem.unwrap().kind, problem_type::UNAUTHENTICATED);
    let wrong = call(
        Method::POST,
        &reserve_url,
        Some("not-a-known-token"),
        &[],
        Some(reserve("r-0", "auth-sku")),
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_token"));
    let basic = call(
        Method::GET,
        &format!("{base}/v1/inventory/auth-sku"),
        None,
        &[("authorization", "Basic c2hvcDpzaG9w")],
        None,
    )
    .await;
    assert_eq!(basic.status, StatusCode::UNAUTHORIZED);
    // The hash from the file is not a token.
    let hash = hash_hex(SHOP.as_bytes());
    let by_hash = call(
        Method::GET,
        &format!("{base}/v1/inventory/auth-sku"),
        Some(&hash),
        &[],
        None,
    )
    .await;
    assert_eq!(by_hash.status, StatusCode::UNAUTHORIZED);

    // A reserve token may not restock.
    let forbidden = call(
        Method::POST,
        &adjust_url,
        Some(SHOP),
        &[],
        Some(adjust("a-1", 5)),
    )
    .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let problem = forbidden.problem.expect("problem");
    assert_eq!(problem.kind, problem_type::FORBIDDEN);
    assert!(problem.detail.unwrap().contains("admin"));
    // Nothing was applied: the SKU does not exist.
    let missing = call(
        Method::GET,
        &format!("{base}/v1/inventory/auth-sku"),
        Some(SHOP),
        &[],
        None,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // An admin token may.
    let restocked = call(
        Method::POST,
        &adjust_url,
        Some(OPS),
        &[],
        Some(adjust("a-1", 5)),
    )
    .await;
    assert_eq!(restocked.status, StatusCode::CREATED);
    let held = call(
        Method::POST,
        &reserve_url,
        Some(SHOP),
        &[],
        Some(reserve("r-1", "auth-sku")),
    )
    .await;
    assert_eq!(held.status, StatusCode::CREATED);

    // A direct caller cannot claim to be another client; only routers may name one.
    let spoofed = call(
        Method::POST,
        &adjust_url,
        Some(SHOP),
        &[(HEADER_CLIENT, "ops")],
        Some(adjust("a-2", 5)),
    )
    .await;
    assert_eq!(spoofed.status, StatusCode::FORBIDDEN);
    // A router stands in for the client it names, which is what gets counted.
    let via_router = call(
        Method::POST,
        &reserve_url,
        Some(ROUTER),
        &[(HEADER_CLIENT, "checkout-eu")],
        Some(reserve("r-2", "auth-sku")),
    )
    .await;
    assert_eq!(via_router.status, StatusCode::CREATED);

    let series = |client: &str, outcome: &str| {
        format!("allocator_client_requests_total{{client=\"{client}\",outcome=\"{outcome}\"}}")
    };
    assert!(metric(base, &series("shop", "forbidden")).await >= 2.0);
    assert!(metric(base, &series("(none)", "unauthenticated")).await >= 4.0);
    assert!(metric(base, &series("checkout-eu", "ok")).await >= 1.0);
    assert_eq!(metric(base, &series("router-1", "ok")).await, 0.0);
    replica.stop().await;
}

#[tokio::test]
async fn a_replica_that_requires_routers_refuses_direct_callers() {
    let dir = tempfile::tempdir().unwrap();
    let (replica, _db) =
        replica_with(dir.path(), "auth-router-only", |s| s.require_router = true).await;
    let base = &replica.url;
    use reqwest::Method;
    let direct = call(
        Method::POST,
        &format!("{base}/v1/inventory/ro-sku/adjustments"),
        Some(OPS),
        &[],
        Some(adjust("ro-1", 3)),
    )
    .await;
    assert_eq!(direct.status, StatusCode::FORBIDDEN);
    assert!(direct
        .problem
        .unwrap()
        .detail
        .unwrap()
        .contains("routers only"));
    let routed = call(
        Method::POST,
        &format!("{base}/v1/inventory/ro-sku/adjustments"),
        Some(ROUTER),
        &[(HEADER_CLIENT, "ops")],
        Some(adjust("ro-1", 3)),
    )
    .await;
    assert_eq!(routed.status, StatusCode::CREATED);
    // Probes need no router.
    let ready = call(Method::GET, &format!("{base}/readyz"), None, &[], None).await;
    assert_eq!(ready.status, StatusCode::OK);
    replica.stop().await;
}

#[tokio::test]
async fn a_client_over_its_rate_gets_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let (replica, _db) = replica_with(dir.path(), "auth-rate", |s| {
        s.rate = Some(0.5);
        s.burst = Some(3);
    })
    .await;
    let url = format!("{}/v1/inventory/rate-sku", replica.url);
    use reqwest::Method;
    for i in 0..3 {
        let answer = call(Method::GET, &url, Some(SHOP), &[], None).await;
        assert_eq!(
            answer.status,
            StatusCode::NOT_FOUND,
            "request {i} is within the burst"
        );
    }
    let limited = call(Method::GET, &url, Some(SHOP), &[], None).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    // At 0.5/s the next token is up to 2 s away: rounded up, never 0.
    let retry_after: u64 = limited.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    assert_eq!(limited.problem.unwrap().kind, problem_type::RATE_LIMITED);
    // Another client has its own bucket.
    let other = call(Method::GET, &url, Some(OPS), &[], None).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    // After the wait the client is served again.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let again = call(Method::GET, &url, Some(SHOP), &[], None).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    let series = "allocator_client_requests_total{client=\"shop\",outcome=\"rate_limited\"}";
    assert!(metric(&replica.url, series).await >= 1.0);
    replica.stop().await;
}

#[tokio::test]
async fn a_client_at_its_concurrency_cap_gets_429() {
    let dir = tempfile::tempdir().unwrap();
    let (replica, db) = replica_with(dir.path(), "auth-concurrency", |s| {
        s.concurrency = NonZeroUsize::new(1)
    })
    .await;
    let base = replica.url.clone();
    use reqwest::Method;
    let restocked = call(
        Method::POST,
        &format!("{base}/v1/inventory/slow-sku/adjustments"),
        Some(OPS),
        &[],
        Some(adjust("slow-a", 10)),
    )
    .await;
    assert_eq!(restocked.status, StatusCode::CREATED);

    // Hold the SKU's row from outside, so a reserve of it stays in flight until the batch's
    // lock timeout.
    let mut client = client(&db).await;
    let tx = client.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM inventory WHERE sku = 'slow-sku' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    let slow_url = format!("{base}/v1/reservations");
    let started = Instant::now();
    let slow = tokio::spawn(async move {
        call(
            Method::POST,
            &slow_url,
            Some(SHOP),
            &[],
            Some(reserve("slow-r", "slow-sku")),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let capped = call(
        Method::GET,
        &format!("{base}/v1/inventory/slow-sku"),
        Some(SHOP),
        &[],
        None,
    )
    .await;
    let capped_at = started.elapsed();
    assert_eq!(
        capped.status,
        StatusCode::TOO_MANY_REQUESTS,
        "after {capped_at:?}"
    );
    assert_eq!(capped.headers["retry-after"], "1");
    assert!(capped
        .problem
        .unwrap()
        .detail
        .unwrap()
        .contains("in flight"));
    // Another client is not held back by shop's request.
    let other = call(
        Method::GET,
        &format!("{base}/v1/inventory/slow-sku"),
        Some(OPS),
        &[],
        None,
    )
    .await;
    assert_eq!(other.status, StatusCode::OK);
    let slow = slow.await.unwrap();
    assert!(
        started.elapsed() > capped_at,
        "the first request was still in flight when the second was refused"
    );
    tx.rollback().await.unwrap();
    // The slot came back with the answer (whatever it was).
    assert_ne!(slow.status, StatusCode::TOO_MANY_REQUESTS);
    let after = call(
        Method::GET,
        &format!("{base}/v1/inventory/slow-sku"),
        Some(SHOP),
        &[],
        None,
    )
    .await;
    assert_eq!(after.status, StatusCode::OK);
    let series = "allocator_client_requests_total{client=\"shop\",outcome=\"concurrency_limited\"}";
    assert!(metric(&base, series).await >= 1.0);
    replica.stop().await;
}
