//! One call: a request sent with retries under a policy, and its typed answer ([`Reply`]) or
//! [`Error`]. A [`Call`] is a future (`.await` it) with knobs for this call only.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use schema::wire::{RequestId, HEADER_REPLAYED};
use serde::de::DeserializeOwned;

use crate::client::Client;
use crate::error::{Error, Last};
use crate::retry::{self, Attempt, Ended, Observe, Policy, TokioClock};
use crate::transport::{Response, TransportError};

/// A successful answer.
#[derive(Debug, Clone)]
pub struct Reply<T> {
    pub value: T,
    /// `201` for something made now, `200` for a read or a replay.
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Attempts the call took (1 without retries).
    pub attempts: u32,
}

impl<T> Reply<T> {
    /// Whether the answer replays the stored outcome of an earlier request with the same id
    /// (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header(HEADER_REPLAYED) == Some("true")
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A request about to be sent: `.await` it for its [`Reply`]. The id it carries (for calls that
/// change something) is [`Call::id`].
#[must_use = "a call does nothing until it is awaited"]
pub struct Call<'a, T> {
    client: &'a Client,
    method: Method,
    path: String,
    body: Option<Bytes>,
    id: Option<String>,
    policy: Policy,
    request_id: Option<HeaderValue>,
    observer: Option<&'a mut (dyn Observe + Send)>,
    answer: PhantomData<fn() -> T>,
}

impl<'a, T: DeserializeOwned> Call<'a, T> {
    /// `method path` with `body`; `id` is the idempotency id of a call that changes something.
    pub(crate) fn new(
        client: &'a Client,
        method: Method,
        path: String,
        body: Option<Bytes>,
        id: Option<String>,
    ) -> Self {
        Call {
            client,
            method,
            path,
            body,
            id,
            policy: client.policy(),
            request_id: None,
            observer: None,
            answer: PhantomData,
        }
    }

    /// The idempotency id this call sends (reservation, adjustment or order id), if it changes
    /// something.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The total time of this call, retries included.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.policy.deadline = deadline;
        self
    }

    /// The longest wait for one attempt.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.policy.attempt_timeout = timeout;
        self
    }

    /// This call's whole policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// One attempt only: every outcome is reported as it came.
    pub fn once(mut self) -> Self {
        self.policy = self.policy.once();
        self
    }

    /// Send `X-Request-Id: id` on every attempt, to find the call in the services' logs.
    pub fn request_id(mut self, id: &RequestId) -> Self {
        self.request_id = HeaderValue::from_str(id.as_str()).ok();
        self
    }

    /// Let `observer` see every attempt and retry.
    pub fn observe(mut self, observer: &'a mut (dyn Observe + Send)) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Send it (what `.await` does).
    pub async fn send(self) -> Result<Reply<T>, Error> {
        let Call {
            client,
            method,
            path,
            body,
            id,
            policy,
            request_id,
            observer,
            ..
        } = self;
        let uri: Uri = client.url(&path).parse().map_err(|e| {
            Error::from(schema::wire::InvalidValue(format!(
                "{path}: not a path: {e}"
            )))
        })?;
        let mut unobserved = ();
        let observe = match observer {
            Some(observer) => observer,
            None => &mut unobserved,
        };
        let request_id = request_id.as_ref().or(client.request_id());
        let ended = retry::run(
            policy,
            &TokioClock,
            |timeout| {
                let request = client.request(&method, &uri, body.clone(), request_id);
                client.transport().exchange(request, timeout)
            },
            classify,
            observe,
        )
        .await;
        conclude(ended, id)
    }
}

impl<'a, T: DeserializeOwned + Send + 'a> IntoFuture for Call<'a, T> {
    type Output = Result<Reply<T>, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.send())
    }
}

fn classify(result: &Result<Response, TransportError>) -> Attempt {
    match result {
        Ok(response) => response.attempt(),
        Err(error) => error.attempt(),
    }
}

/// The call's result from how its attempts ended (the contract in the crate's documentation).
fn conclude<T: DeserializeOwned>(
    ended: Ended<Response, TransportError>,
    id: Option<String>,
) -> Result<Reply<T>, Error> {
    let changes = id.is_some();
    let response = match ended.last {
        Ok(response) if !ended.gave_up => response,
        last => {
            let last = Box::new(Last::of(last));
            return Err(if changes && ended.maybe_applied {
                Error::OutcomeUnknown { id, last }
            } else {
                Error::Unavailable { last }
            });
        }
    };
    let status = response.status;
    if status.is_success() {
        return match serde_json::from_slice(&response.body) {
            Ok(value) => Ok(Reply {
                value,
                status,
                headers: response.headers,
                attempts: ended.attempts,
            }),
            Err(e) => Err(Error::Unexpected {
                status: status.as_u16(),
                problem: None,
                detail: format!("the answer is not the documented body: {e}"),
            }),
        };
    }
    let error = Error::from_answer(&response);
    if changes && ended.maybe_applied && !error.is_definitive() {
        return Err(Error::OutcomeUnknown {
            id,
            last: Box::new(Last::Answer {
                status: status.as_u16(),
                problem: error.problem().cloned(),
            }),
        });
    }
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::FailureKind;
    use schema::wire::{Problem, ProblemType, Reservation};

    fn answer(status: u16, body: &impl serde::Serialize) -> Response {
        Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: serde_json::to_vec(body).unwrap().into(),
        }
    }

    fn ended(
        last: Result<Response, TransportError>,
        gave_up: bool,
        maybe_applied: bool,
    ) -> Ended<Response, TransportError> {
        Ended {
            last,
            gave_up,
            maybe_applied,
            attempts: 2,
        }
    }

    fn refusal(kind: ProblemType) -> Response {
        answer(kind.status(), &Problem::new(kind, "no"))
    }

    fn timeout() -> TransportError {
        TransportError {
            kind: FailureKind::Timeout,
            status: None,
            detail: "slow".into(),
        }
    }

    type Outcome = Result<Reply<Reservation>, Error>;

    #[test]
    fn a_call_that_may_have_been_applied_is_unknown_unless_the_answer_settles_it() {
        let id = Some("r-1".to_owned());
        // Out of time after a possibly applied attempt: unknown, with the id to retry.
        let r: Outcome = conclude(ended(Err(timeout()), true, true), id.clone());
        match r {
            Err(Error::OutcomeUnknown { id, last }) => {
                assert_eq!(id.as_deref(), Some("r-1"));
                assert!(matches!(*last, Last::Transport(_)));
            }
            other => panic!("{other:?}"),
        }
        // Out of time with nothing applied: unavailable.
        let r: Outcome = conclude(
            ended(Ok(refusal(ProblemType::PartitionUnavailable)), true, false),
            id.clone(),
        );
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
        // A rate limit after a timeout does not say what the timed-out attempt did.
        let r: Outcome = conclude(
            ended(Ok(refusal(ProblemType::RateLimited)), false, true),
            id.clone(),
        );
        assert!(r.as_ref().is_err_and(Error::is_outcome_unknown), "{r:?}");
        // An answer decided from the id's stored state settles it.
        let r: Outcome = conclude(
            ended(Ok(refusal(ProblemType::InsufficientStock)), false, true),
            id.clone(),
        );
        assert!(matches!(r, Err(Error::InsufficientStock(_))), "{r:?}");
        // Without a preceding maybe-applied attempt a rate limit is a plain refusal.
        let r: Outcome = conclude(
            ended(Ok(refusal(ProblemType::RateLimited)), false, false),
            id,
        );
        assert!(matches!(r, Err(Error::RateLimited { .. })), "{r:?}");
    }

    #[test]
    fn a_read_is_never_unknown() {
        let r: Outcome = conclude(ended(Err(timeout()), true, true), None);
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    }

    #[test]
    fn a_success_must_have_the_documented_body() {
        let r: Outcome = conclude(
            ended(Ok(answer(201, &"not a reservation")), false, false),
            None,
        );
        assert!(
            matches!(r, Err(Error::Unexpected { status: 201, .. })),
            "{r:?}"
        );
    }
}
