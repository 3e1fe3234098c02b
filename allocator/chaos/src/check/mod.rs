//! The independent checker: reads a recorded history and the final database dump and decides
//! whether the run kept the safety contract.
//!
//! It uses nothing but `std` and `serde_json`, and it re-derives everything from the raw
//! records: the outcome of an operation from its HTTP status (2xx acknowledged, 4xx refused,
//! anything else or no answer unknown), stock levels by replaying the ledger, epochs from the
//! lease history, settlement totals from the ledger's confirmations. Each rule is a [`Rule`] in
//! a file of its own, a function over plain data ([`Facts`]) with unit tests on small synthetic
//! histories that make it fire.
//!
//! Rules (names as printed in the table):
//!
//! | rule | violation |
//! | --- | --- |
//! | `oversell` | replaying one SKU's ledger in entry order, some prefix has `available < 0`, `held < 0`, `confirmed < 0` or `held + confirmed > on_hand` |
//! | `negative-row` | a final inventory row with a negative column, or `on_hand != available + held + confirmed` |
//! | `ledger-row-mismatch` | a SKU's ledger deltas do not sum to its inventory row (or a row without ledger, or ledger without row) |
//! | `stale-epoch-write` | a ledger row of partition `p` at epoch `e` written (`written_at`) after the acquisition of some epoch `e' > e` of `p`'s lease; rows before the history horizon (V6) are left out |
//! | `double-reserve` | a reservation id with more than one `reserve` ledger row |
//! | `acked-hold-missing` | a `201` reserve whose reservation is absent, refused, of another SKU/quantity, or without exactly one `reserve` ledger row |
//! | `lost-ack` | an acknowledged confirm whose reservation is not `confirmed` at the end; an acknowledged release not `released`/`expired`; an acknowledged adjustment not applied |
//! | `refused-but-applied` | a refused reserve whose id holds stock; a refused confirm/release (none of the same id acknowledged or unknown) that took effect |
//! | `reservation-ledger-mismatch` | a reservation whose ledger rows do not match its status, or ledger rows naming an unknown reservation |
//! | `order-atomicity` | an order answered `2xx` or stored `placed` with a line it never held (or held under another request's payload); an order answered `409`/`422`/any `4xx` or stored `failed`/`refused` with a line still held or confirmed, a hold not given back, or given back only after the answer; answers that contradict the stored decision |
//! | `orphan-held-line` | a hold at the end under an order's line id whose order is absent, `failed` or `refused`, or stores another payload for that line |
//! | `settlement-exactness` | a confirmation inside the settled range in no settled window or in more than one; a window's per-SKU totals that differ from the ledger's confirmations in it; a run's totals that differ from its rows |
//! | `two-lease-holders` | in a round of the harness's lease samples (`leases.jsonl`, every shard read twice), one partition held unexpired, with the same holder and epoch in both reads, on two shards (a lease row a move is bringing in is not sampled) |
//! | `stream-position-forked` | two shards hold different ledger rows at one position of a partition (a move's copies are the same rows) |
//! | `event-delivery` | the run's change-event consumer applied a stream's positions other than `1, 2, 3, …` in order; a duplicate with another position's key; a ledger row or settled window the relay recorded as published that the consumer never got, or got as another event; a row still unpublished 30 s after its commit; an event beyond the database's stream |
//!
//! History that the database no longer holds (see [`facts`]): reservations and orders the
//! retention job removed past the idempotency horizon may be missing when their ledger rows (or
//! their submission times) show they were finished before the horizon; a hold never may. Where
//! ledger partitions were archived, the ledger is replayed from the archived rows' per-SKU sums
//! and settlement windows that began before the archived range ended are not recomputed.
//!
//! Order line ids: line `i` of order `o` is reserved as `order:{o}:{i}` or, in the older form,
//! `{o}:{i}`; the checker accepts both (see [`facts`]). A single reservation that used the id of
//! an order's line (a collision) is told apart by its payload.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

mod acked_hold_missing;
mod double_reserve;
mod event_delivery;
mod facts;
#[cfg(test)]
mod horizon_tests;
mod input;
mod ledger_row_mismatch;
mod lost_ack;
mod negative_row;
mod order_atomicity;
mod orphan_held_line;
mod oversell;
mod position_forked;
mod refused_but_applied;
mod reservation_ledger_mismatch;
mod settlement_exactness;
pub mod shards;
#[cfg(test)]
mod shards_tests;
mod stale_epoch_write;
#[cfg(test)]
mod testdata;
mod two_lease_holders;

pub use facts::Facts;
pub use input::{
    ArchivedPrefix, Delivery, Dump, LedgerRow, Op, Order, Outcome, Reservation, Run, Settled,
};
pub use two_lease_holders::{LeaseRound, ShardLeases};

/// One rule of the checker.
pub struct Rule {
    /// Its name in the table and in `check.json`.
    pub name: &'static str,
    /// Every violation found, one line each.
    run: fn(&Facts) -> Vec<String>,
}

/// Every rule, in table order.
pub const RULES: [Rule; 15] = [
    oversell::RULE,
    negative_row::RULE,
    ledger_row_mismatch::RULE,
    stale_epoch_write::RULE,
    double_reserve::RULE,
    acked_hold_missing::RULE,
    lost_ack::RULE,
    refused_but_applied::RULE,
    reservation_ledger_mismatch::RULE,
    order_atomicity::RULE,
    orphan_held_line::RULE,
    settlement_exactness::RULE,
    event_delivery::RULE,
    two_lease_holders::RULE,
    position_forked::RULE,
];

/// How many examples of each violated rule the table shows.
const EXAMPLES: usize = 3;

/// Operation counts of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub attempted: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub unknown: u64,
}

/// The checker's verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub ops: BTreeMap<String, Counts>,
    /// rule → every violation found (one line each).
    pub violations: BTreeMap<&'static str, Vec<String>>,
}

impl Report {
    pub fn count(&self, rule: &str) -> usize {
        self.violations.get(rule).map_or(0, Vec::len)
    }

    pub fn total(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }

    /// Violations per rule (every rule listed, zero included), for scripts.
    pub fn to_json(&self) -> Value {
        let mut by_rule = serde_json::Map::new();
        for rule in &RULES {
            by_rule.insert(rule.name.to_owned(), Value::from(self.count(rule.name)));
        }
        let mut ops = serde_json::Map::new();
        for (kind, c) in &self.ops {
            ops.insert(
                kind.clone(),
                serde_json::json!({
                    "attempted": c.attempted, "acknowledged": c.acknowledged,
                    "refused": c.refused, "unknown": c.unknown,
                }),
            );
        }
        serde_json::json!({ "violations": by_rule, "total_violations": self.total(), "operations": ops })
    }

    /// The operations and violations table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let row = |out: &mut String, kind: &str, c: &Counts| {
            let _ = writeln!(
                out,
                "{:<14} {:>10} {:>13} {:>8} {:>8}",
                kind, c.attempted, c.acknowledged, c.refused, c.unknown
            );
        };
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>13} {:>8} {:>8}",
            "operation", "attempted", "acknowledged", "refused", "unknown"
        );
        let mut total = Counts::default();
        for (kind, c) in &self.ops {
            row(&mut out, kind, c);
            total.attempted += c.attempted;
            total.acknowledged += c.acknowledged;
            total.refused += c.refused;
            total.unknown += c.unknown;
        }
        row(&mut out, "total", &total);
        let _ = writeln!(out);
        let _ = writeln!(out, "{:<28} {:>6}  first examples", "rule", "found");
        for rule in &RULES {
            let found = self
                .violations
                .get(rule.name)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let examples = found
                .iter()
                .take(EXAMPLES)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ");
            let _ = writeln!(out, "{:<28} {:>6}  {}", rule.name, found.len(), examples);
        }
        out
    }
}

/// Runs every rule.
pub fn check(history: &[Op], dump: &Dump) -> Report {
    let mut report = Report::default();
    for op in history {
        let c = report.ops.entry(op.kind.clone()).or_default();
        c.attempted += 1;
        match op.outcome {
            Outcome::Acknowledged => c.acknowledged += 1,
            Outcome::Refused => c.refused += 1,
            Outcome::Unknown => c.unknown += 1,
        }
    }
    let facts = Facts::new(history, dump);
    for rule in &RULES {
        let found = (rule.run)(&facts);
        if !found.is_empty() {
            report.violations.insert(rule.name, found);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::testdata::*;
    use super::*;

    #[test]
    fn a_consistent_history_passes() {
        let (history, dump) = clean();
        let report = check(&history, &dump);
        assert_eq!(report.total(), 0, "{}", report.table());
        let reserve = report.ops["reserve"];
        assert_eq!(
            (reserve.attempted, reserve.acknowledged, reserve.refused),
            (3, 2, 1)
        );
        assert_eq!(report.ops["release"].unknown, 1);
    }

    #[test]
    fn rule_names_are_unique() {
        let mut names: Vec<&str> = RULES.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
    }

    #[test]
    fn outcomes_come_from_the_status_alone() {
        assert_eq!(Outcome::of(Some(201)), Outcome::Acknowledged);
        assert_eq!(Outcome::of(Some(409)), Outcome::Refused);
        assert_eq!(Outcome::of(Some(429)), Outcome::Refused);
        assert_eq!(Outcome::of(Some(503)), Outcome::Unknown);
        assert_eq!(Outcome::of(None), Outcome::Unknown);
    }
}
