-- The singleton settlement job (DESIGN.md §8).
--
-- The holder of the lease 'job/settlement' sums the confirmed reservations of each closed window
-- into `settlements`, one `settlement_runs` row per window. The lease's epoch is the job's term.
-- Every write checks the term inside its own transaction (the triggers below), so a holder that
-- was paused or cut off past its lease can never write again once a newer holder exists, whatever
-- it believes: the same fence as a partition's, applied to the job.
--
-- Windows are aligned to the Unix epoch and judged by the database clock only. A confirmation is
-- stamped with its transaction's start (`ledger.recorded_at = now()`), and a batch statement runs
-- for at most `statement_timeout`, so a window is settled only once the database clock is past
-- its end plus a grace longer than that: nothing can still commit into a settled window.

-- Finding one window's confirmations must not scan the ledger.
CREATE INDEX ledger_confirmed_at ON ledger (recorded_at) WHERE kind = 'confirm';

CREATE TABLE settlement_runs (
    window_start timestamptz PRIMARY KEY,
    window_end   timestamptz NOT NULL CHECK (window_end > window_start),
    -- 'running': claimed by a holder, not yet settled; a newer term may take it over.
    -- 'settled': final; the trigger refuses any later change.
    status       text NOT NULL CHECK (status IN ('running', 'settled')),
    term         bigint NOT NULL CHECK (term >= 1),
    holder_id    text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    reservations bigint CHECK (reservations >= 0),
    quantity     bigint CHECK (quantity >= 0),
    CHECK ((status = 'settled') = (finished_at IS NOT NULL))
);

CREATE TABLE settlements (
    window_start timestamptz NOT NULL REFERENCES settlement_runs (window_start),
    sku          text NOT NULL,
    quantity     bigint NOT NULL CHECK (quantity > 0),
    reservations bigint NOT NULL CHECK (reservations > 0),
    term         bigint NOT NULL,
    PRIMARY KEY (window_start, sku)
);

-- The term fence. The lease row is read FOR KEY SHARE, which conflicts with the FOR UPDATE an
-- acquisition takes: a newer holder's acquisition either committed before this check (and the
-- check sees the newer epoch) or waits until this transaction ends. So once term t+1 exists, no
-- transaction of term <= t commits a write to either table.
CREATE FUNCTION settlement_term_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_term bigint;
    live         boolean;
BEGIN
    SELECT epoch, holder_id IS NOT NULL AND expires_at > now()
      INTO current_term, live
      FROM leases WHERE name = 'job/settlement'
       FOR KEY SHARE;
    IF current_term IS DISTINCT FROM NEW.term OR NOT live THEN
        RAISE EXCEPTION 'stale settlement term % (current term %)', NEW.term, current_term
            USING ERRCODE = 'FA010';
    END IF;
    RETURN NEW;
END $$;

-- A settled window is final: settling it again would count its reservations twice.
CREATE FUNCTION settlement_run_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'settled' THEN
        RAISE EXCEPTION 'settlement window % is already settled', OLD.window_start
            USING ERRCODE = 'FA011';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER settlement_runs_term_fence BEFORE INSERT OR UPDATE ON settlement_runs
    FOR EACH ROW EXECUTE FUNCTION settlement_term_fence();
CREATE TRIGGER settlements_term_fence BEFORE INSERT OR UPDATE ON settlements
    FOR EACH ROW EXECUTE FUNCTION settlement_term_fence();
CREATE TRIGGER settlement_runs_final BEFORE UPDATE ON settlement_runs
    FOR EACH ROW EXECUTE FUNCTION settlement_run_final();

-- Settled history is never rewritten or removed.
CREATE FUNCTION settlement_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'settlement history is append-only' USING ERRCODE = 'FA011';
END $$;
CREATE TRIGGER settlement_runs_no_delete BEFORE DELETE ON settlement_runs
    FOR EACH ROW EXECUTE FUNCTION settlement_append_only();
CREATE TRIGGER settlements_no_delete BEFORE DELETE ON settlements
    FOR EACH ROW EXECUTE FUNCTION settlement_append_only();
CREATE TRIGGER settlement_runs_no_truncate BEFORE TRUNCATE ON settlement_runs
    FOR EACH STATEMENT EXECUTE FUNCTION settlement_append_only();
CREATE TRIGGER settlements_no_truncate BEFORE TRUNCATE ON settlements
    FOR EACH STATEMENT EXECUTE FUNCTION settlement_append_only();
