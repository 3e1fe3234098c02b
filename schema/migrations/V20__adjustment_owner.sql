-- Adjustments record the client that made them (README "Security", DESIGN.md §9), and a SKU's
-- ledger can be paged through in commit order (GET /v1/inventory/{sku}/history).
--
-- owner: the adjusting request's client, as V18 records it on reservations and orders (on an
-- allocator the client a router names in X-Allocator-Client when the caller holds the `router`
-- scope, else the caller's own token name). NULL is the anonymous or unknown client: adjustments
-- made with authentication off, every adjustment that existed before this migration, and those a
-- replica of an earlier build writes during an upgrade. Added without a default, so the table is
-- not rewritten. A refused shrink records who tried, like an applied adjustment.
ALTER TABLE adjustments ADD COLUMN owner text;

-- apply_fenced_batch records each new adjustment's owner from the command's client (c_owner, the
-- argument V18 added for reservations; NULL for a caller that does not pass it, so a replica of
-- an earlier build keeps working and records NULL). A replay answers as before, whoever sends
-- it: adjustments need `admin`, which may act on everything. The signature does not change, so
-- the function is replaced in place.
--
-- The function's current definition is edited, whatever earlier migrations changed in it; every
-- edit must match as often as expected, otherwise the migration fails rather than leave an
-- adjustment without its owner unnoticed.
DO $migrate$
DECLARE
    definition text;
    -- (old text, new text, expected matches)
    edits constant text[][] := ARRAY[
        ARRAY[$o$    a_new      boolean[] := '{}';$o$,
              $n$    a_new      boolean[] := '{}';
    a_owner    text[] := '{}';  -- V20: who made a new one (NULL: anonymous or unknown)$n$,
              '1'],
        -- Adjustments read back for replays: their owner is never needed again.
        ARRAY[$o$            a_new := a_new || false;$o$,
              $n$            a_new := a_new || false;
            a_owner := a_owner || NULL::text;$n$,
              '1'],
        -- A new adjustment, refused (a shrink below what is available) or applied.
        ARRAY[$o$a_epoch := a_epoch || e; a_new := a_new || true;$o$,
              $n$a_epoch := a_epoch || e; a_new := a_new || true;
                    a_owner := a_owner || c_owner[k];$n$,
              '2'],
        ARRAY[$o$                                 on_hand_after, available_after)
        SELECT u.id, u.sku, u.part, u.delta, u.status, u.epoch, u.on_hand, u.avail
          FROM unnest(a_id, a_sku, a_part, a_delta, a_status, a_epoch, a_on_hand, a_avail, a_new)
               AS u(id, sku, part, delta, status, epoch, on_hand, avail, is_new)$o$,
              $n$                                 on_hand_after, available_after, owner)
        SELECT u.id, u.sku, u.part, u.delta, u.status, u.epoch, u.on_hand, u.avail, u.owner
          FROM unnest(a_id, a_sku, a_part, a_delta, a_status, a_epoch, a_on_hand, a_avail, a_new,
                      a_owner)
               AS u(id, sku, part, delta, status, epoch, on_hand, avail, is_new, owner)$n$,
              '1']
    ];
    i integer;
    found integer;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    FOR i IN 1 .. array_length(edits, 1) LOOP
        found := array_length(string_to_array(definition, edits[i][1]), 1) - 1;
        IF found IS DISTINCT FROM edits[i][3]::integer THEN
            RAISE EXCEPTION 'apply_fenced_batch: V20 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    -- pg_get_functiondef writes CREATE OR REPLACE: same signature, replaced in place.
    EXECUTE definition;
END $migrate$;

-- GET /v1/inventory/{sku}/history pages through one SKU's ledger rows by position (a SKU lives
-- in one partition, whose positions are in commit order, V12). ledger_sku (sku) finds the rows
-- but not in order: every page read and sorted all of the SKU's rows (a SKU with 200,000 of a
-- ledger's 800,000 rows: 125 ms a page, growing with the SKU's history). (sku, position) answers
-- a page from the index in order (0.2 ms, a merge of the time partitions' index scans, stopped
-- at the page's end) and serves every lookup by SKU that ledger_sku served, so it replaces it:
-- every ledger row still writes one SKU index entry.
--
-- On a large ledger the build blocks ledger writes while it runs (each time partition is locked
-- against writes while its part is built). To build it beforehand without that: CREATE INDEX
-- ledger_sku_position ON ONLY ledger (sku, position); then for each partition P, CREATE INDEX
-- CONCURRENTLY P_sku_position ON P (sku, position) and ALTER INDEX ledger_sku_position ATTACH
-- PARTITION P_sku_position; once every partition's is attached, this migration keeps it.
CREATE INDEX IF NOT EXISTS ledger_sku_position ON ledger (sku, position);
DROP INDEX ledger_sku;
