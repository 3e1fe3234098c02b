-- Reservations and orders owned by the client that created them (DESIGN.md §9, README
-- "Security").
--
-- owner: the authenticated client's name (on an allocator the client a router names in
-- X-Allocator-Client when the caller holds the `router` scope, else the caller's own token
-- name). NULL is the anonymous or unknown owner: rows written with authentication off, every row
-- that existed before this migration, and rows a replica of an earlier build writes during an
-- upgrade. Any client may act on a NULL-owned row, as every client could before; a client with
-- the `admin` scope may act on every row; anyone else is answered exactly as for an unknown id.
-- Both columns are added without a default, so neither table is rewritten.
ALTER TABLE reservations ADD COLUMN owner text;
ALTER TABLE orders ADD COLUMN owner text;

-- apply_fenced_batch takes each command's client (c_owner, recorded on a new reservation) and
-- whether it may act on every client's reservations (c_any: `admin`, or authentication off).
-- Both default to NULL, which means "no owner, act on any": a replica of an earlier build keeps
-- calling it with nine arguments and keeps its behaviour. The owner is checked where the batch
-- reads the row, inside the fenced transaction: another client's reservation is 'not_found' to
-- a confirm or release, and to a reserve replaying its id, with the detail an unknown id gets.
--
-- The function's current definition is edited, whatever earlier migrations changed in it (V12);
-- every edit must match as often as expected, otherwise the migration fails rather than leave a
-- check out unnoticed. The signature changes, so the function is dropped and created again.
DO $migrate$
DECLARE
    definition text;
    -- (old text, new text, expected matches)
    edits constant text[][] := ARRAY[
        ARRAY['c_ttl integer[])',
              'c_ttl integer[], c_owner text[] DEFAULT NULL::text[], c_any boolean[] DEFAULT NULL::boolean[])',
              '1'],
        ARRAY[$o$    r_fp       text[] := '{}';$o$,
              $n$    r_fp       text[] := '{}';
    r_owner    text[] := '{}';  -- the client that made it (NULL: anonymous or unknown)$n$,
              '1'],
        ARRAY[$o$r.ttl_seconds, r.expires_at, r.available_at_refusal
$o$,
              $n$r.ttl_seconds, r.expires_at, r.available_at_refusal, r.owner
$n$,
              '2'],
        ARRAY[$o$        r_refusal := r_refusal || rec.available_at_refusal;$o$,
              $n$        r_refusal := r_refusal || rec.available_at_refusal;
        r_owner := r_owner || rec.owner;$n$,
              '1'],
        ARRAY[$o$            IF j IS NOT NULL THEN
                IF r_sku[j] <> c_sku[k] OR r_qty[j] <> c_amount[k] OR r_ttl[j] <> c_ttl[k] THEN$o$,
              $n$            IF j IS NOT NULL AND NOT (coalesce(c_any[k], true) OR r_owner[j] IS NULL
                                      OR r_owner[j] IS NOT DISTINCT FROM c_owner[k]) THEN
                -- Another client's id: answered as an unknown reservation (V18__owners.sql).
                o_result := 'not_found';
                o_detail := format('reservation %s does not exist', c_id[k]);
            ELSIF j IS NOT NULL THEN
                IF r_sku[j] <> c_sku[k] OR r_qty[j] <> c_amount[k] OR r_ttl[j] <> c_ttl[k] THEN$n$,
              '1'],
        ARRAY[$o$r_expired_by := r_expired_by || NULL::integer;$o$,
              $n$r_expired_by := r_expired_by || NULL::integer;
                r_owner := r_owner || c_owner[k];$n$,
              '1'],
        ARRAY[$o$            IF j IS NULL OR r_part[j] <> c_partition[k] THEN$o$,
              $n$            IF j IS NULL OR r_part[j] <> c_partition[k]
               OR NOT (coalesce(c_any[k], true) OR r_owner[j] IS NULL
                       OR r_owner[j] IS NOT DISTINCT FROM c_owner[k]) THEN$n$,
              '1'],
        ARRAY[$o$ttl_seconds, request_fingerprint, available_at_refusal, expires_at)$o$,
              $n$ttl_seconds, request_fingerprint, available_at_refusal, expires_at,
                                  owner)$n$,
              '1'],
        ARRAY[$o$u.sku || '/' || u.qty || '/' || u.ttl, u.refusal, u.exp
          FROM unnest(r_id, r_sku, r_part, r_qty, r_status, r_epoch, r_ttl, r_refusal, r_exp, r_new)
               AS u(id, sku, part, qty, status, epoch, ttl, refusal, exp, is_new)$o$,
              $n$u.sku || '/' || u.qty || '/' || u.ttl, u.refusal, u.exp, u.owner
          FROM unnest(r_id, r_sku, r_part, r_qty, r_status, r_epoch, r_ttl, r_refusal, r_exp, r_new,
                      r_owner)
               AS u(id, sku, part, qty, status, epoch, ttl, refusal, exp, is_new, owner)$n$,
              '1']
    ];
    i integer;
    found integer;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    FOR i IN 1 .. array_length(edits, 1) LOOP
        found := array_length(string_to_array(definition, edits[i][1]), 1) - 1;
        IF found IS DISTINCT FROM edits[i][3]::integer THEN
            RAISE EXCEPTION 'apply_fenced_batch: V18 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    DROP FUNCTION apply_fenced_batch(text, integer[], bigint[], integer[], text[], text[], text[],
                                     bigint[], integer[]);
    EXECUTE definition;
END $migrate$;
