//! Steady traffic through a failover, with every acknowledgement recorded, and the count of what
//! the surviving database lost.
//!
//! Storage failover tests (the router's replicated pair, the allocator's Patroni cluster) all ask
//! the same question: of every answer a client got, is each one still in the database the
//! operator keeps? [`Workload`] sends reserves with unique ids (a third of the holds then
//! confirmed) and, optionally, restocks through one service URL, retrying nothing: an unanswered
//! or refused request is simply not counted. Each acknowledgement is kept with the instant it
//! was sent and answered, so a test can place a lost write in time and measure how long after a
//! fault the first request succeeded. [`lost_on`] looks every acknowledged id up in a database.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinHandle;

/// How many clients reserve, and whether a restocker runs beside them.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub clients: usize,
    /// A restock of 1 every 100 ms, ids `restock-N`.
    pub restock: bool,
}

/// One acknowledged operation: its id and when its answer arrived.
pub type Ack = (String, Instant);

/// Acknowledged operations with the instant each answer arrived.
#[derive(Debug, Default)]
pub struct Acks {
    pub holds: Vec<Ack>,
    pub confirms: Vec<Ack>,
    pub adjustments: Vec<Ack>,
    /// Every 2xx answer: when its request was sent and when it was answered.
    pub successes: Vec<(Instant, Instant)>,
    /// Reserves answered with anything but `201`, or not answered, by when they were sent.
    pub failed_reserves: Vec<Instant>,
}

impl Acks {
    /// Successes answered after `since`.
    pub fn successes_after(&self, since: Instant) -> usize {
        self.successes.iter().filter(|(_, at)| *at > since).count()
    }

    /// How long after `since` the first request *sent* after it was answered with success: the
    /// time from a fault to service again (a request in flight at the fault does not count).
    pub fn first_success_sent_after(&self, since: Instant) -> Option<Duration> {
        self.successes
            .iter()
            .filter(|(sent, _)| *sent > since)
            .map(|(_, at)| *at - since)
            .min()
    }

    /// The longest time without any successful answer between `from` and `to`.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut times: Vec<Instant> = self
            .successes
            .iter()
            .map(|(_, at)| *at)
            .filter(|at| *at > from && *at < to)
            .collect();
        times.sort();
        let mut previous = from;
        let mut longest = Duration::ZERO;
        for at in times.into_iter().chain([to]) {
            longest = longest.max(at - previous);
            previous = at;
        }
        longest
    }
}

/// Clients reserving (and confirming a third) plus an optional restocker; see the module
/// documentation.
pub struct Workload {
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Acks>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Starts the traffic against `base` (a router or an allocator) over `skus`, which must have
    /// stock. Client `c`'s reservation ids are `c{c}-{n}`.
    pub fn start(base: &str, skus: &[String], shape: Shape) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Acks::default()));
        let mut tasks = Vec::new();
        for client in 0..shape.clients {
            let (stop, acks, base, skus) =
                (stop.clone(), acks.clone(), base.to_owned(), skus.to_vec());
            tasks.push(tokio::spawn(async move {
                let http = short_http();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = format!("c{client}-{n}");
                    let sku = &skus[n % skus.len()];
                    let body = json!({"reservation_id": id, "sku": sku, "quantity": 1, "ttl_seconds": 3600});
                    let sent = Instant::now();
                    if post(&http, &format!("{base}/v1/reservations"), &body).await != Some(201) {
                        acks.lock().unwrap().failed_reserves.push(sent);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    record(&acks, |a| &mut a.holds, &id, sent);
                    if n.is_multiple_of(3) {
                        let url = format!("{base}/v1/reservations/{id}/confirm");
                        let sent = Instant::now();
                        if post(&http, &url, &json!({})).await == Some(200) {
                            record(&acks, |a| &mut a.confirms, &id, sent);
                        }
                    }
                }
            }));
        }
        if shape.restock {
            let (stop, acks, base, skus) =
                (stop.clone(), acks.clone(), base.to_owned(), skus.to_vec());
            tasks.push(tokio::spawn(async move {
                let http = short_http();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = format!("restock-{n}");
                    let url = format!("{base}/v1/inventory/{}/adjustments", skus[n % skus.len()]);
                    let sent = Instant::now();
                    let body = json!({"adjustment_id": id, "delta": 1});
                    if post(&http, &url, &body).await == Some(201) {
                        record(&acks, |a| &mut a.adjustments, &id, sent);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        Workload { stop, acks, tasks }
    }

    /// Reads the acknowledgements so far.
    pub fn with_acks<T>(&self, f: impl FnOnce(&Acks) -> T) -> T {
        f(&self.acks.lock().unwrap())
    }

    /// How long after `since` the first request was answered with success (including one in
    /// flight at `since`).
    pub fn first_success_after(&self, since: Instant) -> Option<Duration> {
        self.with_acks(|acks| {
            acks.successes
                .iter()
                .map(|(_, at)| *at)
                .filter(|&at| at > since)
                .min()
                .map(|at| at - since)
        })
    }

    /// Stops every client (each finishes its request in flight, at most 8 s) and returns what
    /// was acknowledged.
    pub async fn finish(self) -> Acks {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("client task");
        }
        Arc::try_unwrap(self.acks)
            .expect("clients stopped")
            .into_inner()
            .unwrap()
    }
}

fn record(acks: &Mutex<Acks>, list: impl Fn(&mut Acks) -> &mut Vec<Ack>, id: &str, sent: Instant) {
    let mut acks = acks.lock().unwrap();
    let now = Instant::now();
    list(&mut acks).push((id.to_owned(), now));
    acks.successes.push((sent, now));
}

fn short_http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(8))
        .build()
        .expect("http client")
}

async fn post(http: &reqwest::Client, url: &str, body: &serde_json::Value) -> Option<u16> {
    let response = http.post(url).json(body).send().await.ok()?;
    Some(response.status().as_u16())
}

/// Acknowledged operations that a database does not have.
#[derive(Debug, Default)]
pub struct Lost {
    pub holds: Vec<Ack>,
    pub confirms: Vec<Ack>,
    pub adjustments: Vec<Ack>,
}

impl Lost {
    pub fn total(&self) -> usize {
        self.holds.len() + self.confirms.len() + self.adjustments.len()
    }

    pub fn all(&self) -> impl Iterator<Item = &Ack> {
        self.holds
            .iter()
            .chain(&self.confirms)
            .chain(&self.adjustments)
    }
}

/// What of `acks` the database `client` is connected to does not have: a hold without its
/// reservation, a confirmation whose reservation is not `confirmed`, a restock not applied.
pub async fn lost_on(client: &tokio_postgres::Client, acks: &Acks) -> anyhow::Result<Lost> {
    async fn present(
        client: &tokio_postgres::Client,
        sql: &str,
    ) -> anyhow::Result<HashSet<String>> {
        Ok(client
            .query(sql, &[])
            .await?
            .iter()
            .map(|row| row.get::<_, String>(0))
            .collect())
    }
    let held = present(client, "SELECT reservation_id FROM reservations").await?;
    let confirmed = present(
        client,
        "SELECT reservation_id FROM reservations WHERE status = 'confirmed'",
    )
    .await?;
    let adjusted = present(
        client,
        "SELECT adjustment_id FROM adjustments WHERE status = 'applied'",
    )
    .await?;
    let missing = |acked: &[Ack], have: &HashSet<String>| {
        acked
            .iter()
            .filter(|(id, _)| !have.contains(id))
            .cloned()
            .collect::<Vec<_>>()
    };
    Ok(Lost {
        holds: missing(&acks.holds, &held),
        confirms: missing(&acks.confirms, &confirmed),
        adjustments: missing(&acks.adjustments, &adjusted),
    })
}
