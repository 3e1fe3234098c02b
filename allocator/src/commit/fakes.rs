//! Test doubles for the commit path's seams: an authority whose answer the test sets, and
//! statements that record what the lanes send and answer without a database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::{Claim, CommitError, CommitSettings, Committer, GroupResult, Statements, Submission};
use crate::authority::{AuthoritySource, PartitionAuthority};
use crate::fenced::{Command, Fence, FencedError, Outcome, PartitionBatch};
use crate::lease::state::{Authority, LossCause};
use crate::lease::FenceToken;

pub const REPLICA: &str = "replica-a";

/// The lease table as the test sets it: every tenure is granted until `base + 60 s` unless told
/// otherwise.
pub struct FakeAuthority {
    pub base: Instant,
    answers: Mutex<HashMap<FenceToken, Authority>>,
    asked: Mutex<HashMap<FenceToken, usize>>,
    pub losses: Mutex<Vec<(FenceToken, LossCause)>>,
}

impl FakeAuthority {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            answers: Mutex::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
            losses: Mutex::new(Vec::new()),
        })
    }

    pub fn set(&self, token: FenceToken, authority: Authority) {
        self.answers.lock().unwrap().insert(token, authority);
    }

    /// Granted until `base + secs`.
    pub fn grant_until(&self, token: FenceToken, secs: u64) {
        let safe_until = self.base + Duration::from_secs(secs);
        self.set(
            token,
            Authority::Granted {
                epoch: token.epoch,
                safe_until,
            },
        );
    }

    /// How often `token`'s authority was asked.
    pub fn asked(&self, token: FenceToken) -> usize {
        self.asked.lock().unwrap().get(&token).copied().unwrap_or(0)
    }

    pub fn handle(self: &Arc<Self>, token: FenceToken) -> PartitionAuthority {
        PartitionAuthority::new(token, self.clone())
    }
}

impl AuthoritySource for FakeAuthority {
    fn authority(&self, token: FenceToken) -> Authority {
        *self.asked.lock().unwrap().entry(token).or_default() += 1;
        let answers = self.answers.lock().unwrap();
        answers.get(&token).copied().unwrap_or(Authority::Granted {
            epoch: token.epoch,
            safe_until: self.base + Duration::from_secs(60),
        })
    }

    fn report_loss(&self, token: FenceToken, cause: LossCause) {
        self.losses.lock().unwrap().push((token, cause));
    }
}

/// One statement a lane sent.
#[derive(Debug, Clone)]
pub struct Call {
    pub set_based: bool,
    pub tenures: Vec<FenceToken>,
    pub commands: Vec<Vec<Command>>,
    pub deadline: Instant,
}

impl Call {
    pub fn partitions(&self) -> Vec<u32> {
        self.tenures.iter().map(|t| t.partition).collect()
    }
}

/// How the fake database answers a statement that carries a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The whole statement fails and rolls back (nothing committed).
    FailGroup,
    /// The statement may have committed: the connection went away (deadline reached).
    Unknown,
    /// The partition's fence refuses its epoch; the others commit.
    Stale,
}

/// Statements that record every group and answer each command `Expired { count: partition }`.
#[derive(Default)]
pub struct FakeStatements {
    pub calls: Mutex<Vec<Call>>,
    /// A statement carrying this partition waits until the sender is dropped or fires.
    holds: Mutex<HashMap<u32, oneshot::Receiver<()>>>,
    answers: Mutex<HashMap<u32, Answer>>,
    started: Mutex<Option<mpsc::UnboundedSender<Vec<u32>>>>,
}

impl FakeStatements {
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Vec<u32>>) {
        let (sender, started) = mpsc::unbounded_channel();
        let fake = Self::default();
        *fake.started.lock().unwrap() = Some(sender);
        (Arc::new(fake), started)
    }

    /// Hold the next statement that carries `partition` until the returned sender fires.
    pub fn hold(&self, partition: u32) -> oneshot::Sender<()> {
        let (open, held) = oneshot::channel();
        self.holds.lock().unwrap().insert(partition, held);
        open
    }

    pub fn answer(&self, partition: u32, answer: Answer) {
        self.answers.lock().unwrap().insert(partition, answer);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Every statement after the first (the one holding the lane), by partitions.
    pub fn groups_after_first(&self) -> Vec<Vec<u32>> {
        self.calls().iter().skip(1).map(Call::partitions).collect()
    }
}

impl Statements for FakeStatements {
    fn run<'a>(
        &'a self,
        group: &'a [PartitionBatch<'a>],
        set_based: bool,
        deadline: Instant,
    ) -> BoxFuture<'a, GroupResult> {
        let call = Call {
            set_based,
            tenures: group.iter().map(|b| b.fence.token).collect(),
            commands: group.iter().map(|b| b.commands.to_vec()).collect(),
            deadline,
        };
        let partitions = call.partitions();
        self.calls.lock().unwrap().push(call);
        let held: Vec<_> = {
            let mut holds = self.holds.lock().unwrap();
            partitions.iter().filter_map(|p| holds.remove(p)).collect()
        };
        if let Some(started) = &*self.started.lock().unwrap() {
            let _ = started.send(partitions.clone());
        }
        let answers = self.answers.lock().unwrap().clone();
        Box::pin(async move {
            for hold in held {
                let _ = hold.await;
            }
            let answer = |p: &u32| answers.get(p).copied();
            if partitions
                .iter()
                .any(|p| answer(p) == Some(Answer::Unknown))
            {
                return Err(CommitError::Unavailable {
                    reason: "lease safe deadline reached during the transaction".into(),
                    outcome_unknown: true,
                });
            }
            if partitions
                .iter()
                .any(|p| answer(p) == Some(Answer::FailGroup))
            {
                return Err(CommitError::Fenced(FencedError::Malformed(
                    "refused".into(),
                )));
            }
            Ok(group
                .iter()
                .map(|b| {
                    let token = b.fence.token;
                    if answer(&token.partition) == Some(Answer::Stale) {
                        return Err(FencedError::stale(token, Some(token.epoch + 1)));
                    }
                    Ok(b.commands
                        .iter()
                        .map(|_| Outcome::Expired {
                            count: u64::from(token.partition),
                        })
                        .collect())
                })
                .collect())
        })
    }
}

/// One lane, group commit on, the set-based statement on.
pub fn settings() -> CommitSettings {
    let one = std::num::NonZeroUsize::new(1).unwrap();
    CommitSettings {
        lanes: one,
        min_lanes: one,
        max_partitions: 8,
        max_commands: 64,
        pool_wait: Duration::from_secs(1),
        set_based_reserves: true,
    }
}

pub fn reserve(id: &str) -> Command {
    Command::Reserve {
        reservation_id: id.to_owned(),
        sku: format!("sku-{id}"),
        quantity: 1,
        ttl_seconds: 60,
        owner: Default::default(),
    }
}

pub fn confirm(id: &str) -> Command {
    Command::Confirm {
        reservation_id: id.to_owned(),
        owner: Default::default(),
    }
}

pub type Reply = oneshot::Receiver<Result<Vec<Outcome>, CommitError>>;

/// Queue a batch of `token`'s tenure as a worker would.
pub async fn submit(
    committer: &Committer,
    authority: &Arc<FakeAuthority>,
    token: FenceToken,
    commands: Vec<Command>,
    solo: bool,
) -> (Arc<Claim>, Reply) {
    let (reply, answer) = oneshot::channel();
    let claim = Arc::new(Claim::default());
    let submission = Submission {
        fence: Fence::new(token, REPLICA),
        authority: authority.handle(token),
        commands,
        solo,
        claim: claim.clone(),
        stamps: Default::default(),
        reply,
    };
    assert!(committer.submit(submission).await.is_ok(), "lanes running");
    (claim, answer)
}

/// Wait (bounded) until `done` holds; other tasks run meanwhile.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out waiting until {what}");
}
