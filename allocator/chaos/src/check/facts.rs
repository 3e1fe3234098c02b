//! What several rules derive from the raw records, computed once: each reservation's ledger
//! rows, the payloads single reserves asked for, and which stored reservation (if any) is an
//! order's own line.
//!
//! The dump may hold less than the whole history, in two ways the rules allow for here:
//!
//! * **Removed past the idempotency horizon** (the retention job): a terminal reservation or a
//!   finished order whose last change is before [`Dump::removed_before_us`] may be absent. For a
//!   reservation that is told by its ledger rows (the last one a confirm, release or expiry
//!   recorded before the bound); rows never removed inside the horizon are therefore still
//!   judged, and a hold is never allowed to be missing.
//! * **An archived ledger prefix** (V17): the ledger starts at [`ArchivedPrefix::before_us`].
//!   A reservation whose rows in the dump begin with a later transition had its reserve
//!   archived; one with no rows at all was archived whole, which is allowed only when it was
//!   first asked for before the prefix ends.
//!
//! [`ArchivedPrefix::before_us`]: super::ArchivedPrefix

use std::collections::{HashMap, HashSet};

use super::input::{Dump, LedgerRow, Op};

/// The records and what the rules share about them.
pub struct Facts<'a> {
    pub history: &'a [Op],
    pub dump: &'a Dump,
    /// reservation id → its ledger rows in entry order.
    pub ledger_by_id: HashMap<&'a str, Vec<&'a LedgerRow>>,
    /// reservation id → the (sku, quantity) of every single reserve sent under it.
    single_reserves: HashMap<&'a str, Vec<(&'a str, i64)>>,
    /// Every order id of the history or the dump.
    pub order_ids: HashSet<&'a str>,
    /// order id → its submissions in the history, in order.
    orders_sent: HashMap<&'a str, Vec<&'a Op>>,
    /// reservation id (of a single reserve) or order id → when it was first sent (µs), where
    /// recorded.
    first_sent_us: HashMap<&'a str, i64>,
}

/// What [`Facts::final_status`] says of a reservation whose rows are all archived and which was
/// then removed: nothing about it is left to judge.
pub const ARCHIVED: &str = "archived";

/// Where order `o`'s line `i` is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Stored under this id with the line's own payload (or only as ledger rows).
    Own(String),
    /// Nothing stored under either form of the line's id.
    NotStored,
    /// Stored under this id with another payload: a single reservation (or another order
    /// request) occupies the id, so it is not this order's hold.
    Foreign(String),
    /// Stored with the line's payload, but a single reserve asked for the same one under the
    /// same id: whose hold it is cannot be told.
    Ambiguous(String),
}

/// The two forms of line `index`'s id: the reserved namespace first, then the older one.
pub fn line_ids(order: &str, index: usize) -> [String; 2] {
    [format!("order:{order}:{index}"), format!("{order}:{index}")]
}

/// `(order id, line index)` of an id in either line form; `None` for any other id.
pub fn parse_line_id(id: &str) -> Option<(&str, usize)> {
    let (order, index) = id.rsplit_once(':')?;
    let index = index.parse().ok()?;
    Some((order.strip_prefix("order:").unwrap_or(order), index))
}

impl<'a> Facts<'a> {
    pub fn new(history: &'a [Op], dump: &'a Dump) -> Facts<'a> {
        let mut ledger_by_id: HashMap<&str, Vec<&LedgerRow>> = HashMap::new();
        for r in &dump.ledger {
            if let Some(id) = r.reservation_id.as_deref() {
                ledger_by_id.entry(id).or_default().push(r);
            }
        }
        for rows in ledger_by_id.values_mut() {
            rows.sort_by_key(|r| r.entry_id);
        }
        let mut single_reserves: HashMap<&str, Vec<(&str, i64)>> = HashMap::new();
        let mut order_ids: HashSet<&str> = dump.orders.keys().map(String::as_str).collect();
        let mut orders_sent: HashMap<&str, Vec<&Op>> = HashMap::new();
        let mut first_sent_us: HashMap<&str, i64> = HashMap::new();
        for op in history {
            // Only what creates a reservation: a confirm or release may be sent long after.
            let id = match op.kind.as_str() {
                "order" => Some(op.id("order_id")),
                "reserve" => Some(op.id("reservation_id")),
                _ => None,
            };
            if let (Some(id), Some(ms)) = (id, op.invoke_wall_ms) {
                let first = first_sent_us.entry(id).or_insert(ms * 1000);
                *first = (*first).min(ms * 1000);
            }
            match op.kind.as_str() {
                "reserve" => single_reserves
                    .entry(op.id("reservation_id"))
                    .or_default()
                    .push((
                        op.request["sku"].as_str().unwrap_or_default(),
                        op.request["quantity"].as_i64().unwrap_or_default(),
                    )),
                "order" => {
                    order_ids.insert(op.id("order_id"));
                    orders_sent.entry(op.id("order_id")).or_default().push(op);
                }
                _ => {}
            }
        }
        Facts {
            history,
            dump,
            ledger_by_id,
            single_reserves,
            order_ids,
            orders_sent,
            first_sent_us,
        }
    }

    /// When order `id`, or a single reserve under reservation id `id`, was first sent (µs), if
    /// recorded; for an order's line, when its order was, unless a single reserve took the id
    /// earlier. Nothing under the id can be stamped earlier.
    pub fn first_sent_us(&self, id: &str) -> Option<i64> {
        let own = self.first_sent_us.get(id).copied();
        let order = parse_line_id(id).and_then(|(o, _)| self.first_sent_us.get(o).copied());
        match (own, order) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The ledger kinds of reservation `id` from its reserve on: the dump's rows, after a
    /// `reserve` when the ledger starts later and its first row in the dump is a later
    /// transition (the reserve was archived). `None` when the ledger starts later, no row of
    /// `id` is left and it was first asked for (when recorded) before the archived prefix
    /// ends: every row it had may be archived, so there is nothing to compare.
    pub fn kinds_from_reserve(&self, id: &str) -> Option<Vec<&'a str>> {
        let mut kinds = self.kinds(id);
        let Some(archived) = &self.dump.archived else {
            return Some(kinds);
        };
        match kinds.first() {
            Some(&"reserve") => {}
            Some(_) => kinds.insert(0, "reserve"),
            None if self
                .first_sent_us(id)
                .is_none_or(|t| t < archived.before_us) =>
            {
                return None
            }
            None => {}
        }
        Some(kinds)
    }

    /// Whether reservation `id`, absent from the dump, may have been removed past the horizon:
    /// its last row in the dump is a confirm, release or expiry recorded before the removal
    /// bound; or it has no row left, the ledger starts later, and it was first asked for
    /// (`first_us`, when known) before the archived prefix ends.
    pub fn removed_past_horizon(&self, id: &str, first_us: Option<i64>) -> bool {
        let Some(bound) = self.dump.removed_before_us else {
            return false;
        };
        if self.dump.reservations.contains_key(id) {
            return false;
        }
        match self.ledger_by_id.get(id).and_then(|rows| rows.last()) {
            Some(last) => {
                matches!(last.kind.as_str(), "confirm" | "release" | "expire")
                    && last.recorded_us < bound
            }
            None => self
                .dump
                .archived
                .as_ref()
                .is_some_and(|a| first_us.is_none_or(|t| t < a.before_us)),
        }
    }

    /// Whether order `order`, absent from the dump, may have been removed past the horizon: it
    /// was first submitted (when recorded) before the removal bound.
    pub fn order_removed_past_horizon(&self, order: &str) -> bool {
        !self.dump.orders.contains_key(order)
            && self
                .dump
                .removed_before_us
                .is_some_and(|bound| self.first_sent_us(order).is_none_or(|t| t < bound))
    }

    /// The final status of reservation `id`: the dump's, or for one removed past the horizon
    /// the one its last ledger row shows ([`ARCHIVED`] when no row is left).
    pub fn final_status(&self, id: &str) -> Option<&'a str> {
        if let Some(status) = self.status(id) {
            return Some(status);
        }
        if !self.removed_past_horizon(id, self.first_sent_us(id)) {
            return None;
        }
        let last = self.ledger_by_id.get(id).and_then(|rows| rows.last());
        Some(match last.map(|r| r.kind.as_str()) {
            Some("confirm") => "confirmed",
            Some("release") => "released",
            Some(_) => "expired",
            None => ARCHIVED,
        })
    }

    /// The history's submissions of `order`, in order.
    pub fn submissions(&self, order: &str) -> &[&'a Op] {
        self.orders_sent.get(order).map_or(&[], Vec::as_slice)
    }

    /// The ledger kinds of reservation `id`, in entry order.
    pub fn kinds(&self, id: &str) -> Vec<&'a str> {
        self.ledger_by_id
            .get(id)
            .map(|rows| rows.iter().map(|r| r.kind.as_str()).collect())
            .unwrap_or_default()
    }

    /// The final status of reservation `id`.
    pub fn status(&self, id: &str) -> Option<&'a str> {
        self.dump.reservations.get(id).map(|r| r.status.as_str())
    }

    /// Whether a single reserve asked for `sku` × `quantity` under `id`.
    pub fn single_reserve_asked(&self, id: &str, sku: &str, quantity: i64) -> bool {
        self.single_reserves
            .get(id)
            .is_some_and(|asked| asked.contains(&(sku, quantity)))
    }

    /// Where line `index` of `order`, asked as `sku` × `quantity`, is stored.
    pub fn line(&self, order: &str, index: usize, sku: &str, quantity: i64) -> Line {
        for id in line_ids(order, index) {
            let stored = self.dump.reservations.get(&id);
            let Some(stored) = stored else {
                if self.ledger_by_id.contains_key(id.as_str()) {
                    return Line::Own(id);
                }
                continue;
            };
            if (stored.sku.as_str(), stored.quantity) != (sku, quantity) {
                return Line::Foreign(id);
            }
            return if self.single_reserve_asked(&id, sku, quantity) {
                Line::Ambiguous(id)
            } else {
                Line::Own(id)
            };
        }
        Line::NotStored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_line_id_forms_parse() {
        assert_eq!(parse_line_id("order:c1-o7:2"), Some(("c1-o7", 2)));
        assert_eq!(parse_line_id("c1-o7:0"), Some(("c1-o7", 0)));
        assert_eq!(parse_line_id("c1-r7"), None);
        assert_eq!(parse_line_id("c1-o7:x"), None);
        assert_eq!(line_ids("o", 1), ["order:o:1".to_owned(), "o:1".to_owned()]);
    }
}
