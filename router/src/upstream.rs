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
//! The pool keeps up to [`UpstreamClient::new`]'s `max_idle` connections per allocator and
//! closes idle ones after `idle_timeout`, which must stay below the allocators' keep-alive so a
//! request is rarely written into a connection the server is just closing.

use std::time::Duration;

use actix_web::web::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderMap;
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

/// One per router, shared by all HTTP workers (cloning shares the pool).
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

impl UpstreamClient {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration, max_idle: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle_timeout)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        UpstreamClient { inner }
    }

    /// Send `request` and read the whole answer within `timeout`.
    pub async fn send(
        &self,
        request: UpstreamHttpRequest,
        timeout: Duration,
    ) -> Result<Answer, SendError> {
        let exchange = async {
            let response = self.inner.request(request).await.map_err(|e| {
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
