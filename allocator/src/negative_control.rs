//! A deliberately unsafe build for the chaos run's negative control (cargo feature
//! `negative-control`, never a default feature, never enabled by another workspace crate).
//!
//! A fault run that never finds anything proves little unless the same run, against a replica
//! known to be broken, does find something. With the feature compiled in *and*
//! `ALLOCATOR_UNSAFE_DISABLE_FENCE=1` in the environment, the replica turns off both halves of
//! fencing (DESIGN.md §5, §6):
//!
//! * **its own checks**: a lease past its safe deadline, with an unconfirmed renewal or with a
//!   renewal the database rejected still grants authority, and the stall watchdog no longer
//!   drops leases, so a paused or cut-off owner keeps running the commands queued for it and
//!   keeps sweeping its partitions' overdue holds after a peer took them over. Its tenure ends
//!   only when it acquires the partition again (a new epoch) or stops;
//! * **the database fence**: batches go to `apply_fenced_batch_unfenced`, a copy of
//!   `apply_fenced_batch` made at start-up in which the lease check always passes and the row
//!   epoch only ever rises. The copy still takes the lease row `FOR KEY SHARE` and still writes
//!   the replica's *own* epoch into reservations and ledger rows, so a late write is visible to
//!   the checker as a row whose epoch was superseded before it was written.
//!
//! Without the feature [`enabled`] is a constant `false` and nothing here can be reached, so a
//! production build carries no switch.

/// The environment variable that arms the negative control (only with the feature).
pub const DISABLE_FENCE_ENV: &str = "ALLOCATOR_UNSAFE_DISABLE_FENCE";

/// The name of the unfenced copy of the batch function.
pub const UNFENCED_FUNCTION: &str = "apply_fenced_batch_unfenced";

/// Whether this process runs with fencing disabled.
#[inline]
pub fn enabled() -> bool {
    #[cfg(feature = "negative-control")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var(DISABLE_FENCE_ENV).is_ok_and(|v| v == "1"))
    }
    #[cfg(not(feature = "negative-control"))]
    {
        false
    }
}

/// The batch function this process calls.
pub fn batch_function() -> &'static str {
    if enabled() {
        UNFENCED_FUNCTION
    } else {
        "apply_fenced_batch"
    }
}

/// The textual edits that turn `apply_fenced_batch` into its unfenced copy; each must match
/// exactly once, so a changed function file (`schema/functions/apply_fenced_batch.sql`) makes
/// start-up fail instead of silently testing nothing.
#[cfg(feature = "negative-control")]
const EDITS: [(&str, &str); 3] = [
    (
        "FUNCTION public.apply_fenced_batch(",
        "FUNCTION public.apply_fenced_batch_unfenced(",
    ),
    (
        "IF rec.holder_id IS NOT DISTINCT FROM p_replica AND rec.epoch = p_epochs[fp] AND rec.live THEN
            ok_part := ok_part || rec.partition;
            ok_epoch := ok_epoch || rec.epoch;",
        "IF true THEN
            ok_part := ok_part || rec.partition;
            ok_epoch := ok_epoch || p_epochs[fp];",
    ),
    (
        "highest_epoch = ok_epoch[array_position(ok_part, u.part)]",
        "highest_epoch = greatest(i.highest_epoch, ok_epoch[array_position(ok_part, u.part)])",
    ),
];

/// Creates the unfenced copy of the batch function when the negative control is armed; a no-op
/// otherwise.
pub async fn install(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    if !enabled() {
        return Ok(());
    }
    #[cfg(feature = "negative-control")]
    {
        use anyhow::Context;
        let row = client
            .query_one(
                "SELECT pg_get_functiondef('apply_fenced_batch'::regproc)",
                &[],
            )
            .await
            .context("reading apply_fenced_batch")?;
        let mut source: String = row.get(0);
        for (from, to) in EDITS {
            let found = source.matches(from).count();
            anyhow::ensure!(
                found == 1,
                "negative control: expected one {from:?} in apply_fenced_batch, found {found}"
            );
            source = source.replace(from, to);
        }
        // Replicas start together; concurrent CREATE OR REPLACE of one function can fail with
        // "tuple concurrently updated", so they take turns.
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('{UNFENCED_FUNCTION}')); {source}; COMMIT;"
            ))
            .await
            .context("creating the unfenced batch function")?;
        tracing::warn!(
            function = UNFENCED_FUNCTION,
            "negative control armed: fencing is disabled in this replica"
        );
    }
    #[cfg(not(feature = "negative-control"))]
    let _ = client;
    Ok(())
}
