//! A SKU's history (`GET /v1/inventory/{sku}/history`) as both services' tests check it: the
//! same movements made by two clients and an admin through either service, then the history read
//! whole and page by page, and the refusals of the route.
//!
//! The calls go through [`ApiClient`]s holding each client's token, so the same scenario runs
//! against an allocator replica (which records the caller's own name) and against a router
//! (which names the client to the allocator in `X-Allocator-Client`).

use reqwest::StatusCode;
use schema::history::{HistoryEntry, HistoryPage};
use schema::wire::{problem_type, AdjustmentRequest, ReserveRequest};

use crate::ApiClient;

/// The clients of the scenario: two with `reserve`, one with `admin`, each by its name in the
/// auth file.
pub struct Clients<'a> {
    pub first: (&'a str, ApiClient),
    pub second: (&'a str, ApiClient),
    pub admin: (&'a str, ApiClient),
}

/// One movement the history must list: its kind, the reservation or adjustment id, the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub kind: &'static str,
    pub id: String,
    pub client: String,
}

fn expected(kind: &'static str, id: &str, client: &str) -> Expected {
    Expected {
        kind,
        id: id.to_owned(),
        client: client.to_owned(),
    }
}

async fn adjust(api: &ApiClient, sku: &str, id: &str, delta: i64) {
    let request = AdjustmentRequest {
        adjustment_id: id.parse().expect("an adjustment id"),
        delta: delta.try_into().expect("a delta"),
    };
    let answer = api.adjust(sku, &request).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "adjust {id}: {answer:?}"
    );
}

async fn reserve(api: &ApiClient, sku: &str, id: &str, quantity: i64) {
    let request = ReserveRequest {
        reservation_id: id.parse().expect("a reservation id"),
        sku: sku.parse().expect("a sku"),
        quantity: quantity.try_into().expect("a quantity"),
        ttl_seconds: None,
    };
    let answer = api.reserve(&request).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "reserve {id}: {answer:?}"
    );
}

/// The admin restocks `sku`, each client reserves, the first confirms and the second releases,
/// the admin shrinks: six movements, returned in the order they were made. Ids are prefixed
/// with `prefix`.
pub async fn two_clients_and_an_admin(
    clients: &Clients<'_>,
    sku: &str,
    prefix: &str,
) -> Vec<Expected> {
    let (first, first_api) = (clients.first.0, &clients.first.1);
    let (second, second_api) = (clients.second.0, &clients.second.1);
    let (admin, admin_api) = (clients.admin.0, &clients.admin.1);
    let stock = format!("{prefix}-stock");
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    let shrink = format!("{prefix}-shrink");
    adjust(admin_api, sku, &stock, 10).await;
    reserve(first_api, sku, &a, 2).await;
    reserve(second_api, sku, &b, 3).await;
    assert_eq!(first_api.confirm(&a).await.status, StatusCode::OK);
    assert_eq!(second_api.release(&b).await.status, StatusCode::OK);
    adjust(admin_api, sku, &shrink, -1).await;
    vec![
        expected("restock", &stock, admin),
        expected("reserve", &a, first),
        expected("reserve", &b, second),
        expected("confirm", &a, first),
        expected("release", &b, second),
        expected("shrink", &shrink, admin),
    ]
}

/// What an entry says, in the terms of [`Expected`].
fn seen(entry: &HistoryEntry) -> Expected {
    let id = entry
        .reservation_id
        .clone()
        .or_else(|| entry.adjustment_id.clone())
        .expect("an entry names its reservation or adjustment");
    Expected {
        kind: match entry.kind.as_str() {
            "reserve" => "reserve",
            "confirm" => "confirm",
            "release" => "release",
            "expire" => "expire",
            "restock" => "restock",
            "shrink" => "shrink",
            other => panic!("unknown kind {other}"),
        },
        id,
        client: entry.client.clone().unwrap_or_else(|| "(null)".into()),
    }
}

async fn page(api: &ApiClient, sku: &str, query: &str) -> HistoryPage {
    let answer = api.history(sku, query).await;
    assert_eq!(answer.status, StatusCode::OK, "history {query}: {answer:?}");
    answer.ok()
}

/// The history of `sku` read whole lists `expected` in order, each movement with its client,
/// positions rising, every change balanced, the quantities right; read in pages of `limit`,
/// it is the same entries, and only the last page has no `next_after`. Returns the entries.
pub async fn check_history(
    admin: &ApiClient,
    sku: &str,
    expected: &[Expected],
    limit: usize,
) -> Vec<HistoryEntry> {
    let whole = page(admin, sku, "").await;
    assert_eq!(whole.sku, sku);
    assert_eq!(whole.next_after, None, "one page holds it all");
    let listed: Vec<Expected> = whole.entries.iter().map(seen).collect();
    assert_eq!(
        listed, expected,
        "every movement, in order, with its client"
    );
    assert!(whole
        .entries
        .windows(2)
        .all(|w| w[0].position < w[1].position));
    for entry in &whole.entries {
        let c = &entry.change;
        assert_eq!(c.on_hand, c.available + c.held + c.confirmed, "{entry:?}");
        assert!(entry.epoch >= 1, "{entry:?}");
    }
    // The movements' quantities, as made by the scenario's first six steps.
    let held: Vec<i64> = whole.entries.iter().map(|e| e.change.held).collect();
    assert_eq!(&held[..6], &[0, 2, 3, -2, -3, 0]);
    assert_eq!(whole.entries[0].change.on_hand, 10);
    assert_eq!(whole.entries[5].change.on_hand, -1);

    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let query = format!("after={after}&limit={limit}");
        let next = page(admin, sku, &query).await;
        assert!(next.entries.len() <= limit, "{query}");
        paged.extend(next.entries.iter().cloned());
        match next.next_after {
            Some(position) => {
                assert_eq!(
                    next.entries.len(),
                    limit,
                    "{query}: a full page before the last"
                );
                assert_eq!(Some(position), next.entries.last().map(|e| e.position));
                after = position;
            }
            None => break,
        }
    }
    assert_eq!(paged, whole.entries, "the pages are the whole history");
    // After the last position there is nothing (yet).
    let last = whole.entries.last().expect("entries").position;
    let tail = page(admin, sku, &format!("after={last}")).await;
    assert!(tail.entries.is_empty() && tail.next_after.is_none());
    whole.entries
}

/// The route's refusals: no token `401`; a `reserve`-only client `403`; an unknown SKU `404`;
/// a bad `after` or `limit` or an unknown parameter `400`; all problem documents.
pub async fn check_refusals(
    anonymous: &ApiClient,
    reserve_only: &ApiClient,
    admin: &ApiClient,
    sku: &str,
) {
    let no_token = anonymous.history(sku, "").await;
    assert_eq!(no_token.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_token.problem().kind, problem_type::UNAUTHENTICATED);
    let not_admin = reserve_only.history(sku, "").await;
    assert_eq!(not_admin.status, StatusCode::FORBIDDEN);
    assert_eq!(not_admin.problem().kind, problem_type::FORBIDDEN);
    let unknown = admin.history("never-stocked", "").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let problem = unknown.problem();
    assert_eq!(problem.kind, problem_type::NOT_FOUND);
    assert_eq!(
        problem.detail.as_deref(),
        Some("sku never-stocked is not stocked")
    );
    for (query, detail) in [
        ("after=-1", "after must be a position >= 0, got \"-1\""),
        (
            "after=first",
            "after must be a position >= 0, got \"first\"",
        ),
        ("limit=0", "limit must be 1..1000, got \"0\""),
        ("limit=1001", "limit must be 1..1000, got \"1001\""),
        ("page=2", "unknown query parameter \"page\""),
    ] {
        let bad = admin.history(sku, query).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{query}");
        let problem = bad.problem();
        assert_eq!(problem.kind, problem_type::INVALID_REQUEST, "{query}");
        assert_eq!(problem.detail.as_deref(), Some(detail), "{query}");
    }
}
