//! What the Patroni failover tests share: the cluster with an allocator on it, a sampler of what
//! every PostgreSQL node says it is through the fault, and the checks run afterwards (nothing
//! acknowledged lost, no oversell, the old primary back as a streaming standby, the storage fence
//! refusing the old primary).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use storage::identity::{Known, ServerIdentity};
use storage::{Refusal, Verdict};
use testkit::postgres::patroni::{connect, Member};
use testkit::workload::{lost_on, Acks};
use testkit::{PatroniCluster, PatroniOptions};
use tokio::task::JoinHandle;

use crate::common::*;

/// Units each SKU is stocked with; nothing restocks during the run, so every SKU must end with
/// exactly this many units on hand.
pub const STOCK: i64 = 1_000_000;

/// Patroni tests start a dozen processes each; on a 2-core machine two at once would measure
/// each other, so they take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Patroni cluster of two nodes, a migrated database on it and one allocator replica given the
/// multi-host URL, owning every partition; SKUs with [`STOCK`] units each.
pub struct Setup {
    pub pg: PatroniCluster,
    pub replica: TestReplica,
    pub url: String,
    pub db: String,
    pub skus: Vec<String>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// `etcd_proxies`: each agent reaches etcd through proxies of its own, so that one node can be
/// cut off from etcd.
pub async fn setup(db: &str, etcd_proxies: bool) -> Setup {
    let turn = TURN.lock().await;
    let started = Instant::now();
    let options = PatroniOptions {
        nodes: 2,
        etcd_proxies,
        ..PatroniOptions::default()
    };
    let pg = PatroniCluster::start_with(options)
        .await
        .expect("Patroni cluster");
    let url = pg.create_database(db).await.expect("database");
    migrate(&url, PARTITIONS).await;
    let replica = TestReplica::start(fast_config(&url, &format!("{db}-a"))).await;
    wait_owns_all(&replica).await;
    let skus: Vec<String> = (0..8).map(|i| format!("{db}-{i}")).collect();
    for sku in &skus {
        restock(&replica.url, sku, STOCK).await;
    }
    eprintln!("{db}: cluster up in {:?}: {url}", started.elapsed());
    Setup {
        pg,
        replica,
        url,
        db: db.to_owned(),
        skus,
        _turn: turn,
    }
}

/// What node `name` says it is, read as the storage fence reads it.
pub async fn identity_of(pg: &PatroniCluster, name: &str, db: &str) -> ServerIdentity {
    let client = connect(&pg.node(name).unwrap().url_for(db))
        .await
        .expect("connect");
    storage::identity::read(&client).await.expect("identity")
}

/// One reading of one node.
pub struct Sample {
    pub at: Instant,
    pub node: String,
    pub identity: ServerIdentity,
}

/// Reads every node's identity every 100 ms over a session of its own per node, reconnecting
/// after a failure, until stopped.
pub struct IdentitySampler {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Sample>>,
}

impl IdentitySampler {
    pub fn start(pg: &PatroniCluster, db: &str) -> IdentitySampler {
        let nodes: Vec<(String, String)> = pg
            .nodes()
            .iter()
            .map(|n| (n.name().to_owned(), n.url_for(db)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut sessions: Vec<Option<tokio_postgres::Client>> =
                nodes.iter().map(|_| None).collect();
            while !stopped.load(Ordering::Relaxed) {
                for (i, (name, url)) in nodes.iter().enumerate() {
                    if sessions[i].as_ref().is_none_or(|c| c.is_closed()) {
                        sessions[i] = connect(url).await.ok();
                    }
                    let Some(client) = &sessions[i] else { continue };
                    let read = tokio::time::timeout(
                        Duration::from_secs(1),
                        storage::identity::read(client),
                    )
                    .await;
                    match read {
                        Ok(Ok(identity)) => samples.push(Sample {
                            at: Instant::now(),
                            node: name.clone(),
                            identity,
                        }),
                        _ => sessions[i] = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        IdentitySampler { stop, task }
    }

    pub async fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("sampler")
    }
}

/// Replays every reading in time order through the fence's rule (what a process that saw them
/// all would know). Once a node other than `old` was seen writable ahead of `stale` (the old
/// primary as it was before the fault), nothing `old` answers may be judged writable, and `stale`
/// itself must be refused as `behind`. Returns when the promoted primary was first seen.
pub fn check_fence(samples: &[Sample], old: &str, stale: &ServerIdentity) -> Instant {
    let mut known = Known::default();
    let mut promoted_seen = None;
    for sample in samples {
        let (verdict, _) = known.judge(&sample.identity);
        if sample.node != old
            && verdict == Verdict::Writable
            && sample.identity.position() > stale.position()
        {
            promoted_seen.get_or_insert(sample.at);
        }
        if sample.node == old && promoted_seen.is_some() {
            assert_ne!(
                verdict,
                Verdict::Writable,
                "the old primary {old} answered as a writable primary after the promotion: {:?}",
                sample.identity
            );
        }
    }
    let promoted_seen = promoted_seen.expect("the promoted primary was never seen");
    assert_eq!(
        known.judge(stale).0,
        Verdict::Refused(Refusal::Behind),
        "the old primary as it was before the fault is not refused"
    );
    promoted_seen
}

/// The old primary is back as a running standby on the leader's (newer) timeline; the cluster
/// waited for it to stream, so `members` is what `GET /cluster` showed then.
pub fn check_rejoined(members: &[Member], old: &str, timeline_before: i32) {
    let leader = members.iter().find(|m| m.role == "leader").expect("leader");
    let back = members.iter().find(|m| m.name == old).expect("old primary");
    assert_ne!(leader.name, old, "{old} still leads: {members:?}");
    assert!(
        matches!(back.role.as_str(), "replica" | "sync_standby") && back.state == "running",
        "{old} is not a running standby: {members:?}"
    );
    assert!(
        leader.timeline > Some(i64::from(timeline_before)) && back.timeline == leader.timeline,
        "{old} is not on the new timeline: {members:?}"
    );
}

/// Every acknowledged hold and confirmation is on the new primary, and every SKU balances:
/// `available + held + confirmed = on_hand = STOCK`, the inventory row equals its ledger, and the
/// held and confirmed units are exactly those of the reservations in those states.
pub async fn check_database(url: &str, acks: &Acks, skus: &[String]) {
    let client = client(url).await;
    let lost = lost_on(&client, acks).await.expect("read back");
    assert_eq!(
        lost.total(),
        0,
        "acknowledged writes lost: {} holds, {} confirmations: {:?}",
        lost.holds.len(),
        lost.confirms.len(),
        lost.all().take(10).collect::<Vec<_>>()
    );
    for sku in skus {
        let (row, ledger) = ledger_balance(&client, sku).await;
        assert_eq!(row, ledger, "{sku}: the row differs from its ledger");
        assert_eq!(row.on_hand, STOCK, "{sku}: stock changed");
        assert_eq!(
            row.available + row.held + row.confirmed,
            row.on_hand,
            "{sku}: oversold or lost units: {row:?}"
        );
        assert!(
            row.available >= 0 && row.held >= 0 && row.confirmed >= 0,
            "{sku}: {row:?}"
        );
        let by_status = client
            .query_one(
                "SELECT coalesce(sum(quantity) FILTER (WHERE status = 'held'), 0)::bigint,
                        coalesce(sum(quantity) FILTER (WHERE status = 'confirmed'), 0)::bigint
                   FROM reservations WHERE sku = $1",
                &[sku],
            )
            .await
            .expect("reservation sums");
        assert_eq!(
            (row.held, row.confirmed),
            (by_status.get::<_, i64>(0), by_status.get::<_, i64>(1)),
            "{sku}: held/confirmed units differ from the reservations"
        );
    }
}
