//! The lanes through their seams: a fake authority and fake statements, no database.
//!
//! Each test first holds the only lane with a statement of partition 0, queues what it is
//! about, and then lets the lane go, so what the lane takes next is exactly what was queued.

use std::time::Duration;

use super::fakes::*;
use super::*;
use crate::lease::state::Authority;

fn tenure(partition: u32) -> FenceToken {
    FenceToken::new(partition, 1)
}

/// A committer with one lane whose first statement (partition 0) is held until the returned
/// sender fires.
async fn held_lane(
    settings: CommitSettings,
) -> (
    Arc<FakeStatements>,
    Arc<FakeAuthority>,
    Committer,
    oneshot::Sender<()>,
) {
    let (statements, mut started) = FakeStatements::new();
    let authority = FakeAuthority::new();
    let open = statements.hold(0);
    let (committer, _lanes) = Committer::spawn_with(statements.clone(), settings);
    let _blocker = submit(&committer, &authority, tenure(0), vec![reserve("z")], false).await;
    assert_eq!(started.recv().await, Some(vec![0]), "the lane is busy");
    (statements, authority, committer, open)
}

async fn answered(reply: Reply) -> Result<Vec<Outcome>, CommitError> {
    tokio::time::timeout(Duration::from_secs(10), reply)
        .await
        .expect("answered in time")
        .expect("answered, not dropped")
}

/// Queue one batch per `(partition, commands)`, each of tenure 1.
async fn queue(
    committer: &Committer,
    authority: &Arc<FakeAuthority>,
    batches: impl IntoIterator<Item = (u32, Vec<Command>)>,
) -> Vec<Reply> {
    let mut replies = Vec::new();
    for (p, commands) in batches {
        replies.push(
            submit(committer, authority, tenure(p), commands, false)
                .await
                .1,
        );
    }
    replies
}

/// One reserve `r<p>` for each partition.
fn reserves(partitions: impl IntoIterator<Item = u32>) -> Vec<(u32, Vec<Command>)> {
    partitions
        .into_iter()
        .map(|p| (p, vec![reserve(&format!("r{p}"))]))
        .collect()
}

async fn all_committed(replies: Vec<Reply>) {
    for reply in replies {
        answered(reply).await.expect("committed");
    }
}

#[tokio::test]
async fn queued_batches_of_different_partitions_share_one_statement_in_queue_order() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    let replies = queue(&committer, &authority, reserves([3, 1, 2])).await;
    drop(open);
    for (reply, p) in replies.into_iter().zip([3u64, 1, 2]) {
        let outcomes = answered(reply).await.expect("committed");
        assert_eq!(
            outcomes,
            vec![Outcome::Expired { count: p }],
            "each batch its own answers"
        );
    }
    assert_eq!(statements.groups_after_first(), vec![vec![3, 1, 2]]);
}

#[tokio::test]
async fn a_partition_never_twice_in_a_group_and_a_solo_batch_runs_alone() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    let retaken = FenceToken::new(1, 2);
    let mut replies = Vec::new();
    for (token, solo) in [
        (tenure(1), false),
        (tenure(2), false),
        // The partition taken again while its ended tenure's batch still waits.
        (retaken, false),
        (tenure(3), false),
        (tenure(4), true),
    ] {
        replies.push(
            submit(&committer, &authority, token, vec![reserve("x")], solo)
                .await
                .1,
        );
    }
    drop(open);
    all_committed(replies).await;
    let calls = statements.calls();
    let groups: Vec<Vec<FenceToken>> = calls.iter().skip(1).map(|c| c.tenures.clone()).collect();
    assert_eq!(
        groups,
        vec![
            vec![tenure(1), tenure(2), tenure(3)],
            vec![retaken],
            vec![tenure(4)],
        ],
        "one tenure per partition per group; the second tenure and the solo batch after it"
    );
}

#[tokio::test]
async fn a_group_stops_at_its_partition_and_command_limits() {
    let mut limited = settings();
    limited.max_partitions = 2;
    let (statements, authority, committer, open) = held_lane(limited).await;
    let replies = queue(&committer, &authority, reserves(1..=5)).await;
    drop(open);
    all_committed(replies).await;
    assert_eq!(
        statements.groups_after_first(),
        vec![vec![1, 2], vec![3, 4], vec![5]]
    );

    let mut limited = settings();
    limited.max_commands = 3;
    let (statements, authority, committer, open) = held_lane(limited).await;
    let two = |p: u32| {
        (
            p,
            vec![reserve(&format!("a{p}")), reserve(&format!("b{p}"))],
        )
    };
    let replies = queue(&committer, &authority, (1..=3).map(two)).await;
    drop(open);
    all_committed(replies).await;
    // A batch joins while the group holds fewer commands than the limit.
    assert_eq!(statements.groups_after_first(), vec![vec![1, 2], vec![3]]);
}

#[tokio::test]
async fn a_mixed_group_sends_plain_reserves_to_the_set_based_statement_and_the_rest_to_the_function(
) {
    let batches = || {
        vec![
            (1, vec![reserve("a")]),
            (2, vec![confirm("b")]),
            (3, vec![reserve("c"), reserve("d")]),
            // A reserve of an id another batch of the group also names stays with that batch.
            (4, vec![reserve("e")]),
            (5, vec![confirm("e")]),
        ]
    };
    let (statements, authority, committer, open) = held_lane(settings()).await;
    let replies = queue(&committer, &authority, batches()).await;
    drop(open);
    all_committed(replies).await;
    assert_eq!(
        statements.groups_after_first(),
        vec![vec![1, 3], vec![2, 4, 5]]
    );

    // Without the set-based statement nothing is split.
    let mut function_only = settings();
    function_only.set_based_reserves = false;
    let (statements, authority, committer, open) = held_lane(function_only).await;
    let replies = queue(&committer, &authority, batches()).await;
    drop(open);
    all_committed(replies).await;
    let calls = statements.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].partitions(), vec![1, 2, 3, 4, 5]);
    assert!(!calls[1].set_based);
}

#[tokio::test]
async fn an_ended_tenure_is_answered_without_running_and_an_unconfirmed_one_is_unavailable() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    let (_, ended) = submit(&committer, &authority, tenure(1), vec![reserve("a")], false).await;
    let (_, unconfirmed) =
        submit(&committer, &authority, tenure(2), vec![reserve("b")], false).await;
    let (_, early) = submit(&committer, &authority, tenure(3), vec![reserve("c")], false).await;
    let (_, late) = submit(&committer, &authority, tenure(4), vec![reserve("d")], false).await;
    // While they waited: tenure 1 ended, 2's renewal is unconfirmed.
    authority.set(tenure(1), Authority::NotHeld);
    authority.set(tenure(2), Authority::Uncertain);
    authority.grant_until(tenure(3), 7);
    authority.grant_until(tenure(4), 9);
    drop(open);
    assert!(matches!(answered(ended).await, Err(CommitError::Ended)));
    assert!(matches!(
        answered(unconfirmed).await,
        Err(CommitError::Unavailable {
            outcome_unknown: false,
            ..
        })
    ));
    answered(early).await.expect("committed");
    answered(late).await.expect("committed");
    let calls = statements.calls();
    assert_eq!(calls.len(), 2, "one statement after the first");
    assert_eq!(
        calls[1].partitions(),
        vec![3, 4],
        "neither withheld batch ran"
    );
    assert_eq!(
        calls[1].deadline,
        authority.base + Duration::from_secs(7),
        "bounded by the earliest safe deadline"
    );
}

#[tokio::test]
async fn a_withdrawn_batch_never_runs() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    // Withdrawn as the first batch the lane will find, and again behind a live one.
    let (first, first_reply) =
        submit(&committer, &authority, tenure(1), vec![reserve("a")], false).await;
    let (_, live) = submit(&committer, &authority, tenure(2), vec![reserve("b")], false).await;
    let (later, later_reply) =
        submit(&committer, &authority, tenure(3), vec![reserve("c")], false).await;
    assert!(
        first.withdraw() && later.withdraw(),
        "queued, so the worker wins"
    );
    drop(open);
    answered(live).await.expect("committed");
    assert!(
        first_reply.await.is_err(),
        "no lane answers a withdrawn batch"
    );
    assert!(
        later_reply.await.is_err(),
        "no lane answers a withdrawn batch"
    );
    assert_eq!(statements.groups_after_first(), vec![vec![2]]);
    assert!(!first.take(), "claimed once only");
}

#[tokio::test]
async fn a_group_that_fails_whole_is_rerun_partition_by_partition() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    statements.answer(2, Answer::FailGroup);
    let replies = queue(&committer, &authority, reserves(1..=3)).await;
    drop(open);
    let results: Vec<_> = futures::future::join_all(replies.into_iter().map(answered)).await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(matches!(
        results[1],
        Err(CommitError::Fenced(FencedError::Malformed(_)))
    ));
    assert_eq!(
        statements.groups_after_first(),
        vec![vec![1, 2, 3], vec![1], vec![2], vec![3]]
    );
}

#[tokio::test]
async fn a_group_whose_outcome_is_unknown_is_not_rerun_and_every_batch_learns_so() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    statements.answer(1, Answer::Unknown);
    let (_, one) = submit(&committer, &authority, tenure(1), vec![reserve("a")], false).await;
    let (_, two) = submit(&committer, &authority, tenure(2), vec![reserve("b")], false).await;
    drop(open);
    for reply in [one, two] {
        assert!(matches!(
            answered(reply).await,
            Err(CommitError::Unavailable {
                outcome_unknown: true,
                ..
            })
        ));
    }
    assert_eq!(
        statements.groups_after_first(),
        vec![vec![1, 2]],
        "never run twice"
    );
}

#[tokio::test]
async fn a_solo_batch_found_first_runs_alone_and_what_queued_behind_it_forms_the_next_group() {
    let (statements, authority, committer, open) = held_lane(settings()).await;
    let (_, solo) = submit(&committer, &authority, tenure(1), vec![reserve("a")], true).await;
    let (_, two) = submit(&committer, &authority, tenure(2), vec![reserve("b")], false).await;
    let (_, three) = submit(&committer, &authority, tenure(3), vec![reserve("c")], false).await;
    drop(open);
    for reply in [solo, two, three] {
        answered(reply).await.expect("committed");
    }
    assert_eq!(statements.groups_after_first(), vec![vec![1], vec![2, 3]]);
}

/// Two lanes (at least one always open): a batch that arrives while the other lane's statement
/// runs takes the idle lane at once, before the first statement answers.
#[tokio::test]
async fn a_lone_batch_is_not_queued_behind_an_idle_lane() {
    let mut settings = settings();
    settings.lanes = std::num::NonZeroUsize::new(2).unwrap();
    let (statements, mut started) = FakeStatements::new();
    let authority = FakeAuthority::new();
    let open = statements.hold(0);
    let (committer, _lanes) = Committer::spawn_with(statements.clone(), settings);
    let (_, first) = submit(&committer, &authority, tenure(0), vec![reserve("a")], false).await;
    assert_eq!(
        started.recv().await,
        Some(vec![0]),
        "the first lane is busy"
    );
    let (_, lone) = submit(&committer, &authority, tenure(1), vec![reserve("b")], false).await;
    let second = tokio::time::timeout(Duration::from_secs(5), started.recv()).await;
    assert_eq!(
        second.ok().flatten(),
        Some(vec![1]),
        "the lone batch ran beside the held statement"
    );
    answered(lone).await.expect("committed");
    drop(open);
    answered(first).await.expect("committed");
}
