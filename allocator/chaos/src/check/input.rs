//! The checker's inputs: recorded operations with the outcome a client learned, and the final
//! database dump, read from their JSON without any of the services' types.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// What a client learned about one operation, derived from its HTTP status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the operation took effect (or replayed one that did).
    Acknowledged,
    /// 4xx: the service answered that it did not apply it.
    Refused,
    /// No answer (timeout, connection error) or 5xx: it may or may not have been applied.
    Unknown,
}

impl Outcome {
    pub fn of(status: Option<i64>) -> Outcome {
        match status {
            Some(s) if (200..300).contains(&s) => Outcome::Acknowledged,
            Some(s) if (400..500).contains(&s) => Outcome::Refused,
            _ => Outcome::Unknown,
        }
    }
}

/// One client operation as recorded.
#[derive(Debug, Clone)]
pub struct Op {
    pub kind: String,
    pub request: Value,
    pub status: Option<i64>,
    pub outcome: Outcome,
    /// When the client had the answer (wall-clock ms since the Unix epoch), if recorded.
    pub complete_wall_ms: Option<i64>,
    /// When the client sent it (wall-clock ms since the Unix epoch), if recorded: nothing it
    /// did is stamped earlier.
    pub invoke_wall_ms: Option<i64>,
}

impl Op {
    pub fn from_json(v: &Value) -> Result<Op, String> {
        let kind = v["kind"]
            .as_str()
            .ok_or_else(|| format!("history record without kind: {v}"))?
            .to_owned();
        let status = v["status"].as_i64();
        Ok(Op {
            kind,
            request: v["request"].clone(),
            status,
            outcome: Outcome::of(status),
            complete_wall_ms: v["complete_wall_ms"].as_i64(),
            invoke_wall_ms: v["invoke_wall_ms"].as_i64(),
        })
    }

    pub(super) fn id(&self, field: &str) -> &str {
        self.request[field].as_str().unwrap_or("")
    }

    /// The (sku, quantity) of each line of an order request.
    pub(super) fn order_lines(&self) -> Vec<(String, i64)> {
        lines_of(&self.request)
    }
}

/// The (sku, quantity) of each line of an order request (`{"lines": [{sku, quantity}]}`).
fn lines_of(request: &Value) -> Vec<(String, i64)> {
    request["lines"]
        .as_array()
        .map(|lines| {
            lines
                .iter()
                .map(|l| {
                    (
                        l["sku"].as_str().unwrap_or_default().to_owned(),
                        l["quantity"].as_i64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A ledger row as dumped.
#[derive(Debug, Clone)]
pub struct LedgerRow {
    pub entry_id: i64,
    pub sku: String,
    pub partition: i64,
    pub kind: String,
    pub reservation_id: Option<String>,
    pub adjustment_id: Option<String>,
    /// on_hand, available, held, confirmed deltas.
    pub d: [i64; 4],
    pub epoch: i64,
    /// `written_at` in microseconds since the Unix epoch.
    pub written_us: i64,
    /// `recorded_at` (its transaction's start, what settlement windows are cut by), in µs.
    pub recorded_us: i64,
    /// Its position in the partition's change-event stream (V12); `None` in older dumps.
    pub position: Option<i64>,
}

/// A reservation as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub sku: String,
    pub quantity: i64,
    pub status: String,
}

/// An order as stored by the routers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// `pending`, `placed`, `failed` or `refused`.
    pub status: String,
    /// (sku, quantity) per line of the stored request.
    pub lines: Vec<(String, i64)>,
}

/// One settlement run (window), times in microseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub start_us: i64,
    pub end_us: i64,
    pub status: String,
    pub reservations: Option<i64>,
    pub quantity: Option<i64>,
    /// A settled window's position in its stream (V13).
    pub position: Option<i64>,
    /// That stream: `settlement`, or `settlement/<shard>` for a shard other than the catalog.
    pub stream: String,
}

/// One `settlements` row: a window's total for one SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub start_us: i64,
    pub sku: String,
    pub quantity: i64,
    pub reservations: i64,
}

/// The final state of the database, as dumped.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// sku → [on_hand, available, held, confirmed].
    pub inventory: BTreeMap<String, [i64; 4]>,
    pub reservations: HashMap<String, Reservation>,
    pub ledger: Vec<LedgerRow>,
    /// adjustment id → (sku, delta, status).
    pub adjustments: HashMap<String, (String, i64, String)>,
    pub orders: HashMap<String, Order>,
    /// partition → (epoch, acquired_us), one per recorded epoch.
    pub lease_history: HashMap<i64, Vec<(i64, i64)>>,
    pub runs: Vec<Run>,
    pub settlements: Vec<Settled>,
    /// First ledger entry whose write time and epoch history are recorded (migration V6); rows
    /// below it predate the lease history. `None` in a dump without it: every row counts.
    pub history_from_entry: Option<i64>,
    /// Reservations and orders last changed before this (µs, database clock) may have been
    /// removed by the retention job: the dump's time minus the idempotency horizon. `None`:
    /// nothing may be missing.
    pub removed_before_us: Option<i64>,
    /// The ledger's archived prefix (V17), when partitions were archived.
    pub archived: Option<ArchivedPrefix>,
    /// stream (`partition/P`, `settlement`) → the position up to which the relay recorded it as
    /// published at the dump (`event_relay_progress`).
    pub relay_progress: BTreeMap<String, i64>,
    /// The dump's time (µs, database clock), when recorded.
    pub dumped_us: Option<i64>,
    /// What the run's change-event consumer logged (`events.jsonl`), in the order it saw it;
    /// `None` when no consumer ran.
    pub deliveries: Option<Vec<Delivery>>,
    /// stream → its last position, read after the consumer stopped (`events.heads.json`).
    pub final_heads: Option<BTreeMap<String, i64>>,
    /// Over several shards, each shard's own dump for its settlement (see `shards`); empty for
    /// one database, whose settlement is judged on this dump.
    pub shard_settlement: Vec<(String, Dump)>,
    /// Over several shards, the ledger rows each shard keeps of partitions it no longer holds
    /// (a move's source): no owner may have written them under a superseded epoch either, so the
    /// `stale-epoch-write` rule judges them too, and `stream-position-forked` compares them
    /// with the holder's rows.
    pub foreign_ledger: Vec<LedgerRow>,
    /// The harness's samples of every shard's partition leases during the run (`leases.jsonl`);
    /// `None` when it took none.
    pub lease_samples: Option<Vec<super::LeaseRound>>,
}

/// One change event as the run's consumer received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// `partition/P` or `settlement`.
    pub stream: String,
    pub position: i64,
    /// The dedupe key it carried.
    pub key: String,
    /// `reservation.held`, …, `settlement.window_settled`.
    pub event_type: String,
    /// The reservation or adjustment id, for a ledger event.
    pub id: Option<String>,
    /// At or below the consumer's last applied position: skipped, not applied.
    pub duplicate: bool,
}

impl Delivery {
    pub fn from_json(v: &Value) -> Result<Delivery, String> {
        Ok(Delivery {
            stream: field_str(v, "stream")?,
            position: field_i64(v, "position")?,
            key: field_str(v, "key")?,
            event_type: field_str(v, "type")?,
            id: v["id"].as_str().map(str::to_owned),
            duplicate: v["duplicate"]
                .as_bool()
                .ok_or_else(|| format!("delivery without duplicate: {v}"))?,
        })
    }
}

/// What the dump knows of archived ledger partitions: the ledger it holds is the history from
/// `before_us` on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchivedPrefix {
    /// Every archived row was recorded before this (µs); every row from it on is in the dump.
    pub before_us: i64,
    /// The highest archived entry id: a live row below it was inserted before an archived one.
    pub last_entry_id: i64,
    /// Over several shards, the highest archived entry id of the shard each SKU's rows come
    /// from (entry ids are per shard); `last_entry_id` for a SKU not named.
    pub last_entry_by_sku: BTreeMap<String, i64>,
    /// sku → the archived rows' sums, [on_hand, available, held, confirmed].
    pub totals: BTreeMap<String, [i64; 4]>,
}

fn field_i64(v: &Value, k: &str) -> Result<i64, String> {
    v[k].as_i64()
        .ok_or_else(|| format!("missing integer {k} in {v}"))
}

fn field_str(v: &Value, k: &str) -> Result<String, String> {
    v[k].as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("missing string {k} in {v}"))
}

fn rows<'a>(v: &'a Value, table: &str) -> Result<&'a Vec<Value>, String> {
    v[table]
        .as_array()
        .ok_or_else(|| format!("dump has no array {table:?}"))
}

/// Tables added to the dump after the first runs: absent means empty.
fn optional_rows<'a>(v: &'a Value, table: &str) -> &'a [Value] {
    v[table].as_array().map_or(&[], Vec::as_slice)
}

impl Dump {
    pub fn from_json(v: &Value) -> Result<Dump, String> {
        let mut dump = Dump::default();
        for r in rows(v, "inventory")? {
            dump.inventory.insert(
                field_str(r, "sku")?,
                [
                    field_i64(r, "on_hand")?,
                    field_i64(r, "available")?,
                    field_i64(r, "held")?,
                    field_i64(r, "confirmed")?,
                ],
            );
        }
        for r in rows(v, "reservations")? {
            dump.reservations.insert(
                field_str(r, "reservation_id")?,
                Reservation {
                    sku: field_str(r, "sku")?,
                    quantity: field_i64(r, "quantity")?,
                    status: field_str(r, "status")?,
                },
            );
        }
        for r in rows(v, "ledger")? {
            let written_us = field_i64(r, "written_us")?;
            dump.ledger.push(LedgerRow {
                entry_id: field_i64(r, "entry_id")?,
                sku: field_str(r, "sku")?,
                partition: field_i64(r, "partition")?,
                kind: field_str(r, "kind")?,
                reservation_id: r["reservation_id"].as_str().map(str::to_owned),
                adjustment_id: r["adjustment_id"].as_str().map(str::to_owned),
                d: [
                    field_i64(r, "d_on_hand")?,
                    field_i64(r, "d_available")?,
                    field_i64(r, "d_held")?,
                    field_i64(r, "d_confirmed")?,
                ],
                epoch: field_i64(r, "epoch")?,
                written_us,
                recorded_us: r["recorded_us"].as_i64().unwrap_or(written_us),
                position: r["position"].as_i64(),
            });
        }
        for r in rows(v, "adjustments")? {
            dump.adjustments.insert(
                field_str(r, "adjustment_id")?,
                (
                    field_str(r, "sku")?,
                    field_i64(r, "delta")?,
                    field_str(r, "status")?,
                ),
            );
        }
        for r in rows(v, "orders")? {
            dump.orders.insert(
                field_str(r, "order_id")?,
                Order {
                    status: field_str(r, "status")?,
                    lines: lines_of(&r["request"]),
                },
            );
        }
        for r in rows(v, "lease_history")? {
            // The settlement job's lease has no partition; its term fences other tables.
            let Some(p) = r["partition"].as_i64() else {
                continue;
            };
            dump.lease_history
                .entry(p)
                .or_default()
                .push((field_i64(r, "epoch")?, field_i64(r, "acquired_us")?));
        }
        for r in optional_rows(v, "settlement_runs") {
            dump.runs.push(Run {
                start_us: field_i64(r, "start_us")?,
                end_us: field_i64(r, "end_us")?,
                status: field_str(r, "status")?,
                reservations: r["reservations"].as_i64(),
                quantity: r["quantity"].as_i64(),
                position: r["position"].as_i64(),
                stream: r["stream"].as_str().unwrap_or("settlement").to_owned(),
            });
        }
        for r in optional_rows(v, "settlements") {
            dump.settlements.push(Settled {
                start_us: field_i64(r, "start_us")?,
                sku: field_str(r, "sku")?,
                quantity: field_i64(r, "quantity")?,
                reservations: field_i64(r, "reservations")?,
            });
        }
        dump.history_from_entry = optional_rows(v, "history_horizon")
            .first()
            .map(|r| field_i64(r, "first_entry_id"))
            .transpose()?;
        for r in optional_rows(v, "event_relay_progress") {
            dump.relay_progress
                .insert(field_str(r, "stream")?, field_i64(r, "published")?);
        }
        dump.dumped_us = optional_rows(v, "retention")
            .first()
            .and_then(|r| r["dumped_us"].as_i64());
        dump.removed_before_us = optional_rows(v, "retention")
            .first()
            .map(|r| Ok::<_, String>(field_i64(r, "dumped_us")? - field_i64(r, "horizon_us")?))
            .transpose()?;
        let archives = optional_rows(v, "ledger_archives");
        if !archives.is_empty() {
            let mut prefix = ArchivedPrefix::default();
            for r in archives {
                prefix.before_us = prefix.before_us.max(field_i64(r, "end_us")?);
                prefix.last_entry_id = prefix
                    .last_entry_id
                    .max(r["last_entry_id"].as_i64().unwrap_or(0));
            }
            for r in optional_rows(v, "ledger_archived_totals") {
                prefix.totals.insert(
                    field_str(r, "sku")?,
                    [
                        field_i64(r, "d_on_hand")?,
                        field_i64(r, "d_available")?,
                        field_i64(r, "d_held")?,
                        field_i64(r, "d_confirmed")?,
                    ],
                );
            }
            dump.archived = Some(prefix);
        }
        Ok(dump)
    }
}
