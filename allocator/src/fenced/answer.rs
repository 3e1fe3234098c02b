//! One row of the batch function's answer (`apply_fenced_batch`, and the set-based reserve
//! statement's rows in the same shape), read by column position under the column's name.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

/// One row of the batch function's answer, by column name; which columns are set depends on
/// the result (see the header of `schema/functions/apply_fenced_batch.sql`).
pub(super) struct AnswerRow<'a>(pub(super) &'a Row);

impl AnswerRow<'_> {
    pub(super) fn result(&self) -> String {
        self.0.get(1)
    }
    pub(super) fn replayed(&self) -> bool {
        self.0.get(2)
    }
    pub(super) fn status(&self) -> String {
        self.0.get(3)
    }
    pub(super) fn sku(&self) -> String {
        self.0.get(4)
    }
    /// A reservation's quantity, an adjustment's delta, or a sweep's count.
    pub(super) fn quantity(&self) -> Option<i64> {
        self.0.get(5)
    }
    pub(super) fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.get(6)
    }
    /// The epoch that wrote the answer; for a stale fence, the lease's current epoch.
    pub(super) fn epoch(&self) -> Option<i64> {
        self.0.get(7)
    }
    pub(super) fn partition(&self) -> i32 {
        self.0.get(8)
    }
    pub(super) fn available(&self) -> i64 {
        self.0.get::<_, Option<i64>>(9).unwrap_or(0)
    }
    pub(super) fn on_hand(&self) -> i64 {
        self.0.get::<_, Option<i64>>(10).unwrap_or(0)
    }
    pub(super) fn detail(&self) -> String {
        self.0.get::<_, Option<String>>(11).unwrap_or_default()
    }
}
