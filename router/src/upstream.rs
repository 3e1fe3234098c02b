//! The HTTP/1.1 client the router forwards with: hyper-util's pooled client, used directly.
//!
//! A forwarded request is small (a JSON body of about a hundred bytes, a handful of headers) and
//! the router sends thousands a second, so what the client does per request besides writing and
//! reading the socket is most of the router's own cost. A general-purpose client (reqwest) parses
//! the URL with a WHATWG parser, converts it to a URI, and clones every request's header map for
//! redirects and retries the router never wants; here a request is built straight as an
//! `http::Request` with its body shared (`Bytes`), sent over a keep-alive pool, and read into one
//! buffer. Redirects are not followed and nothing is retried here: the forwarder's own rule
//! decides what is retried, with the same id.
//!
//! A pool (one per thread, see [`UpstreamClient`]) keeps up to `max_idle` connections per
//! allocator and closes idle ones after `idle_timeout`, which must stay below the allocators' keep-alive so a
//! request is rarely written into a connection the server is just closing.
//!
//! With an upstream TLS configuration (`--upstream-ca`, optionally a client certificate for
//! mutual TLS) the pools connect through rustls (`hyper-rustls`) and reach `https://` allocators
//! only: an allocator advertising `http://` is refused before anything is sent (fail closed), so
//! the router's token never crosses in clear text. Without one, the pools are plain HTTP and no
//! TLS code runs on the request path.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// A request as the forwarder builds it.
pub type UpstreamHttpRequest = http::Request<Full<Bytes>>;

/// A complete answer: status, headers and the whole body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why an attempt got no complete answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// No connection could be made: nothing was sent.
    Connect,
    /// No complete answer within the attempt's time.
    Timeout,
    /// The connection broke after the request may have been sent.
    Lost,
}

impl SendError {
    pub fn is_connect(self) -> bool {
        self == SendError::Connect
    }

    pub fn is_timeout(self) -> bool {
        self == SendError::Timeout
    }
}

/// The TCP connector, timed: what opening a connection took is the request's `connect` stage
/// ([`crate::forward::stages`]) when it is opened on the request's task.
#[derive(Clone)]
pub struct TimedConnector(HttpConnector);

impl tower_service::Service<http::Uri> for TimedConnector {
    type Response = <HttpConnector as tower_service::Service<http::Uri>>::Response;
    type Error = <HttpConnector as tower_service::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connect = self.0.call(uri);
        Box::pin(async move {
            let started = Instant::now();
            let connection = connect.await;
            crate::forward::stages::connecting(started.elapsed());
            connection
        })
    }
}

/// One per router, shared by all HTTP workers; each thread that sends through it gets a pool of
/// its own.
///
/// A pooled connection is driven by a task on the runtime of the thread that opened it. actix
/// serves each connection on one worker thread with a runtime of its own, so a pool shared by all
/// workers hands a connection opened on one worker to a request on another, and every answer then
/// crosses threads (a wake-up through the kernel in each direction). With a pool per thread a
/// forwarded request and its upstream connection stay on one thread; the price is up to
/// `max_idle` idle connections per allocator per worker thread.
#[derive(Debug)]
pub struct UpstreamClient {
    /// Tells this client's per-thread pools apart from another's (tests run several routers in
    /// one process, with different timeouts).
    id: u64,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    /// The rustls configuration for `https://` allocators; `None`: plain HTTP only.
    tls: Option<rustls::ClientConfig>,
}

/// A thread's pool: plain, or able to speak TLS (`https://`) as well as plain HTTP.
#[derive(Clone)]
enum Pooled {
    Plain(Client<TimedConnector, Full<Bytes>>),
    Tls(Client<HttpsConnector<TimedConnector>, Full<Bytes>>),
}

thread_local! {
    /// This thread's pool of each [`UpstreamClient`].
    static POOLS: RefCell<HashMap<u64, Pooled>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl UpstreamClient {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration, max_idle: usize) -> Self {
        UpstreamClient {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            connect_timeout,
            idle_timeout,
            max_idle,
            tls: None,
        }
    }

    /// Reach allocators over TLS only, with `config` (verifying them against its CA, presenting
    /// its client certificate if it has one): an `http://` allocator is never sent to.
    pub fn with_tls(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Whether only `https://` allocators are reached ([`UpstreamClient::with_tls`]).
    pub fn tls_only(&self) -> bool {
        self.tls.is_some()
    }

    /// This thread's pool (a cheap handle: the pool itself is shared by the handle's clones).
    fn pool(&self) -> Pooled {
        POOLS.with(|pools| {
            pools
                .borrow_mut()
                .entry(self.id)
                .or_insert_with(|| {
                    let mut connector = HttpConnector::new();
                    connector.set_connect_timeout(Some(self.connect_timeout));
                    connector.set_nodelay(true);
                    let mut builder = Client::builder(TokioExecutor::new());
                    builder
                        .pool_timer(TokioTimer::new())
                        .pool_idle_timeout(self.idle_timeout)
                        .pool_max_idle_per_host(self.max_idle);
                    match &self.tls {
                        None => Pooled::Plain(builder.build(TimedConnector(connector))),
                        Some(config) => {
                            // The TLS connector wraps the plain one, so https:// URLs are
                            // not refused by the inner connector's scheme check. It refuses
                            // http:// ones: the forwarder never sends them one (fail closed),
                            // and this keeps it so for any other caller.
                            connector.enforce_http(false);
                            let https = hyper_rustls::HttpsConnectorBuilder::new()
                                .with_tls_config(config.clone())
                                .https_only()
                                .enable_http1()
                                .wrap_connector(TimedConnector(connector));
                            Pooled::Tls(builder.build(https))
                        }
                    }
                })
                .clone()
        })
    }

    /// Send `request` and read the whole answer within `timeout`.
    pub async fn send(
        &self,
        request: UpstreamHttpRequest,
        timeout: Duration,
    ) -> Result<Answer, SendError> {
        let exchange = async {
            let response = match self.pool() {
                Pooled::Plain(client) => client.request(request).await,
                Pooled::Tls(client) => client.request(request).await,
            }
            .map_err(|e| {
                if e.is_connect() {
                    SendError::Connect
                } else {
                    SendError::Lost
                }
            })?;
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|_| SendError::Lost)?
                .to_bytes();
            Ok(Answer {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(SendError::Timeout))
    }
}
