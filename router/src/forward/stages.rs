//! Where a forwarded request's time goes in the router (DESIGN.md §10).
//!
//! Six stages tile a forwarded request from the moment the stage middleware sees it to the
//! moment its response is ready, so their means add up to the mean request latency:
//!
//! * `accept` — parsing, the access gate, the partition (for an existing reservation, the
//!   look-up of its partition in PostgreSQL), up to the forward;
//! * `map` — looking the owner up in the assignment map and building the upstream request;
//! * `connect` — waiting for an upstream connection: opening one when no idle one was pooled;
//! * `upstream` — the answering attempt's exchange with the allocator, less its connect;
//! * `retry` — every attempt that did not answer, the map refreshes and the backoff after them;
//! * `reply` — turning the allocator's answer into the client's response.
//!
//! The middleware gives each request a [`Clock`] on its task ([`scope`]); the forwarder moves
//! it from stage to stage ([`advance`]), and the upstream connector adds what opening a
//! connection took ([`connecting`]). A request that forwarded nothing (a refusal, a `404` from
//! the look-up, an order) has no stages.

use std::cell::RefCell;
use std::future::Future;
use std::time::{Duration, Instant};

use actix_web::dev::ServiceResponse;
use metrics::histogram;

use crate::metrics::STAGE_DURATION_SECONDS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Accept,
    Map,
    Connect,
    Upstream,
    Retry,
    Reply,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Accept,
        Stage::Map,
        Stage::Connect,
        Stage::Upstream,
        Stage::Retry,
        Stage::Reply,
    ];

    /// The `stage` label and the `Server-Timing` name (distinct from the allocator's, which
    /// follow in the same header).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Accept => "accept",
            Stage::Map => "map",
            Stage::Connect => "connect",
            Stage::Upstream => "upstream",
            Stage::Retry => "retry",
            Stage::Reply => "reply",
        }
    }
}

/// A forwarded request's stage times, in [`Stage::ALL`] order: left in the request's extensions
/// for the operations page's traffic ring ([`crate::console::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times(pub [Duration; 6]);

/// One request's stage times so far, and the instant the current stage began.
#[derive(Debug, Clone)]
pub struct Clock {
    since: Instant,
    times: [Duration; 6],
    /// Connect time of the attempt in progress, not yet charged.
    connecting: Duration,
    forwarded: bool,
}

impl Clock {
    pub fn new(received: Instant) -> Self {
        Self {
            since: received,
            times: [Duration::ZERO; 6],
            connecting: Duration::ZERO,
            forwarded: false,
        }
    }

    /// The stage that began at the last call ends at `now` and is charged to `stage`.
    pub fn advance(&mut self, stage: Stage, now: Instant) {
        let mut spent = now.saturating_duration_since(self.since);
        let connecting = std::mem::take(&mut self.connecting).min(spent);
        match stage {
            // The answering attempt: what its connection took is its own stage.
            Stage::Upstream => {
                self.times[Stage::Connect as usize] += connecting;
                spent -= connecting;
            }
            Stage::Map | Stage::Retry => self.forwarded = true,
            _ => {}
        }
        self.times[stage as usize] += spent;
        self.since = self.since.max(now);
    }

    /// Opening an upstream connection took `time` (during the attempt in progress).
    pub fn connected(&mut self, time: Duration) {
        self.connecting += time;
    }

    /// The stages of a request that forwarded, ended at `now` by its reply.
    pub fn finish(mut self, now: Instant) -> Option<[(&'static str, Duration); 6]> {
        if !self.forwarded {
            return None;
        }
        self.advance(Stage::Reply, now);
        Some(Stage::ALL.map(|stage| (stage.as_str(), self.times[stage as usize])))
    }
}

tokio::task_local! {
    static CLOCK: RefCell<Clock>;
}

/// Run a request's `future` with its stage clock started at `received`; returns the stages
/// (for a request that forwarded) with the future's output.
pub async fn scope<F: Future>(
    received: Instant,
    future: F,
) -> (F::Output, Option<[(&'static str, Duration); 6]>) {
    let cell = RefCell::new(Clock::new(received));
    CLOCK
        .scope(cell, async {
            let output = future.await;
            let stages = CLOCK.with(|clock| clock.borrow().clone().finish(Instant::now()));
            (output, stages)
        })
        .await
}

/// End the current stage now, charged to `stage` (nothing outside a request's scope).
pub fn advance(stage: Stage) {
    let _ = CLOCK.try_with(|clock| clock.borrow_mut().advance(stage, Instant::now()));
}

/// An upstream connection was opened in `time` for the current request (nothing when the
/// connection is finished on another task after the request took a pooled one).
pub fn connecting(time: Duration) {
    let _ = CLOCK.try_with(|clock| clock.borrow_mut().connected(time));
}

/// Middleware (`App::wrap_fn`): time the request's stages; record them, log them in the
/// request's span and put them first in its `Server-Timing` header.
pub fn middleware<S, B>(
    request: actix_web::dev::ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse<B>, actix_web::Error>>
where
    S: actix_web::dev::Service<
        actix_web::dev::ServiceRequest,
        Response = ServiceResponse<B>,
        Error = actix_web::Error,
    >,
{
    let received = Instant::now();
    let call = service.call(request);
    async move {
        let (mut result, stages) = scope(received, call).await;
        if let (Ok(response), Some(stages)) = (&mut result, stages) {
            for (stage, time) in stages {
                histogram!(STAGE_DURATION_SECONDS, "stage" => stage).record(time.as_secs_f64());
            }
            tracing::debug!(stages = %edge::timing::Breakdown(&stages), "request stages");
            edge::timing::append_header(response.headers_mut(), &stages);
            let times = Times(stages.map(|(_, time)| time));
            actix_web::HttpMessage::extensions_mut(response.request()).insert(times);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_stages_tile_a_forward_with_a_retry() {
        let t0 = Instant::now();
        let mut clock = Clock::new(t0);
        clock.advance(Stage::Accept, t0 + MS);
        clock.advance(Stage::Map, t0 + 2 * MS);
        // The first attempt opened a connection (1 ms) and got a 421: all of it is a retry,
        // with the refresh and the backoff after it.
        clock.connected(MS);
        clock.advance(Stage::Retry, t0 + 10 * MS);
        clock.advance(Stage::Map, t0 + 11 * MS);
        // The second attempt opened another connection (2 ms) and answered.
        clock.connected(2 * MS);
        clock.advance(Stage::Upstream, t0 + 16 * MS);
        let stages = clock.finish(t0 + 17 * MS).expect("forwarded");
        assert_eq!(
            stages,
            [
                ("accept", MS),
                ("map", 2 * MS),
                ("connect", 2 * MS),
                ("upstream", 3 * MS),
                ("retry", 8 * MS),
                ("reply", MS),
            ]
        );
        assert_eq!(stages.iter().map(|(_, t)| *t).sum::<Duration>(), 17 * MS);
    }

    #[test]
    fn a_request_that_forwarded_nothing_has_no_stages() {
        let t0 = Instant::now();
        let mut clock = Clock::new(t0);
        clock.advance(Stage::Accept, t0 + MS);
        assert_eq!(clock.finish(t0 + 2 * MS), None);
    }

    #[tokio::test]
    async fn the_forwarder_moves_the_request_s_clock_on_its_task() {
        let t0 = Instant::now();
        let ((), stages) = scope(t0, async {
            advance(Stage::Accept);
            advance(Stage::Map);
            connecting(Duration::ZERO);
            advance(Stage::Upstream);
        })
        .await;
        let stages = stages.expect("forwarded");
        let total: Duration = stages.iter().map(|(_, t)| *t).sum();
        assert!(total <= t0.elapsed());
        // Outside a request's scope nothing is recorded, and nothing fails.
        advance(Stage::Map);
        connecting(MS);
    }
}
