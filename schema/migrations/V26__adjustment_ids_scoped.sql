-- Adjustment ids scoped like reservation ids (README "Security", DESIGN.md §9): no answer names
-- another client's adjustment, its SKU or its delta.
--
-- An adjustment id is unique in the cluster (I3), so one client can still take an id another
-- would have used, as with reservation ids; what changes is what the other client is told.
-- apply_fenced_batch now reads each stored adjustment's owner (V20) and answers an adjustment id
-- stored by another client exactly as a reservation answers another client's id: 'not_found',
-- 'adjustment <id> does not exist' (404), whatever its SKU and delta, so nothing tells the caller
-- that the id exists or what it did. `admin`, which every adjuster holds, does not widen this:
-- unlike reservations, an adjustment is only ever replayed by the client that made it. The
-- anonymous or unknown owner (NULL: authentication off, adjustments from before V20) is
-- anyone's, as for reservations, and a caller with no client (authentication off, or an
-- earlier build that does not pass c_owner) acts on any.
--
-- A replay with another SKU or delta ('mismatch', 422) no longer names the stored SKU and delta
-- either: such an id may be an anonymous adjustment of a SKU outside the caller's namespaces.
--
-- The signature does not change, so the function is replaced in place; every edit must match as
-- often as expected, otherwise the migration fails rather than leave the check out unnoticed.
DO $migrate$
DECLARE
    definition text;
    -- (old text, new text, expected matches)
    edits constant text[][] := ARRAY[
        ARRAY[$o$                   a.partition, a.epoch
              FROM adjustments a$o$,
              $n$                   a.partition, a.epoch, a.owner
              FROM adjustments a$n$,
              '1'],
        -- V20 read no owner back; now the stored one (inserts still take only new rows).
        ARRAY[$o$            a_owner := a_owner || NULL::text;$o$,
              $n$            a_owner := a_owner || rec.owner;$n$,
              '1'],
        ARRAY[$o$            IF j IS NOT NULL THEN
                IF a_sku[j] <> c_sku[k] OR a_delta[j] <> c_amount[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('adjustment %s already exists for sku %s delta %s',
                                       c_id[k], a_sku[j], a_delta[j]);$o$,
              $n$            IF j IS NOT NULL AND c_owner[k] IS NOT NULL AND a_owner[j] IS NOT NULL
               AND a_owner[j] <> c_owner[k] THEN
                -- Another client's adjustment id: answered as an unknown one (V26).
                o_result := 'not_found';
                o_detail := format('adjustment %s does not exist', c_id[k]);
            ELSIF j IS NOT NULL THEN
                IF a_sku[j] <> c_sku[k] OR a_delta[j] <> c_amount[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('adjustment %s already exists with another sku or delta',
                                       c_id[k]);$n$,
              '1']
    ];
    i integer;
    found integer;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    FOR i IN 1 .. array_length(edits, 1) LOOP
        found := array_length(string_to_array(definition, edits[i][1]), 1) - 1;
        IF found IS DISTINCT FROM edits[i][3]::integer THEN
            RAISE EXCEPTION 'apply_fenced_batch: V26 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    -- pg_get_functiondef writes CREATE OR REPLACE: same signature, replaced in place.
    EXECUTE definition;
END $migrate$;
