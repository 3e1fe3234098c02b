//! Failover when the database goes away rather than a replica: a black-holed connection (network
//! partition) and a stopped server. While it is gone no hold is granted and clients get fast
//! `503`s with `Retry-After`; once it is back the replica re-acquires its partitions and a
//! retried id converges, with the ledger still balanced. The recovery times are printed
//! (`cargo test -- --nocapture` shows them).

use std::time::{Duration, Instant};

use crate::common::*;
use reqwest::StatusCode;
use serde_json::json;
use testkit::{PgServer, ProxyMode, TcpProxy};

#[tokio::test]
async fn database_blackhole_and_stop_make_partitions_unavailable_then_recover() {
    let pg = PgServer::start().await.unwrap();
    let db = pg.create_database("faults").await.unwrap();
    migrate(&db, PARTITIONS).await;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap()).unwrap();
    let proxied = db.replace(
        &format!(":{}/", pg.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    let replica = TestReplica::start(fast_config(&proxied, "bh")).await;
    wait_owns_all(&replica).await;
    restock(&replica.url, "bh-sku", 100).await;

    let reserve = |id: String| {
        let url = replica.url.clone();
        async move {
            http()
                .post(format!("{url}/v1/reservations"))
                .json(&json!({"reservation_id": id, "sku": "bh-sku", "quantity": 1}))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(reserve("bh-0".into()).await.status(), StatusCode::CREATED);

    // Network partition between the replica and its database.
    proxy.set_mode(ProxyMode::Blackhole);
    let cut = Instant::now();
    let mut saw_unavailable = false;
    let mut i = 0;
    while cut.elapsed() < Duration::from_secs(6) {
        i += 1;
        let response = reserve(format!("bh-{i}")).await;
        assert_ne!(
            response.status(),
            StatusCode::CREATED,
            "no hold can be granted without the database"
        );
        assert_ne!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert!(response.headers().get("retry-after").is_some());
            saw_unavailable = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(saw_unavailable, "clients were told to retry");
    assert!(
        replica.ownership.held().is_empty(),
        "authority dropped at the safe deadline"
    );

    // Heal: the replica re-acquires (new epochs) and serves again; a retried id converges.
    proxy.set_mode(ProxyMode::Pass);
    let healed = Instant::now();
    loop {
        let response = reserve("bh-retry".into()).await;
        if response.status().is_success() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(15),
            "did not recover: {}",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "service restored {} ms after the partition healed",
        healed.elapsed().as_millis()
    );

    // A stopped database: answers stay fast 503s, then service resumes after restart.
    let mut pg = pg;
    pg.stop().await.unwrap();
    let started = Instant::now();
    let response = reserve("stopped-1".into()).await;
    assert!(started.elapsed() < Duration::from_secs(6));
    assert!(
        matches!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::MISDIRECTED_REQUEST
        ),
        "{}",
        response.status()
    );
    pg.restart().await.unwrap();
    let restarted = Instant::now();
    loop {
        if reserve("stopped-1".into()).await.status().is_success() {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "did not recover after restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "service restored {} ms after the database restarted",
        restarted.elapsed().as_millis()
    );
    let check = client(&db).await;
    let (row, ledger) = ledger_balance(&check, "bh-sku").await;
    assert_eq!(row, ledger);
    let holds: i64 = check
        .query_one(
            "SELECT count(*) FROM reservations WHERE status = 'held'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        row.held, holds,
        "every held unit has exactly one reservation"
    );
    replica.stop().await;
}

/// The hand-off `LISTEN` session passes the storage fence like every pooled session: after a
/// failover, with the old primary revived writable at the first address of the URL, a listener
/// of a process that has seen the promotion connects to the new primary and hears what is
/// announced there (a session through the URL's own `target_session_attrs=read-write` would take
/// the old primary, the first host that accepts writes, and hear nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listening_session_follows_the_newest_primary_not_a_revived_old_one() {
    use testkit::{ReplicatedPg, Replication};

    let mut pair = ReplicatedPg::start(Replication::Synchronous).await.unwrap();
    let url = pair.create_database("listening").await.unwrap();
    migrate(&url, PARTITIONS).await;
    let fence = allocator::sessions::fence(&url, "listening-test").unwrap();
    fence.probe_all().await;

    pair.kill_primary().unwrap();
    pair.promote_standby().await.unwrap();
    fence.probe_all().await;
    pair.revive_old_primary_writable().await.unwrap();

    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(allocator::sessions::listen(&fence, "listening_test").run(
        move || {
            let _ = heard_tx.send(());
        },
    ));
    // Announce on the new primary until the listener hears it (its LISTEN may not have run yet).
    let primary = pair.primary();
    let new_primary = primary
        .connect_url(&primary.url_for("listening"))
        .await
        .expect("the new primary");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        new_primary
            .batch_execute("NOTIFY listening_test")
            .await
            .unwrap();
        if tokio::time::timeout(Duration::from_millis(300), heard.recv())
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            !listener.is_finished(),
            "the listener ended: {:?}",
            listener.await
        );
        assert!(
            Instant::now() < deadline,
            "the listener heard nothing announced on the new primary"
        );
    }
    listener.abort();
}

/// The fence remembers the newest primary across a restart (`--fence-memory`): a process that
/// saw a failover, restarted while only the revived old primary answers (the promoted one is out
/// of reach), refuses it; the same restart without memory takes it, as the first host that
/// accepts writes. The replica itself does not start on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_remembers_the_newest_primary_and_refuses_the_old_one() {
    use testkit::{ReplicatedPg, Replication};

    let mut pair = ReplicatedPg::start(Replication::Synchronous).await.unwrap();
    let url = pair.create_database("remembering").await.unwrap();
    migrate(&url, PARTITIONS).await;
    let dir = tempfile::tempdir().unwrap();
    let memory = dir.path().join("fence-memory");
    let remembering =
        || allocator::sessions::remembering_fence(&url, "memory-test", Some(memory.clone()));
    {
        let fence = remembering().unwrap();
        fence.probe_all().await;
        pair.kill_primary().unwrap();
        pair.promote_standby().await.unwrap();
        fence.probe_all().await;
    }
    pair.revive_old_primary_writable().await.unwrap();
    pair.primary_mut().stop().await.unwrap();

    let forgetful = allocator::sessions::fence(&url, "memory-test").unwrap();
    storage::connect(&forgetful, forgetful.config())
        .await
        .expect("without memory a restarted process takes the revived old primary");

    let fence = remembering().unwrap();
    let refused = storage::connect(&fence, fence.config())
        .await
        .expect_err("with memory the old primary is refused");
    assert!(
        format!("{refused:#}").contains("a newer primary of this cluster is known"),
        "{refused:#}"
    );
    let memory_arg = memory.display().to_string();
    let serve = allocator::app::Application::build(fast_config_with(
        &url,
        "remembering",
        &["--fence-memory", &memory_arg],
    ))
    .await;
    assert!(serve.is_err(), "the replica started on the old primary");
}
