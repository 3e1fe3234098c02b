//! Where a written request's time goes (DESIGN.md §10): one mark per hand-over on its way through
//! the replica, and the stages between consecutive marks.
//!
//! A write passes six stages, which tile it from the moment the outermost timing middleware sees
//! it to the moment its response is ready, so their means add up to the mean request latency:
//!
//! * `admission` — parsing, the access gate and the ownership look-up, up to its partition's queue;
//! * `queue` — in the partition's queue while the worker's previous batch is in flight;
//! * `batch` — the worker collecting what is queued into one batch and handing it to the lanes;
//! * `lane` — the batch waiting for a commit lane (and a slot under the concurrency limit);
//! * `statement` — the group statement that carried it, from its start to its answer (a group
//!   that failed and was re-run partition by partition counts until the run that answered);
//! * `answer` — the outcome travelling back through the worker to the handler and its response.
//!
//! The marks are set by whoever does the hand-over, on different tasks, into one shared
//! [`Stamps`] per request (a batch's marks are copied into each of its requests'). A request that
//! stopped short of a statement (refused, not owned, a full queue) has no stages: its time is in
//! the request histogram only, so no stage ever stands for "everything else".

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::ServiceResponse;
use actix_web::HttpMessage;

use crate::metrics as m;

/// A stage of a written request, in the order a request passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Admission,
    Queue,
    Batch,
    Lane,
    Statement,
    Answer,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Admission,
        Stage::Queue,
        Stage::Batch,
        Stage::Lane,
        Stage::Statement,
        Stage::Answer,
    ];

    /// The `stage` label and the `Server-Timing` metric name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Admission => "admission",
            Stage::Queue => "queue",
            Stage::Batch => "batch",
            Stage::Lane => "lane",
            Stage::Statement => "statement",
            Stage::Answer => "answer",
        }
    }
}

/// The hand-overs a request passes, in order; each stage lies between two consecutive marks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The timing middleware saw the request.
    pub received: Option<Instant>,
    /// Dispatch queued its command on the partition's worker.
    pub enqueued: Option<Instant>,
    /// The worker took it into a batch.
    pub admitted: Option<Instant>,
    /// The worker handed the batch to the commit lanes.
    pub submitted: Option<Instant>,
    /// A lane started the statement that carried it.
    pub started: Option<Instant>,
    /// That statement's answer came back to the lane.
    pub ran: Option<Instant>,
    /// The response was ready.
    pub finished: Option<Instant>,
}

impl Marks {
    /// Each stage's time, when the request passed every mark; `None` for a request that stopped
    /// short of a statement. The stages add up to `finished - received` exactly (a mark set out
    /// of order counts its stage as zero and the next one from the later of the two).
    pub fn stages(&self) -> Option<[(Stage, Duration); 6]> {
        let marks = [
            self.received?,
            self.enqueued?,
            self.admitted?,
            self.submitted?,
            self.started?,
            self.ran?,
            self.finished?,
        ];
        let mut stages = [(Stage::Admission, Duration::ZERO); 6];
        let mut from = marks[0];
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            let to = marks[i + 1].max(from);
            stages[i] = (stage, to - from);
            from = to;
        }
        Some(stages)
    }

    /// Take the marks a batch collected (its hand-over to the lanes and its statement).
    fn absorb_batch(&mut self, batch: &Marks) {
        self.submitted = batch.submitted.or(self.submitted);
        self.started = batch.started.or(self.started);
        self.ran = batch.ran.or(self.ran);
    }
}

/// One request's (or one batch's) marks, shared by the tasks that hand it over.
#[derive(Debug, Default)]
pub struct Stamps(Mutex<Marks>);

/// Which mark to set.
#[derive(Debug, Clone, Copy)]
pub enum Mark {
    Received,
    Enqueued,
    Admitted,
    Submitted,
    /// Set once: a re-run of a failed group keeps the first statement's start.
    Started,
    Ran,
    Finished,
}

impl Stamps {
    fn lock(&self) -> std::sync::MutexGuard<'_, Marks> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn mark(&self, mark: Mark, at: Instant) {
        let mut marks = self.lock();
        let slot = match mark {
            Mark::Received => &mut marks.received,
            Mark::Enqueued => &mut marks.enqueued,
            Mark::Admitted => &mut marks.admitted,
            Mark::Submitted => &mut marks.submitted,
            Mark::Started => {
                marks.started.get_or_insert(at);
                return;
            }
            Mark::Ran => &mut marks.ran,
            Mark::Finished => &mut marks.finished,
        };
        *slot = Some(at);
    }

    /// Copy a batch's hand-over and statement marks into this request's.
    pub fn absorb_batch(&self, batch: &Stamps) {
        let batch = *batch.lock();
        self.lock().absorb_batch(&batch);
    }

    pub fn marks(&self) -> Marks {
        *self.lock()
    }
}

/// The stamps the timing middleware gave `request`, or fresh ones (a caller without the
/// middleware, as in unit tests).
pub fn of(request: &actix_web::HttpRequest) -> Arc<Stamps> {
    request
        .extensions()
        .get::<Arc<Stamps>>()
        .cloned()
        .unwrap_or_default()
}

/// Give a request its stamps (marked received at `now`), for [`finish`] to read.
pub fn begin(request: &actix_web::dev::ServiceRequest, now: Instant) {
    let stamps = Arc::new(Stamps::default());
    stamps.mark(Mark::Received, now);
    request.extensions_mut().insert(stamps);
}

/// Record the stages of a request that ran a statement: one histogram sample per stage, a debug
/// line in the request's span, and a `Server-Timing` header (milliseconds), so a client or a
/// benchmark sees the breakdown of each answer.
pub fn finish<B>(response: &mut ServiceResponse<B>, now: Instant) {
    let Some(stamps) = response
        .request()
        .extensions()
        .get::<Arc<Stamps>>()
        .cloned()
    else {
        return;
    };
    stamps.mark(Mark::Finished, now);
    let Some(stages) = stamps.marks().stages() else {
        return;
    };
    for (stage, time) in stages {
        metrics::histogram!(m::STAGE_DURATION, "stage" => stage.as_str())
            .record(time.as_secs_f64());
    }
    let named = stages.map(|(stage, time)| (stage.as_str(), time));
    tracing::debug!(stages = %edge::timing::Breakdown(&named), "request stages");
    edge::timing::append_header(response.headers_mut(), &named);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    const MS: Duration = Duration::from_millis(1);

    /// Marks set one stage apart on a fake clock.
    fn walk(clock: &ManualClock, stamps: &Stamps, steps: &[(Mark, Duration)]) {
        for (mark, after) in steps {
            clock.advance(*after);
            stamps.mark(*mark, clock.now());
        }
    }

    #[test]
    fn the_stages_tile_the_request() {
        let clock = ManualClock::new();
        let request = Stamps::default();
        let batch = Stamps::default();
        walk(
            &clock,
            &request,
            &[
                (Mark::Received, Duration::ZERO),
                (Mark::Enqueued, MS),
                (Mark::Admitted, 2 * MS),
            ],
        );
        walk(
            &clock,
            &batch,
            &[
                (Mark::Submitted, 3 * MS),
                (Mark::Started, 4 * MS),
                (Mark::Ran, 5 * MS),
            ],
        );
        request.absorb_batch(&batch);
        walk(&clock, &request, &[(Mark::Finished, 6 * MS)]);
        let marks = request.marks();
        let stages = marks.stages().expect("every mark is set");
        let times: Vec<_> = stages.iter().map(|(s, t)| (s.as_str(), *t)).collect();
        assert_eq!(
            times,
            vec![
                ("admission", MS),
                ("queue", 2 * MS),
                ("batch", 3 * MS),
                ("lane", 4 * MS),
                ("statement", 5 * MS),
                ("answer", 6 * MS),
            ]
        );
        let total: Duration = stages.iter().map(|(_, t)| *t).sum();
        assert_eq!(total, marks.finished.unwrap() - marks.received.unwrap());
    }

    #[test]
    fn a_request_that_ran_no_statement_has_no_stages() {
        let clock = ManualClock::new();
        let stamps = Stamps::default();
        walk(
            &clock,
            &stamps,
            &[
                (Mark::Received, Duration::ZERO),
                (Mark::Enqueued, MS),
                (Mark::Finished, MS),
            ],
        );
        assert_eq!(stamps.marks().stages(), None);
    }

    #[test]
    fn a_rerun_keeps_the_first_start_and_marks_out_of_order_count_zero() {
        let clock = ManualClock::new();
        let stamps = Stamps::default();
        let t0 = clock.now();
        stamps.mark(Mark::Received, t0);
        stamps.mark(Mark::Enqueued, t0 + MS);
        stamps.mark(Mark::Admitted, t0 + 2 * MS);
        stamps.mark(Mark::Submitted, t0 + 3 * MS);
        stamps.mark(Mark::Started, t0 + 4 * MS);
        // The group failed; the re-run started later, and the first start stands.
        stamps.mark(Mark::Started, t0 + 9 * MS);
        // A mark set before its predecessor (another thread's clock read) is a zero stage.
        stamps.mark(Mark::Ran, t0 + 3 * MS);
        stamps.mark(Mark::Finished, t0 + 10 * MS);
        let stages = stamps.marks().stages().unwrap();
        assert_eq!(stages[4], (Stage::Statement, Duration::ZERO));
        assert_eq!(stages[5], (Stage::Answer, 6 * MS));
        let total: Duration = stages.iter().map(|(_, t)| *t).sum();
        assert_eq!(total, 10 * MS);
    }
}
