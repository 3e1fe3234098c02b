//! The client: a base URL, the optional credentials and request id, the retry policy, and the
//! connection pool its clones share.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::Full;
use schema::wire::{RequestId, HEADER_REQUEST_ID};

use crate::backoff::Backoff;
use crate::retry::Policy;
use crate::transport::{Response, Settings, Transport, TransportError};

/// A client of one service (a router, or one allocator replica) at a base URL. Cheap to clone;
/// clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    transport: Transport,
    base: Arc<str>,
    authorization: Option<HeaderValue>,
    request_id: Option<HeaderValue>,
    policy: Policy,
}

/// A base URL, token or setting the client cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(String);

impl From<BuildError> for crate::Error {
    fn from(error: BuildError) -> crate::Error {
        crate::Error::from(schema::wire::InvalidValue(error.0))
    }
}

/// How to build a [`Client`]; every setting has a default.
#[derive(Debug, Clone)]
pub struct Builder {
    base: String,
    token: Option<String>,
    request_id: Option<RequestId>,
    policy: Policy,
    settings: Settings,
}

impl Builder {
    /// Send `Authorization: Bearer token` (the services' `--auth-file` credentials).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Send `X-Request-Id: id` with every request (a call can set its own).
    pub fn request_id(mut self, id: RequestId) -> Self {
        self.request_id = Some(id);
        self
    }

    /// The longest wait for one attempt's answer (default 10 s).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.policy.attempt_timeout = timeout;
        self
    }

    /// The total time of one call, retries included (default 30 s; zero: one attempt).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.policy.deadline = deadline;
        self
    }

    /// The wait between attempts (default 25 ms doubling up to 1 s, equal jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = backoff;
        self
    }

    /// The whole retry policy at once.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The longest wait for a TCP connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Idle connections kept per host (default 32).
    pub fn max_idle_per_host(mut self, connections: usize) -> Self {
        self.settings.max_idle_per_host = connections;
        self
    }

    /// TLS for `https://` base URLs, with the caller's roots and, for mutual TLS, identity
    /// (the services' `access::tls` builds one from PEM files). With it an `http://` base URL is
    /// refused: the token would cross in clear text.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, config: rustls::ClientConfig) -> Self {
        self.settings.tls = Some(config);
        self
    }

    pub fn build(self) -> Result<Client, BuildError> {
        let base = self.base.trim_end_matches('/').to_owned();
        let uri: Uri = format!("{base}/")
            .parse()
            .map_err(|e| BuildError(format!("{base}: not a URL: {e}")))?;
        let tls = cfg!(feature = "tls") && self.tls_configured();
        match uri.scheme_str() {
            Some("http") if tls => {
                return Err(BuildError(format!(
                    "{base}: a TLS configuration needs an https:// URL (http:// would send the \
                     token in clear text)"
                )))
            }
            Some("http") => {}
            Some("https") if tls => {}
            Some("https") => {
                return Err(BuildError(format!(
                    "{base}: https needs the `tls` feature and a TLS configuration"
                )))
            }
            _ => return Err(BuildError(format!("{base}: only http(s)://host:port URLs"))),
        }
        if uri.authority().is_none() || uri.query().is_some() {
            return Err(BuildError(format!("{base}: only http(s)://host:port URLs")));
        }
        let authorization = self.token.as_deref().map(bearer).transpose()?;
        let request_id = self.request_id.as_ref().map(|id| {
            HeaderValue::from_str(id.as_str()).map_err(|e| BuildError(format!("request id: {e}")))
        });
        Ok(Client {
            transport: Transport::new(self.settings),
            base: base.into(),
            authorization,
            request_id: request_id.transpose()?,
            policy: self.policy,
        })
    }

    fn tls_configured(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.settings.tls.is_some();
        #[cfg(not(feature = "tls"))]
        return false;
    }
}

fn bearer(token: &str) -> Result<HeaderValue, BuildError> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| BuildError("the token must be visible ASCII".to_owned()))?;
    value.set_sensitive(true);
    Ok(value)
}

impl Client {
    /// A client of `base` (`http://host:port`) with every default.
    pub fn new(base: impl Into<String>) -> Result<Client, BuildError> {
        Client::builder(base).build()
    }

    pub fn builder(base: impl Into<String>) -> Builder {
        Builder {
            base: base.into(),
            token: None,
            request_id: None,
            policy: Policy::DEFAULT,
            settings: Settings {
                connect_timeout: Duration::from_secs(2),
                max_idle_per_host: 32,
                #[cfg(feature = "tls")]
                tls: None,
            },
        }
    }

    /// The same client (and pool) with another bearer token.
    pub fn with_token(&self, token: &str) -> Result<Client, BuildError> {
        Ok(Client {
            authorization: Some(bearer(token)?),
            ..self.clone()
        })
    }

    /// The same client (and pool) with another retry policy.
    pub fn with_policy(&self, policy: Policy) -> Client {
        Client {
            policy,
            ..self.clone()
        }
    }

    /// The base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The URL of `path` (which starts with `/`) on this client's service.
    pub fn url(&self, path: &str) -> String {
        let mut url = String::with_capacity(self.base.len() + path.len());
        url.push_str(&self.base);
        url.push_str(path);
        url
    }

    /// One attempt of `method path` with a JSON `body`, under the policy's attempt timeout and
    /// without any retry or interpretation: the answer as it came, whatever its status. For
    /// callers that record raw outcomes (tests, the chaos workload's history).
    pub async fn send_once(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response, TransportError> {
        let uri: Uri = self.url(path).parse().map_err(|e| TransportError {
            kind: crate::retry::FailureKind::Connect,
            status: None,
            detail: format!("{path}: not a path: {e}"),
        })?;
        let request = self.request(&method, &uri, body, self.request_id.as_ref());
        self.transport
            .exchange(request, self.policy.attempt_timeout)
            .await
    }

    pub(crate) fn request_id(&self) -> Option<&HeaderValue> {
        self.request_id.as_ref()
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The request of one attempt.
    pub(crate) fn request(
        &self,
        method: &Method,
        uri: &Uri,
        body: Option<Bytes>,
        request_id: Option<&HeaderValue>,
    ) -> Request<Full<Bytes>> {
        let has_body = body.is_some();
        let mut request = Request::new(Full::new(body.unwrap_or_default()));
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri.clone();
        let headers = request.headers_mut();
        if has_body {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(authorization) = &self.authorization {
            headers.insert(AUTHORIZATION, authorization.clone());
        }
        if let Some(id) = request_id {
            headers.insert(HEADER_REQUEST_ID, id.clone());
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn base_urls_are_checked_once() {
        assert_eq!(
            Client::new("http://127.0.0.1:8080/").unwrap().base(),
            "http://127.0.0.1:8080"
        );
        assert!(Client::new("127.0.0.1:8080").is_err());
        assert!(Client::new("ftp://host:1").is_err());
        assert!(Client::new("http://host:1/?x=1").is_err());
        let https = Client::new("https://host:1").unwrap_err();
        assert!(https.0.contains("tls"), "{https}");
        assert!(Client::builder("http://h:1").token("a\nb").build().is_err());
    }

    /// With TLS configured the client never speaks plain HTTP, so its token never crosses in
    /// clear text.
    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn a_tls_client_refuses_an_http_url() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let plain = Client::builder("http://h:1")
            .tls(config.clone())
            .build()
            .unwrap_err();
        assert!(plain.0.contains("clear text"), "{plain}");
        Client::builder("https://h:1").tls(config).build().unwrap();
    }

    #[tokio::test]
    async fn requests_carry_the_token_the_request_id_and_a_json_type_with_a_body() {
        let client = Client::builder("http://h:1")
            .token("s3cret")
            .request_id(RequestId::parse(b"req-1").unwrap())
            .build()
            .unwrap();
        let uri: Uri = client.url("/v1/x").parse().unwrap();
        let with_body = client.request(&Method::POST, &uri, Some("{}".into()), client.request_id());
        assert_eq!(with_body.headers()[AUTHORIZATION], "Bearer s3cret");
        assert_eq!(with_body.headers()[HEADER_REQUEST_ID], "req-1");
        assert_eq!(with_body.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(with_body.uri(), "http://h:1/v1/x");
        let other = client.with_token("t2").unwrap();
        let without = other.request(&Method::GET, &uri, None, None);
        assert_eq!(without.headers()[AUTHORIZATION], "Bearer t2");
        assert!(without.headers().get(CONTENT_TYPE).is_none());
        assert!(without.headers().get(HEADER_REQUEST_ID).is_none());
    }
}
