//! Authentication end to end: clients authenticate at the router, the router authenticates to
//! allocators with its own token and names the client, and allocators that require routers
//! refuse everyone else.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use access::table::hash_hex;
use reqwest::StatusCode;
use schema::wire::{problem_type, Problem};
use serde_json::json;

use crate::common::{http, metric, serial, Cluster};

const SHOP: &str = "shop-token-3f9a1c7e5b2d";
const OPS: &str = "ops-token-8e6c4a2f0d1b";
const ROUTER: &str = "router-token-7a5c3e1f9b0d";

fn auth_file(path: &Path, clients: &[(&str, &str, &str)]) {
    let mut file = std::fs::File::create(path).expect("auth file");
    for (name, scopes, token) in clients {
        writeln!(file, "{name} {scopes} {}", hash_hex(token.as_bytes())).unwrap();
    }
}

async fn send(
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
    use reqwest::Method;

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

    // A router whose credential the allocators refuse answers 503, nothing applied, and never
    // passes the allocator's 401 on as if the client's token were wrong.
    let wrong_token = dir.path().join("wrong-token");
    std::fs::write(&wrong_token, "not-the-router-token").unwrap();
    for credential in [Some(wrong_token.clone()), None] {
        let refused = cluster
            .router(|c| {
                c.access.auth_file = Some(router_auth.clone());
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
                c.access.auth_file = Some(router_auth.clone());
                c.upstream_token_file = Some(token_file.clone());
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

/// The first attempt of a reserve lands (the proxy delays its answer past the attempt timeout);
/// before the retry, the allocator stops accepting this router's credential (its auth file is
/// rotated without it). The retry's `401` says nothing about the first attempt, so the client must
/// hear `outcome_unknown: true`, never "nothing was applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_after_a_timed_out_attempt_leaves_the_outcome_unknown() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let allocator_auth = dir.path().join("allocator-auth");
    auth_file(&allocator_auth, &[("router-1", "router", ROUTER)]);
    let router_auth = dir.path().join("router-auth");
    auth_file(&router_auth, &[("ops", "reserve,admin", OPS)]);
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, format!("{ROUTER}\n")).unwrap();
    let mut cluster = Cluster::start_with_env(
        "auth-unknown",
        0,
        2,
        vec![(
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        )],
    )
    .await;
    let proxy = cluster.spawn_allocator_behind_proxy("alloc-0");
    cluster
        .wait_map(Duration::from_secs(30), |m| {
            crate::common::balanced(m, &["alloc-0"], 2)
        })
        .await;
    let router = cluster
        .router(|c| {
            c.access.auth_file = Some(router_auth.clone());
            c.upstream_token_file = Some(token_file.clone());
            // The first attempt times out long before the proxy hands its answer back; the
            // retry follows 1–2 s later.
            c.allocator_request_timeout = Duration::from_millis(350);
            c.upstream_request_timeout = Duration::from_millis(600);
            c.backoff_base = Duration::from_millis(2000);
            c.backoff_max = Duration::from_millis(2000);
            c.retry_deadline = Duration::from_secs(5);
        })
        .await;
    let base = router.url.clone();
    use reqwest::Method;
    let deadline = Instant::now() + Duration::from_secs(15);
    let restock = json!({"adjustment_id": "unknown-restock", "delta": 10});
    while !send(
        Method::POST,
        &format!("{base}/v1/inventory/unknown-1/adjustments"),
        Some(OPS),
        Some(restock.clone()),
    )
    .await
    .0
    .is_success()
    {
        assert!(Instant::now() < deadline, "restock kept failing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let refusals_before = metric(&base, "router_upstream_auth_failures_total").await;
    proxy.set_mode(testkit::ProxyMode::Delay(Duration::from_millis(1000)));
    let reserve = tokio::spawn({
        let url = format!("{base}/v1/reservations");
        async move {
            send(
                Method::POST,
                &url,
                Some(OPS),
                Some(json!({"reservation_id": "maybe-1", "sku": "unknown-1", "quantity": 1})),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set_mode(testkit::ProxyMode::Pass);
    // Once the first attempt has committed, the allocator drops the router's credential.
    let db = cluster.db().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while db
        .query_opt(
            "SELECT 1 FROM reservations WHERE reservation_id = 'maybe-1'",
            &[],
        )
        .await
        .unwrap()
        .is_none()
    {
        assert!(Instant::now() < deadline, "the first attempt never landed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    auth_file(
        &allocator_auth,
        &[("someone-else", "router", "another-token-1")],
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cluster.allocators[0].process.as_ref().unwrap().pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();

    let (status, _, problem) = reserve.await.unwrap();
    let problem = problem.expect("a problem document");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem:?}");
    assert_eq!(problem.kind, problem_type::UPSTREAM_UNAVAILABLE);
    // The allocator did refuse the retry for the credential (the scenario happened) ...
    assert!(
        metric(&base, "router_upstream_auth_failures_total").await > refusals_before,
        "{problem:?}"
    );
    // ... and the first attempt is held: the answer must not say nothing was applied.
    let held: String = db
        .query_one(
            "SELECT status FROM reservations WHERE reservation_id = 'maybe-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, "held");
    assert_eq!(problem.outcome_unknown, Some(true), "{problem:?}");
    router.stop().await;
}

/// With authentication on, an allocator takes an id in the order-line namespace only from a
/// router marking an order line: a client calling it directly cannot, header or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_router_may_place_an_order_line_at_an_allocator() {
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
    let cluster = Cluster::start_with_env(
        "auth-lines",
        1,
        2,
        vec![(
            "ALLOCATOR_AUTH_FILE".into(),
            allocator_auth.display().to_string(),
        )],
    )
    .await;
    let direct = cluster.allocators[0].url.clone();
    use reqwest::Method;
    let deadline = Instant::now() + Duration::from_secs(15);
    let restock = json!({"adjustment_id": "lines-restock", "delta": 10});
    let adjust = format!("{direct}/v1/inventory/lines-1/adjustments");
    while !send(Method::POST, &adjust, Some(OPS), Some(restock.clone()))
        .await
        .0
        .is_success()
    {
        assert!(Instant::now() < deadline, "restock kept failing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reserve = |token: &'static str, marked: bool, id: &'static str| {
        let mut request = http()
            .post(format!("{direct}/v1/reservations"))
            .bearer_auth(token)
            .json(&json!({"reservation_id": id, "sku": "lines-1", "quantity": 1}));
        if marked {
            request = request.header(schema::wire::HEADER_ORDER_LINE, "true");
        }
        async move {
            let response = request.send().await.expect("reserve");
            let status = response.status();
            (status, response.text().await.unwrap_or_default())
        }
    };
    for marked in [false, true] {
        let (status, body) = reserve(OPS, marked, "order:lines:0").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "marked {marked}: {body}");
        assert!(body.contains(problem_type::INVALID_REQUEST), "{body}");
    }
    // Unmarked, not even a router places one (only its orders mark their lines).
    let (status, body) = reserve(ROUTER, false, "order:lines:0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = reserve(ROUTER, true, "order:lines:0").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Ids outside the namespace are anyone's.
    let (status, body) = reserve(OPS, true, "lines:0").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
