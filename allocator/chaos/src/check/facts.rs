//! What several rules derive from the raw records, computed once: each reservation's ledger
//! rows, the payloads single reserves asked for, and which stored reservation (if any) is an
//! order's own line.

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
}

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
        for op in history {
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
        }
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
