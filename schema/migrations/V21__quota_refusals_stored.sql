-- A reserve refused by max_held_per_sku is stored under its id, like a refusal for stock
-- (README "Security", DESIGN.md §9): status 'rejected', `available_at_refusal` = what the client
-- held of the SKU, and the new `refused_quota` = the quota's value (NULL: refused for stock).
--
-- Why: a refusal that records nothing proves nothing about an earlier attempt of the same id
-- still on its way (a retry after a timeout, an order's line sent again), so an order whose line
-- was refused by the quota could only be answered as undecided. Stored, the refusal decides the
-- id for good: a late duplicate replays it (429 quota-exceeded, `replayed`), so a router may
-- count the line as refused and fail the order. The same id therefore no longer goes through
-- once the client holds less; a new reservation id does (as after a refusal for stock).
--
-- apply_fenced_batch loads `refused_quota` with the reservations it names (r_quota, aligned with
-- the loaded rows; one it refuses now gets its entry when it is appended), answers a replay of a
-- quota refusal as 'quota', and sets the column on the rows it inserted for this batch's quota
-- refusals in one statement after the insert (only when there are any).
ALTER TABLE reservations ADD COLUMN refused_quota bigint;

DO $migrate$
DECLARE
    definition text;
    edits constant text[][] := ARRAY[
        ARRAY[$o$    r_owner    text[] := '{}';$o$,
              $n$    r_owner    text[] := '{}';
    r_quota    bigint[] := '{}';  -- V21: the quota a stored refusal was refused by (NULL: stock)
    z_id       text[] := '{}';    -- V21: this batch's quota refusals, and their quotas
    z_limit    bigint[] := '{}';$n$,
              '1'],
        ARRAY[$o$r.ttl_seconds, r.expires_at, r.available_at_refusal, r.owner$o$,
              $n$r.ttl_seconds, r.expires_at, r.available_at_refusal, r.owner, r.refused_quota$n$,
              '2'],
        ARRAY[$o$        r_owner := r_owner || rec.owner;$o$,
              $n$        r_owner := r_owner || rec.owner;
        r_quota := r_quota || rec.refused_quota;$n$,
              '1'],
        ARRAY[$o$                ELSIF r_status[j] = 'rejected' THEN
                    o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);$o$,
              $n$                ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                    o_result := 'quota'; o_replayed := true; o_quantity := r_quota[j];
                    o_available := coalesce(r_refusal[j], 0);
                    o_detail := format('reservation %s was refused: its client held %s of sku %s; its max_held_per_sku was %s',
                                       c_id[k], o_available, r_sku[j], r_quota[j]);
                ELSIF r_status[j] = 'rejected' THEN
                    o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);$n$,
              '1'],
        ARRAY[$o$            ELSIF r_status[j] = 'rejected' THEN
                o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);$o$,
              $n$            ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                o_result := 'quota'; o_replayed := true; o_quantity := r_quota[j];
                o_available := coalesce(r_refusal[j], 0);
                o_detail := format('reservation %s was refused by its client''s max_held_per_sku (%s)',
                                   c_id[k], r_quota[j]);
            ELSIF r_status[j] = 'rejected' THEN
                o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);$n$,
              '1'],
        ARRAY[$o$                -- Over the client's max_held_per_sku (V19): nothing is recorded.
                o_result := 'quota'; o_quantity := c_quota[k];
                o_available := coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0);$o$,
              $n$                -- Over the client's max_held_per_sku: stored as a refusal (V21).
                o_result := 'quota'; o_quantity := c_quota[k];
                o_available := coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0);
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true; r_expired_by := r_expired_by || NULL::integer;
                r_owner := r_owner || c_owner[k];
                r_status := r_status || 'rejected'::text; r_exp := r_exp || NULL::timestamptz;
                r_refusal := r_refusal || o_available;
                r_quota[array_length(r_id, 1)] := c_quota[k];
                z_id := z_id || c_id[k]; z_limit := z_limit || c_quota[k];$n$,
              '1'],
        ARRAY[$o$            RAISE EXCEPTION 'reservation id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;$o$,
              $n$            RAISE EXCEPTION 'reservation id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;
        IF array_length(z_id, 1) > 0 THEN
            UPDATE reservations AS r
               SET refused_quota = z.lim
              FROM unnest(z_id, z_limit) AS z(id, lim)
             WHERE r.reservation_id = z.id;
        END IF;$n$,
              '1']
    ];
    i integer;
    found integer;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    FOR i IN 1 .. array_length(edits, 1) LOOP
        found := array_length(string_to_array(definition, edits[i][1]), 1) - 1;
        IF found IS DISTINCT FROM edits[i][3]::integer THEN
            RAISE EXCEPTION 'apply_fenced_batch: V21 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    EXECUTE definition;
END $migrate$;
