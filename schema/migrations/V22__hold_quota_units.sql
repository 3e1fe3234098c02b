-- max_held_units decided inside the fenced batch (README "Security", DESIGN.md §9): the units one
-- client may hold at once over every SKU.
--
-- apply_fenced_batch takes each reserve's units quota (c_units, NULL: none; defaults to NULL, so
-- an earlier build's twelve-argument call keeps its behaviour). When any reserve of the batch has
-- one, the batch sums what those clients hold, unexpired, over every partition (one read through
-- the index below), after it has locked its SKUs' inventory rows. In arrival order a reserve that
-- would take its client over the quota is refused ('quota_units', 429 quota-exceeded naming
-- max_held_units) and stored under its id like a per-SKU refusal (V21); a grant adds to the
-- count, a confirm or release of one of the client's holds takes from it.
--
-- How exact it is. A partition's holds change only through its owner's batches, one at a time
-- (its worker serialises them; a stale owner is fenced), so what the batch reads of its own
-- partitions is exact until it commits: a client whose holds sit in one partition is held to the
-- quota exactly. Holds in other partitions are read as last committed, so a batch does not see
-- what another partition's batch grants while both are open. Every grant still passed the check
-- of its own batch, and the batch whose read came last saw everything committed before it, so at
-- any moment a client holds at most max_held_units × T, T being the number of fenced
-- transactions open at once (at most the sum of the allocators' --commit-lanes); one at a time
-- (requests in sequence, or all in one partition) it is exact. Making it exact across
-- partitions would need a lock per client shared by every partition, which would let one
-- stalled owner stop that client's reserves everywhere and cannot span databases.
--
-- Stored refusals now name their quota (refused_quota_name; NULL on rows from before this
-- migration, which were all refused by max_held_per_sku), so a replay answers with the same one.
ALTER TABLE reservations ADD COLUMN refused_quota_name text
    CHECK (refused_quota_name IN ('max_held_per_sku', 'max_held_units'));

-- A client's holds, by SKU: the units count reads the client's prefix of it, and the per-SKU
-- count (V19) now reads the (client, SKU) entries instead of every unexpired hold of the batch's
-- partitions, so what a quota costs a batch follows what the client holds, not what everybody
-- holds. Only held rows of a known client are in it, so a hold adds one entry and leaves it when
-- it ends (the status is in the predicate, as in reservations_held_expiry, so that update writes
-- new index entries anyway). On a database that already holds many rows, build it first by hand
-- without blocking writes:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS reservations_held_owner ...  (the same definition)
-- and this migration leaves it as it is.
CREATE INDEX IF NOT EXISTS reservations_held_owner
    ON reservations (owner, sku) INCLUDE (quantity, expires_at)
    WHERE status = 'held' AND owner IS NOT NULL;

DO $migrate$
DECLARE
    definition text;
    edits constant text[][] := ARRAY[
        ARRAY['c_quota bigint[] DEFAULT NULL::bigint[])',
              'c_quota bigint[] DEFAULT NULL::bigint[], c_units bigint[] DEFAULT NULL::bigint[])',
              '1'],
        ARRAY[$o$    q_held     bigint[] := '{}';$o$,
              $n$    q_held     bigint[] := '{}';
    -- V22: what each client with max_held_units holds over every partition, by owner
    u_key      text[] := '{}';
    u_held     bigint[] := '{}';
    ui         integer;
    r_qname    text[] := '{}';    -- V22: the quota a stored refusal names (NULL: max_held_per_sku)
    z_name     text[] := '{}';$n$,
              '1'],
        ARRAY[$o$r.available_at_refusal, r.owner, r.refused_quota$o$,
              $n$r.available_at_refusal, r.owner, r.refused_quota,
                       r.refused_quota_name$n$,
              '2'],
        ARRAY[$o$        r_quota := r_quota || rec.refused_quota;$o$,
              $n$        r_quota := r_quota || rec.refused_quota;
        r_qname[array_length(r_id, 1)] := rec.refused_quota_name;$n$,
              '1'],
        -- The per-SKU count through the index above (the same rows: a SKU's holds sit in its
        -- partition, read under its locked inventory row).
        ARRAY[$o$            SELECT r.owner || '/' || r.sku AS key, sum(r.quantity)::bigint AS held
              FROM reservations r
             WHERE r.partition = ANY (ok_part) AND r.status = 'held' AND r.expires_at > t_now
               AND r.owner || '/' || r.sku IN (
                       SELECT u.o || '/' || u.s
                         FROM unnest(c_owner, c_sku, c_quota) AS u(o, s, q)
                        WHERE u.q IS NOT NULL AND u.o IS NOT NULL)
             GROUP BY 1$o$,
              $n$            SELECT r.owner || '/' || r.sku AS key, sum(r.quantity)::bigint AS held
              FROM (SELECT DISTINCT u.o, u.s
                      FROM unnest(c_owner, c_sku, c_quota) AS u(o, s, q)
                     WHERE u.q IS NOT NULL AND u.o IS NOT NULL AND u.s IS NOT NULL) AS w
              JOIN reservations r ON r.owner = w.o AND r.sku = w.s
             WHERE r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
               AND r.partition = ANY (ok_part)
             GROUP BY 1$n$,
              '1'],
        ARRAY[$o$    -- 5. Decide every command in arrival order, in memory.$o$,
              $n$    -- V22: what the clients with max_held_units hold over every partition, unexpired.
    IF c_units IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(c_units) AS x WHERE x IS NOT NULL) THEN
        FOR rec IN
            SELECT r.owner, sum(r.quantity)::bigint AS held
              FROM reservations r
             WHERE r.owner IN (SELECT u.o FROM unnest(c_owner, c_units) AS u(o, q)
                                WHERE u.q IS NOT NULL AND u.o IS NOT NULL)
               AND r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
             GROUP BY 1
        LOOP
            u_key := u_key || rec.owner;
            u_held := u_held || rec.held;
        END LOOP;
    END IF;

    -- 5. Decide every command in arrival order, in memory.$n$,
              '1'],
        -- A replay of a stored refusal answers with the quota it names.
        ARRAY[$o$                ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                    o_result := 'quota';$o$,
              $n$                ELSIF r_status[j] = 'rejected' AND r_qname[j] = 'max_held_units' THEN
                    o_result := 'quota_units'; o_replayed := true; o_quantity := r_quota[j];
                    o_available := coalesce(r_refusal[j], 0);
                    o_detail := format('reservation %s was refused: its client held %s units; its max_held_units was %s',
                                       c_id[k], o_available, r_quota[j]);
                ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                    o_result := 'quota';$n$,
              '1'],
        ARRAY[$o$            ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                o_result := 'quota';$o$,
              $n$            ELSIF r_status[j] = 'rejected' AND r_qname[j] = 'max_held_units' THEN
                o_result := 'quota_units'; o_replayed := true; o_quantity := r_quota[j];
                o_available := coalesce(r_refusal[j], 0);
                o_detail := format('reservation %s was refused by its client''s max_held_units (%s)',
                                   c_id[k], r_quota[j]);
            ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                o_result := 'quota';$n$,
              '1'],
        -- The per-SKU refusal names its quota; the units refusal follows it.
        ARRAY[$o$                z_id := z_id || c_id[k]; z_limit := z_limit || c_quota[k];$o$,
              $n$                r_qname[array_length(r_id, 1)] := 'max_held_per_sku';
                z_id := z_id || c_id[k]; z_limit := z_limit || c_quota[k];
                z_name := z_name || 'max_held_per_sku'::text;$n$,
              '1'],
        ARRAY[$o$            ELSIF s IS NULL THEN
                -- Unknown SKU:$o$,
              $n$            ELSIF c_units[k] IS NOT NULL AND c_owner[k] IS NOT NULL AND s IS NOT NULL
              AND coalesce(u_held[array_position(u_key, c_owner[k])], 0) + c_amount[k] > c_units[k] THEN
                -- Over the client's max_held_units: stored as a refusal (V22).
                o_result := 'quota_units'; o_quantity := c_units[k];
                o_available := coalesce(u_held[array_position(u_key, c_owner[k])], 0);
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true; r_expired_by := r_expired_by || NULL::integer;
                r_owner := r_owner || c_owner[k];
                r_status := r_status || 'rejected'::text; r_exp := r_exp || NULL::timestamptz;
                r_refusal := r_refusal || o_available;
                r_quota[array_length(r_id, 1)] := c_units[k];
                r_qname[array_length(r_id, 1)] := 'max_held_units';
                z_id := z_id || c_id[k]; z_limit := z_limit || c_units[k];
                z_name := z_name || 'max_held_units'::text;
                o_detail := format('client %s holds %s units and asked for %s more; its max_held_units is %s',
                                   c_owner[k], o_available, c_amount[k], c_units[k]);
            ELSIF s IS NULL THEN
                -- Unknown SKU:$n$,
              '1'],
        ARRAY[$o$                    IF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        qi := array_position(q_key, c_owner[k] || '/' || c_sku[k]);$o$,
              $n$                    IF c_units[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        ui := array_position(u_key, c_owner[k]);
                        IF ui IS NULL THEN
                            u_key := u_key || c_owner[k];
                            u_held := u_held || q;
                        ELSE
                            u_held[ui] := u_held[ui] + q;
                        END IF;
                    END IF;
                    IF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        qi := array_position(q_key, c_owner[k] || '/' || c_sku[k]);$n$,
              '1'],
        ARRAY[$o$                IF qi IS NOT NULL THEN
                    q_held[qi] := q_held[qi] - q;
                END IF;$o$,
              $n$                IF qi IS NOT NULL THEN
                    q_held[qi] := q_held[qi] - q;
                END IF;
                ui := array_position(u_key, r_owner[j]);
                IF ui IS NOT NULL THEN
                    u_held[ui] := u_held[ui] - q;
                END IF;$n$,
              '1'],
        ARRAY[$o$               SET refused_quota = z.lim
              FROM unnest(z_id, z_limit) AS z(id, lim)$o$,
              $n$               SET refused_quota = z.lim, refused_quota_name = z.name
              FROM unnest(z_id, z_limit, z_name) AS z(id, lim, name)$n$,
              '1']
    ];
    i integer;
    found integer;
BEGIN
    SELECT pg_get_functiondef('apply_fenced_batch'::regproc) INTO definition;
    FOR i IN 1 .. array_length(edits, 1) LOOP
        found := array_length(string_to_array(definition, edits[i][1]), 1) - 1;
        IF found IS DISTINCT FROM edits[i][3]::integer THEN
            RAISE EXCEPTION 'apply_fenced_batch: V22 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    DROP FUNCTION apply_fenced_batch(text, integer[], bigint[], integer[], text[], text[], text[],
                                     bigint[], integer[], text[], boolean[], bigint[]);
    EXECUTE definition;
END $migrate$;
