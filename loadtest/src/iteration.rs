//! One iteration of the workload, shared by the closed and the open loop: a reservation (or, with
//! `--order-ratio`, a multi-line order through the router), then confirm, release or leave each
//! hold. The iteration records into the caller's [`WorkerStats`] only when it is over, so the
//! open loop can keep one set of histograms behind a lock.

use std::time::Instant;

use allocator_client::{Client, Error};
use rand::Rng;
use schema::wire::{InvalidValue, OrderLine, OrderRequest, ReservationStatus, ReserveRequest};

use crate::client::{failure_label, may_hold};
use crate::report::RunConfig;
use crate::skew::SkuPicker;
use crate::stats::{OpTrace, Tracked, WorkerStats};
use crate::timeline::{Outcome, Timeline};

pub fn sku_name(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index}")
}

/// What a reserve/confirm/release iteration does after the reservation is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Confirm,
    Release,
    Leave,
}

/// `u` uniform in [0, 1): below `confirm` → confirm, below `confirm + release` → release.
pub fn choose_action(u: f64, confirm: f64, release: f64) -> Action {
    if u < confirm {
        Action::Confirm
    } else if u < confirm + release {
        Action::Release
    } else {
        Action::Leave
    }
}

/// What one iteration did; applied to [`WorkerStats`] by [`Record::apply`].
#[derive(Debug, Default)]
pub struct Record {
    /// Operation, trace, outcome label, and when it completed (for the per-second series).
    ops: Vec<(&'static str, OpTrace, String, Instant)>,
    attempted: Vec<usize>,
    /// Final statuses the client knows: (sku index, status, quantity, reservation id).
    known: Vec<(usize, ReservationStatus, i64, String)>,
    pending: Vec<Tracked>,
}

impl Record {
    /// Add this iteration's operations to the run's time series; `now` lets it seal old seconds.
    pub fn feed(&self, timeline: &mut Timeline, now: Instant) {
        for (_, trace, outcome, at) in &self.ops {
            timeline.record(*at, Outcome::of(outcome), trace.latency);
        }
        timeline.seal_before(now);
    }

    pub fn apply(self, stats: &mut WorkerStats) {
        for (op, trace, outcome, _) in &self.ops {
            stats.op(op).absorb(trace, outcome);
        }
        for k in self.attempted {
            stats.tally(k).attempted += 1;
        }
        for (k, status, quantity, id) in self.known {
            stats.tally(k).account(status, quantity);
            if status == ReservationStatus::Held {
                stats.held.push(Tracked {
                    reservation_id: id,
                    sku_index: k,
                    quantity,
                });
            }
        }
        stats.pending.extend(self.pending);
        stats.iterations += 1;
    }
}

/// Run one iteration under the id prefix `id`. `origin` is the intended start (open loop): the
/// first request's latency counts from it.
pub async fn iterate<R: Rng + ?Sized>(
    api: &Client,
    c: &RunConfig,
    picker: &SkuPicker,
    id: String,
    origin: Option<Instant>,
    rng: &mut R,
) -> Record {
    let mut record = Record::default();
    let holds = if c.order_ratio > 0.0 && rng.random::<f64>() < c.order_ratio {
        order(api, c, picker, &id, origin, rng, &mut record).await
    } else {
        reserve(api, c, picker, id, origin, rng, &mut record).await
    };
    for (k, reservation_id) in holds {
        let action = choose_action(rng.random::<f64>(), c.confirm_ratio, c.release_ratio);
        let status = match action {
            Action::Leave => Some(ReservationStatus::Held),
            Action::Confirm => transition(api, "confirm", &reservation_id, &mut record).await,
            Action::Release => transition(api, "release", &reservation_id, &mut record).await,
        };
        match status {
            Some(status) => record.known.push((k, status, c.quantity, reservation_id)),
            None => record.pending.push(Tracked {
                reservation_id,
                sku_index: k,
                quantity: c.quantity,
            }),
        }
    }
    record
}

/// A request value the load generator derives from what it checked at start (the SKU range,
/// the id scheme, quantity and ttl: see `main.rs`), as the wire type. A refusal here is a bug in
/// those start checks, not bad input.
pub fn checked<V, T: TryFrom<V, Error = InvalidValue>>(value: V) -> T {
    T::try_from(value).unwrap_or_else(|e| panic!("a value checked at start was refused: {e}"))
}

/// A single reservation. Returns the hold (sku index, id) when it is held.
async fn reserve<R: Rng + ?Sized>(
    api: &Client,
    c: &RunConfig,
    picker: &SkuPicker,
    reservation_id: String,
    origin: Option<Instant>,
    rng: &mut R,
    record: &mut Record,
) -> Vec<(usize, String)> {
    let k = picker.pick(rng);
    record.attempted.push(k);
    let request = ReserveRequest {
        reservation_id: checked(reservation_id.clone()),
        sku: checked(sku_name(&c.prefix, k)),
        quantity: checked(c.quantity),
        ttl_seconds: Some(checked(c.ttl_seconds)),
    };
    let mut trace = OpTrace::default();
    let started = Instant::now();
    let outcome = api.reserve(&request).observe(&mut trace).await;
    trace.latency = origin.unwrap_or(started).elapsed();
    let mut unknown = false;
    let mut held = Vec::new();
    let label = match outcome {
        Ok(reply) if reply.value.status == ReservationStatus::Held => {
            held.push((k, reservation_id.clone()));
            if reply.status == 201 {
                "created"
            } else {
                "replayed"
            }
            .to_owned()
        }
        Ok(reply) => {
            // A replay of a hold that has moved on (expired): count it as it is now.
            let status = reply.value.status;
            record
                .known
                .push((k, status, c.quantity, reservation_id.clone()));
            format!("replayed_{}", status.as_str())
        }
        Err(error) => {
            // Refused: nothing held. Unknown, given up or a 5xx: learn it after the run.
            unknown = may_hold(&error);
            failure_label(&error)
        }
    };
    record.ops.push(("reserve", trace, label, Instant::now()));
    if unknown {
        record.pending.push(Tracked {
            reservation_id,
            sku_index: k,
            quantity: c.quantity,
        });
    }
    held
}

/// An all-or-nothing order of `order_lines` lines (router only). Line `i` is the reservation
/// `order:{order_id}:{i}` ([`schema::wire::order_line_id`]). Returns the held lines.
async fn order<R: Rng + ?Sized>(
    api: &Client,
    c: &RunConfig,
    picker: &SkuPicker,
    order_id: &str,
    origin: Option<Instant>,
    rng: &mut R,
    record: &mut Record,
) -> Vec<(usize, String)> {
    let picks: Vec<usize> = (0..c.order_lines.max(1))
        .map(|_| picker.pick(rng))
        .collect();
    record.attempted.extend(&picks);
    let request = OrderRequest {
        lines: picks
            .iter()
            .map(|&k| OrderLine {
                sku: checked(sku_name(&c.prefix, k)),
                quantity: checked(c.quantity),
            })
            .collect(),
        ttl_seconds: Some(checked(c.ttl_seconds)),
    };
    let mut trace = OpTrace::default();
    let started = Instant::now();
    let outcome = api.order(order_id, &request).observe(&mut trace).await;
    trace.latency = origin.unwrap_or(started).elapsed();
    let line_id = |i: usize| schema::wire::order_line_id(order_id, i);
    let mut held = Vec::new();
    let mut unknown = false;
    let label = match outcome {
        Ok(reply) if reply.value.reservations.len() == picks.len() => {
            for (i, r) in reply.value.reservations.iter().enumerate() {
                if r.status == ReservationStatus::Held {
                    held.push((picks[i], line_id(i)));
                } else {
                    record
                        .known
                        .push((picks[i], r.status, c.quantity, line_id(i)));
                }
            }
            if reply.status == 201 {
                "placed"
            } else {
                "replayed"
            }
            .to_owned()
        }
        Ok(reply) => {
            unknown = true;
            format!("unparsable_{}", reply.status.as_u16())
        }
        // Decided failure: the router released every line it had held, nothing of the order
        // stays held (checked by the accounting).
        Err(error @ Error::OrderFailed(_)) => failure_label(&error),
        Err(error) => {
            // An order id stored with other lines (422) leaves that order's holds as they were.
            unknown = may_hold(&error) || matches!(error, Error::IdempotencyMismatch(_));
            failure_label(&error)
        }
    };
    record.ops.push(("order", trace, label, Instant::now()));
    if unknown {
        for (i, &k) in picks.iter().enumerate() {
            record.pending.push(Tracked {
                reservation_id: line_id(i),
                sku_index: k,
                quantity: c.quantity,
            });
        }
    }
    held
}

/// Confirm or release a hold. Returns its status, or `None` when unknown (learnt after the run).
async fn transition(
    api: &Client,
    op: &'static str,
    reservation_id: &str,
    record: &mut Record,
) -> Option<ReservationStatus> {
    let mut trace = OpTrace::default();
    let started = Instant::now();
    let call = if op == "confirm" {
        api.confirm(reservation_id)
    } else {
        api.release(reservation_id)
    };
    let outcome = call.observe(&mut trace).await;
    trace.latency = started.elapsed();
    let (label, status) = match outcome {
        Ok(reply) => {
            let label = match (op, reply.value.status) {
                ("confirm", ReservationStatus::Confirmed) => "confirmed".to_owned(),
                ("release", ReservationStatus::Released) => "released".to_owned(),
                (_, other) => format!("ok_but_{}", other.as_str()),
            };
            (label, Some(reply.value.status))
        }
        // 409 invalid-state (expired?), 404, 5xx, unknown: learn the state after the run.
        Err(error) => (failure_label(&error), None),
    };
    record.ops.push((op, trace, label, Instant::now()));
    status
}

/// A worker's RNG seed: distinct per worker, reproducible per `--seed`.
pub fn worker_seed(seed: u64, worker: usize) -> u64 {
    seed ^ (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_seeds_differ_and_are_stable() {
        assert_eq!(worker_seed(42, 3), worker_seed(42, 3));
        let seeds: std::collections::BTreeSet<u64> =
            (0..1000).map(|w| worker_seed(42, w)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_ne!(worker_seed(42, 0), worker_seed(43, 0));
    }

    #[test]
    fn actions_follow_the_ratios() {
        assert_eq!(choose_action(0.0, 0.5, 0.3), Action::Confirm);
        assert_eq!(choose_action(0.49, 0.5, 0.3), Action::Confirm);
        assert_eq!(choose_action(0.5, 0.5, 0.3), Action::Release);
        assert_eq!(choose_action(0.79, 0.5, 0.3), Action::Release);
        assert_eq!(choose_action(0.8, 0.5, 0.3), Action::Leave);
        assert_eq!(choose_action(0.99, 0.0, 0.0), Action::Leave);
        assert_eq!(choose_action(0.99, 1.0, 0.0), Action::Confirm);
    }

    #[test]
    fn sku_names() {
        assert_eq!(sku_name("bench", 0), "bench-0");
        assert_eq!(sku_name("bench", 999), "bench-999");
    }

    #[test]
    fn records_apply_outcomes_holds_and_unknowns() {
        let mut record = Record::default();
        let t0 = Instant::now();
        record
            .ops
            .push(("reserve", OpTrace::default(), "created".into(), t0));
        record.attempted.extend([3, 3, 4]);
        record
            .known
            .push((3, ReservationStatus::Held, 2, "a".into()));
        record
            .known
            .push((3, ReservationStatus::Confirmed, 2, "b".into()));
        record.pending.push(Tracked {
            reservation_id: "c".into(),
            sku_index: 4,
            quantity: 2,
        });
        let mut timeline = Timeline::new(t0);
        record.feed(&mut timeline, t0);
        assert_eq!(timeline.done(), 1);
        let mut stats = WorkerStats::default();
        record.apply(&mut stats);
        assert_eq!(stats.iterations, 1);
        assert_eq!(stats.tallies[&3].attempted, 2);
        assert_eq!(stats.tallies[&3].reserved, 4);
        assert_eq!(stats.tallies[&3].confirmed, 2);
        assert_eq!(stats.held.len(), 1);
        assert_eq!(stats.held[0].reservation_id, "a");
        assert_eq!(stats.pending.len(), 1);
        assert_eq!(stats.ops["reserve"].outcomes["created"], 1);
    }
}
