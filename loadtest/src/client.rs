//! The HTTP side: one pooled HTTP/1.1 client for the whole process, and the retry rule every
//! operation follows.
//!
//! The client is hyper-util's, used directly: the load generator must cost little per request so
//! that a benchmark measures the service, and a general-purpose client (reqwest) parses every URL
//! with a WHATWG parser and clones every request's headers for redirects and retries this tool
//! does not want. Requests are built as `http::Request`s from a base URI checked once, with the
//! body shared; redirects are never followed and only the rule below retries.
//!
//! Retry rule (DESIGN.md §1, §9): an ambiguous or "try again" answer — `503` (no confirmed owner;
//! `Retry-After`), `421` (allocator: not the owner), `502`/`504` (router gave up upstream), a
//! timeout, a refused or broken connection — is retried with the *same* request (same reservation
//! or adjustment id, so the server replays the original outcome) until the operation's deadline.
//! Every attempt is recorded (status or transport failure, latency) and every retry by its cause.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rand::Rng;
use serde::Serialize;

use crate::stats::OpTrace;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Total time one operation may take, retries and backoff included.
    pub deadline: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// Delay before retry number `retry` (0-based): "equal jitter" exponential backoff, i.e. a
    /// value in `[d/2, d]` with `d = min(max, base * 2^retry)`. A server's `Retry-After` replaces
    /// `d`, capped at `backoff_max` (so a `Retry-After: 1` does not idle a closed-loop worker a
    /// whole second).
    pub fn delay<R: Rng + ?Sized>(
        &self,
        retry: u32,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let exp = self
            .backoff_base
            .saturating_mul(1u32 << retry.min(20))
            .min(self.backoff_max);
        let d = retry_after.map_or(exp, |ra| ra.min(self.backoff_max).max(exp));
        let half = d / 2;
        half + d.mul_f64(rng.random::<f64>()) / 2
    }
}

/// The response of the last attempt of an operation.
#[derive(Debug, Clone)]
pub enum Final {
    /// A definitive HTTP answer (not one of the retryable statuses).
    Answer { status: u16, body: Vec<u8> },
    /// The deadline passed while the last attempt still failed with `cause`; the operation may
    /// or may not have been applied.
    GaveUp { cause: String },
}

/// One attempt's result, classified.
enum Attempt {
    Done(u16, Vec<u8>),
    Retry {
        cause: String,
        retry_after: Option<Duration>,
    },
}

/// `true` for statuses that mean "not done (or unknown), the same request may be retried".
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 421 | 502 | 503 | 504)
}

/// Transport failure → attempt/retry label.
fn transport_cause(error: &hyper_util::client::legacy::Error) -> &'static str {
    if error.is_connect() {
        "connect"
    } else {
        // Reset or closed mid-request/response, ...
        "io"
    }
}

fn parse_retry_after(value: Option<&HeaderValue>) -> Option<Duration> {
    let secs: f64 = value?.to_str().ok()?.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}

#[derive(Clone)]
pub struct Api {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    pub retry: RetryPolicy,
    request_timeout: Duration,
}

impl Api {
    pub fn new(
        base: &str,
        request_timeout: Duration,
        connect_timeout: Duration,
        retry: RetryPolicy,
        max_idle: usize,
    ) -> anyhow::Result<Api> {
        let base = base.trim_end_matches('/').to_owned();
        let uri: http::Uri = format!("{base}/").parse()?;
        anyhow::ensure!(
            uri.scheme_str() == Some("http") && uri.authority().is_some(),
            "{base}: only http://host:port URLs are supported"
        );
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Ok(Api {
            client,
            base,
            retry,
            request_timeout,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    async fn attempt(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Bytes>,
        timeout: Duration,
    ) -> (Attempt, String) {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(self.url(path));
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = match request.body(Full::new(body.cloned().unwrap_or_default())) {
            Ok(request) => request,
            // The base was checked at start and paths are percent-encoded: a bug if it fails.
            Err(e) => panic!("request for {path} could not be built: {e}"),
        };
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| transport_cause(&e))?;
            let (parts, body) = response.into_parts();
            let retry_after = parse_retry_after(parts.headers.get("retry-after"));
            let body = body.collect().await.map_err(|_| "io")?.to_bytes();
            Ok::<_, &'static str>((parts.status.as_u16(), retry_after, body))
        };
        let result = tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err("timeout"));
        match result {
            Ok((status, retry_after, _)) if retryable_status(status) => {
                let label = status.to_string();
                (
                    Attempt::Retry {
                        cause: label.clone(),
                        retry_after,
                    },
                    label,
                )
            }
            Ok((status, _, body)) => (Attempt::Done(status, body.to_vec()), status.to_string()),
            Err(cause) => (
                Attempt::Retry {
                    cause: cause.to_owned(),
                    retry_after: None,
                },
                cause.to_owned(),
            ),
        }
    }

    /// Send `method path [json body]`, retrying per the policy. Records attempts, retries and
    /// the end-to-end latency into `trace`; the latency counts from `origin` when given (the
    /// intended start of an open-loop request), else from now.
    pub async fn call<R: Rng + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        origin: Option<Instant>,
        trace: &mut OpTrace,
        rng: &mut R,
    ) -> Final {
        let started = Instant::now();
        let deadline = started + self.retry.deadline;
        let mut retry = 0u32;
        let result = loop {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            // Each attempt gets the full per-request timeout, but never beyond the deadline
            // (at least 1 ms so that a last attempt is still made).
            let timeout = self.request_timeout.min(left).max(Duration::from_millis(1));
            let (attempt, label) = self.attempt(&method, path, body.as_ref(), timeout).await;
            trace.attempts.push((label, now.elapsed()));
            match attempt {
                Attempt::Done(status, body) => break Final::Answer { status, body },
                Attempt::Retry { cause, retry_after } => {
                    let delay = self.retry.delay(retry, retry_after, rng);
                    if Instant::now() + delay >= deadline {
                        break Final::GaveUp { cause };
                    }
                    trace.retries.push(cause);
                    tokio::time::sleep(delay).await;
                    retry += 1;
                }
            }
        };
        trace.latency = origin.unwrap_or(started).elapsed();
        result
    }

    pub async fn post_json<T: Serialize, R: Rng + ?Sized>(
        &self,
        path: &str,
        body: &T,
        origin: Option<Instant>,
        trace: &mut OpTrace,
        rng: &mut R,
    ) -> Final {
        let bytes = serde_json::to_vec(body).expect("wire types serialise");
        self.call(Method::POST, path, Some(bytes.into()), origin, trace, rng)
            .await
    }

    pub async fn post_empty<R: Rng + ?Sized>(
        &self,
        path: &str,
        trace: &mut OpTrace,
        rng: &mut R,
    ) -> Final {
        self.call(Method::POST, path, None, None, trace, rng).await
    }

    /// GET with retries; nothing recorded.
    pub async fn get<R: Rng + ?Sized>(&self, path: &str, rng: &mut R) -> Final {
        let mut trace = OpTrace::default();
        self.call(Method::GET, path, None, None, &mut trace, rng)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(10),
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(500),
        };
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let d0 = policy.delay(0, None, &mut rng);
            assert!(d0 >= Duration::from_millis(5) && d0 <= Duration::from_millis(10));
            let d3 = policy.delay(3, None, &mut rng);
            assert!(d3 >= Duration::from_millis(40) && d3 <= Duration::from_millis(80));
            let d30 = policy.delay(30, None, &mut rng);
            assert!(d30 >= Duration::from_millis(250) && d30 <= Duration::from_millis(500));
            // Retry-After: 1 s is honoured up to the cap.
            let ra = policy.delay(0, Some(Duration::from_secs(1)), &mut rng);
            assert!(ra >= Duration::from_millis(250) && ra <= Duration::from_millis(500));
            // A Retry-After below the exponential delay does not shorten it.
            let ra = policy.delay(4, Some(Duration::ZERO), &mut rng);
            assert!(ra >= Duration::from_millis(80));
        }
    }

    #[test]
    fn retryable_statuses() {
        for s in [421, 502, 503, 504] {
            assert!(retryable_status(s));
        }
        for s in [200, 201, 400, 404, 409, 422, 500] {
            assert!(!retryable_status(s));
        }
    }

    #[test]
    fn encodes_path_segments() {
        assert_eq!(
            schema::path::encode_segment("lt-1a2b-w3-17"),
            "lt-1a2b-w3-17"
        );
        assert_eq!(schema::path::encode_segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn parses_retry_after() {
        let v = HeaderValue::from_static("1");
        assert_eq!(parse_retry_after(Some(&v)), Some(Duration::from_secs(1)));
        let v = HeaderValue::from_static("soon");
        assert_eq!(parse_retry_after(Some(&v)), None);
        assert_eq!(parse_retry_after(None), None);
    }
}
