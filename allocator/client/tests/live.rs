//! The client against real processes: the walkthrough example's contract, a retry that crosses
//! the kill of the owner that applied the first attempt, an outcome the router reports as
//! unknown, and bearer tokens.
//!
//! Needs the allocator binary: `cargo build -p allocator --bins`.

mod support;

#[allow(dead_code)]
#[path = "../examples/walkthrough.rs"]
mod walkthrough;

use std::io::Write;
use std::time::{Duration, Instant};

use allocator_client::{new_reservation, Attempt, Client, Error, Last, Observe};
use testkit::ProxyMode;

use support::{restock, serial, Stack};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_holds_against_a_router_and_fails_without_one() {
    let _serial = serial().await;
    let mut stack = Stack::start("client_walk", 4).await;
    let direct = stack.spawn_allocator("walk-0", false).direct_url.clone();
    stack.spawn_allocator("walk-1", false);
    stack.wait_owned_by(&direct, &["walk-0", "walk-1"]).await;
    let router = stack.router(|_| {}).await;

    let walk = walkthrough::walk(&Client::new(router).unwrap()).await;
    assert_eq!(walk.failed, 0, "{walk:?}");
    assert!(walk.checks >= 25, "{walk:?}");

    // An allocator serves no orders (404), and owns only some SKUs (421 until the deadline):
    // the walkthrough must notice.
    let client = Client::builder(direct)
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let walk = walkthrough::walk(&client).await;
    assert!(walk.failed > 0, "{walk:?}");
}

/// Every attempt's label, as the call saw it.
#[derive(Default)]
struct Attempts(Vec<String>);

impl Observe for Attempts {
    fn attempt(&mut self, attempt: &Attempt, _elapsed: Duration) {
        self.0.push(attempt.label().into_owned());
    }
}

/// Attempts answered with `outcome_unknown: true`.
#[derive(Default)]
struct Unknowns(u32);

impl Observe for Unknowns {
    fn attempt(&mut self, attempt: &Attempt, _elapsed: Duration) {
        if let Attempt::Answered {
            outcome_unknown: Some(true),
            ..
        } = attempt
        {
            self.0 += 1;
        }
    }
}

/// The router's attempts to the only allocator time out (the proxy in front of it delays
/// everything beyond the router's attempt timeout): routers answer `outcome_unknown`.
fn slow_router(config: &mut router::RouterConfig) {
    config.retry_deadline = Duration::from_millis(1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_across_the_kill_of_the_owner_that_applied_it_holds_once() {
    let _serial = serial().await;
    let mut stack = Stack::start("client_kill", 4).await;
    let first = stack.spawn_allocator("kill-0", true);
    let first_direct = first.direct_url.clone();
    stack.wait_owned_by(&first_direct, &["kill-0"]).await;
    let router = stack.router(slow_router).await;
    let client = Client::builder(router)
        .deadline(Duration::from_secs(40))
        .attempt_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    restock(&client, "kill-sku", 10).await;

    // The owner gets every request 2 s late: it applies the reserve, but the router has given up
    // on it by then and answers that the outcome is unknown.
    let proxy = stack.allocators[0].proxy.as_ref().unwrap();
    proxy.set_mode(ProxyMode::Delay(Duration::from_secs(2)));
    let request = new_reservation("kill-sku", 3).unwrap();
    let call = tokio::spawn({
        let (client, request) = (client.clone(), request.clone());
        async move {
            let mut attempts = Attempts::default();
            let result = client.reserve(&request).observe(&mut attempts).await;
            (result, attempts.0)
        }
    });

    // Once the owner has applied it, kill the owner and start another.
    let owner = Client::new(first_direct).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while owner
        .reservation(&request.reservation_id)
        .once()
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the delayed reserve never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stack.allocators[0].process.sigkill().unwrap();
    let second = stack.spawn_allocator("kill-1", false).direct_url.clone();

    let (result, attempts) = call.await.unwrap();
    let reply =
        result.unwrap_or_else(|e| panic!("the retried reserve: {e}; attempts {attempts:?}"));
    assert!(
        reply.replayed(),
        "the retry replays the first hold: {attempts:?}"
    );
    assert!(attempts.len() >= 2, "{attempts:?}");
    assert!(
        attempts
            .iter()
            .any(|a| a == "503" || a == "504" || a == "502"),
        "the router said it did not know: {attempts:?}"
    );
    stack.wait_owned_by(&second, &["kill-1"]).await;
    let stock = Client::new(second)
        .unwrap()
        .inventory("kill-sku")
        .await
        .unwrap();
    assert_eq!(stock.value.held, 3, "one hold, not two: {:?}", stock.value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_router_cannot_know_is_surfaced_with_its_id() {
    let _serial = serial().await;
    let mut stack = Stack::start("client_unknown", 4).await;
    let direct = stack.spawn_allocator("unknown-0", true).direct_url.clone();
    stack.wait_owned_by(&direct, &["unknown-0"]).await;
    let router = stack.router(slow_router).await;
    let client = Client::builder(router)
        .deadline(Duration::from_secs(6))
        .attempt_timeout(Duration::from_secs(4))
        .build()
        .unwrap();
    restock(&client, "unknown-sku", 10).await;

    // Cut between the router and the owner: nothing answers, nothing is lost.
    let proxy = stack.allocators[0].proxy.as_ref().unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    let request = new_reservation("unknown-sku", 2).unwrap();
    // One attempt: the router's own answer says it cannot know.
    match client.reserve(&request).once().await {
        Err(Error::OutcomeUnknown { id, last }) => {
            assert_eq!(id.as_deref(), Some(request.reservation_id.as_str()));
            match *last {
                Last::Answer {
                    status,
                    problem: Some(problem),
                } => {
                    assert!(matches!(status, 502..=504), "{status}");
                    assert_eq!(problem.outcome_unknown, Some(true), "{problem:?}");
                }
                other => panic!("the router's own answer expected, got {other}"),
            }
        }
        other => panic!("an unknown outcome expected, got {other:?}"),
    }
    // Retried until the deadline, it stays unknown.
    let mut seen = Unknowns::default();
    let result = client.reserve(&request).observe(&mut seen).await;
    assert!(
        result.as_ref().is_err_and(Error::is_outcome_unknown),
        "{result:?}"
    );
    assert!(
        seen.0 >= 1,
        "the router's outcome_unknown answers were seen"
    );
    // A read changes nothing, so it is never unknown.
    match client.inventory("unknown-sku").await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("unavailable expected, got {other:?}"),
    }

    // Healed: the held bytes arrive, and the same id tells the outcome. One hold either way.
    proxy.set_mode(ProxyMode::Pass);
    let reply = client
        .reserve(&request)
        .await
        .expect("the retry with the same id");
    assert_eq!(reply.value.reservation_id, request.reservation_id.as_str());
    let stock = client.inventory("unknown-sku").await.unwrap().value;
    assert_eq!(stock.held, 2, "{stock:?}");
}

const SHOP: &str = "client-shop-token-51c0";
const OPS: &str = "client-ops-token-9e2d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_are_sent_and_refusals_are_typed() {
    let _serial = serial().await;
    let mut stack = Stack::start("client_auth", 4).await;
    let direct = stack.spawn_allocator("auth-0", false).direct_url.clone();
    stack.wait_owned_by(&direct, &["auth-0"]).await;
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("router-auth");
    let mut file = std::fs::File::create(&auth).unwrap();
    for (name, scopes, token) in [("shop", "reserve", SHOP), ("ops", "reserve,admin", OPS)] {
        let hash = access::table::hash_hex(token.as_bytes());
        writeln!(file, "{name} {scopes} {hash}").unwrap();
    }
    drop(file);
    let router = stack
        .router(|c| c.access.auth_file = Some(auth.clone()))
        .await;
    let anonymous = Client::new(router.as_str()).unwrap();
    let shop = anonymous.with_token(SHOP).unwrap();
    let ops = anonymous.with_token(OPS).unwrap();

    let request = new_reservation("auth-sku", 1).unwrap();
    match anonymous.reserve(&request).await {
        Err(Error::Unauthorized(problem)) => assert_eq!(problem.status, 401),
        other => panic!("unauthorized expected, got {other:?}"),
    }
    let wrong = anonymous.with_token("not-a-known-token").unwrap();
    assert!(matches!(
        wrong.inventory("auth-sku").await,
        Err(Error::Unauthorized(_))
    ));
    let adjustment = allocator_client::new_adjustment(5).unwrap();
    match shop.adjust("auth-sku", &adjustment).await {
        Err(Error::Forbidden(problem)) => assert_eq!(problem.status, 403),
        other => panic!("forbidden expected, got {other:?}"),
    }
    let restocked = ops.adjust("auth-sku", &adjustment).await.unwrap();
    assert_eq!(restocked.status, 201);
    let held = shop.reserve(&request).await.unwrap();
    assert_eq!(held.status, 201);
    assert_eq!(shop.inventory("auth-sku").await.unwrap().value.held, 1);

    // The SKU's history is the admin's: the restock, then the hold, one page.
    let page = ops.history("auth-sku", 0, Some(10)).await.unwrap().value;
    let kinds: Vec<&str> = page.entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["restock", "reserve"], "{page:?}");
    assert_eq!(
        page.entries[1].reservation_id.as_deref(),
        Some(request.reservation_id.as_str())
    );
    assert_eq!(page.next_after, None, "{page:?}");
    let rest = ops
        .history("auth-sku", page.entries[0].position, None)
        .await
        .unwrap();
    assert_eq!(rest.value.entries.len(), 1, "{:?}", rest.value);
    assert!(matches!(
        shop.history("auth-sku", 0, None).await,
        Err(Error::Forbidden(_))
    ));
}
