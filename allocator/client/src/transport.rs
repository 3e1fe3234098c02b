//! One HTTP exchange: hyper-util's pooled HTTP/1.1 client (over rustls with the `tls` feature),
//! the whole exchange under one timeout, and the answer read whole.
//!
//! hyper-util is used directly, not a general-purpose client: the load generator sends through
//! this and must cost little per request, so requests are `http::Request`s from a base URL
//! checked once, redirects are never followed and nothing is retried here ([`crate::retry`]
//! decides that).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as Pool;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::retry::{Attempt, FailureKind};

/// An answer, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// `Retry-After` in seconds (fractions allowed), capped at an hour.
    pub fn retry_after(&self) -> Option<Duration> {
        let secs: f64 = self.header("retry-after")?.trim().parse().ok()?;
        (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
    }

    /// How this answer counts for retrying. The problem body is looked at only for the statuses
    /// whose meaning depends on its `outcome_unknown`.
    pub fn attempt(&self) -> Attempt {
        let status = self.status.as_u16();
        let outcome_unknown = match status {
            502..=504 => serde_json::from_slice::<OutcomeOnly>(&self.body)
                .ok()
                .and_then(|p| p.outcome_unknown),
            _ => None,
        };
        Attempt::Answered {
            status,
            retry_after: self.retry_after(),
            outcome_unknown,
        }
    }
}

#[derive(serde::Deserialize)]
struct OutcomeOnly {
    outcome_unknown: Option<bool>,
}

/// No answer: what failed and, if the head arrived before the body broke, its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {detail}", kind.as_str())]
pub struct TransportError {
    pub kind: FailureKind,
    pub status: Option<u16>,
    pub detail: String,
}

impl TransportError {
    pub fn attempt(&self) -> Attempt {
        Attempt::Failed(self.kind)
    }
}

/// How the pool reaches servers.
#[derive(Debug, Clone)]
pub struct Settings {
    pub connect_timeout: Duration,
    pub max_idle_per_host: usize,
    #[cfg(feature = "tls")]
    pub tls: Option<rustls::ClientConfig>,
}

#[derive(Clone)]
pub(crate) enum Transport {
    Plain(Pool<HttpConnector, Full<Bytes>>),
    #[cfg(feature = "tls")]
    Tls(Pool<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Plain(_) => "Transport::Plain",
            #[cfg(feature = "tls")]
            Transport::Tls(_) => "Transport::Tls",
        })
    }
}

impl Transport {
    pub(crate) fn new(settings: Settings) -> Transport {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.connect_timeout));
        connector.set_nodelay(true);
        let mut builder = Pool::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(settings.max_idle_per_host);
        #[cfg(feature = "tls")]
        if let Some(config) = settings.tls {
            connector.enforce_http(false);
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(config)
                .https_only()
                .enable_http1()
                .wrap_connector(connector);
            return Transport::Tls(builder.build(https));
        }
        Transport::Plain(builder.build(connector))
    }

    /// Send `request` and read the whole answer within `timeout`.
    pub(crate) async fn exchange(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response, TransportError> {
        let mut status = None;
        let exchange = async {
            let response = match self {
                Transport::Plain(pool) => pool.request(request).await,
                #[cfg(feature = "tls")]
                Transport::Tls(pool) => pool.request(request).await,
            }
            .map_err(|e| failure(e.is_connect(), &e))?;
            status = Some(response.status());
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| failure(false, &e))?
                .to_bytes();
            Ok(Response {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        let result = tokio::time::timeout(timeout, exchange).await;
        let mut result = result.unwrap_or_else(|_| {
            Err(TransportError {
                kind: FailureKind::Timeout,
                status: None,
                detail: format!("no answer within {timeout:?}"),
            })
        });
        if let Err(error) = &mut result {
            error.status = status.map(|s| s.as_u16());
        }
        result
    }
}

/// A failed exchange, described with the error's causes.
fn failure(connect: bool, error: &(dyn std::error::Error + 'static)) -> TransportError {
    let mut detail = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    TransportError {
        kind: if connect {
            FailureKind::Connect
        } else {
            FailureKind::Io
        },
        status: None,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, retry_after: Option<&str>, body: &str) -> Response {
        let mut headers = HeaderMap::new();
        if let Some(value) = retry_after {
            headers.insert("retry-after", value.parse().unwrap());
        }
        Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn answers_are_classified_with_retry_after_and_outcome_unknown() {
        let a = response(503, Some("1"), r#"{"outcome_unknown":true}"#).attempt();
        assert_eq!(
            a,
            Attempt::Answered {
                status: 503,
                retry_after: Some(Duration::from_secs(1)),
                outcome_unknown: Some(true),
            }
        );
        assert!(a.may_have_applied());
        let a = response(504, Some("soon"), r#"{"outcome_unknown":false}"#).attempt();
        assert_eq!(a.retry_after(), None);
        assert!(!a.may_have_applied());
        // A body that is not a problem says nothing: a 502 may then have been applied.
        assert!(response(502, None, "<html>").attempt().may_have_applied());
        // Other statuses' bodies are not parsed.
        assert_eq!(
            response(409, None, r#"{"outcome_unknown":true}"#).attempt(),
            Attempt::Answered {
                status: 409,
                retry_after: None,
                outcome_unknown: None
            }
        );
    }
}
