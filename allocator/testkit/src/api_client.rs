//! The tests' view of the public API, shared by the allocator's and the router's tests: a thin
//! layer over the client crate ([`allocator_client::Client`]) that shows every answer as it came.
//!
//! Both services answer the same routes with the same wire types, so their tests talk to them
//! through one client: requests are [`schema::wire`] values, paths come from
//! [`schema::routes`] (with path segments percent-encoded by the client crate), and an answer is
//! an [`Answer`] holding the status, the headers and either the success body or the problem
//! document. A test then states what it expects (`.ok()`, `.problem()`) instead of repeating the
//! request plumbing. Each request is one attempt (no retry: a test sees the `503` or the `421`
//! a service answered); [`ApiClient::client`] is the retrying, typed client for tests of the
//! contract itself.
//!
//! Transport failures panic: a test that means to observe them (a killed owner, a cut
//! connection) uses the client crate's own calls or `reqwest` directly.

use std::time::Duration;

use allocator_client::{route_path, Client};
use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use schema::history::HistoryPage;
use schema::routes::{self, Route};
use schema::wire::{
    Adjustment, AdjustmentRequest, Inventory, OrderRequest, PartitionMap, Problem, Reservation,
    ReserveRequest, HEADER_REPLAYED, PROBLEM_CONTENT_TYPE,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// One answer: the status and headers, and the body as `T` on success or as a problem.
#[derive(Debug)]
pub struct Answer<T> {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Result<T, Problem>,
}

impl<T: std::fmt::Debug> Answer<T> {
    /// The success body; panics with the problem otherwise.
    #[track_caller]
    pub fn ok(self) -> T {
        match self.body {
            Ok(body) => body,
            Err(problem) => panic!("expected success, got {}: {problem:?}", self.status),
        }
    }

    /// The problem document, which must come as `application/problem+json`; panics on success.
    #[track_caller]
    pub fn problem(self) -> Problem {
        let content_type = self.header("content-type").map(str::to_owned);
        match self.body {
            Err(problem) => {
                assert_eq!(
                    content_type.as_deref(),
                    Some(PROBLEM_CONTENT_TYPE),
                    "errors are problem+json (status {})",
                    self.status
                );
                problem
            }
            Ok(body) => panic!("expected a problem, got {}: {body:?}", self.status),
        }
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the answer replays an earlier outcome (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header(HEADER_REPLAYED) == Some("true")
    }
}

/// A client of one service (an allocator replica or a router) at `base`.
#[derive(Debug, Clone)]
pub struct ApiClient {
    client: Client,
}

impl ApiClient {
    /// A client of the service at `base` (`http://127.0.0.1:PORT`), one attempt per request with
    /// a 20 s timeout, so that a hung service fails the test instead of stalling it.
    pub fn new(base: impl Into<String>) -> Self {
        let client = Client::builder(base)
            .attempt_timeout(Duration::from_secs(20))
            .deadline(Duration::ZERO)
            .build()
            .expect("a test service URL");
        Self { client }
    }

    /// The same, sending `token` as the bearer token.
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            client: self
                .client
                .with_token(token)
                .expect("a visible-ASCII token"),
        }
    }

    /// The client crate's client of the same service: typed results and the retry contract.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn base(&self) -> &str {
        self.client.base()
    }

    /// The URL of `route` with its placeholders filled by `segments`, in order.
    pub fn url(&self, route: &Route, segments: &[&str]) -> String {
        self.client.url(&route_path(route, segments))
    }

    pub async fn reserve(&self, request: &ReserveRequest) -> Answer<Reservation> {
        self.send(&routes::RESERVE, &[], Some(request)).await
    }

    pub async fn reservation(&self, reservation_id: &str) -> Answer<Reservation> {
        self.send::<(), _>(&routes::GET_RESERVATION, &[reservation_id], None)
            .await
    }

    pub async fn confirm(&self, reservation_id: &str) -> Answer<Reservation> {
        self.send::<(), _>(&routes::CONFIRM, &[reservation_id], None)
            .await
    }

    pub async fn release(&self, reservation_id: &str) -> Answer<Reservation> {
        self.send::<(), _>(&routes::RELEASE, &[reservation_id], None)
            .await
    }

    pub async fn inventory(&self, sku: &str) -> Answer<Inventory> {
        self.send::<(), _>(&routes::GET_INVENTORY, &[sku], None)
            .await
    }

    pub async fn adjust(&self, sku: &str, request: &AdjustmentRequest) -> Answer<Adjustment> {
        self.send(&routes::ADJUST, &[sku], Some(request)).await
    }

    /// An order through a router; the body stays JSON because its success and failure shapes
    /// (placed reservations, per-line reports) belong to the router.
    pub async fn order(&self, order_id: &str, request: &OrderRequest) -> Answer<serde_json::Value> {
        self.send(&routes::RESERVE_ORDER, &[order_id], Some(request))
            .await
    }

    pub async fn partitions(&self) -> Answer<PartitionMap> {
        self.send::<(), _>(&routes::PARTITIONS, &[], None).await
    }

    /// One page of a SKU's history; `query` is the raw query string (`after=3&limit=2`, or
    /// empty), sent as it is so that tests can send malformed ones.
    pub async fn history(&self, sku: &str, query: &str) -> Answer<HistoryPage> {
        let mut path = route_path(&routes::INVENTORY_HISTORY, &[sku]);
        if !query.is_empty() {
            path = format!("{path}?{query}");
        }
        self.send_to::<(), _>(&routes::INVENTORY_HISTORY, path, None)
            .await
    }

    /// Send `body` (if any) to `route` and read the answer.
    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &Route,
        segments: &[&str],
        body: Option<&B>,
    ) -> Answer<T> {
        self.send_to(route, route_path(route, segments), body).await
    }

    /// Send `body` (if any) with `route`'s method to `path` (the route's, with a query string)
    /// and read the answer.
    async fn send_to<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &Route,
        path: String,
        body: Option<&B>,
    ) -> Answer<T> {
        let method = Method::from_bytes(route.method.as_bytes()).expect("route method");
        let body = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("a wire body")));
        let response = self
            .client
            .send_once(method, &path, body)
            .await
            .unwrap_or_else(|e| panic!("{} {path}: {e}", route.method));
        let status = response.status;
        let bytes = &response.body;
        let text = || String::from_utf8_lossy(bytes).into_owned();
        let body = if status.is_success() {
            Ok(serde_json::from_slice(bytes)
                .unwrap_or_else(|e| panic!("{} {path} → {status}: {e}: {}", route.method, text())))
        } else {
            Err(serde_json::from_slice(bytes).unwrap_or_else(|e| {
                panic!(
                    "{} {path} → {status}: not a problem ({e}): {}",
                    route.method,
                    text()
                )
            }))
        };
        Answer {
            status,
            headers: response.headers,
            body,
        }
    }
}
