//! Where a routed request's time went, on its answer: the router's stages first, then the
//! owner's, in one `Server-Timing` header (DESIGN.md §10); a request the router answers itself
//! forwarded nothing and carries none.

use crate::common::{http, serial, Cluster};
use serde_json::json;

const PARTITIONS: u32 = 8;

fn stage_names(response: &reqwest::Response) -> Option<Vec<String>> {
    let value = response.headers().get("server-timing")?.to_str().ok()?;
    Some(
        value
            .split(", ")
            .map(|entry| entry.split(";dur=").next().unwrap_or_default().to_owned())
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_reserve_says_where_its_time_went_in_both_services() {
    let _serial = serial().await;
    let cluster = Cluster::start("stages", 1, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let base = &router.url;
    let client = http();
    cluster.restock(base, "stage-sku", 5).await;

    let response = client
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": "stage-1", "sku": "stage-sku", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(
        stage_names(&response).expect("a Server-Timing header"),
        [
            "accept",
            "map",
            "connect",
            "upstream",
            "retry",
            "reply",
            "admission",
            "queue",
            "batch",
            "lane",
            "statement",
            "answer"
        ]
    );

    let refused = client
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": "stage-2", "sku": "bad sku", "quantity": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(stage_names(&refused), None);
    router.stop().await;
}
