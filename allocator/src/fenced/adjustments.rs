//! Stock adjustments: a restock (positive delta) or a shrink (negative delta) of one SKU, keyed
//! by an adjustment id so a retry applies it once.
//!
//! A shrink may only take stock that is available: held and confirmed units belong to
//! reservations. A refused shrink is recorded like an applied one, so a replay answers the same
//! refusal. Whatever the outcome, the answer carries the SKU's stock after the adjustment, as
//! stored with it.

use super::answer::AnswerRow;
use super::command::Command;
use super::fence::{malformed, FencedError};
use schema::wire::Adjustment;

/// The adjustment a batch answered for `command` (applied now, or replayed).
pub(super) fn adjustment_from_answer(
    command: &Command,
    row: &AnswerRow<'_>,
) -> Result<Adjustment, FencedError> {
    let Some((adjustment_id, _, _)) = command.adjustment() else {
        return Err(malformed("adjustment outcome for another command"));
    };
    Ok(Adjustment {
        adjustment_id: adjustment_id.to_owned(),
        sku: row.sku(),
        delta: row
            .quantity()
            .ok_or_else(|| malformed("adjustment outcome without a delta"))?,
        on_hand: row.on_hand(),
        available: row.available(),
        partition: row.partition() as u32,
        epoch: row
            .epoch()
            .ok_or_else(|| malformed("adjustment outcome without an epoch"))?,
    })
}
