//! A run over several shards: one dump per shard (`dump-<shard>.json`) and `shards.json`, which
//! names the shards in the catalog's order with the partitions the catalog's map gives each at
//! the end. The rules judge one merged [`Dump`], built here from the raw JSON:
//!
//! * a partition's inventory, reservations, adjustments, ledger and relay progress come from the
//!   shard that holds it at the end — a move copies the partition's whole ledger (the same
//!   positions, the same write times and epochs) to its target, and the source keeps a stale
//!   copy that no owner can write any more;
//! * the lease history is every shard's, partition by partition: a move raises the epoch on the
//!   source (the mover's fence) and again on the target, so a partition's epochs increase across
//!   shards and a write under a superseded epoch is stale wherever it landed;
//! * orders are every shard's (each order lives on one shard);
//! * settlement is judged shard by shard ([`Dump::shard_settlement`]): each shard's windows
//!   against its own ledger without the ranges it copied in (`partition_moves_in`), which the
//!   source settled; each shard's settled windows are its own stream (`settlement` on the
//!   catalog, `settlement/<shard>` elsewhere).
//!
//! Ledger entry ids come from each shard's own sequence; the merged ledger keeps them, and the
//! rules compare them only within one SKU, whose rows come from one shard — so a SKU's archived
//! sums and last archived entry id are its holder's too. Rows older than a shard's lease history
//! are not judged over several shards: such a dump is refused.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::input::{ArchivedPrefix, Dump};

/// One shard of the run as `shards.json` lists it, with its dump.
#[derive(Debug, Clone)]
pub struct ShardPart {
    pub name: String,
    pub catalog: bool,
    /// What the catalog's map gives it at the end.
    pub partitions: BTreeSet<i64>,
    pub dump: Value,
}

/// Tables whose rows belong to one partition and are taken from the shard that holds it.
const BY_HOLDER: [&str; 5] = [
    "inventory",
    "reservations",
    "adjustments",
    "ledger",
    "leases",
];

fn rows(v: &Value, table: &str) -> Vec<Value> {
    v[table].as_array().cloned().unwrap_or_default()
}

impl ShardPart {
    fn holds(&self, row: &Value) -> bool {
        row["partition"]
            .as_i64()
            .is_some_and(|p| self.partitions.contains(&p))
    }

    /// The run-wide name of a stream this shard records as `stored`; `None` for a partition it
    /// no longer holds.
    fn stream_name(&self, stored: &str) -> Option<String> {
        run_stream_name(
            &self.name,
            self.catalog,
            |p| self.partitions.contains(&p),
            stored,
        )
    }

    /// This shard's settled windows' stream.
    fn settlement_stream(&self) -> String {
        self.stream_name("settlement").unwrap_or_default()
    }

    /// The SKUs of the partitions it holds.
    fn skus(&self) -> BTreeSet<String> {
        rows(&self.dump, "inventory")
            .iter()
            .filter(|r| self.holds(r))
            .filter_map(|r| r["sku"].as_str().map(str::to_owned))
            .collect()
    }

    /// Refuses what the merge cannot judge.
    fn check_judgeable(&self) -> Result<(), String> {
        let horizon = rows(&self.dump, "history_horizon")
            .first()
            .and_then(|r| r["first_entry_id"].as_i64())
            .unwrap_or(1);
        let first = rows(&self.dump, "ledger")
            .iter()
            .filter_map(|r| r["entry_id"].as_i64())
            .min()
            .unwrap_or(i64::MAX);
        if horizon > 1 && first < horizon {
            return Err(format!(
                "shard {} holds ledger rows older than its lease history (entry {first} < {horizon})",
                self.name
            ));
        }
        Ok(())
    }

    /// This shard's dump for its own settlement: its whole ledger but the ranges it copied in.
    fn settlement_dump(&self) -> Result<Dump, String> {
        let moved_in: Vec<(i64, i64, i64)> = rows(&self.dump, "partition_moves_in")
            .iter()
            .filter_map(|m| {
                Some((
                    m["partition"].as_i64()?,
                    m["from_position"].as_i64()?,
                    m["through_position"].as_i64()?,
                ))
            })
            .collect();
        let copied = |r: &Value| {
            let (Some(p), Some(pos)) = (r["partition"].as_i64(), r["position"].as_i64()) else {
                return false;
            };
            moved_in
                .iter()
                .any(|(mp, from, through)| *mp == p && (*from..=*through).contains(&pos))
        };
        let mut v = self.dump.clone();
        let ledger: Vec<Value> = rows(&v, "ledger")
            .into_iter()
            .filter(|r| !copied(r))
            .collect();
        v["ledger"] = Value::Array(ledger);
        Dump::from_json(&v)
    }
}

/// The archived prefix of the merged ledger: each SKU's archived sums and last archived entry
/// id from the shard that holds it, the latest end of any shard's archived range. A move leaves
/// on its target, as archived sums, the history the target does not hold live — also on a
/// target that never archived a partition of its own, so the sums are read without one.
fn archived_prefix(parts: &[ShardPart]) -> Result<Option<ArchivedPrefix>, String> {
    let mut merged: Option<ArchivedPrefix> = None;
    for part in parts {
        let archives = rows(&part.dump, "ledger_archives");
        let totals = rows(&part.dump, "ledger_archived_totals");
        if archives.is_empty() && totals.is_empty() {
            continue;
        }
        let m = merged.get_or_insert_with(ArchivedPrefix::default);
        let mut last = 0;
        for a in &archives {
            m.before_us = m.before_us.max(a["end_us"].as_i64().unwrap_or(0));
            last = last.max(a["last_entry_id"].as_i64().unwrap_or(0));
        }
        let skus = part.skus();
        for t in &totals {
            let Some(sku) = t["sku"].as_str().filter(|s| skus.contains(*s)) else {
                continue;
            };
            let d = |k: &str| {
                t[k].as_i64()
                    .ok_or_else(|| format!("archived totals without {k}"))
            };
            m.totals.insert(
                sku.to_owned(),
                [
                    d("d_on_hand")?,
                    d("d_available")?,
                    d("d_held")?,
                    d("d_confirmed")?,
                ],
            );
        }
        for sku in skus {
            m.last_entry_by_sku.insert(sku, last);
        }
    }
    Ok(merged)
}

/// The run-wide name of the stream shard `name` records as `stored` (its own tables name its
/// settlement stream `settlement`), or `None` for a partition it does not `hold`: partition
/// streams keep their names, and a shard other than the catalog settles into
/// `settlement/<shard>`. The harness names what it reads from each shard by the same rule.
pub fn run_stream_name(
    name: &str,
    catalog: bool,
    holds: impl Fn(i64) -> bool,
    stored: &str,
) -> Option<String> {
    if let Some(p) = stored.strip_prefix("partition/") {
        return holds(p.parse().ok()?).then(|| stored.to_owned());
    }
    if stored == "settlement" && !catalog {
        return Some(format!("settlement/{name}"));
    }
    Some(stored.to_owned())
}

/// Reads `shards.json` (already parsed) with each shard's dump from `read(file)`.
pub fn parts(
    listing: &Value,
    read: impl Fn(&str) -> Result<Value, String>,
) -> Result<Vec<ShardPart>, String> {
    let shards = listing["shards"]
        .as_array()
        .ok_or("shards.json has no array \"shards\"")?;
    shards
        .iter()
        .map(|s| {
            let name = s["name"].as_str().ok_or("a shard without name")?.to_owned();
            let file = s["dump"].as_str().ok_or("a shard without dump")?;
            Ok(ShardPart {
                catalog: s["catalog"].as_bool().unwrap_or(false),
                partitions: s["partitions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_i64)
                    .collect(),
                dump: read(file)?,
                name,
            })
        })
        .collect()
}

/// The merged dump of every shard (see the module docs).
pub fn merge(parts: &[ShardPart]) -> Result<Dump, String> {
    let mut held: BTreeMap<i64, &str> = BTreeMap::new();
    for part in parts {
        part.check_judgeable()?;
        for p in &part.partitions {
            if let Some(other) = held.insert(*p, &part.name) {
                return Err(format!(
                    "partition {p} is mapped to {other} and {}",
                    part.name
                ));
            }
        }
    }
    let mut merged = Map::new();
    let mut push = |table: &str, row: Value| {
        merged
            .entry(table.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .expect("arrays only")
            .push(row);
    };
    for part in parts {
        for table in BY_HOLDER {
            for row in rows(&part.dump, table)
                .into_iter()
                .filter(|r| part.holds(r))
            {
                push(table, row);
            }
        }
        for row in rows(&part.dump, "lease_history") {
            if row["partition"].is_i64() {
                push("lease_history", row);
            }
        }
        for row in rows(&part.dump, "orders") {
            push("orders", row);
        }
        for row in rows(&part.dump, "event_relay_progress") {
            if let Some(name) = row["stream"].as_str().and_then(|s| part.stream_name(s)) {
                let mut row = row.clone();
                row["stream"] = Value::from(name);
                push("event_relay_progress", row);
            }
        }
        let stream = part.settlement_stream();
        for row in rows(&part.dump, "settlement_runs") {
            let mut row = row.clone();
            row["stream"] = Value::from(stream.clone());
            push("settlement_runs", row);
        }
    }
    for table in BY_HOLDER.into_iter().chain(["lease_history", "orders"]) {
        merged
            .entry(table.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    // The latest dump's time: a reservation removed by any shard's retention was finished
    // before that time minus the horizon.
    if let Some(latest) = parts
        .iter()
        .filter_map(|p| rows(&p.dump, "retention").first().cloned())
        .max_by_key(|r| r["dumped_us"].as_i64().unwrap_or(i64::MIN))
    {
        merged.insert("retention".to_owned(), Value::Array(vec![latest]));
    }
    let mut dump = Dump::from_json(&Value::Object(merged))?;
    for part in parts {
        let mut foreign = Map::new();
        let rows: Vec<Value> = rows(&part.dump, "ledger")
            .into_iter()
            .filter(|r| !part.holds(r))
            .collect();
        foreign.insert("ledger".to_owned(), Value::Array(rows));
        for table in [
            "inventory",
            "reservations",
            "adjustments",
            "orders",
            "lease_history",
        ] {
            foreign.insert(table.to_owned(), Value::Array(Vec::new()));
        }
        dump.foreign_ledger
            .extend(Dump::from_json(&Value::Object(foreign))?.ledger);
    }
    dump.archived = archived_prefix(parts)?;
    dump.shard_settlement = parts
        .iter()
        .map(|p| Ok((p.name.clone(), p.settlement_dump()?)))
        .collect::<Result<_, String>>()?;
    Ok(dump)
}
