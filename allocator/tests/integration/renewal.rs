//! The renewal slack the lease timing promises (allocator/README.md "Lease timing defaults", DESIGN.md §5):
//! with the default timings, two consecutive renewal attempts can fail or time out and the third
//! still lands before the safe deadline, so the replica keeps every lease. The database link is
//! black-holed right after a confirmed renewal and healed once the replica has given up on two
//! attempts; a real replica process, a private PostgreSQL and the testkit proxy.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::spawn_replica_with;
use testkit::{PgServer, ProxyMode, TcpProxy};

/// (partition, epoch) of every lease the database names `owner` for, unexpired.
async fn held(pg: &tokio_postgres::Client, owner: &str) -> Vec<(i32, i64)> {
    pg.query(
        "SELECT partition, epoch FROM leases
          WHERE holder_id = $1 AND expires_at > now() AND partition IS NOT NULL
          ORDER BY partition",
        &[&owner],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

async fn last_renewal(
    pg: &tokio_postgres::Client,
    owner: &str,
) -> Option<chrono::DateTime<chrono::Utc>> {
    pg.query_one(
        "SELECT max(renewed_at) FROM leases WHERE holder_id = $1 AND partition IS NOT NULL",
        &[&owner],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn two_black_holed_renewals_do_not_lose_the_leases_with_default_timings() {
    let server = PgServer::start().await.unwrap();
    let db = server.create_database("renewal").await.unwrap();
    migrate(&db, PARTITIONS).await;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap()).unwrap();
    let proxied = db.replace(
        &format!(":{}/", server.port()),
        &format!(":{}/", proxy.addr().port()),
    );
    // The defaults: TTL 5 s, margin 1 s, renewal every TTL / 3.
    let env = |k: &str, v: &str| (k.to_string(), v.to_string());
    let replica = spawn_replica_with(
        &proxied,
        "renew-a",
        5000,
        vec![
            env("ALLOCATOR_LEASE_MARGIN_MS", "1000"),
            env("ALLOCATOR_RENEW_INTERVAL_MS", "1666"),
            env("ALLOCATOR_HANDOFF_LISTEN", "false"),
        ],
    );
    let pg = client(&db).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while held(&pg, "renew-a").await.len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "replica never owned every partition\n{}",
            replica.process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = held(&pg, "renew-a").await;

    // Cut the link the moment a renewal has been confirmed, so the next two attempts are lost.
    let confirmed = last_renewal(&pg, "renew-a").await;
    while last_renewal(&pg, "renew-a").await == confirmed {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    proxy.set_mode(ProxyMode::Blackhole);
    let cut = Instant::now();
    let failures = |log: &str| {
        log.matches("lease renewal failed, partitions uncertain")
            .count()
    };
    let lost = |log: &str| log.contains("lease lost, authority dropped");
    loop {
        let log = replica.process.log_tail(2000);
        assert!(
            !lost(&log),
            "leases lost {:?} after the cut, before two renewal attempts had failed:\n{}",
            cut.elapsed(),
            replica.process.log_tail(30)
        );
        if failures(&log) >= 2 {
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(10),
            "renewals never failed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set_mode(ProxyMode::Pass);
    let healed = cut.elapsed();

    // The third attempt lands before the safe deadline: nothing is lost, no epoch changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = replica.process.log_tail(2000);
    assert!(
        !lost(&log),
        "a lease was lost after the heal ({healed:?} after the cut):\n{}",
        replica.process.log_tail(30)
    );
    assert_eq!(
        held(&pg, "renew-a").await,
        before,
        "the same tenures, still held"
    );
    println!(
        "link healed {} ms after the cut, after {} failed renewal attempts; no lease lost",
        healed.as_millis(),
        failures(&log)
    );
}
