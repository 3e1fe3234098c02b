//! Storage failure with real processes: a primary with a streaming standby, two allocator
//! processes and a router given the multi-host URL of both servers, under steady traffic of
//! reserves, confirmations and restocks. The primary is SIGKILLed and the standby promoted; then
//! the old primary comes back *writable* on its old address and every service connection to the
//! new primary is cut, so each service reconnects and can reach the stale server first.
//!
//! Every answer a client got is then looked up on the promoted primary, the one an operator
//! keeps: an acknowledged hold, confirmation or restock missing there is lost. With a synchronous
//! standby nothing may be lost and the revived old primary must take no write; with an
//! asynchronous one, what the standby had not received when the primary died is lost, and the
//! test shows exactly that window.

use std::time::{Duration, Instant};

use testkit::workload::{lost_on, Acks, Lost, Shape, Workload};
use testkit::{PgServer, ReplicatedPg, Replication};

use crate::common::{metric, serial, Cluster};

const PARTITIONS: u32 = 8;
const DB: &str = "storage_failover";
/// Clients reserving (a third of the holds then confirmed) and a restocker, through one router.
const LOAD: Shape = Shape {
    clients: 8,
    restock: true,
};

async fn lost_on_server(server: &PgServer, acks: &Acks) -> Lost {
    let client = server
        .connect_url(&server.url_for(DB))
        .await
        .expect("connect to the promoted primary");
    lost_on(&client, acks).await.expect("read back")
}

/// Milliseconds from `origin` to `at`, negative when `at` came first.
fn signed_ms(at: Instant, origin: Instant) -> i64 {
    if at >= origin {
        (at - origin).as_millis() as i64
    } else {
        -((origin - at).as_millis() as i64)
    }
}

/// Writes a server holds in this test's database: reservations, adjustments and lease epochs.
async fn write_count(server: &PgServer) -> i64 {
    let client = server
        .connect_url(&server.url_for(DB))
        .await
        .expect("connect");
    client
        .query_one(
            "SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM adjustments)
                  + (SELECT count(*) FROM lease_history)",
            &[],
        )
        .await
        .expect("count writes")
        .get(0)
}

/// Ends every client session of this test's database on `server`, as an idle timeout or a
/// network blip would: every pool must connect again.
async fn cut_sessions(server: &PgServer) {
    let client = server.client().await.expect("connect");
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[&DB],
        )
        .await
        .expect("terminate sessions");
}

/// A replicated pair, two allocators and a router on it, SKUs with plenty of stock.
async fn setup(
    mode: Replication,
) -> (
    ReplicatedPg,
    Cluster,
    crate::common::TestRouter,
    Vec<String>,
) {
    let pg = ReplicatedPg::start(mode).await.expect("replicated pair");
    let db_url = pg.create_database(DB).await.expect("database");
    let cluster = Cluster::start_on(DB, db_url, 2, PARTITIONS, Vec::new()).await;
    let router = cluster.router(|_| {}).await;
    let skus: Vec<String> = (0..16).map(|i| format!("sf-{i}")).collect();
    for sku in &skus {
        cluster.restock(&router.url, sku, 1_000_000).await;
    }
    (pg, cluster, router, skus)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revived_old_primary_takes_no_write_and_no_acknowledged_write_is_lost() {
    let _serial = serial().await;
    let (mut pg, cluster, router, skus) = setup(Replication::Synchronous).await;
    let load = Workload::start(&router.url, &skus, LOAD);
    tokio::time::sleep(Duration::from_secs(2)).await;

    pg.kill_primary().expect("kill primary");
    // The HA manager's detection time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pg.promote_standby().await.expect("promote");
    let promoted_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let first_success = load.first_success_after(promoted_at);

    pg.revive_old_primary_writable()
        .await
        .expect("revive old primary");
    let revived_at = Instant::now();
    let stale_writes_before = write_count(pg.standby()).await;
    cut_sessions(pg.primary()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let successes_after_revival = load.with_acks(|acks| acks.successes_after(revived_at));
    // What operators see while the stale server is reachable: the router's prober reports it,
    // and both services counted the connections they refused.
    // The router's fence series carry its shard (one database: `main`).
    let stale_seen = metric(
        &router.url,
        "router_storage_stale_writable_servers{shard=\"main\"}",
    )
    .await;
    let mut refused = metric(
        &router.url,
        "router_storage_refusals_total{cause=\"behind\",shard=\"main\"}",
    )
    .await;
    for allocator in &cluster.allocators {
        refused += metric(
            &allocator.url,
            "allocator_storage_refusals_total{cause=\"behind\"}",
        )
        .await;
    }
    let acks = load.finish().await;
    let stale_writes = write_count(pg.standby()).await - stale_writes_before;
    let lost = lost_on_server(pg.primary(), &acks).await;

    eprintln!(
        "acknowledged: {} holds, {} confirmations, {} restocks; first success {:?} after the \
         promotion; {successes_after_revival} successes after the old primary came back; \
         writes taken by the revived old primary: {stale_writes}; lost on the promoted primary: \
         {} holds, {} confirmations, {} restocks",
        acks.holds.len(),
        acks.confirms.len(),
        acks.adjustments.len(),
        first_success,
        lost.holds.len(),
        lost.confirms.len(),
        lost.adjustments.len(),
    );
    eprintln!("stale writable servers reported: {stale_seen}; connections refused: {refused}");
    assert!(
        first_success.is_some(),
        "nothing succeeded after the promotion"
    );
    assert!(
        successes_after_revival > 0,
        "the router and allocators did not follow the promoted primary"
    );
    let since_revival: Vec<String> = lost
        .all()
        .map(|(id, at)| format!("{id} at {:+} ms", signed_ms(*at, revived_at)))
        .collect();
    assert_eq!(
        lost.total(),
        0,
        "acknowledged writes lost (answer time relative to the old primary's return): {since_revival:?}"
    );
    assert_eq!(stale_writes, 0, "the revived old primary took writes");
    assert_eq!(stale_seen, 1.0, "the revived old primary was not reported");
    assert!(
        refused > 0.0,
        "no connection to the revived old primary was refused"
    );
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_loses_exactly_what_it_had_not_received() {
    let _serial = serial().await;
    let (mut pg, _cluster, router, skus) = setup(Replication::Asynchronous).await;
    let load = Workload::start(&router.url, &skus, LOAD);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The window: the standby receives nothing from here on, the primary keeps acknowledging.
    // A commit acknowledged just before the stall may not have been sent yet either, so the
    // window opens up to `SEND_SLACK` before it.
    const SEND_SLACK: Duration = Duration::from_secs(1);
    let stalled_at = Instant::now();
    pg.stall_replication().expect("stall replication");
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.kill_primary().expect("kill primary");
    let killed_at = Instant::now();
    pg.promote_standby().await.expect("promote");
    let promoted_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let first_success = load.first_success_after(promoted_at);
    let acks = load.finish().await;
    let lost = lost_on_server(pg.primary(), &acks).await;
    let acked_in_window = acks
        .holds
        .iter()
        .chain(&acks.confirms)
        .chain(&acks.adjustments)
        .filter(|(_, t)| *t > stalled_at && *t < killed_at)
        .count();

    eprintln!(
        "asynchronous standby: {} acknowledgements lost ({} holds, {} confirmations, {} \
         restocks) of {acked_in_window} given while the standby received nothing (2 s before \
         the primary died); first success {first_success:?} after the promotion",
        lost.total(),
        lost.holds.len(),
        lost.confirms.len(),
        lost.adjustments.len(),
    );
    assert!(
        lost.total() > 0,
        "the window lost nothing: the test shows nothing"
    );
    for (id, at) in lost.all() {
        assert!(
            *at + SEND_SLACK > stalled_at && *at < killed_at,
            "{id} was acknowledged outside the replication window and lost"
        );
    }
    router.stop().await;
}
