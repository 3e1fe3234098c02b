//! A client's in-flight slot is held for as long as its request's work runs, not only while the
//! client waits for the answer: an order keeps running when its client's connection is reset,
//! and so does the slot it took (`--client-concurrency`).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use schema::wire::problem_type;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::common::{http, serial, Cluster};

async fn inventory(base: &str) -> (StatusCode, Value) {
    let response = http()
        .get(format!("{base}/v1/inventory/slot:1"))
        .send()
        .await
        .expect("inventory");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_keeps_its_in_flight_slot_after_its_client_disconnects() {
    let _serial = serial().await;
    let cluster = Cluster::start("in_flight", 1, 2).await;
    let router = cluster
        .router(|c| c.access.concurrency = NonZeroUsize::new(1))
        .await;
    let base = router.url.clone();
    cluster.restock(&base, "slot:1", 5).await;

    // The order waits for its row, which the test holds locked, so it outlives its client.
    let lines = json!([{"sku": "slot:1", "quantity": 1}]);
    let db = cluster.db().await;
    db.execute(
        "INSERT INTO orders (order_id, request) VALUES ('o-slow', $1::text::jsonb)",
        &[&json!({ "lines": lines }).to_string()],
    )
    .await
    .unwrap();
    let mut holder = cluster.db().await;
    let lock = holder.transaction().await.unwrap();
    lock.execute(
        "SELECT 1 FROM orders WHERE order_id = 'o-slow' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    // The client sends the order and goes away with a reset (a crash, a proxy giving up): the
    // server's read fails, and the connection's work is dropped while the order goes on.
    let body = json!({ "lines": lines }).to_string();
    let mut client = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let request = format!(
        "POST /v1/orders/o-slow/reservations HTTP/1.1\r\nHost: router\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A zero linger resets at once; it never blocks the thread on drop (the deprecation's
    // concern is a positive linger).
    #[allow(deprecated)]
    client.set_linger(Some(Duration::ZERO)).unwrap();
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = db
        .query_one("SELECT status FROM orders WHERE order_id = 'o-slow'", &[])
        .await
        .unwrap();
    assert_eq!(waiting.get::<_, &str>(0), "pending");

    // The client's one slot is still the order's.
    let (status, body) = inventory(&base).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["type"], problem_type::RATE_LIMITED, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("in flight"),
        "{body}"
    );

    // Once the order has run to its end, the slot is free again.
    lock.rollback().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = db
            .query_one("SELECT status FROM orders WHERE order_id = 'o-slow'", &[])
            .await
            .unwrap();
        let (status, body) = inventory(&base).await;
        if row.get::<_, &str>(0) == "placed" && status == StatusCode::OK {
            assert_eq!(body["held"], 1, "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "order {} / inventory {status}: {body}",
            row.get::<_, &str>(0)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    router.stop().await;
}
