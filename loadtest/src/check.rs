//! The end-of-run invariant checks (pure; the reads are in `run.rs`).

use schema::wire::Inventory;
use serde::Serialize;

use crate::stats::SkuTally;

/// The invariant verdict for one SKU touched by the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkuCheck {
    pub sku: String,
    pub tally: SkuTally,
    pub before: Option<Counts>,
    pub after: Option<Counts>,
    /// `false` when a reservation of this SKU has an unknown outcome (or its holds were still
    /// expiring while the SKU was read), so the accounting check (not I1) was skipped.
    pub accounting_checked: bool,
    pub violations: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub on_hand: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
}

impl From<&Inventory> for Counts {
    fn from(inv: &Inventory) -> Self {
        Counts {
            on_hand: inv.on_hand,
            available: inv.available,
            held: inv.held,
            confirmed: inv.confirmed,
        }
    }
}

/// Check one SKU.
///
/// * I1: `available >= 0` and `on_hand == available + held + confirmed` after the run.
/// * Accounting (only when every outcome for the SKU is known, and nobody else wrote to it):
///   `Δ(held + confirmed) == reserved − released − expired`, `Δconfirmed == confirmed`,
///   `Δheld == reserved − confirmed − released − expired`, `Δon_hand == 0`. Expired units are
///   those of holds the service reported `expired` after the load. `before` is the snapshot
///   taken before the run; `None` means "not snapshotted", taken as a fresh SKU with no holds
///   (and then `Δon_hand` is not checked).
pub fn check_sku(
    sku: &str,
    tally: SkuTally,
    before: Option<Counts>,
    after: Option<Counts>,
    accounting_known: bool,
) -> SkuCheck {
    let mut violations = Vec::new();
    match after {
        None => {
            if tally.reserved > 0 {
                violations.push(format!(
                    "inventory row missing after {} units were reserved",
                    tally.reserved
                ));
            }
        }
        Some(a) => {
            if a.available < 0 {
                violations.push(format!("I1: available {} < 0", a.available));
            }
            if a.held < 0 || a.confirmed < 0 {
                violations.push(format!(
                    "negative counter: held {} confirmed {}",
                    a.held, a.confirmed
                ));
            }
            if a.on_hand != a.available + a.held + a.confirmed {
                violations.push(format!(
                    "I1: on_hand {} != available {} + held {} + confirmed {}",
                    a.on_hand, a.available, a.held, a.confirmed
                ));
            }
            if accounting_known {
                accounting(&mut violations, tally, before, a);
            }
        }
    }
    SkuCheck {
        sku: sku.to_owned(),
        tally,
        before,
        after,
        accounting_checked: accounting_known && after.is_some(),
        violations,
    }
}

fn accounting(violations: &mut Vec<String>, tally: SkuTally, before: Option<Counts>, a: Counts) {
    let b = before.unwrap_or(Counts {
        on_hand: a.on_hand,
        available: a.on_hand,
        held: 0,
        confirmed: 0,
    });
    let net = tally.reserved - tally.released - tally.expired;
    let d_taken = (a.held + a.confirmed) - (b.held + b.confirmed);
    if d_taken != net {
        violations.push(format!(
            "accounting: held+confirmed changed by {d_taken}, but this run created {} and released {} units and {} expired (expected {net})",
            tally.reserved, tally.released, tally.expired
        ));
    }
    let d_confirmed = a.confirmed - b.confirmed;
    if d_confirmed != tally.confirmed {
        violations.push(format!(
            "accounting: confirmed changed by {d_confirmed}, this run confirmed {}",
            tally.confirmed
        ));
    }
    let d_held = a.held - b.held;
    if d_held != tally.held() {
        violations.push(format!(
            "accounting: held changed by {d_held}, expected {}",
            tally.held()
        ));
    }
    if before.is_some() && a.on_hand != b.on_hand {
        violations.push(format!(
            "accounting: on_hand changed from {} to {} without adjustments",
            b.on_hand, a.on_hand
        ));
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct InvariantReport {
    pub ok: bool,
    pub skus_checked: usize,
    pub accounting_checked: usize,
    pub snapshot_before: bool,
    /// Reservations with an unknown outcome at the end of the run, and how many of them a GET
    /// resolved.
    pub pending: usize,
    pub pending_resolved: usize,
    /// Holds left by the run that were read back because they could have expired, and how many
    /// had.
    pub holds_read_back: usize,
    pub expired: usize,
    /// SKUs whose holds kept expiring while they were read (accounting skipped, I1 checked).
    pub unstable_skus: usize,
    /// Problems reading inventory (the check could not be made).
    pub errors: Vec<String>,
    /// SKUs with violations (all of them) followed by the hottest SKUs (for context).
    pub skus: Vec<SkuCheck>,
    pub violations: usize,
}

/// Pick the SKUs shown in the report: every violation, then the most used ones.
pub fn shown_skus(mut checks: Vec<SkuCheck>, top: usize) -> Vec<SkuCheck> {
    checks.sort_by(|a, b| {
        // Violations (is_empty() == false) first.
        a.violations
            .is_empty()
            .cmp(&b.violations.is_empty())
            .then(b.tally.attempted.cmp(&a.tally.attempted))
            .then(a.sku.cmp(&b.sku))
    });
    let bad = checks.iter().filter(|c| !c.violations.is_empty()).count();
    checks.truncate(bad + top);
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use schema::wire::ReservationStatus;

    fn counts(on_hand: i64, available: i64, held: i64, confirmed: i64) -> Counts {
        Counts {
            on_hand,
            available,
            held,
            confirmed,
        }
    }

    #[test]
    fn consistent_sku_passes() {
        let tally = SkuTally {
            attempted: 10,
            reserved: 10,
            confirmed: 5,
            released: 3,
            expired: 0,
        };
        let c = check_sku(
            "s-0",
            tally,
            Some(counts(100, 98, 1, 1)),
            Some(counts(100, 91, 3, 6)),
            true,
        );
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert!(c.accounting_checked);
        // Without a snapshot the SKU is taken as fresh.
        let c = check_sku("s-0", tally, None, Some(counts(100, 93, 2, 5)), true);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    #[test]
    fn expirations_read_back_keep_the_accounting_right() {
        // 10 reserved, 2 confirmed, 1 released, 7 left held of which 5 expired on the server.
        let mut tally = SkuTally {
            attempted: 10,
            ..Default::default()
        };
        for _ in 0..10 {
            tally.account(ReservationStatus::Held, 1);
        }
        for _ in 0..2 {
            tally.leave_held(ReservationStatus::Confirmed, 1);
        }
        tally.leave_held(ReservationStatus::Released, 1);
        let after = counts(50, 46, 2, 2);
        // Before the expirations are read back, the check reports the 5 expired units.
        let c = check_sku("s", tally, Some(counts(50, 50, 0, 0)), Some(after), true);
        assert!(
            c.violations
                .iter()
                .any(|v| v.contains("held changed by 2, expected 7")),
            "{:?}",
            c.violations
        );
        for _ in 0..5 {
            tally.leave_held(ReservationStatus::Expired, 1);
        }
        let c = check_sku("s", tally, Some(counts(50, 50, 0, 0)), Some(after), true);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.tally.expired, 5);
        // One expiry too many (the service gave back stock we still think held) is caught.
        tally.leave_held(ReservationStatus::Expired, 1);
        let c = check_sku("s", tally, Some(counts(50, 50, 0, 0)), Some(after), true);
        assert!(c.violations.iter().any(|v| v.contains("held+confirmed")));
    }

    #[test]
    fn oversell_and_broken_sum_are_caught() {
        let tally = SkuTally::default();
        let c = check_sku("s", tally, None, Some(counts(5, -1, 6, 0)), false);
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
        assert!(c.violations[0].contains("available -1"));
        let c = check_sku("s", tally, None, Some(counts(5, 1, 1, 1)), false);
        assert!(c.violations[0].contains("on_hand 5"));
        assert!(!c.accounting_checked);
    }

    #[test]
    fn accounting_mismatch_is_caught_only_when_outcomes_are_known() {
        let tally = SkuTally {
            attempted: 4,
            reserved: 4,
            confirmed: 1,
            released: 1,
            expired: 0,
        };
        let before = counts(10, 10, 0, 0);
        // One hold too many (a lost release or a double decrement).
        let after = counts(10, 6, 3, 1);
        let c = check_sku("s", tally, Some(before), Some(after), true);
        assert!(c.violations.iter().any(|v| v.contains("held+confirmed")));
        assert!(c.violations.iter().any(|v| v.contains("held changed")));
        let c = check_sku("s", tally, Some(before), Some(after), false);
        assert!(c.violations.is_empty());
        let c = check_sku("s", tally, Some(before), Some(counts(11, 9, 1, 1)), true);
        assert!(c.violations.iter().any(|v| v.contains("on_hand changed")));
    }

    #[test]
    fn missing_row_after_reservations_is_a_violation() {
        let tally = SkuTally {
            attempted: 1,
            reserved: 1,
            ..Default::default()
        };
        assert_eq!(check_sku("s", tally, None, None, true).violations.len(), 1);
        let untouched = SkuTally {
            attempted: 3,
            ..Default::default()
        };
        assert!(check_sku("s", untouched, None, None, true)
            .violations
            .is_empty());
    }

    #[test]
    fn shown_skus_lists_violations_first_then_the_busiest() {
        let check = |sku: &str, attempted: u64, bad: bool| SkuCheck {
            sku: sku.into(),
            tally: SkuTally {
                attempted,
                ..Default::default()
            },
            before: None,
            after: None,
            accounting_checked: true,
            violations: if bad { vec!["x".into()] } else { vec![] },
        };
        let shown = shown_skus(
            vec![
                check("a", 5, false),
                check("b", 50, false),
                check("c", 1, true),
                check("d", 7, false),
                check("e", 2, true),
            ],
            2,
        );
        let names: Vec<&str> = shown.iter().map(|c| c.sku.as_str()).collect();
        assert_eq!(names, vec!["e", "c", "b", "d"]);
    }
}
