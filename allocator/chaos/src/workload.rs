//! The clients: a mixed workload through both routers, every operation recorded.
//!
//! Each client reserves (unique ids), confirms or releases holds it got (or may have got),
//! places multi-line orders and sometimes confirms their lines, and lets the rest expire (hold
//! TTLs are a few seconds). SKUs are drawn from two hot SKUs and a Zipf tail over tight stock,
//! so out-of-stock answers are common; a restocker adds stock through adjustments. Operations go
//! to either router at random. Nothing is retried: an operation whose outcome is unknown stays
//! unknown in the history, and the checker treats it as possibly applied.
//!
//! Two things make the history harder on purpose. Client `c0` calls with a token the routers
//! limit to a few requests per second ([`crate::tokens`]), so `429` answers of every operation
//! kind are frequent. And some orders are preceded by a single reserve under the id one of the
//! order's lines will use ([`colliding_line_id`]), with a quantity no order line asks for. Line
//! ids live in their own namespace, so the routers refuse that reserve (`400`) and the order's
//! lines stay its own; the checker would see a hold under a line id with another payload if one
//! ever got through.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use allocator_client::retry::FailureKind;
use allocator_client::{Client, Method};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::history::{Clock, JsonLines};
use crate::tokens::Tokens;

/// A client gives up on one operation after this long and records it as unknown: longer than
/// an order's two router retry deadlines, so an answer that comes is normally seen.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Zipf exponent of the SKU tail.
const ZIPF_S: f64 = 1.1;
/// Holds a client keeps track of for later confirm or release.
const MAX_PENDING: usize = 24;
/// Share of orders preceded by a reserve under one of their line ids.
const COLLISION_SHARE: f64 = 0.1;
/// Quantity of a colliding reserve: order lines ask for 1 or 2, so the stored payload tells
/// whose hold an id is.
const COLLISION_QUANTITY: i64 = 3;
/// The client whose operations use the rate-limited token.
const LIMITED_CLIENT: &str = "c0";

/// The reservation id a single reserve uses to collide with line `line` of order `order_id`:
/// the id the routers reserve that line under (`order:{order_id}:{line}`).
pub fn colliding_line_id(order_id: &str, line: usize) -> String {
    schema::wire::order_line_id(order_id, line)
}

/// What the workload's tasks share.
pub struct Workload {
    pub clock: Clock,
    pub history: Arc<JsonLines>,
    pub routers: Vec<String>,
    pub hot: Vec<String>,
    pub tail: Vec<String>,
    /// Cumulative Zipf weights over `tail`.
    tail_cdf: Vec<f64>,
    /// Per router: the client with the unlimited token, then the one with the limited token.
    /// One attempt per operation, never retried.
    clients: Vec<[Client; 2]>,
    next_op: std::sync::atomic::AtomicU64,
}

impl Workload {
    pub fn new(
        clock: Clock,
        history: Arc<JsonLines>,
        routers: Vec<String>,
        tokens: Tokens,
    ) -> anyhow::Result<Self> {
        let hot: Vec<String> = (0..2).map(|i| format!("hot-{i}")).collect();
        let tail: Vec<String> = (0..24).map(|i| format!("sku-{i:02}")).collect();
        let weights: Vec<f64> = (1..=tail.len())
            .map(|k| 1.0 / (k as f64).powf(ZIPF_S))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let tail_cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        let clients = routers
            .iter()
            .map(|url| {
                let client = Client::builder(url.as_str())
                    .attempt_timeout(CLIENT_TIMEOUT)
                    .deadline(Duration::ZERO)
                    .max_idle_per_host(4)
                    .token(tokens.client.as_str())
                    .build()?;
                let limited = client.with_token(&tokens.limited)?;
                Ok([client, limited])
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            clock,
            history,
            routers,
            hot,
            tail,
            tail_cdf,
            clients,
            next_op: std::sync::atomic::AtomicU64::new(1),
        })
    }

    /// Every SKU of the run.
    pub fn skus(&self) -> impl Iterator<Item = &String> {
        self.hot.iter().chain(self.tail.iter())
    }

    fn pick_sku(&self, rng: &mut StdRng) -> &str {
        if rng.random_bool(0.3) {
            &self.hot[rng.random_range(0..self.hot.len())]
        } else {
            let u: f64 = rng.random();
            let i = self.tail_cdf.partition_point(|c| *c < u);
            &self.tail[i.min(self.tail.len() - 1)]
        }
    }

    /// Sends one operation to router `router`, records it, and returns its status and body
    /// (`None` when no answer arrived).
    pub async fn call(
        &self,
        client: &str,
        router: usize,
        kind: &str,
        path: String,
        request: Value,
        body: Value,
    ) -> (Option<u16>, Option<Value>) {
        let id = self
            .next_op
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let invoke_ms = self.clock.ms();
        let invoke_wall_ms = self.clock.wall_ms();
        let limited = usize::from(client == LIMITED_CLIENT);
        let body = serde_json::to_vec(&body).expect("a JSON value serialises");
        let result = self.clients[router][limited]
            .send_once(Method::POST, &path, Some(body.into()))
            .await;
        let (status, answer, error) = match result {
            Ok(resp) => {
                let body = serde_json::from_slice::<Value>(&resp.body).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&resp.body).into_owned())
                });
                (Some(resp.status.as_u16()), Some(body), None)
            }
            // The status line arrived but the body did not: still an answer.
            Err(e) if e.status.is_some() => (e.status, None, Some(format!("reading body: {e}"))),
            Err(e) => {
                let what = match e.kind {
                    FailureKind::Timeout => "timeout",
                    FailureKind::Connect => "connection refused",
                    FailureKind::Io => "connection error",
                };
                (None, None, Some(format!("{what}: {e}")))
            }
        };
        let outcome = match status {
            Some(s) if (200..300).contains(&s) => "ok",
            Some(s) if (400..500).contains(&s) => "fail",
            _ => "unknown",
        };
        self.history.write(&json!({
            "id": id,
            "client": client,
            "router": router,
            "kind": kind,
            "request": request,
            "invoke_ms": invoke_ms,
            "invoke_wall_ms": invoke_wall_ms,
            "complete_ms": self.clock.ms(),
            "complete_wall_ms": self.clock.wall_ms(),
            "status": status,
            "body": answer,
            "error": error,
            "outcome": outcome,
        }));
        (status, answer)
    }

    /// Restock `sku` by `delta` under `adjustment_id` through router `router`.
    pub async fn adjust(
        &self,
        client: &str,
        router: usize,
        adjustment_id: &str,
        sku: &str,
        delta: i64,
    ) -> Option<u16> {
        let request = json!({"adjustment_id": adjustment_id, "sku": sku, "delta": delta});
        let body = json!({"adjustment_id": adjustment_id, "delta": delta});
        self.call(
            client,
            router,
            "adjust",
            format!("/v1/inventory/{sku}/adjustments"),
            request,
            body,
        )
        .await
        .0
    }

    /// Stocks every SKU before the run; an unknown answer is retried with the same id, which
    /// the service applies at most once.
    pub async fn seed(&self) -> anyhow::Result<()> {
        let skus: Vec<String> = self.skus().cloned().collect();
        for sku in skus {
            let units = if sku.starts_with("hot-") { 60 } else { 20 };
            let id = format!("seed-{sku}");
            let mut attempts = 0;
            loop {
                attempts += 1;
                match self
                    .adjust("seed", attempts % self.routers.len(), &id, &sku, units)
                    .await
                {
                    Some(s) if (200..300).contains(&s) => break,
                    other if attempts >= 20 => {
                        anyhow::bail!("seeding {sku} failed: last status {other:?}")
                    }
                    _ => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        }
        Ok(())
    }

    /// One client until `stop` is set.
    pub async fn client(self: Arc<Self>, n: usize, seed: u64, stop: Arc<AtomicBool>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let name = format!("c{n}");
        let mut pending: Vec<String> = Vec::new();
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let router = rng.random_range(0..self.routers.len());
            let roll: f64 = rng.random();
            if roll < 0.45 || (roll < 0.8 && pending.is_empty()) {
                let id = format!("{name}-r{seq}");
                let sku = self.pick_sku(&mut rng).to_owned();
                let quantity = rng.random_range(1..=3);
                let ttl = rng.random_range(2..=6);
                self.reserve(&name, router, &id, &sku, quantity, ttl, &mut pending)
                    .await;
            } else if roll < 0.8 {
                let id = pending.swap_remove(rng.random_range(0..pending.len()));
                let kind = if roll < 0.65 { "confirm" } else { "release" };
                self.call(
                    &name,
                    router,
                    kind,
                    format!("/v1/reservations/{id}/{kind}"),
                    json!({"reservation_id": id}),
                    json!({}),
                )
                .await;
            } else {
                let order_id = format!("{name}-o{seq}");
                let lines: Vec<Value> = (0..rng.random_range(2..=3))
                    .map(|_| json!({"sku": self.pick_sku(&mut rng), "quantity": rng.random_range(1..=2)}))
                    .collect();
                if rng.random_bool(COLLISION_SHARE) {
                    let line = rng.random_range(0..lines.len());
                    let sku = self.pick_sku(&mut rng).to_owned();
                    let id = colliding_line_id(&order_id, line);
                    self.reserve(
                        &name,
                        router,
                        &id,
                        &sku,
                        COLLISION_QUANTITY,
                        5,
                        &mut pending,
                    )
                    .await;
                }
                let ttl = rng.random_range(3..=6);
                let request = json!({"order_id": order_id, "lines": lines, "ttl_seconds": ttl});
                let (status, body) = self
                    .call(
                        &name,
                        router,
                        "order",
                        format!("/v1/orders/{order_id}/reservations"),
                        request,
                        json!({"lines": lines, "ttl_seconds": ttl}),
                    )
                    .await;
                if status.is_some_and(|s| (200..300).contains(&s)) {
                    // The lines' reservation ids, as the router reserved them.
                    let held = body.as_ref().and_then(|b| b["reservations"].as_array());
                    pending.extend(
                        held.into_iter()
                            .flatten()
                            .filter_map(|r| r["reservation_id"].as_str().map(str::to_owned)),
                    );
                }
            }
            if pending.len() > MAX_PENDING {
                pending.drain(..pending.len() - MAX_PENDING);
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..=25))).await;
        }
    }

    /// One single reserve; an id that is (or may be) held goes to `pending`.
    #[allow(clippy::too_many_arguments)]
    async fn reserve(
        &self,
        client: &str,
        router: usize,
        id: &str,
        sku: &str,
        quantity: i64,
        ttl: i64,
        pending: &mut Vec<String>,
    ) {
        let request =
            json!({"reservation_id": id, "sku": sku, "quantity": quantity, "ttl_seconds": ttl});
        let (status, _) = self
            .call(
                client,
                router,
                "reserve",
                "/v1/reservations".into(),
                request.clone(),
                request,
            )
            .await;
        if status.is_none_or(|s| (200..300).contains(&s) || s >= 500) {
            pending.push(id.to_owned());
        }
    }

    /// Adds stock to random SKUs until `stop` is set.
    pub async fn restocker(self: Arc<Self>, seed: u64, stop: Arc<AtomicBool>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let skus: Vec<String> = self.skus().cloned().collect();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let sku = &skus[rng.random_range(0..skus.len())];
            let delta = rng.random_range(5..=20);
            let router = rng.random_range(0..self.routers.len());
            self.adjust("restock", router, &format!("adj-{n}"), sku, delta)
                .await;
            tokio::time::sleep(Duration::from_millis(rng.random_range(150..=400))).await;
        }
    }
}
