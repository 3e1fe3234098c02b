//! A campaign round's decision, from what it read: no database, a seeded shuffle.

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::lease::store::CampaignView;

fn view(partition_count: u32, live: u32, free: &[u32], mine: &[u32]) -> CampaignView {
    CampaignView {
        live_replicas: live,
        partition_count,
        free: free.to_vec(),
        named_for_me: mine.to_vec(),
    }
}

fn holding(partitions: &[u32]) -> Vec<FenceToken> {
    partitions.iter().map(|&p| FenceToken::new(p, 1)).collect()
}

fn decide(round: Round, view: CampaignView, held: &[u32]) -> Plan {
    let count = view.partition_count;
    plan(
        round,
        view,
        &holding(held),
        count,
        &mut StdRng::seed_from_u64(7),
    )
}

fn wanted(plan: &Plan) -> usize {
    match plan {
        Plan::Acquire { wanted, .. } => *wanted,
        other => panic!("expected an acquisition, got {other:?}"),
    }
}

#[test]
fn the_fair_share_is_the_partition_count_over_live_replicas_rounded_up() {
    let free: Vec<u32> = (0..10).collect();
    // 10 partitions, 3 replicas: ceil(10 / 3) = 4, of which one is held.
    assert_eq!(
        wanted(&decide(Round::Timed, view(10, 3, &free, &[]), &[0])),
        3
    );
    assert_eq!(
        wanted(&decide(Round::Timed, view(10, 1, &free, &[]), &[])),
        10
    );
    assert_eq!(
        wanted(&decide(Round::Timed, view(10, 10, &free, &[]), &[])),
        1
    );
    // An announced round acquires as a timed one does.
    assert_eq!(
        wanted(&decide(Round::Announced, view(10, 4, &free, &[]), &[])),
        3
    );
    // At the share: nothing to do.
    assert_eq!(
        decide(Round::Timed, view(10, 3, &free, &[]), &[1, 2, 3, 4]),
        Plan::Hold
    );
}

#[test]
fn leases_still_named_for_this_replica_are_tried_before_free_ones() {
    let free = [0, 1, 2, 3, 8, 9];
    let Plan::Acquire { candidates, .. } =
        decide(Round::Timed, view(12, 2, &free, &[6, 4, 5]), &[5])
    else {
        panic!("below the share");
    };
    // Its own leases first (except one it already serves), then every free one.
    assert_eq!(candidates[..2], [6, 4]);
    let mut rest = candidates[2..].to_vec();
    rest.sort_unstable();
    assert_eq!(rest, free);
}

#[test]
fn free_partitions_are_tried_in_a_random_order() {
    let free: Vec<u32> = (0..32).collect();
    let orders: std::collections::HashSet<Vec<u32>> = (0..4)
        .map(|seed| {
            let plan = plan(
                Round::Timed,
                view(32, 2, &free, &[]),
                &[],
                32,
                &mut StdRng::seed_from_u64(seed),
            );
            match plan {
                Plan::Acquire { candidates, .. } => candidates,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    // Replicas campaigning at once should not all race for partition 0 first.
    assert!(orders.len() > 1, "{orders:?}");
}

#[test]
fn partitions_beyond_the_tables_count_are_never_candidates() {
    let plan = plan(
        Round::Timed,
        view(8, 1, &[2, 9], &[12, 3]),
        &[],
        8,
        &mut StdRng::seed_from_u64(1),
    );
    assert_eq!(
        plan,
        Plan::Acquire {
            candidates: vec![3, 2],
            wanted: 8
        }
    );
}

#[test]
fn surplus_is_handed_back_one_partition_per_timed_round() {
    // 8 partitions, 4 live: the share is 2 and this replica holds 4.
    let held = [1, 7, 3, 5];
    assert_eq!(
        decide(Round::Timed, view(8, 4, &[], &[]), &held),
        Plan::HandBack(7),
        "one partition, the highest held"
    );
    // An announced round only acquires; the first round only registers.
    assert_eq!(
        decide(Round::Announced, view(8, 4, &[], &[]), &held),
        Plan::Hold
    );
    assert_eq!(
        decide(Round::Register, view(8, 4, &[0], &[]), &[]),
        Plan::Hold
    );
}
