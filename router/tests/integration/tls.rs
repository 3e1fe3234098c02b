//! HTTPS end to end: a client calls a router over TLS, the router calls an allocator over mutual
//! TLS (verifying it against a CA file and presenting its client certificate), the allocator
//! refuses callers without a certificate its client CA signed, and SIGHUP swaps the allocator's
//! certificate. Certificates come from `rcgen` ([`testkit::TestPki`]).

use std::time::{Duration, Instant};

use access::tls::{ClientTls, ClientTlsSettings, PemFile, ServerTlsSettings};
use reqwest::StatusCode;
use serde_json::json;
use testkit::{free_port, TestPki};

use crate::common::{balanced, metric, serial, Cluster};

/// A client that trusts the test CA, presenting `identity` if given, reporting the peer's
/// certificate. A new one opens new connections (a reload shows only on those).
fn https(pki: &TestPki, identity: Option<(&std::path::Path, &std::path::Path)>) -> reqwest::Client {
    let tls = ClientTls::load(ClientTlsSettings {
        ca: PemFile::new("test CA", &pki.ca_cert),
        identity: identity.map(|(c, k)| (PemFile::new("cert", c), PemFile::new("key", k))),
    })
    .unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls.client_config().unwrap())
        .tls_info(true)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn peer_certificate(response: &reqwest::Response) -> Vec<u8> {
    response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("a TLS answer carries the peer's certificate")
        .to_vec()
}

/// The router's port speaks TLS only, and the allocator answers only clients with a certificate
/// of the test CA (the router's identity), neither anonymous ones nor another CA's.
async fn only_tls_and_the_cas_clients_are_answered(
    pki: &TestPki,
    client: &reqwest::Client,
    router_url: &str,
    allocator_url: &str,
) {
    let plain = reqwest::Client::new()
        .get(format!("{router_url}/healthz"))
        .send()
        .await;
    assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));
    let anonymous = client.get(format!("{allocator_url}/healthz")).send().await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let stranger = https(
        pki,
        Some((pki.stranger_cert.as_path(), pki.stranger_key.as_path())),
    );
    let refused = stranger
        .get(format!("{allocator_url}/healthz"))
        .send()
        .await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
    let router_identity = (pki.client_cert.as_path(), pki.client_key.as_path());
    let direct = https(pki, Some(router_identity))
        .get(format!("{allocator_url}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_end_to_end_with_mutual_tls_between_router_and_allocator() {
    let _serial = serial().await;
    let pki = TestPki::generate().unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    let mut cluster = Cluster::start_with_env(
        "tls",
        0,
        4,
        vec![
            ("ALLOCATOR_TLS_CERT".into(), path(&pki.server_cert)),
            ("ALLOCATOR_TLS_KEY".into(), path(&pki.server_key)),
            ("ALLOCATOR_TLS_CLIENT_CA".into(), path(&pki.ca_cert)),
        ],
    )
    .await;
    let port = free_port();
    let allocator_url = format!("https://localhost:{port}");
    cluster.spawn_allocator_at("alloc-0", port, allocator_url.clone());
    cluster
        .wait_map(Duration::from_secs(30), |m| balanced(m, &["alloc-0"], 4))
        .await;
    let router = cluster
        .router(|c| {
            c.tls = Some(ServerTlsSettings {
                cert: PemFile::new("--tls-cert", &pki.server_cert),
                key: PemFile::new("--tls-key", &pki.server_key),
                client_ca: None,
            });
            c.upstream_tls = Some(ClientTlsSettings {
                ca: PemFile::new("--upstream-ca", &pki.ca_cert),
                identity: Some((
                    PemFile::new("--upstream-client-cert", &pki.client_cert),
                    PemFile::new("--upstream-client-key", &pki.client_key),
                )),
            });
        })
        .await;
    let base = router.url.replace("http://", "https://");
    let client = https(&pki, None);

    // Restock, reserve and confirm through the router, HTTPS on both hops.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = client
            .post(format!("{base}/v1/inventory/tls-1/adjustments"))
            .json(&json!({"adjustment_id": "tls-seed", "delta": 5}))
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status().is_success() => {
                assert_eq!(peer_certificate(&answer), pki.server_der);
                assert_eq!(answer.headers()["x-served-by"], "alloc-0");
                break;
            }
            other => assert!(Instant::now() < deadline, "restock kept failing: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = client
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": "tls-r1", "sku": "tls-1", "quantity": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::CREATED);
    let confirmed = client
        .post(format!("{base}/v1/reservations/tls-r1/confirm"))
        .send()
        .await
        .unwrap();
    assert_eq!(confirmed.status(), StatusCode::OK);

    only_tls_and_the_cas_clients_are_answered(&pki, &client, &router.url, &allocator_url).await;
    let router_identity = (pki.client_cert.as_path(), pki.client_key.as_path());

    // A router without the client certificate is refused by the allocator: 503, nothing applied.
    let no_identity = cluster
        .router(|c| {
            c.upstream_tls = Some(ClientTlsSettings {
                ca: PemFile::new("--upstream-ca", &pki.ca_cert),
                identity: None,
            });
            c.retry_deadline = Duration::from_millis(800);
        })
        .await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/reservations", no_identity.url))
        .json(&json!({"reservation_id": "tls-r2", "sku": "tls-1", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    no_identity.stop().await;

    // SIGHUP makes the allocator serve a renewed certificate on new connections.
    let renewed = pki.renew_server().unwrap();
    cluster.allocators[0]
        .process
        .as_mut()
        .unwrap()
        .sighup()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = https(&pki, Some(router_identity))
            .get(format!("{allocator_url}/healthz"))
            .send()
            .await
            .unwrap();
        if peer_certificate(&answer) == renewed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The router, verifying against the same CA, still reaches it.
    let released = client
        .post(format!("{base}/v1/reservations/tls-r1/release"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        released.status(),
        StatusCode::CONFLICT,
        "a confirmed hold stays confirmed"
    );
    router.stop().await;
}

/// With upstream TLS configured, an owner advertising a plain `http://` URL is never sent to:
/// the router answers `503 upstream-unavailable` (nothing applied) and counts it; neither the
/// request nor the router's token crosses in clear text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tls_fails_closed_on_a_plain_http_owner() {
    let _serial = serial().await;
    let pki = TestPki::generate().unwrap();
    let cluster = Cluster::start("tls_plain_owner", 1, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("router-token");
    std::fs::write(&token_file, "router-token-sent-in-clear-9a8b").unwrap();
    let router = cluster
        .router(|c| {
            c.upstream_tls = Some(ClientTlsSettings {
                ca: PemFile::new("--upstream-ca", &pki.ca_cert),
                identity: None,
            });
            c.upstream_token_file = Some(token_file.clone());
            c.retry_deadline = Duration::from_millis(800);
        })
        .await;
    let refusals = "router_upstream_plain_refusals_total";
    let before = metric(&router.url, refusals).await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/reservations", router.url))
        .json(&json!({"reservation_id": "plain-r1", "sku": "plain-1", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(
        body["type"],
        schema::wire::problem_type::UPSTREAM_UNAVAILABLE,
        "{body}"
    );
    assert_eq!(body["outcome_unknown"], false, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("http://"),
        "the answer says why: {body}"
    );
    assert!(metric(&router.url, refusals).await > before);
    // Nothing reached the allocator.
    let stored = cluster
        .db()
        .await
        .query_opt(
            "SELECT status FROM reservations WHERE reservation_id = 'plain-r1'",
            &[],
        )
        .await
        .unwrap();
    assert!(stored.is_none(), "the allocator got the request");
    router.stop().await;
}
