//! What the settlement tests share: replicas with short windows, a confirmation load over HTTP,
//! waits on the job's status, and the exactly-once recomputation every test ends with
//! ([`assert_settled_exactly_once`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::{spawn_replica_with, Replica};
use schema::partition::partition_for;
use schema::wire::SettlementStatus;
use serde_json::json;

pub(crate) const TTL_MS: u64 = 2000;
pub(crate) const SKUS: [&str; 4] = ["settle-a", "settle-b", "settle-c", "settle-d"];

/// Grace of every replica these tests start: the spawned replicas' statement timeout is 1 s.
pub(crate) const GRACE_MS: u64 = 1500;

/// One-second windows, and optionally a pause between the first claim and its settle.
pub(crate) fn settlement_env(pause_ms: Option<u64>) -> Vec<(String, String)> {
    settlement_env_with(1, pause_ms)
}

pub(crate) fn settlement_env_with(
    window_secs: u64,
    pause_ms: Option<u64>,
) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "ALLOCATOR_SETTLEMENT_WINDOW_SECS".to_string(),
            window_secs.to_string(),
        ),
        (
            "ALLOCATOR_SETTLEMENT_GRACE_MS".to_string(),
            GRACE_MS.to_string(),
        ),
    ];
    if let Some(ms) = pause_ms {
        env.push((
            allocator::faults::SETTLE_PAUSE_ENV.to_string(),
            ms.to_string(),
        ));
    }
    env
}

pub(crate) fn replica(db: &str, id: &str, extra: Vec<(String, String)>) -> Replica {
    spawn_replica_with(db, id, TTL_MS, extra)
}

pub(crate) async fn status(db: &str) -> SettlementStatus {
    schema::settlement::read_status(&client(db).await)
        .await
        .expect("settlement status")
}

pub(crate) async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn wait_for_holder(db: &str, holder: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(db).await;
        if s.holder_id.as_deref() == Some(holder) {
            return s.term;
        }
        assert!(
            Instant::now() < deadline,
            "{holder} never held the job: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Number of settled windows.
pub(crate) async fn settled_windows(db: &str) -> i64 {
    status(db).await.settled_windows
}

/// A `running` run claimed by `holder`, if any: (window start, term).
pub(crate) async fn running_run(
    db: &str,
    holder: &str,
) -> Option<(chrono::DateTime<chrono::Utc>, i64)> {
    client(db)
        .await
        .query_opt(
            "SELECT window_start, term FROM settlement_runs
              WHERE status = 'running' AND holder_id = $1",
            &[&holder],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

pub(crate) async fn wait_for_running_run(
    db: &str,
    holder: &str,
) -> (chrono::DateTime<chrono::Utc>, i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(run) = running_run(db, holder).await {
            return run;
        }
        assert!(Instant::now() < deadline, "no run opened by {holder}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reserves and confirms over HTTP at the partitions' owners until stopped; returns the number
/// of confirmations that were acknowledged.
pub(crate) struct ConfirmLoad {
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ConfirmLoad {
    pub(crate) fn start(db: String, prefix: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let confirmed = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (stop, confirmed) = (stop.clone(), confirmed.clone());
            async move {
                let http = http();
                let mut pg = None;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let sku = SKUS[i as usize % SKUS.len()];
                    let id = format!("{prefix}-{i}");
                    // Whatever happens to this id, the recomputation reads what was committed.
                    if confirm_once(&http, &mut pg, &db, sku, &id).await {
                        confirmed.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }
        });
        Self {
            stop,
            confirmed,
            task,
        }
    }

    pub(crate) async fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.confirmed.load(Ordering::Relaxed)
    }
}

/// The owner of `sku`'s partition by the database; `None` while unowned or unreadable (the
/// connection is kept across calls and dropped when it fails).
pub(crate) async fn owner_url(
    pg: &mut Option<tokio_postgres::Client>,
    db: &str,
    sku: &str,
) -> Option<String> {
    if pg.as_ref().is_none_or(|c| c.is_closed()) {
        *pg = allocator::sessions::connect(db).await.ok();
    }
    let map = schema::assignment::read_map(pg.as_ref()?).await.ok()?;
    let partition = partition_for(sku, map.partition_count);
    map.partitions[partition as usize].owner_url.clone()
}

pub(crate) async fn confirm_once(
    http: &reqwest::Client,
    pg: &mut Option<tokio_postgres::Client>,
    db: &str,
    sku: &str,
    id: &str,
) -> bool {
    for op in ["reserve", "confirm"] {
        let Some(url) = owner_url(pg, db, sku).await else {
            return false;
        };
        let request = if op == "reserve" {
            http.post(format!("{url}/v1/reservations"))
                .json(&json!({"reservation_id": id, "sku": sku, "quantity": 1}))
        } else {
            http.post(format!("{url}/v1/reservations/{id}/confirm"))
        };
        match request.timeout(Duration::from_secs(2)).send().await {
            Ok(response) if response.status().is_success() => {}
            _ => return false,
        }
    }
    true
}

pub(crate) async fn seed_stock(db: &str) {
    let mut pg = None;
    for sku in SKUS {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(url) = owner_url(&mut pg, db, sku).await {
                let response = http()
                    .post(format!("{url}/v1/inventory/{sku}/adjustments"))
                    .json(&json!({"adjustment_id": format!("seed-{sku}"), "delta": 1_000_000}))
                    .send()
                    .await;
                if response.is_ok_and(|r| r.status().is_success()) {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "could not stock {sku}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Exactly once, recomputed independently of the ledger the job read: the settled windows are
/// contiguous (no gap, no overlap), every one before the last is settled, and each window's
/// per-SKU totals equal the confirmed reservations whose confirmation falls in it. Returns the
/// number of reservations settled.
pub(crate) async fn assert_settled_exactly_once(db: &str) -> i64 {
    let pg = client(db).await;
    let runs = pg
        .query(
            "SELECT window_start, window_end, status FROM settlement_runs ORDER BY window_start",
            &[],
        )
        .await
        .unwrap();
    assert!(!runs.is_empty(), "nothing was settled");
    for pair in runs.windows(2) {
        let end: chrono::DateTime<chrono::Utc> = pair[0].get(1);
        let next_start: chrono::DateTime<chrono::Utc> = pair[1].get(0);
        assert_eq!(end, next_start, "windows must be contiguous");
        assert_eq!(
            pair[0].get::<_, String>(2),
            "settled",
            "only the last run may be open"
        );
    }
    let mismatches: i64 = pg
        .query_one(
            "WITH recomputed AS (
                 SELECT w.window_start, r.sku, sum(r.quantity) AS quantity, count(*) AS n
                   FROM settlement_runs AS w
                   JOIN reservations AS r
                     ON r.status = 'confirmed'
                    AND r.updated_at >= w.window_start AND r.updated_at < w.window_end
                  WHERE w.status = 'settled'
                  GROUP BY 1, 2)
             SELECT count(*)
               FROM settlements AS s
               FULL JOIN recomputed AS c USING (window_start, sku)
              WHERE s.quantity IS DISTINCT FROM c.quantity
                 OR s.reservations IS DISTINCT FROM c.n",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mismatches, 0, "settled totals differ from the reservations");
    // Closed by the database clock: nothing was settled before its end plus the grace.
    let early: Vec<String> = pg
        .query(
            "SELECT window_start::text FROM settlement_runs
              WHERE status = 'settled'
                AND finished_at < window_end + $1::bigint * interval '1 millisecond'",
            &[&(GRACE_MS as i64)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(early.is_empty(), "settled before end + grace: {early:?}");
    let run_totals_ok: bool = pg
        .query_one(
            "SELECT bool_and(w.reservations = COALESCE(s.n, 0) AND w.quantity = COALESCE(s.q, 0))
               FROM settlement_runs AS w
               LEFT JOIN (SELECT window_start, sum(reservations) AS n, sum(quantity) AS q
                            FROM settlements GROUP BY 1) AS s USING (window_start)
              WHERE w.status = 'settled'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(run_totals_ok, "a run's totals differ from its rows");
    pg.query_one(
        "SELECT COALESCE(sum(reservations), 0)::bigint FROM settlement_runs WHERE status = 'settled'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// The settlement job's leader gauge; the retention job has one too, which a replica may hold.
pub(crate) const SETTLEMENT_LEADER: &str = "allocator_job_leader{job=\"settlement\",";

/// Scrape one replica's metric value (sum over label sets matching `prefix`).
pub(crate) async fn metric(url: &str, prefix: &str) -> f64 {
    let Ok(response) = http().get(format!("{url}/metrics")).send().await else {
        return f64::NAN;
    };
    let body = response.text().await.unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Let the job catch up past the end of the load, then check.
pub(crate) async fn drain_and_check(db: &str, load: ConfirmLoad) -> i64 {
    let confirmed = load.finish().await;
    assert!(confirmed > 0, "the load confirmed nothing");
    let pg = client(db).await;
    let last_confirm: chrono::DateTime<chrono::Utc> = pg
        .query_one(
            "SELECT max(updated_at) FROM reservations WHERE status = 'confirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_until("the job caught up", Duration::from_secs(30), || async {
        status(db)
            .await
            .last_settled
            .is_some_and(|w| w.window_end > last_confirm)
    })
    .await;
    let settled = assert_settled_exactly_once(db).await;
    let all_confirmed: i64 = pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE status = 'confirmed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(settled, all_confirmed, "every confirmation settled once");
    assert!(all_confirmed as usize >= confirmed);
    settled
}
