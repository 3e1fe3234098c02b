//! The API's contract, walked through against a live router: restock, reserve, replay, out of
//! stock, confirm, release, and multi-line orders. Every answer is checked; the exit status is 1
//! when any differs from the contract.
//!
//! ```text
//! cargo run --release -p allocator-client --example walkthrough -- http://127.0.0.1:8080
//! ```
//!
//! The URL is the first argument, else `CLUSTER_DEMO_URL`; `CLUSTER_TOKEN` is sent as the bearer
//! token when set (it needs the `admin` scope for the restocks). The crate's integration tests
//! run [`walk`] against a router (every check passes) and an allocator (the orders fail).

use std::process::ExitCode;

use allocator_client::wire::{
    OrderLine, OrderRequest, Quantity, ReservationStatus, Sku, TtlSeconds,
};
use allocator_client::{ids, new_adjustment, new_reservation, Client, Error, Reply};

/// The checks made so far and the ones that failed.
#[derive(Debug, Default)]
pub struct Walk {
    pub checks: u32,
    pub failed: u32,
}

impl Walk {
    fn step(&self, what: &str) {
        println!("\n== {what}");
    }

    /// Record one expectation.
    fn expect(&mut self, ok: bool, what: &str) {
        self.checks += 1;
        if ok {
            println!("   ok  {what}");
        } else {
            self.failed += 1;
            println!("   !!  {what}");
        }
    }

    /// The reply's value when the call succeeded; records a failure otherwise.
    fn ok<T>(&mut self, result: Result<Reply<T>, Error>, what: &str) -> Option<Reply<T>> {
        match result {
            Ok(reply) => {
                self.expect(true, &format!("{what}: {}", reply.status));
                Some(reply)
            }
            Err(error) => {
                self.expect(false, &format!("{what}: {error}"));
                None
            }
        }
    }
}

fn order(lines: &[(&str, i64)]) -> Result<OrderRequest, Error> {
    let lines = lines
        .iter()
        .map(|(sku, quantity)| {
            Ok(OrderLine {
                sku: Sku::try_from(*sku)?,
                quantity: Quantity::try_from(*quantity)?,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(OrderRequest {
        lines,
        ttl_seconds: None,
    })
}

/// Walk the contract through `client`; every check is printed and counted.
pub async fn walk(client: &Client) -> Walk {
    let mut w = Walk::default();
    if let Err(error) = steps(client, &mut w).await {
        w.expect(false, &format!("stopped: {error}"));
    }
    w
}

async fn steps(client: &Client, w: &mut Walk) -> Result<(), Error> {
    w.step("restock: the first adjustment creates the SKU");
    let widget = new_adjustment(3)?;
    w.ok(
        client.adjust("demo-widget", &widget).await,
        "restock demo-widget by 3",
    );
    w.ok(
        client.adjust("demo-gadget", &new_adjustment(10)?).await,
        "restock demo-gadget by 10",
    );
    w.ok(
        client.adjust("demo-gizmo", &new_adjustment(5)?).await,
        "restock demo-gizmo by 5",
    );
    w.step("an adjustment retried with the same id is applied once");
    let before = w.ok(client.inventory("demo-widget").await, "read demo-widget");
    let again = w.ok(
        client.adjust("demo-widget", &widget).await,
        "the same adjustment again",
    );
    if let (Some(before), Some(again)) = (before, again) {
        w.expect(again.replayed(), "replayed (Idempotent-Replayed: true)");
        let after = client.inventory("demo-widget").await?.value;
        w.expect(after.on_hand == before.value.on_hand, "on hand unchanged");
    }
    let available = client.inventory("demo-widget").await?.value.available;

    w.step("reserve 2 of demo-widget under a fresh id");
    let first = new_reservation("demo-widget", 2)?;
    if let Some(held) = w.ok(client.reserve(&first).await, "reserve 2") {
        w.expect(held.status == 201, "201 Created");
        w.expect(held.value.status == ReservationStatus::Held, "status held");
    }
    w.step("a retry with the same reservation id replays the original outcome");
    if let Some(replay) = w.ok(client.reserve(&first).await, "reserve again, same id") {
        w.expect(replay.status == 200 && replay.replayed(), "200, replayed");
        w.expect(
            replay.value.reservation_id == first.reservation_id.as_str(),
            "the same hold",
        );
    }
    w.step("ask for more than is left: insufficient stock, nothing held");
    let greedy = new_reservation("demo-widget", available - 2 + 1)?;
    match client.reserve(&greedy).await {
        Err(Error::InsufficientStock(problem)) => w.expect(
            problem.available == Some(available - 2),
            &format!("insufficient stock, {:?} available", problem.available),
        ),
        other => w.expect(
            false,
            &format!("insufficient stock expected, got {other:?}"),
        ),
    }
    w.step("reserve one more, held for 10 minutes");
    let mut last = new_reservation("demo-widget", 1)?;
    last.ttl_seconds = Some(TtlSeconds::try_from(600)?);
    w.ok(client.reserve(&last).await, "reserve 1");

    w.step("confirm the first, release the other");
    let confirmed = w.ok(client.confirm(&first.reservation_id).await, "confirm");
    w.expect(
        confirmed.is_some_and(|r| r.value.status == ReservationStatus::Confirmed),
        "status confirmed",
    );
    let released = w.ok(client.release(&last.reservation_id).await, "release");
    w.expect(
        released.is_some_and(|r| r.value.status == ReservationStatus::Released),
        "status released",
    );
    w.step("a release after a confirm is refused");
    match client.release(&first.reservation_id).await {
        Err(Error::InvalidState(problem)) => w.expect(
            problem.current_status == Some(ReservationStatus::Confirmed),
            "invalid state: confirmed",
        ),
        other => w.expect(false, &format!("invalid state expected, got {other:?}")),
    }
    let read = client.reservation(&first.reservation_id).await?.value;
    w.expect(
        read.status == ReservationStatus::Confirmed,
        "reads back as confirmed",
    );
    let read = client.reservation(&last.reservation_id).await?.value;
    w.expect(
        read.status == ReservationStatus::Released,
        "reads back as released",
    );
    let widget_now = client.inventory("demo-widget").await?.value;
    w.expect(
        widget_now.available == available - 2,
        "available went down by the confirmed 2",
    );

    w.step("a multi-line order: every line held, or none");
    let gadget = client.inventory("demo-gadget").await?.value;
    let order_id = ids::order_id();
    let placed = order(&[("demo-gadget", 2), ("demo-gizmo", 1)])?;
    if let Some(reply) = w.ok(client.order(&order_id, &placed).await, "order of 2 lines") {
        w.expect(reply.value.reservations.len() == 2, "two lines held");
    }
    let again = w.ok(
        client.order(&order_id, &placed).await,
        "the same order again",
    );
    w.expect(again.is_some_and(|r| r.replayed()), "replayed");
    let failing = order(&[("demo-gadget", 1), ("demo-gizmo", 999)])?;
    match client.order(&ids::order_id(), &failing).await {
        Err(Error::OrderFailed(failure)) => w.expect(
            failure.lines.len() == 2 && failure.lines[1].outcome == "refused",
            "order failed, its second line refused",
        ),
        other => w.expect(false, &format!("order failed expected, got {other:?}")),
    }
    let gadget_now = client.inventory("demo-gadget").await?.value;
    w.expect(
        gadget_now.held == gadget.held + 2,
        "demo-gadget holds only the placed order's 2",
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
pub async fn main() -> ExitCode {
    let Some(url) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("CLUSTER_DEMO_URL").ok())
    else {
        eprintln!("usage: walkthrough URL (or CLUSTER_DEMO_URL); CLUSTER_TOKEN for a token");
        return ExitCode::from(2);
    };
    let mut builder = Client::builder(url.as_str());
    if let Ok(token) = std::env::var("CLUSTER_TOKEN") {
        builder = builder.token(token);
    }
    let client = match builder.build() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!("walkthrough against {url}");
    let w = walk(&client).await;
    println!();
    if w.failed > 0 {
        println!("walkthrough: {} of {} checks failed", w.failed, w.checks);
        ExitCode::FAILURE
    } else {
        println!("walkthrough: all {} checks as the contract says", w.checks);
        ExitCode::SUCCESS
    }
}
