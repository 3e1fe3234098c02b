//! `two-lease-holders`: at no instant do two shards hold an unexpired lease of one partition
//! that an allocator may act on (I13). The harness samples every shard's lease rows during the
//! run (`leases.jsonl`): each round reads every shard, then every shard again; a lease read
//! with the same holder and epoch, unexpired, in both reads of its shard was held throughout
//! the round, so two shards holding one partition that way held it at one instant (each shard's
//! first read of the round falls between the other's two reads, or its second does). A lease
//! row a move is bringing in (`moving_in`) is not sampled: no allocator may act on it.

use serde_json::Value;

use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "two-lease-holders",
    run,
};

/// A partition lease as sampled: (partition, holder, epoch).
pub type Held = (i64, String, i64);

/// One shard's two reads in a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLeases {
    pub shard: String,
    pub first: Vec<Held>,
    pub second: Vec<Held>,
}

/// One sampling round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRound {
    /// Milliseconds since the run started.
    pub at_ms: i64,
    /// The shards read twice in the round (a shard that did not answer is left out).
    pub shards: Vec<ShardLeases>,
}

fn held(v: &Value) -> Result<Vec<Held>, String> {
    v.as_array()
        .ok_or_else(|| format!("not an array of leases: {v}"))?
        .iter()
        .map(|l| match (l[0].as_i64(), l[1].as_str(), l[2].as_i64()) {
            (Some(p), Some(h), Some(e)) => Ok((p, h.to_owned(), e)),
            _ => Err(format!("not [partition, holder, epoch]: {l}")),
        })
        .collect()
}

impl LeaseRound {
    pub fn from_json(v: &Value) -> Result<LeaseRound, String> {
        let shards = v["shards"]
            .as_array()
            .ok_or_else(|| format!("a lease round without shards: {v}"))?
            .iter()
            .map(|s| {
                Ok(ShardLeases {
                    shard: s["shard"]
                        .as_str()
                        .ok_or("a shard without name")?
                        .to_owned(),
                    first: held(&s["first"])?,
                    second: held(&s["second"])?,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(LeaseRound {
            at_ms: v["at_ms"].as_i64().ok_or("a lease round without at_ms")?,
            shards,
        })
    }
}

fn run(facts: &Facts) -> Vec<String> {
    let Some(rounds) = &facts.dump.lease_samples else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for round in rounds {
        let mut holders: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
        for s in &round.shards {
            for (p, holder, epoch) in s.first.iter().filter(|l| s.second.contains(l)) {
                holders
                    .entry(*p)
                    .or_default()
                    .push(format!("{} ({holder}, epoch {epoch})", s.shard));
            }
        }
        for (p, on) in holders.into_iter().filter(|(_, on)| on.len() > 1) {
            found.push(format!(
                "at {} ms partition {p} held on {}",
                round.at_ms,
                on.join(" and ")
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;
    use super::*;

    fn shard(name: &str, first: &[(i64, &str, i64)], second: &[(i64, &str, i64)]) -> ShardLeases {
        let own =
            |l: &[(i64, &str, i64)]| l.iter().map(|(p, h, e)| (*p, h.to_string(), *e)).collect();
        ShardLeases {
            shard: name.into(),
            first: own(first),
            second: own(second),
        }
    }

    #[test]
    fn a_lease_handed_over_within_a_round_passes() {
        let (history, mut dump) = clean();
        dump.lease_samples = Some(vec![LeaseRound {
            at_ms: 10,
            shards: vec![
                // s0 lost partition 3 to the mover between its reads; s1 got it after.
                shard("s0", &[(3, "a0", 4)], &[(3, "move/3/1", 5)]),
                shard("s1", &[(7, "a1", 2)], &[(3, "a1", 7), (7, "a1", 2)]),
            ],
        }]);
        let report = check(&history, &dump);
        assert_eq!(report.count("two-lease-holders"), 0, "{}", report.table());
    }

    #[test]
    fn fires_for_a_partition_held_on_two_shards_through_a_round() {
        let (history, mut dump) = clean();
        dump.lease_samples = Some(vec![LeaseRound {
            at_ms: 10,
            shards: vec![
                shard("s0", &[(3, "move/3", 5)], &[(3, "move/3", 5)]),
                shard("s1", &[(3, "a1", 7)], &[(3, "a1", 7)]),
            ],
        }]);
        let report = check(&history, &dump);
        assert_eq!(report.count("two-lease-holders"), 1, "{}", report.table());
    }
}
