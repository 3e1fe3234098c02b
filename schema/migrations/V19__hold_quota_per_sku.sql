-- max_held_per_sku decided inside the fenced batch (README "Security", DESIGN.md §9): the units one
-- client may hold of one SKU at once ("two per customer").
--
-- apply_fenced_batch takes each reserve's quota (c_quota, NULL: none; defaults to NULL, so the
-- earlier calls keep their behaviour). When any reserve of the batch has one, the batch reads
-- what those clients hold of those SKUs (unexpired holds; V18's owner column) after it has
-- locked the SKUs' inventory rows. Every writer of a hold of a SKU (reserve, confirm, release,
-- expiry, by this function or the set-based statement) updates that row, so nobody changes what
-- a client holds of it until the batch commits: the count is exact under concurrency, whichever
-- router the reserves came through. In arrival order, a reserve that would take the client over
-- its quota answers 'quota' and records nothing (the same id may be used again once the client
-- holds less); a granted one adds to the count, a confirm or release of one of its holds takes
-- from it. The set-based reserve statement never carries a reserve with a quota (the allocator
-- sends those to this function), so it is unchanged.
--
-- The holds are found through reservations_held_expiry (partition, expires_at WHERE held): the
-- batch reads the unexpired holds of its partitions once, and only when a reserve has a quota.
DO $migrate$
DECLARE
    definition text;
    edits constant text[][] := ARRAY[
        ARRAY['c_any boolean[] DEFAULT NULL::boolean[])',
              'c_any boolean[] DEFAULT NULL::boolean[], c_quota bigint[] DEFAULT NULL::bigint[])',
              '1'],
        ARRAY[$o$    r_owner    text[] := '{}';$o$,
              $n$    r_owner    text[] := '{}';
    -- V19: what each client with a per-SKU quota holds, by 'owner/sku' (neither has a '/')
    q_key      text[] := '{}';
    q_held     bigint[] := '{}';
    qi         integer;$n$,
              '1'],
        ARRAY[$o$    -- 5. Decide every command in arrival order, in memory.$o$,
              $n$    -- V19: what the clients with a per-SKU quota hold of the SKUs they reserve, read
    --      under the inventory row locks taken above.
    IF c_quota IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(c_quota) AS x WHERE x IS NOT NULL) THEN
        FOR rec IN
            SELECT r.owner || '/' || r.sku AS key, sum(r.quantity)::bigint AS held
              FROM reservations r
             WHERE r.partition = ANY (ok_part) AND r.status = 'held' AND r.expires_at > t_now
               AND r.owner || '/' || r.sku IN (
                       SELECT u.o || '/' || u.s
                         FROM unnest(c_owner, c_sku, c_quota) AS u(o, s, q)
                        WHERE u.q IS NOT NULL AND u.o IS NOT NULL)
             GROUP BY 1
        LOOP
            q_key := q_key || rec.key;
            q_held := q_held || rec.held;
        END LOOP;
    END IF;

    -- 5. Decide every command in arrival order, in memory.$n$,
              '1'],
        ARRAY[$o$            ELSIF s IS NULL THEN
                -- Unknown SKU:$o$,
              $n$            ELSIF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL AND s IS NOT NULL
              AND coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0)
                  + c_amount[k] > c_quota[k] THEN
                -- Over the client's max_held_per_sku (V19): nothing is recorded.
                o_result := 'quota'; o_quantity := c_quota[k];
                o_available := coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0);
                o_detail := format('client %s holds %s of sku %s and asked for %s more; its max_held_per_sku is %s',
                                   c_owner[k], o_available, c_sku[k], c_amount[k], c_quota[k]);
            ELSIF s IS NULL THEN
                -- Unknown SKU:$n$,
              '1'],
        ARRAY[$o$                    o_result := 'created'; o_status := 'held'; o_sku := c_sku[k]; o_quantity := q;$o$,
              $n$                    o_result := 'created'; o_status := 'held'; o_sku := c_sku[k]; o_quantity := q;
                    IF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        qi := array_position(q_key, c_owner[k] || '/' || c_sku[k]);
                        IF qi IS NULL THEN
                            q_key := q_key || (c_owner[k] || '/' || c_sku[k]);
                            q_held := q_held || q;
                        ELSE
                            q_held[qi] := q_held[qi] + q;
                        END IF;
                    END IF;$n$,
              '1'],
        ARRAY[$o$                r_status[j] := v_target; r_epoch[j] := e; r_dirty[j] := true; res_changed := true;$o$,
              $n$                r_status[j] := v_target; r_epoch[j] := e; r_dirty[j] := true; res_changed := true;
                qi := array_position(q_key, r_owner[j] || '/' || r_sku[j]);
                IF qi IS NOT NULL THEN
                    q_held[qi] := q_held[qi] - q;
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
            RAISE EXCEPTION 'apply_fenced_batch: V19 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    DROP FUNCTION apply_fenced_batch(text, integer[], bigint[], integer[], text[], text[], text[],
                                     bigint[], integer[], text[], boolean[]);
    EXECUTE definition;
END $migrate$;
