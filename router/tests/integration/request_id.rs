//! `X-Request-Id` through a router in front of real allocators: the client's id reaches the
//! owner and comes back; without one (or with an unacceptable one) the router makes one.

use crate::common::{http, serial, Cluster};
use schema::wire::{HEADER_REQUEST_ID, REQUEST_ID_MAX_LEN};
use serde_json::json;

const PARTITIONS: u32 = 8;

fn request_id(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(HEADER_REQUEST_ID)
        .expect("response carries a request id")
        .to_str()
        .expect("visible ascii")
        .to_owned()
}

fn is_generated(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_request_id_reaches_the_owner_and_comes_back() {
    let _serial = serial().await;
    let cluster = Cluster::start("request_id_client", 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    let client = http();
    cluster.restock(base, "rid-sku", 5).await;

    // The owner echoes the id it received and the router passes its answer through unchanged
    // (it only adds an id to answers that have none), so the same id on a forwarded answer
    // means the owner got it.
    let response = client
        .post(format!("{base}/v1/reservations"))
        .header(HEADER_REQUEST_ID, "client-id-7f3a")
        .json(&json!({"reservation_id": "rid-1", "sku": "rid-sku", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert!(response.headers().contains_key("x-served-by"), "forwarded");
    assert_eq!(request_id(&response), "client-id-7f3a");

    // A forwarded problem answer carries it too.
    let response = client
        .post(format!("{base}/v1/reservations"))
        .header(HEADER_REQUEST_ID, "client-id-conflict")
        .json(&json!({"reservation_id": "rid-2", "sku": "rid-sku", "quantity": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 409);
    assert!(response.headers().contains_key("x-served-by"), "forwarded");
    assert_eq!(request_id(&response), "client-id-conflict");

    // An answer the router makes itself (a refused value) carries the client's id.
    let response = client
        .post(format!("{base}/v1/reservations"))
        .header(HEADER_REQUEST_ID, "client-id-bad")
        .json(&json!({"reservation_id": "rid-3", "sku": "bad sku", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert_eq!(request_id(&response), "client-id-bad");
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_an_acceptable_id_gets_a_new_one() {
    let _serial = serial().await;
    let cluster = Cluster::start("request_id_generated", 2, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    let client = http();
    cluster.restock(base, "gen-sku", 5).await;

    let mut seen = Vec::new();
    for (i, sent) in [
        None,
        Some("x".repeat(REQUEST_ID_MAX_LEN + 1)),
        Some("has space".to_owned()),
    ]
    .into_iter()
    .enumerate()
    {
        let mut request = client
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": format!("gen-{i}"), "sku": "gen-sku", "quantity": 1}));
        if let Some(sent) = &sent {
            request = request.header(HEADER_REQUEST_ID, sent);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 201, "{sent:?}");
        assert!(response.headers().contains_key("x-served-by"), "forwarded");
        let id = request_id(&response);
        assert!(is_generated(&id), "{sent:?} → {id:?}");
        seen.push(id);
    }
    // Answered by the router alone.
    let response = client
        .get(format!("{base}/no/such/route"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    seen.push(request_id(&response));
    assert!(is_generated(&seen[3]));
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "every request gets its own id");
    router.stop().await;
}
