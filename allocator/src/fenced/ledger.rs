//! The stock ledger: an append-only record of every stock movement.
//!
//! Each row of the `ledger` table is one movement of one SKU (`reserve`, `confirm`, `release`,
//! `expire`, `restock`, `shrink`), written by `apply_fenced_batch` in the same statement as the
//! inventory row it changes. Summing a SKU's movements reproduces its inventory row, and every
//! movement balances on its own (`on_hand = available + held + confirmed`, a table constraint),
//! so any prefix of the ledger balances too. That is what makes the ledger an audit of the
//! fenced path: a write that escaped the fence or a lost update shows up as a row that no longer
//! equals its ledger.

use std::ops::Add;

/// A change of a SKU's four stock columns, or (summed from zero) their level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StockDelta {
    /// Units in the building: available + held + confirmed.
    pub on_hand: i64,
    /// Units a new reservation may take.
    pub available: i64,
    /// Units promised to reservations that may still be released or expire.
    pub held: i64,
    /// Units of confirmed reservations: gone for good, so no release, expiry or shrink may take
    /// them.
    pub confirmed: i64,
}

impl StockDelta {
    /// Whether on-hand stock moves exactly as its three parts do; every ledger row must.
    pub fn is_balanced(&self) -> bool {
        self.on_hand == self.available + self.held + self.confirmed
    }
}

impl Add for StockDelta {
    type Output = StockDelta;

    fn add(self, other: StockDelta) -> StockDelta {
        StockDelta {
            on_hand: self.on_hand + other.on_hand,
            available: self.available + other.available,
            held: self.held + other.held,
            confirmed: self.confirmed + other.confirmed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movements_that_balance_sum_to_a_balanced_level() {
        let restock = StockDelta {
            on_hand: 10,
            available: 10,
            ..StockDelta::default()
        };
        let reserve = StockDelta {
            available: -3,
            held: 3,
            ..StockDelta::default()
        };
        let confirm = StockDelta {
            held: -3,
            confirmed: 3,
            ..StockDelta::default()
        };
        assert!([restock, reserve, confirm]
            .iter()
            .all(StockDelta::is_balanced));
        let level = restock + reserve + confirm;
        assert!(level.is_balanced());
        assert_eq!(level.available, 7);
        assert_eq!(level.confirmed, 3);
    }

    #[test]
    fn a_movement_of_on_hand_alone_does_not_balance() {
        let lost = StockDelta {
            on_hand: -1,
            ..StockDelta::default()
        };
        assert!(!lost.is_balanced());
    }
}
