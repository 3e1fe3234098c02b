//! One tenure per partition per group commit: a batch of a tenure that ended never runs, and the
//! database refuses a group that names one partition twice (DESIGN.md §6).

use std::time::{Duration, Instant};

use crate::common::*;
use crate::processes::spawn_replica_with;
use allocator::fenced::{apply_group, Command, Fence, FencedError, PartitionBatch};
use allocator::lease::{store, FenceToken};
use allocator::sessions::{build_pool, PoolSettings};
use schema::partition::partition_for;
use serde_json::json;

fn sku_in(partition: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap()
}

fn reserve(id: &str, sku: &str) -> Command {
    Command::Reserve {
        reservation_id: id.into(),
        sku: sku.into(),
        quantity: 1,
        ttl_seconds: 60,
        owner: Default::default(),
    }
}

async fn count(pg: &tokio_postgres::Client, sql: &str) -> i64 {
    pg.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn a_group_naming_a_partition_twice_is_refused_whole() {
    let db = migrated_database(PARTITIONS).await;
    let pool = build_pool(
        &db,
        &PoolSettings {
            size: 2,
            wait: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(300),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: "tenure-test".into(),
        },
    )
    .unwrap();
    let conn = pool.get().await.unwrap();
    let pg = client(&db).await;
    let partition = 2;
    let sku = sku_in(partition, "twice");
    let ttl = Duration::from_secs(30);
    let first = store::acquire(&**conn, partition, "owner", "http://owner", ttl)
        .await
        .unwrap()
        .unwrap();
    let old = Fence::new(FenceToken::new(partition, first.epoch), "owner");
    allocator::fenced::fenced_transaction(
        &conn,
        &old,
        &[Command::Adjust {
            adjustment_id: "seed".into(),
            sku: sku.clone(),
            delta: 10,
            owner: access::Owner::ANYONE,
        }],
    )
    .await
    .unwrap();
    // The same holder takes the partition again: a new tenure, a new epoch.
    let second = store::acquire(&**conn, partition, "owner", "http://owner", ttl)
        .await
        .unwrap()
        .unwrap();
    let new = Fence::new(FenceToken::new(partition, second.epoch), "owner");
    let old_cmds = [reserve("old-tenure", &sku)];
    let new_cmds = [reserve("new-tenure", &sku)];
    for (name, group) in [
        (
            "old tenure first",
            [
                PartitionBatch {
                    fence: &old,
                    commands: &old_cmds,
                },
                PartitionBatch {
                    fence: &new,
                    commands: &new_cmds,
                },
            ],
        ),
        (
            "new tenure first",
            [
                PartitionBatch {
                    fence: &new,
                    commands: &new_cmds,
                },
                PartitionBatch {
                    fence: &old,
                    commands: &old_cmds,
                },
            ],
        ),
    ] {
        let result = apply_group(&conn, &group).await;
        match &result {
            Err(FencedError::Db(e)) if e.code().is_some() => {}
            other => panic!("{name}: the group must be refused as a whole, got {other:?}"),
        }
        assert_eq!(
            count(&pg, "SELECT count(*) FROM reservations").await,
            0,
            "{name}: nothing of either tenure was written"
        );
    }
    let held: i64 = pg
        .query_one("SELECT held FROM inventory WHERE sku = $1", &[&sku])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 0);
}

/// The replica's metric value `name{labels}` (0 when absent).
async fn metric(base: &str, series: &str) -> f64 {
    let text = metrics_text(base).await;
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn lease_epoch(pg: &tokio_postgres::Client, partition: u32) -> (Option<String>, i64) {
    let row = pg
        .query_one(
            "SELECT CASE WHEN expires_at > now() THEN holder_id END, epoch FROM leases
              WHERE partition = $1",
            &[&(partition as i32)],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// POST a reserve; (status, body).
async fn post_reserve(base: &str, id: &str, sku: &str) -> (u16, serde_json::Value) {
    match http()
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": id, "sku": sku, "quantity": 1}))
        .send()
        .await
    {
        Ok(r) => (
            r.status().as_u16(),
            r.json().await.unwrap_or(serde_json::Value::Null),
        ),
        Err(_) => (0, serde_json::Value::Null),
    }
}

#[tokio::test]
async fn a_retaken_partition_never_shares_a_group_with_its_ended_tenure() {
    let db = migrated_database(PARTITIONS).await;
    let pg = client(&db).await;
    // One lane, kept busy by a statement that waits for a row locked from outside; a stall
    // longer than the margin (1 s) but far from the safe deadline (TTL 8 s) drops every lease,
    // which the replica releases, announces and takes back at once with new epochs.
    let env = |k: &str, v: &str| (k.to_string(), v.to_string());
    let mut replica = spawn_replica_with(
        &db,
        "tenure-a",
        8000,
        vec![
            env("ALLOCATOR_LEASE_MARGIN_MS", "1000"),
            env("ALLOCATOR_RENEW_INTERVAL_MS", "2000"),
            env("ALLOCATOR_COMMIT_LANES", "1"),
            env("ALLOCATOR_LOCK_TIMEOUT_MS", "6000"),
            env("ALLOCATOR_STATEMENT_TIMEOUT_MS", "8000"),
            env("ALLOCATOR_REQUEST_TIMEOUT_MS", "12000"),
            env("ALLOCATOR_EXPIRY_INTERVAL_MS", "60000"),
        ],
    );
    let url = replica.url.clone();
    wait_for_map(&url, Duration::from_secs(20), |m| {
        all_owned_by_one_of(m, &["tenure-a"])
    })
    .await;
    let (blocked, retaken) = (5u32, 6u32);
    let blocked_sku = sku_in(blocked, "tenure");
    let sku = sku_in(retaken, "tenure");
    restock(&url, &blocked_sku, 100).await;
    restock(&url, &sku, 100).await;

    // An outside session holds the blocked partition's row: the lane's next statement waits.
    let mut outside = client(&db).await;
    let tx = outside.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM inventory WHERE sku = $1 FOR UPDATE",
        &[&blocked_sku],
    )
    .await
    .unwrap();
    let stuck = tokio::spawn({
        let (url, sku) = (url.clone(), blocked_sku.clone());
        async move { post_reserve(&url, "stuck-1", &sku).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(
        &pg,
        "SELECT count(*) FROM pg_stat_activity
          WHERE wait_event_type = 'Lock' AND application_name = 'allocator:tenure-a'",
    )
    .await
        == 0
    {
        assert!(Instant::now() < deadline, "the lane never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The partition's batch queues behind it, then the replica stalls past its margin.
    let (_, epoch_before) = lease_epoch(&pg, retaken).await;
    let queued: Vec<_> = (0..3)
        .map(|i| {
            let (url, sku) = (url.clone(), sku.clone());
            tokio::spawn(async move { post_reserve(&url, &format!("queued-{i}"), &sku).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    replica.process.sigstop().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    replica.process.sigcont().unwrap();

    // It takes the partition back with a new epoch while the lane is still blocked.
    let deadline = Instant::now() + Duration::from_secs(4);
    let epoch_after = loop {
        if let (Some(holder), epoch) = lease_epoch(&pg, retaken).await {
            if holder == "tenure-a" && epoch > epoch_before {
                break epoch;
            }
        }
        assert!(
            Instant::now() < deadline,
            "partition not retaken\n{}",
            replica.process.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let fresh = tokio::spawn({
        let (url, sku) = (url.clone(), sku.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let answer = post_reserve(&url, "fresh", &sku).await;
                if answer.0 != 421 && answer.0 != 503 || Instant::now() > deadline {
                    return answer;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    // Give the new tenure's batch time to queue behind the blocked statement, then let go.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    tx.rollback().await.unwrap();
    let (status, body) = fresh.await.unwrap();
    assert_eq!(status, 201, "{body}\n{}", replica.process.log_tail(80));
    let _ = stuck.await;
    for (i, answer) in queued.into_iter().enumerate() {
        let (status, body) = answer.await.unwrap();
        assert!(
            status == 421 || status == 503,
            "queued-{i} of the ended tenure answered {status} {body}"
        );
    }
    assert_eq!(
        lease_epoch(&pg, retaken).await,
        (Some("tenure-a".into()), epoch_after),
        "the new tenure was never dropped (no flapping)\n{}",
        replica.process.log_tail(80)
    );
    assert_eq!(
        body["epoch"].as_i64(),
        Some(epoch_after),
        "the new tenure served the fresh reserve"
    );
    assert_eq!(
        metric(&url, "allocator_lease_losses_total{cause=\"fenced\"}").await,
        0.0
    );
    assert_eq!(
        count(
            &pg,
            "SELECT count(*) FROM reservations WHERE reservation_id LIKE 'queued-%'"
        )
        .await,
        0,
        "the ended tenure's batch never ran"
    );
}
