//! The singleton settlement job under real faults: SIGKILL and SIGSTOP of the holder, its
//! database link black-holed, its wall clock shifted, the database restarted. Replicas are real
//! processes with one-second windows, confirmations arrive over HTTP throughout, and every test
//! ends by recomputing the settled totals from `reservations` (see [`assert_settled_exactly_once`]).

use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::faked_clock_env;
use crate::settlement_support::*;
use testkit::{PgServer, ProxyMode, TcpProxy};

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
        metric(&a.url, SETTLEMENT_LEADER).await,
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
        || async { metric(&a.url, SETTLEMENT_LEADER).await == 0.0 },
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
        if let Ok(pg) = allocator::sessions::connect(&db).await {
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
