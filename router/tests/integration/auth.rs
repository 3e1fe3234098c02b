//! Authentication end to end: clients authenticate at the router, the router authenticates to
//! allocators with its own token and names the client, and allocators that require routers
//! refuse everyone else.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use access::table::hash_hex;
use reqwest::{Method, StatusCode};
use schema::wire::{problem_type, Problem};
use serde_json::json;

use crate::common::{http, metric, serial, Cluster};

pub(crate) const SHOP: &str = "shop-token-3f9a1c7e5b2d";
pub(crate) const OPS: &str = "ops-token-8e6c4a2f0d1b";
pub(crate) const ROUTER: &str = "router-token-7a5c3e1f9b0d";

pub(crate) fn auth_file(path: &Path, clients: &[(&str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token) in clients {
        writeln!(file, "{name} {scopes} {}", hash_hex(token.as_bytes())).unwrap();
    }
}

pub(crate) async fn send(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (StatusCode, reqwest::header::HeaderMap, Option<Problem>) {
    let mut request = http().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let headers = response.headers().clone();
    let problem = response.json::<Problem>().await.ok();
    (status, headers, problem)
}

/// Sum of one series over every allocator.
async fn allocator_metric(cluster: &Cluster, series: &str) -> f64 {
    let mut total = 0.0;
    for allocator in &cluster.allocators {
        total += metric(&allocator.url, series).await;
    }
    total
}

fn client_series(prefix: &str, client: &str, outcome: &str) -> String {
    format!("{prefix}_client_requests_total{{client=\"{client}\",outcome=\"{outcome}\"}}")
}

/// At the router, a request without a token or with one it does not know is a 401 (the
/// allocators' router token is not a client token), a reserve token may not restock, and an
/// admin token may (through the router's credential, once the allocators are reachable).
async fn refused_without_a_client_token_or_scope(base: &str) {
    // No token, or a token the router does not know: 401 at the router.
    let (status, headers, problem) = send(
        Method::POST,
        &format!("{base}/v1/reservations"),
        None,
        Some(json!({"reservation_id": "a-0", "sku": "auth-1", "quantity": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.contains_key("www-authenticate"));
    assert_eq!(problem.unwrap().kind, problem_type::UNAUTHENTICATED);
    // The allocators' router token is not a client token at the router.
    let (status, ..) = send(
        Method::GET,
        &format!("{base}/v1/inventory/auth-1"),
        Some(ROUTER),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A reserve token may not restock; an admin token may (through the router's credential).
    let adjust_url = format!("{base}/v1/inventory/auth-1/adjustments");
    let restock = json!({"adjustment_id": "auth-restock", "delta": 10});
    let (status, _, problem) =
        send(Method::POST, &adjust_url, Some(SHOP), Some(restock.clone())).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(problem.unwrap().kind, problem_type::FORBIDDEN);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, ..) = send(Method::POST, &adjust_url, Some(OPS), Some(restock.clone())).await;
        if status.is_success() {
            break;
        }
        assert!(Instant::now() < deadline, "restock kept failing: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A router whose credential the allocators refuse (a wrong one, or none) answers 503 with the
/// outcome known, counts the failure, and never passes the allocator's 401 on as if the client's
/// token were wrong; nothing it sent was applied.
async fn a_refused_router_credential_answers_503_and_applies_nothing(
    cluster: &Cluster,
    router_auth: &Path,
    token_file: &Path,
    dir: &Path,
) {
    let wrong_token = dir.join("wrong-token");
    std::fs::write(&wrong_token, "not-the-router-token").unwrap();
    for credential in [Some(wrong_token.clone()), None] {
        let refused = cluster
            .router(|c| {
                c.access.auth_file = Some(router_auth.to_path_buf());
                c.upstream_token_file = credential.clone();
            })
            .await;
        let failures_before = metric(&refused.url, "router_upstream_auth_failures_total").await;
        let (status, _, problem) = send(
            Method::POST,
            &format!("{}/v1/reservations", refused.url),
            Some(SHOP),
            Some(json!({"reservation_id": "a-2", "sku": "auth-1", "quantity": 1})),
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{credential:?}");
        let problem = problem.unwrap();
        assert_eq!(problem.kind, problem_type::UPSTREAM_UNAVAILABLE);
        assert_eq!(problem.outcome_unknown, Some(false));
        assert!(
            metric(&refused.url, "router_upstream_auth_failures_total").await > failures_before
        );
        refused.stop().await;
    }
    // Nothing was applied by the refused router.
    let (status, ..) = {
        let router = cluster
            .router(|c| {
                c.access.auth_file = Some(router_auth.to_path_buf());
                c.upstream_token_file = Some(token_file.to_path_buf());
            })
            .await;
        let answer = send(
            Method::GET,
            &format!("{}/v1/reservations/a-2", router.url),
            Some(SHOP),
            None,
        )
        .await;
        router.stop().await;
        answer
    };
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_authenticate_at_the_router_which_names_them_to_allocators() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(
        &allocator_auth,
        &[
            ("router-1", "router", ROUTER),
            ("ops", "reserve,admin", OPS),
        ],
    );
    let router_auth = dir.path().join("router-auth");
    auth_file(
        &router_auth,
        &[("shop", "reserve", SHOP), ("ops", "reserve,admin", OPS)],
    );
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, format!("{ROUTER}\n")).unwrap();
    let cluster = Cluster::start_with_env(
        "auth",
        2,
        4,
        vec![
            (
                "ALLOCATOR_AUTH_FILE".into(),
                allocator_auth.display().to_string(),
            ),
            ("ALLOCATOR_REQUIRE_ROUTER".into(), "true".into()),
        ],
    )
    .await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
        })
        .await;
    let base = router.url.clone();

    refused_without_a_client_token_or_scope(&base).await;

    // The shop reserves through the router; allocators count it under its own name.
    let shop_ok = client_series("allocator", "shop", "ok");
    let before = allocator_metric(&cluster, &shop_ok).await;
    let (status, ..) = send(
        Method::POST,
        &format!("{base}/v1/reservations"),
        Some(SHOP),
        Some(json!({"reservation_id": "a-1", "sku": "auth-1", "quantity": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // An order's lines are sent from tasks of their own, and still carry the client.
    let (status, ..) = send(
        Method::POST,
        &format!("{base}/v1/orders/auth-order-1/reservations"),
        Some(SHOP),
        Some(
            json!({"lines": [{"sku": "auth-1", "quantity": 1}, {"sku": "auth-1", "quantity": 2}]}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let after = allocator_metric(&cluster, &shop_ok).await;
    assert!(
        after - before >= 3.0,
        "allocators counted {} requests for shop",
        after - before
    );
    assert_eq!(
        allocator_metric(&cluster, &client_series("allocator", "router-1", "ok")).await,
        0.0,
        "requests are counted for the client, not for the router"
    );

    // The allocators answer routers only: even an admin token is refused when sent directly.
    let direct = &cluster.allocators[0].url;
    let (status, _, problem) = send(
        Method::GET,
        &format!("{direct}/v1/inventory/auth-1"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(problem.unwrap().detail.unwrap().contains("routers only"));
    // Probes stay open on both.
    for url in [format!("{direct}/readyz"), format!("{base}/readyz")] {
        let (status, ..) = send(Method::GET, &url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{url}");
    }
    assert!(metric(&base, &client_series("router", "shop", "forbidden")).await >= 1.0);
    assert!(metric(&base, &client_series("router", "(none)", "unauthenticated")).await >= 1.0);
    router.stop().await;

    a_refused_router_credential_answers_503_and_applies_nothing(
        &cluster,
        &router_auth,
        &token_file,
        dir.path(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_limits_each_client() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let router_auth = dir.path().join("router-auth");
    auth_file(
        &router_auth,
        &[("shop", "reserve", SHOP), ("ops", "reserve,admin", OPS)],
    );
    let cluster = Cluster::start("auth-limits", 1, 2).await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.access.rate = Some(1.0);
            c.access.burst = Some(2);
        })
        .await;
    let url = format!("{}/v1/partitions", router.url);
    use reqwest::Method;
    for _ in 0..2 {
        let (status, ..) = send(Method::GET, &url, Some(SHOP), None).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, headers, problem) = send(Method::GET, &url, Some(SHOP), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(problem.unwrap().kind, problem_type::RATE_LIMITED);
    let (status, ..) = send(Method::GET, &url, Some(OPS), None).await;
    assert_eq!(status, StatusCode::OK, "another client has its own bucket");
    assert!(
        metric(
            &router.url,
            &client_series("router", "shop", "rate_limited")
        )
        .await
            >= 1.0
    );
    router.stop().await;
}
