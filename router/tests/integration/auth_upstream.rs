//! What a router and its allocators do about each other's credentials beyond the basics of
//! [`crate::auth`]: a credential refused after an attempt that may have applied leaves the outcome
//! unknown, and only a router may place an order line at an allocator.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::wire::problem_type;
use serde_json::json;

use crate::auth::{auth_file, send, OPS, ROUTER};
use crate::common::{http, metric, serial, Cluster};

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
