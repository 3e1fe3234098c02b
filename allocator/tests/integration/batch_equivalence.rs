//! One batch ≡ the same commands one per batch (DESIGN.md §6): the fenced batch decides in
//! arrival order, so batching changes how many statements run, never what they decide.
//!
//! A seeded property test over random command sequences against the real database: reserves,
//! confirms, releases, restocks and shrinks on a handful of ids and SKUs (some not stocked yet,
//! so a SKU can appear in the middle of a sequence), spread over two partitions, and the
//! occasional sweep. Each sequence runs once as one group (two partition batches in one
//! statement, in group order) on one database and once command by command, in the same order,
//! on another; the answers (but for
//! timestamps) and the stored rows must be the same. A failure names the seed and the sequence.

use std::time::Duration;

use crate::common::*;
use allocator::fenced::{
    apply_function, apply_group, fast, fenced_transaction, Command, Fence, Outcome, PartitionBatch,
};
use allocator::lease::{store, FenceToken};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use schema::partition::partition_for;

const CASES: u64 = 150;
const PARTS: [u32; 2] = [1, 6];

/// A SKU of `partition` named after the case.
fn sku(case: u64, partition: u32, n: u32) -> String {
    (0..)
        .map(|i| format!("eq{case}-{n}-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap()
}

/// The partition's commands of one case, in arrival order.
fn sequence(rng: &mut StdRng, case: u64) -> Vec<(u32, Command)> {
    // Some partitions get only reserves, so groups of plain reserves (the set-based statement)
    // and mixed groups (split as a lane splits them) both come up.
    let reserve_only = [rng.random_bool(0.4), rng.random_bool(0.4)];
    let len = rng.random_range(1..=14);
    (0..len)
        .map(|_| {
            let which = rng.random_range(0..PARTS.len());
            let partition = PARTS[which];
            let sku = sku(case, partition, rng.random_range(0..3));
            // Ids are shared by the partitions, as in production: an id used on the other
            // partition's SKU is a mismatch.
            let id = format!("eq{case}-r{}", rng.random_range(0..5));
            let pick = if reserve_only[which] {
                0
            } else {
                rng.random_range(0..10)
            };
            let command = match pick {
                0..=3 => Command::Reserve {
                    reservation_id: id,
                    sku,
                    quantity: rng.random_range(1..=4),
                    ttl_seconds: [60, 120][rng.random_range(0..2)],
                    owner: Default::default(),
                },
                4 => Command::Confirm {
                    reservation_id: id,
                    owner: Default::default(),
                },
                5 => Command::Release {
                    reservation_id: id,
                    owner: Default::default(),
                },
                6..=8 => Command::Adjust {
                    adjustment_id: format!("eq{case}-a{}", rng.random_range(0..4)),
                    sku,
                    delta: [-3, -1, 2, 5][rng.random_range(0..4)],
                    owner: access::Owner::ANYONE,
                },
                _ => Command::ExpireDue { limit: 10 },
            };
            (partition, command)
        })
        .collect()
}

/// An answer without its timestamps, which differ between two runs.
fn comparable(outcome: &Outcome) -> String {
    let mut outcome = outcome.clone();
    if let Outcome::Reservation { reservation, .. } = &mut outcome {
        reservation.expires_at = None;
    }
    format!("{outcome:?}")
}

/// Everything a case stored, in a stable order.
async fn stored(pg: &tokio_postgres::Client, case: u64) -> Vec<String> {
    let like = format!("eq{case}-%");
    let mut rows = Vec::new();
    for sql in [
        "SELECT concat_ws(' ', sku, partition, on_hand, available, held, confirmed, highest_epoch)
           FROM inventory WHERE sku LIKE $1 ORDER BY 1",
        "SELECT concat_ws(' ', reservation_id, sku, partition, quantity, status, epoch,
                          ttl_seconds, request_fingerprint, available_at_refusal,
                          expires_at IS NULL)
           FROM reservations WHERE reservation_id LIKE $1 ORDER BY 1",
        "SELECT concat_ws(' ', adjustment_id, sku, partition, delta, status, epoch,
                          on_hand_after, available_after)
           FROM adjustments WHERE adjustment_id LIKE $1 ORDER BY 1",
        "SELECT concat_ws(' ', sku, partition, kind, reservation_id, adjustment_id, d_on_hand,
                          d_available, d_held, d_confirmed, epoch)
           FROM ledger WHERE sku LIKE $1 ORDER BY 1",
    ] {
        for row in pg.query(sql, &[&like]).await.unwrap() {
            rows.push(row.get::<_, String>(0));
        }
    }
    rows
}

struct Side {
    pg: tokio_postgres::Client,
    pool: deadpool_postgres::Pool,
    fences: Vec<Fence>,
}

async fn side(name: &str) -> Side {
    let db = migrated_database(PARTITIONS).await;
    let pool = allocator::sessions::build_pool(
        &db,
        &allocator::sessions::PoolSettings {
            size: 2,
            wait: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(2),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: format!("equivalence-{name}"),
        },
    )
    .unwrap();
    let conn = pool.get().await.unwrap();
    let mut fences = Vec::new();
    for partition in PARTS {
        let lease = store::acquire(
            &**conn,
            partition,
            name,
            "http://x",
            Duration::from_secs(600),
        )
        .await
        .unwrap()
        .unwrap();
        fences.push(Fence::new(FenceToken::new(partition, lease.epoch), name));
    }
    drop(conn);
    Side {
        pg: client(&db).await,
        pool,
        fences,
    }
}

impl Side {
    fn fence(&self, partition: u32) -> &Fence {
        self.fences
            .iter()
            .find(|f| f.token.partition == partition)
            .unwrap()
    }

    /// Stock the first SKU of each partition; the others start unknown.
    async fn seed(&self, case: u64) {
        let conn = self.pool.get().await.unwrap();
        for partition in PARTS {
            let command = Command::Adjust {
                adjustment_id: format!("eq{case}-seed-{partition}"),
                sku: sku(case, partition, 0),
                delta: 6,
                owner: access::Owner::ANYONE,
            };
            fenced_transaction(&conn, self.fence(partition), &[command])
                .await
                .unwrap();
        }
    }

    /// All commands in one statement: one batch per partition, arrival order kept in each.
    async fn as_one_group(&self, commands: &[(u32, Command)]) -> Vec<String> {
        let per_partition: Vec<Vec<Command>> = PARTS
            .iter()
            .map(|p| {
                commands
                    .iter()
                    .filter(|(q, _)| q == p)
                    .map(|(_, c)| c.clone())
                    .collect()
            })
            .collect();
        let group: Vec<PartitionBatch<'_>> = PARTS
            .iter()
            .zip(&per_partition)
            .filter(|(_, commands)| !commands.is_empty())
            .map(|(p, commands)| PartitionBatch {
                fence: self.fence(*p),
                commands,
            })
            .collect();
        // As a commit lane runs it: batches of plain reserves that share no id with the rest
        // are split off into a statement of their own, the set-based one when it can decide
        // them; the rest goes to the function.
        let separable = fast::separable(&group);
        let (reserves, rest): (Vec<_>, Vec<_>) = group
            .iter()
            .zip(&separable)
            .partition(|(_, separable)| **separable);
        let conn = self.pool.get().await.unwrap();
        let mut answers = Vec::new();
        for part in [reserves, rest] {
            let part: Vec<PartitionBatch<'_>> = part.into_iter().map(|(b, _)| *b).collect();
            if part.is_empty() {
                continue;
            }
            let results = apply_group(&conn, &part)
                .await
                .expect("the group statement runs");
            for (result, batch) in results.into_iter().zip(&part) {
                let outcomes = result.expect("every fence holds");
                answers.push((batch.fence.token.partition, outcomes.into_iter()));
            }
        }
        // Back to arrival order over both partitions.
        commands
            .iter()
            .map(|(p, _)| {
                let (_, outcomes) = answers.iter_mut().find(|(q, _)| q == p).unwrap();
                comparable(&outcomes.next().unwrap())
            })
            .collect()
    }

    /// The reference: every command in a statement of its own, through the function alone.
    async fn one_by_one(&self, commands: &[(u32, Command)]) -> Vec<String> {
        let conn = self.pool.get().await.unwrap();
        let mut answers = Vec::new();
        for (partition, command) in commands {
            let batch = PartitionBatch {
                fence: self.fence(*partition),
                commands: std::slice::from_ref(command),
            };
            let mut results = apply_function(&conn, &[batch])
                .await
                .expect("a single command runs");
            let outcome = results.remove(0).expect("the fence holds");
            answers.push(comparable(&outcome[0]));
        }
        answers
    }
}

#[tokio::test]
async fn one_batch_decides_exactly_like_one_command_per_batch() {
    let batched = side("batched").await;
    let single = side("single").await;
    let seed = std::env::var("EQUIVALENCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201u64);
    let mut failures = Vec::new();
    for case in 0..CASES {
        let mut rng = StdRng::seed_from_u64(seed + case);
        let mut commands = sequence(&mut rng, case);
        // A group runs its partitions' batches one after the other (ids are shared by all
        // partitions, so that order matters); one by one runs them in the same order.
        commands.sort_by_key(|(p, _)| PARTS.iter().position(|q| q == p));
        batched.seed(case).await;
        single.seed(case).await;
        let one = batched.as_one_group(&commands).await;
        let each = single.one_by_one(&commands).await;
        let (rows_one, rows_each) = (
            stored(&batched.pg, case).await,
            stored(&single.pg, case).await,
        );
        if one != each || rows_one != rows_each {
            let answers: Vec<String> = commands
                .iter()
                .zip(one.iter().zip(&each))
                .filter(|(_, (a, b))| a != b)
                .map(|((p, c), (a, b))| format!("  p{p} {c:?}\n    batch:  {a}\n    single: {b}"))
                .collect();
            failures.push(format!(
                "case {case} (seed {}): {commands:?}\n{}\n  rows equal: {}",
                seed + case,
                answers.join("\n"),
                rows_one == rows_each
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {CASES} sequences decided differently in one batch:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
