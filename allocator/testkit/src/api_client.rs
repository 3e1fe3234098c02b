//! A typed client for the public API, shared by the allocator's and the router's tests.
//!
//! Both services answer the same routes with the same wire types, so their tests talk to them
//! through one client: requests are [`schema::wire`] values, paths come from
//! [`schema::routes`] (with path segments percent-encoded as any correct client would), and an
//! answer is an [`Answer`] holding the status, the headers and either the success body or the
//! problem document. A test then states what it expects (`.ok()`, `.problem()`) instead of
//! repeating the request plumbing.
//!
//! Transport failures panic: a test that means to observe them (a killed owner, a cut
//! connection) uses `reqwest` directly.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
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
    http: reqwest::Client,
    base: String,
}

impl ApiClient {
    /// A client of the service at `base` (`http://127.0.0.1:PORT`), with a 20 s request timeout
    /// so that a hung service fails the test instead of stalling it.
    pub fn new(base: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("http client");
        Self {
            http,
            base: base.into(),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL of `route` with its placeholders filled by `segments`, in order.
    pub fn url(&self, route: &Route, segments: &[&str]) -> String {
        let mut path = String::new();
        let mut segments = segments.iter();
        for part in route.path.split('/').skip(1) {
            path.push('/');
            if part.starts_with('{') {
                let value = segments
                    .next()
                    .unwrap_or_else(|| panic!("{} needs a value for {part}", route.path));
                path.push_str(&schema::path::encode_segment(value));
            } else {
                path.push_str(part);
            }
        }
        assert!(
            segments.next().is_none(),
            "too many segments for {}",
            route.path
        );
        format!("{}{path}", self.base)
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

    /// Send `body` (if any) to `route` and read the answer.
    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &Route,
        segments: &[&str],
        body: Option<&B>,
    ) -> Answer<T> {
        let url = self.url(route, segments);
        let method = Method::from_bytes(route.method.as_bytes()).expect("route method");
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{} {url}: {e}", route.method));
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("{} {url}: reading the body: {e}", route.method));
        let text = || String::from_utf8_lossy(&bytes).into_owned();
        let body = if status.is_success() {
            Ok(serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("{} {url} → {status}: {e}: {}", route.method, text())))
        } else {
            Err(serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{} {url} → {status}: not a problem ({e}): {}",
                    route.method,
                    text()
                )
            }))
        };
        Answer {
            status,
            headers,
            body,
        }
    }
}
