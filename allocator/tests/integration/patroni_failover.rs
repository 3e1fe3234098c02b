//! Failover the way Patroni does it, under load: an allocator given the multi-host URL of a
//! two-node Patroni cluster (synchronous mode, `pg_rewind`, three etcd members; see
//! `testkit::postgres::patroni`) serves a stream of reserves with unique ids while
//!
//! - the leader's postmaster is `SIGKILL`ed: Patroni notices within one loop (2 s) and, with
//!   `primary_start_timeout = 0`, fails over to the synchronous standby instead of restarting in
//!   place; the old primary rejoins as a standby (through `pg_rewind` when its WAL went past the
//!   fork);
//! - an operator runs `patronictl switchover --force`: the leader shuts down cleanly, the standby
//!   is promoted and the old leader follows it.
//!
//! Afterwards every acknowledged hold (`201`) and confirmation is on the new primary (0 lost),
//! every SKU balances (`available + held + confirmed = on_hand`, the row equals its ledger, no
//! oversell), `GET /cluster` shows the old primary running as a standby on the new timeline and
//! it streams, and the identities every node gave through the fault, replayed through the storage
//! fence's rule, never make the old primary writable after the promotion, while the old primary
//! as it was is refused (`behind`). The times from the fault to the first successful reserve (of
//! a request sent after the fault), to the promotion and to the rejoin are printed
//! (`--nocapture`), not asserted: they depend on Patroni's timings and the machine.

use std::time::{Duration, Instant};

use testkit::workload::{Acks, Shape, Workload};

use crate::common::metrics_text;
use crate::patroni_support::*;

/// Reserving clients; no restocker, so stock stays [`STOCK`].
const LOAD: Shape = Shape {
    clients: 4,
    restock: false,
};
/// Bound on Patroni electing a new leader after a fault.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on the old primary rejoining and streaming (10–30 s seen; a loaded CI machine is
/// slower at crash recovery, `pg_rewind` and catching up).
const REJOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on the allocator serving again after the promotion.
const SERVICE_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_postmaster_fails_over_and_loses_no_acknowledged_hold() {
    run_fault(setup("patroni_kill", false).await, Fault::KillPostmaster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patronictl_switchover_loses_no_acknowledged_hold() {
    run_fault(setup("patroni_switchover", false).await, Fault::Switchover).await;
}

/// Not in CI (each waits out Patroni's `ttl`): `ops/patroni-faults.sh` runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "waits out the leader key's ttl; run by ops/patroni-faults.sh"]
async fn a_frozen_leader_agent_is_replaced_and_its_server_refused() {
    run_fault(setup("patroni_freeze", false).await, Fault::FreezeAgent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "waits out the leader key's ttl; run by ops/patroni-faults.sh"]
async fn a_leader_cut_off_from_etcd_demotes_itself_and_is_replaced() {
    run_fault(setup("patroni_etcd_cut", true).await, Fault::CutFromEtcd).await;
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `SIGKILL` of the leader's postmaster.
    KillPostmaster,
    /// `patronictl switchover --force` to the synchronous standby.
    Switchover,
    /// `SIGSTOP` of the leader's Patroni agent (its PostgreSQL runs on, writable), thawed
    /// [`COEXIST`] after the standby was promoted.
    FreezeAgent,
    /// The leader's agent cut off from every etcd member, reconnected [`COEXIST`] after the
    /// standby was promoted.
    CutFromEtcd,
}

/// How long a frozen or cut-off old leader runs beside the promoted one before it is healed.
const COEXIST: Duration = Duration::from_secs(3);

/// Load for 3 s, the fault, then load until the old primary streams again plus 2 s; then the
/// checks of the module documentation.
async fn run_fault(mut setup: Setup, fault: Fault) {
    let db = setup.db.clone();
    let pg = &setup.pg;
    let old = pg.leader().await.expect("leader").name;
    let candidate = pg
        .members()
        .await
        .expect("members")
        .into_iter()
        .find(|m| m.role == "sync_standby")
        .expect("a synchronous standby")
        .name;
    let stale = identity_of(pg, &old, &db).await;
    let sampler = IdentitySampler::start(pg, &db);
    let load = Workload::start(&setup.replica.url, &setup.skus, LOAD);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = load.with_acks(|a| a.holds.len());
    assert!(before > 0, "no hold before the fault");

    let fault_at = Instant::now();
    match fault {
        Fault::KillPostmaster => {
            let pid = pg.kill_postmaster(&old).expect("kill the postmaster");
            eprintln!("killed {old}'s postmaster (pid {pid})");
        }
        Fault::Switchover => {
            let out = pg.switchover(&old, &candidate).await.expect("switchover");
            let said = out.lines().find(|l| l.contains("witched over"));
            eprintln!("patronictl: {}", said.unwrap_or(&out));
        }
        Fault::FreezeAgent => setup.pg.freeze_agent(&old).expect("freeze the agent"),
        Fault::CutFromEtcd => setup.pg.cut_from_etcd(&old).expect("cut from etcd"),
    }
    let pg = &setup.pg;
    let new_leader = pg
        .wait_for(PROMOTION_TIMEOUT, "a new leader", |c| {
            let old = old.clone();
            async move {
                let leader = c.leader().await?;
                anyhow::ensure!(leader.name != old, "{old} still leads");
                Ok(leader)
            }
        })
        .await
        .expect("promotion");
    let promoted_after = fault_at.elapsed();
    if matches!(fault, Fault::FreezeAgent | Fault::CutFromEtcd) {
        tokio::time::sleep(COEXIST).await;
        match fault {
            Fault::FreezeAgent => setup.pg.thaw_agent(&old).expect("thaw the agent"),
            _ => setup.pg.reconnect_etcd(&old).expect("reconnect etcd"),
        }
    }
    let pg = &setup.pg;
    let deadline = Instant::now() + SERVICE_TIMEOUT;
    let service_after = loop {
        if let Some(after) = load.with_acks(|a| a.first_success_sent_after(fault_at)) {
            break after;
        }
        assert!(
            Instant::now() < deadline,
            "no reserve succeeded within {SERVICE_TIMEOUT:?} after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let members = match pg.wait_healthy(REJOIN_TIMEOUT).await {
        Ok(members) => members,
        Err(e) => {
            // Say what the acknowledged writes became before failing: whichever node leads now
            // is the one an operator keeps.
            let acks = load.finish().await;
            let leader = pg.leader().await.map(|m| m.name);
            let lost = match &leader {
                Ok(name) => {
                    let client =
                        testkit::postgres::patroni::connect(&pg.node(name).unwrap().url_for(&db))
                            .await
                            .expect("connect to the leader");
                    let lost = testkit::workload::lost_on(&client, &acks).await;
                    lost.map(|l| {
                        format!(
                            "{} holds, {} confirmations",
                            l.holds.len(),
                            l.confirms.len()
                        )
                    })
                }
                Err(e) => Err(anyhow::anyhow!("no leader: {e}")),
            };
            let rewound_back = pg
                .node(&new_leader.name)
                .unwrap()
                .log_contains(&format!("running pg_rewind from {old}"));
            panic!(
                "the old primary did not rejoin: {e:#}\nleader now: {leader:?}; {} rewound back \
                 onto {old}: {rewound_back}; acknowledged writes missing on the leader: {lost:?}",
                new_leader.name
            );
        }
    };
    let rejoined_after = fault_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = Instant::now();
    let acks: Acks = load.finish().await;
    let samples = sampler.finish().await;

    let old_node = pg.node(&old).unwrap();
    let rewound = old_node.log_contains("pg_rewind exit code=0");
    let fence_learnt = check_fence(&samples, &old, &stale);
    eprintln!(
        "{fault:?}: {old} -> {}: promoted after {promoted_after:?} (seen by the fence after \
         {:?}); first reserve sent after the fault succeeded {service_after:?} after it; longest \
         time without a 2xx {:?}; {old} streaming again after {rejoined_after:?} ({}); {} holds \
         and {} confirmations acknowledged, {} reserves refused or unanswered",
        new_leader.name,
        fence_learnt.saturating_duration_since(fault_at),
        acks.longest_gap(fault_at - Duration::from_secs(1), end),
        if rewound {
            "rewound with pg_rewind"
        } else {
            "no divergence, pg_rewind not needed"
        },
        acks.holds.len(),
        acks.confirms.len(),
        acks.failed_reserves.len(),
    );
    // One line for ops/patroni-faults.sh's summary over runs (seconds from the fault).
    eprintln!(
        "failover-times fault={fault:?} promoted={:.3} service={:.3} gap={:.3} rejoined={:.3}",
        promoted_after.as_secs_f64(),
        service_after.as_secs_f64(),
        acks.longest_gap(fault_at - Duration::from_secs(1), end)
            .as_secs_f64(),
        rejoined_after.as_secs_f64(),
    );
    // The fence's own series (process-wide: other tests running beside this one add to them).
    let fence_series: Vec<String> = metrics_text(&setup.replica.url)
        .await
        .lines()
        .filter(|l| l.starts_with("allocator_storage_") && !l.contains("lag"))
        .map(str::to_owned)
        .collect();
    eprintln!("allocator's storage fence: {}", fence_series.join("; "));
    check_rejoined(&members, &old, stale.timeline);
    check_database(&setup.url, &acks, &setup.skus).await;
    assert!(
        acks.successes_after(fault_at + service_after) > 0,
        "the allocator did not keep serving after the failover"
    );
    setup.replica.stop().await;
}
