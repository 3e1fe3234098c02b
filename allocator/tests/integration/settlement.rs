//! The singleton settlement job under real faults: SIGKILL and SIGSTOP of the holder, its
//! database link black-holed, its wall clock shifted, the database restarted. Replicas are real
//! processes with one-second windows, confirmations arrive over HTTP throughout, and every test
//! ends by recomputing the settled totals from `reservations` (see [`assert_settled_exactly_once`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::{faked_clock_env, spawn_replica_with, Replica};
use schema::partition::partition_for;
use schema::wire::SettlementStatus;
use serde_json::json;
use testkit::{PgServer, ProxyMode, TcpProxy};

const TTL_MS: u64 = 2000;
const SKUS: [&str; 4] = ["settle-a", "settle-b", "settle-c", "settle-d"];

fn settlement_env(pause_ms: Option<u64>) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "ALLOCATOR_SETTLEMENT_WINDOW_SECS".to_string(),
            "1".to_string(),
        ),
        // Statement timeout 1 s in spawned replicas; the grace must exceed it.
        (
            "ALLOCATOR_SETTLEMENT_GRACE_MS".to_string(),
            "1500".to_string(),
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

fn replica(db: &str, id: &str, extra: Vec<(String, String)>) -> Replica {
    spawn_replica_with(db, id, TTL_MS, extra)
}

async fn status(db: &str) -> SettlementStatus {
    schema::settlement::read_status(&client(db).await)
        .await
        .expect("settlement status")
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
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

async fn wait_for_holder(db: &str, holder: &str) -> i64 {
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
async fn settled_windows(db: &str) -> i64 {
    status(db).await.settled_windows
}

/// A `running` run claimed by `holder`, if any: (window start, term).
async fn running_run(db: &str, holder: &str) -> Option<(chrono::DateTime<chrono::Utc>, i64)> {
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

async fn wait_for_running_run(db: &str, holder: &str) -> (chrono::DateTime<chrono::Utc>, i64) {
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
struct ConfirmLoad {
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ConfirmLoad {
    fn start(db: String, prefix: &'static str) -> Self {
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

    async fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.confirmed.load(Ordering::Relaxed)
    }
}

/// The owner of `sku`'s partition by the database; `None` while unowned or unreadable (the
/// connection is kept across calls and dropped when it fails).
async fn owner_url(pg: &mut Option<tokio_postgres::Client>, db: &str, sku: &str) -> Option<String> {
    if pg.as_ref().is_none_or(|c| c.is_closed()) {
        *pg = allocator::db::connect(db).await.ok();
    }
    let map = schema::assignment::read_map(pg.as_ref()?).await.ok()?;
    let partition = partition_for(sku, map.partition_count);
    map.partitions[partition as usize].owner_url.clone()
}

async fn confirm_once(
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

async fn seed_stock(db: &str) {
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
async fn assert_settled_exactly_once(db: &str) -> i64 {
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

/// Scrape one replica's metric value (sum over label sets matching `prefix`).
async fn metric(url: &str, prefix: &str) -> f64 {
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
async fn drain_and_check(db: &str, load: ConfirmLoad) -> i64 {
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

#[tokio::test]
async fn holder_killed_mid_run_is_finished_by_another_replica() {
    let db = migrated_database(PARTITIONS).await;
    // A pauses between claim and settle, so a run stays open long enough to kill it there.
    let mut a = replica(&db, "settle-kill-a", settlement_env(Some(1500)));
    let a_term = wait_for_holder(&db, "settle-kill-a").await;
    let b = replica(&db, "settle-kill-b", settlement_env(None));
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "kill");

    let (window, _) = wait_for_running_run(&db, "settle-kill-a").await;
    a.process.sigkill().unwrap();
    let killed = Instant::now();

    let b_term = wait_for_holder(&db, "settle-kill-b").await;
    assert!(b_term > a_term, "a new term: {b_term} > {a_term}");
    let pg = client(&db).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let settled = pg
            .query_opt(
                "SELECT 1 FROM settlement_runs
                  WHERE window_start = $1 AND status = 'settled'
                    AND holder_id = 'settle-kill-b' AND term = $2",
                &[&window, &b_term],
            )
            .await
            .unwrap();
        if settled.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let runs: Vec<(String, String, i64, String)> = pg
                .query(
                    "SELECT window_start::text, status, term, holder_id FROM settlement_runs",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect();
            panic!(
                "the open run was not settled by B: {runs:?}\n{}",
                b.process.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "settlement run finished by the next holder {} ms after SIGKILL (ttl {TTL_MS} ms)",
        killed.elapsed().as_millis()
    );
    let settled = drain_and_check(&db, load).await;
    println!("{settled} confirmations settled exactly once");
    drop(b);
}

#[tokio::test]
async fn revived_holder_is_refused_by_the_database() {
    let db = migrated_database(PARTITIONS).await;
    let mut a = replica(&db, "settle-stop-a", settlement_env(Some(1000)));
    let a_term = wait_for_holder(&db, "settle-stop-a").await;
    // B's own pause keeps its takeover claim open while A wakes up and tries to settle.
    let b = replica(&db, "settle-stop-b", settlement_env(Some(4000)));
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "stop");

    let (window, _) = wait_for_running_run(&db, "settle-stop-a").await;
    a.process.sigstop().unwrap();
    let b_term = wait_for_holder(&db, "settle-stop-b").await;
    assert!(b_term > a_term);
    // B claimed A's open run under its own term: only now can A's settle be a stale write.
    wait_until("B took the run over", Duration::from_secs(20), || async {
        running_run(&db, "settle-stop-b")
            .await
            .is_some_and(|(w, term)| w == window && term == b_term)
    })
    .await;
    a.process.sigcont().unwrap();
    wait_until(
        "A's stale write refused and counted",
        Duration::from_secs(10),
        || async { metric(&a.url, "allocator_job_stale_term_rejections_total").await >= 1.0 },
    )
    .await;
    assert_eq!(
        metric(&a.url, "allocator_job_leader").await,
        0.0,
        "A stepped down"
    );
    drain_and_check(&db, load).await;
    drop(b);
}

#[tokio::test]
async fn holder_cut_off_from_the_database_stops_and_another_takes_over() {
    let pg = PgServer::start().await.unwrap();
    let db = pg.create_database("settle").await.unwrap();
    migrate(&db, PARTITIONS).await;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap()).unwrap();
    let proxied = db.replace(
        &format!(":{}/", pg.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    let a = replica(&proxied, "settle-cut-a", settlement_env(None));
    let a_term = wait_for_holder(&db, "settle-cut-a").await;
    let b = replica(&db, "settle-cut-b", settlement_env(None));
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "cut");
    wait_until(
        "windows settled under A",
        Duration::from_secs(20),
        || async { settled_windows(&db).await >= 2 },
    )
    .await;

    proxy.set_mode(ProxyMode::Blackhole);
    let cut = Instant::now();
    wait_until(
        "A stepped down",
        Duration::from_millis(TTL_MS + 2000),
        || async { metric(&a.url, "allocator_job_leader").await == 0.0 },
    )
    .await;
    let stepped_down = cut.elapsed();
    let b_term = wait_for_holder(&db, "settle-cut-b").await;
    assert!(b_term > a_term);
    let before = settled_windows(&db).await;
    wait_until("B settles", Duration::from_secs(20), || async {
        settled_windows(&db).await >= before + 2
    })
    .await;
    println!(
        "cut-off holder stepped down after {} ms; B took over after {} ms",
        stepped_down.as_millis(),
        cut.elapsed().as_millis()
    );
    proxy.set_mode(ProxyMode::Pass);
    drain_and_check(&db, load).await;
    drop((a, b));
}

#[tokio::test]
async fn skewed_wall_clocks_change_nothing() {
    let db = migrated_database(PARTITIONS).await;
    let mut ahead = settlement_env(None);
    ahead.extend(faked_clock_env("+30s"));
    let mut behind = settlement_env(None);
    behind.extend(faked_clock_env("-30s"));
    let a = replica(&db, "settle-skew-a", ahead);
    wait_for_holder(&db, "settle-skew-a").await;
    let b = replica(&db, "settle-skew-b", behind);
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "skew");
    wait_until("windows settled", Duration::from_secs(20), || async {
        settled_windows(&db).await >= 3
    })
    .await;
    // Windows close by the database clock: none was settled before its end plus the grace.
    let early: i64 = client(&db)
        .await
        .query_one(
            "SELECT count(*) FROM settlement_runs
              WHERE status = 'settled' AND finished_at < window_end + interval '1500 ms'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(early, 0, "a window was settled before it closed");
    drain_and_check(&db, load).await;
    drop((a, b));
}

#[tokio::test]
async fn job_resumes_after_the_database_restarts() {
    let mut pg = PgServer::start().await.unwrap();
    let db = pg.create_database("settle").await.unwrap();
    migrate(&db, PARTITIONS).await;
    let a = replica(&db, "settle-restart-a", settlement_env(None));
    wait_for_holder(&db, "settle-restart-a").await;
    seed_stock(&db).await;
    let load = ConfirmLoad::start(db.clone(), "restart");
    wait_until("windows settled", Duration::from_secs(20), || async {
        settled_windows(&db).await >= 2
    })
    .await;
    pg.stop().await.unwrap();
    tokio::time::sleep(Duration::from_millis(TTL_MS)).await;
    pg.restart().await.unwrap();
    let restarted = Instant::now();
    let before = loop {
        if let Ok(pg) = allocator::db::connect(&db).await {
            if let Ok(s) = schema::settlement::read_status(&pg).await {
                break s.settled_windows;
            }
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "database not back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_until("the job resumed", Duration::from_secs(30), || async {
        settled_windows(&db).await >= before + 2
    })
    .await;
    println!(
        "settlement resumed {} ms after the database restarted",
        restarted.elapsed().as_millis()
    );
    drain_and_check(&db, load).await;
    drop(a);
}
