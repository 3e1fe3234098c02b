//! `GET /v1/events` through a router over two shards (DESIGN.md §12, §14): `settlement` is the
//! catalog shard's settled windows, `settlement/s1` shard s1's, read from that shard's database;
//! the catalog by name, or a shard the router does not know, is no stream.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::common::{serial, Cluster};

async fn page(url: &str, stream: &str) -> (StatusCode, Value) {
    let answer = reqwest::get(format!("{url}/v1/events?partition={stream}&limit=1000"))
        .await
        .expect("events request");
    let status = answer.status();
    (status, answer.json().await.unwrap_or_default())
}

/// The settled windows' positions of one shard's database.
async fn settled(cluster: &Cluster, shard: usize) -> Vec<i64> {
    let rows = cluster
        .shard_db(shard)
        .await
        .unwrap()
        .query(
            "SELECT position FROM settlement_runs WHERE position IS NOT NULL ORDER BY position",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn a_router_reads_each_shards_settlement_stream_from_that_shard() {
    let _serial = serial().await;
    let cluster = Cluster::start_sharded("shard-events", 2, 2, 8).await;
    let router = cluster.router(|_| {}).await;
    // Each shard settles its own (empty) windows; the first ends within the default 60 s window
    // and its grace.
    let deadline = Instant::now() + Duration::from_secs(150);
    while settled(&cluster, 0).await.is_empty() || settled(&cluster, 1).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no window settled on both shards"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (shard, stream) in [(0, "settlement"), (1, "settlement/s1")] {
        let (status, page) = page(&router.url, stream).await;
        assert_eq!(status, StatusCode::OK, "{stream}: {page}");
        assert_eq!(page["stream"], stream);
        let events = page["events"].as_array().expect("events");
        let positions: Vec<i64> = events
            .iter()
            .map(|e| e["position"].as_i64().unwrap())
            .collect();
        let want = settled(&cluster, shard).await;
        assert!(
            !positions.is_empty() && want.starts_with(&positions),
            "{stream}: {positions:?} of {want:?}"
        );
        for e in events {
            let key = e["key"].as_str().unwrap();
            assert_eq!(key, format!("{stream}:{}", e["position"]), "{e}");
            assert_eq!(e["shard"].as_str(), (shard == 1).then_some("s1"), "{e}");
        }
    }
    for (stream, want) in [
        ("settlement/s0", StatusCode::NOT_FOUND),
        ("settlement/s9", StatusCode::NOT_FOUND),
        ("settlement/S1", StatusCode::BAD_REQUEST),
    ] {
        let (status, page) = page(&router.url, stream).await;
        assert_eq!(status, want, "{stream}: {page}");
    }
}
