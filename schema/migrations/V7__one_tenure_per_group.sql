-- The fenced batch decides one group exactly as the same commands one per batch, and carries one
-- tenure per partition.
--
-- * A group that names a partition twice is refused whole (SQLSTATE FA005). Two batches of one
--   partition in one group can only be two tenures (an owner runs one batch per partition at a
--   time): an ended tenure's batch still queued beside its successor's. The fence looked the
--   partition up by its first position, so either both were answered stale (a valid lease was
--   dropped) or the ended tenure's commands were written under the new epoch.
-- * A reserve for a SKU that is not stocked records nothing, not even in the batch's memory: the
--   same id later in the batch, for a stocked SKU, is decided as a new reservation, as it would be
--   in a later batch (it used to answer not_found again).
--
-- The rest of apply_fenced_batch is unchanged from V2 (see the comment there for its contract).

CREATE OR REPLACE FUNCTION apply_fenced_batch(
    p_replica    text,
    p_partitions integer[],
    p_epochs     bigint[],
    c_partition  integer[],
    c_op         text[],
    c_id         text[],
    c_sku        text[],
    c_amount     bigint[],
    c_ttl        integer[])
RETURNS TABLE (
    o_ord       integer,
    o_result    text,
    o_replayed  boolean,
    o_status    text,
    o_sku       text,
    o_quantity  bigint,
    o_expires   timestamptz,
    o_epoch     bigint,
    o_partition integer,
    o_available bigint,
    o_on_hand   bigint,
    o_detail    text)
LANGUAGE plpgsql
-- Every table access here is by key. Without this, plans cached while a table was small (a new
-- cluster, before autovacuum's first ANALYZE) keep scanning the whole growing table per batch.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    n          integer := coalesce(array_length(c_op, 1), 0);
    t_now      timestamptz := now();
    ok_part    integer[] := '{}';
    ok_epoch   bigint[] := '{}';
    cur_epoch  bigint[] := '{}';
    -- reservations touched by the batch: loaded ones first, then the ones it creates
    r_id       text[] := '{}';
    r_sku      text[] := '{}';
    r_part     integer[] := '{}';
    r_qty      bigint[] := '{}';
    r_status   text[] := '{}';
    r_epoch    bigint[] := '{}';
    r_ttl      integer[] := '{}';
    r_exp      timestamptz[] := '{}';
    r_refusal  bigint[] := '{}';
    r_fp       text[] := '{}';
    r_new      boolean[] := '{}';
    r_dirty    boolean[] := '{}';
    r_expired_by integer[] := '{}';  -- partition whose sweep expired it (for counting)
    -- inventory rows, locked
    i_sku      text[] := '{}';
    i_part     integer[] := '{}';
    i_on_hand  bigint[] := '{}';
    i_avail    bigint[] := '{}';
    i_held     bigint[] := '{}';
    i_conf     bigint[] := '{}';
    i_epoch    bigint[] := '{}';
    i_new      boolean[] := '{}';
    i_dirty    boolean[] := '{}';
    -- adjustments touched
    a_id       text[] := '{}';
    a_sku      text[] := '{}';
    a_delta    bigint[] := '{}';
    a_status   text[] := '{}';
    a_on_hand  bigint[] := '{}';
    a_avail    bigint[] := '{}';
    a_part     integer[] := '{}';
    a_epoch    bigint[] := '{}';
    a_new      boolean[] := '{}';
    -- ledger rows to append
    l_sku      text[] := '{}';
    l_part     integer[] := '{}';
    l_kind     text[] := '{}';
    l_rid      text[] := '{}';
    l_aid      text[] := '{}';
    l_on_hand  bigint[] := '{}';
    l_avail    bigint[] := '{}';
    l_held     bigint[] := '{}';
    l_conf     bigint[] := '{}';
    l_epoch    bigint[] := '{}';
    k          integer;
    j          integer;
    s          integer;
    fp         integer;
    e          bigint;
    q          bigint;
    cnt        integer;
    n_new      integer;
    res_changed boolean := false;  -- an existing reservation row changed
    sweep_part  integer[] := '{}';
    sweep_limit bigint[] := '{}';
    rec        record;
    v_target   text;
BEGIN
    -- A group carries one tenure per partition. Two batches of one partition (an ended tenure's
    -- and its successor's) would share one fence check, so one of them would be answered or
    -- written under the other's epoch: the group is refused whole instead.
    IF cardinality(p_partitions) <> (SELECT count(DISTINCT x) FROM unnest(p_partitions) AS x) THEN
        RAISE EXCEPTION 'a group names a partition twice: %', p_partitions USING ERRCODE = 'FA005';
    END IF;

    -- 1. Fences, one per partition of the group.
    FOR rec IN
        SELECT l.partition, l.holder_id, l.epoch, l.expires_at > t_now AS live
          FROM leases l
         WHERE l.partition = ANY (p_partitions)
         ORDER BY l.partition
           FOR KEY SHARE
    LOOP
        fp := array_position(p_partitions, rec.partition);
        IF rec.holder_id IS NOT DISTINCT FROM p_replica AND rec.epoch = p_epochs[fp] AND rec.live THEN
            ok_part := ok_part || rec.partition;
            ok_epoch := ok_epoch || rec.epoch;
        ELSE
            cur_epoch[fp] := rec.epoch;
        END IF;
    END LOOP;

    -- 2. Reservations named by the batch and each sweeping partition's overdue holds, in one
    --    statement; `swept_by` names the partition whose sweep picked a row up.
    FOR k IN 1 .. n LOOP
        IF c_op[k] = 'expire' AND c_partition[k] = ANY (ok_part) THEN
            sweep_part := sweep_part || c_partition[k];
            sweep_limit := sweep_limit || c_amount[k];
        END IF;
    END LOOP;
    FOR rec IN
        SELECT named.*, NULL::integer AS swept_by
          FROM (SELECT r.reservation_id, r.sku, r.partition, r.quantity, r.status, r.epoch,
                       r.ttl_seconds, r.expires_at, r.available_at_refusal
                  FROM reservations r
                 WHERE r.reservation_id = ANY (c_id)
                   FOR UPDATE) AS named
        UNION ALL
        SELECT due.*, sweep.part
          FROM unnest(sweep_part, sweep_limit) AS sweep(part, lim)
         CROSS JOIN LATERAL (
                SELECT r.reservation_id, r.sku, r.partition, r.quantity, r.status, r.epoch,
                       r.ttl_seconds, r.expires_at, r.available_at_refusal
                  FROM reservations r
                 WHERE r.partition = sweep.part AND r.status = 'held' AND r.expires_at <= t_now
                 ORDER BY r.expires_at
                 LIMIT sweep.lim
                   FOR UPDATE SKIP LOCKED) AS due
    LOOP
        j := array_position(r_id, rec.reservation_id);
        IF j IS NOT NULL THEN
            -- Named by the batch and due as well: the sweep counts it.
            r_expired_by[j] := rec.swept_by;
            CONTINUE;
        END IF;
        r_id := r_id || rec.reservation_id;
        r_sku := r_sku || rec.sku;
        r_part := r_part || rec.partition;
        r_qty := r_qty || rec.quantity;
        r_status := r_status || rec.status;
        r_epoch := r_epoch || rec.epoch;
        r_ttl := r_ttl || rec.ttl_seconds;
        r_exp := r_exp || rec.expires_at;
        r_refusal := r_refusal || rec.available_at_refusal;
        r_new := r_new || false;
        r_dirty := r_dirty || false;
        r_expired_by := r_expired_by || rec.swept_by;
    END LOOP;

    -- 3. Lock every inventory row the batch may change, in one statement and in SKU order.
    FOR rec IN
        SELECT x.* FROM (
            SELECT i.sku, i.partition, i.on_hand, i.available, i.held, i.confirmed, i.highest_epoch
              FROM inventory i
             WHERE i.partition = ANY (ok_part)
               AND i.sku = ANY (c_sku || r_sku)
             ORDER BY i.sku
               FOR UPDATE) x
    LOOP
        i_sku := i_sku || rec.sku;
        i_part := i_part || rec.partition;
        i_on_hand := i_on_hand || rec.on_hand;
        i_avail := i_avail || rec.available;
        i_held := i_held || rec.held;
        i_conf := i_conf || rec.confirmed;
        i_epoch := i_epoch || rec.highest_epoch;
        i_new := i_new || false;
        i_dirty := i_dirty || false;
    END LOOP;

    -- 4. Expire every loaded hold that is overdue: a replay or transition of it answers
    --    'expired', and its stock is back before the batch's reserves are decided.
    FOR j IN 1 .. coalesce(array_length(r_id, 1), 0) LOOP
        IF r_status[j] = 'held' AND r_exp[j] <= t_now AND r_part[j] = ANY (ok_part) THEN
            s := array_position(i_sku, r_sku[j]);
            e := ok_epoch[array_position(ok_part, r_part[j])];
            q := r_qty[j];
            i_avail[s] := i_avail[s] + q;
            i_held[s] := i_held[s] - q;
            i_dirty[s] := true;
            r_status[j] := 'expired';
            r_epoch[j] := e;
            r_dirty[j] := true;
            res_changed := true;
            r_expired_by[j] := coalesce(r_expired_by[j], -1);
            l_sku := l_sku || r_sku[j]; l_part := l_part || r_part[j]; l_kind := l_kind || 'expire'::text;
            l_rid := l_rid || r_id[j]; l_aid := l_aid || NULL::text;
            l_on_hand := l_on_hand || 0::bigint; l_avail := l_avail || q; l_held := l_held || (-q);
            l_conf := l_conf || 0::bigint; l_epoch := l_epoch || e;
        ELSIF r_expired_by[j] IS NOT NULL AND r_expired_by[j] >= 0 THEN
            r_expired_by[j] := NULL;  -- no longer due (renewed status); not counted
        END IF;
    END LOOP;

    -- Adjustments named by the batch.
    IF 'adjust' = ANY (c_op) THEN
        FOR rec IN
            SELECT a.adjustment_id, a.sku, a.delta, a.status, a.on_hand_after, a.available_after,
                   a.partition, a.epoch
              FROM adjustments a
             WHERE a.adjustment_id = ANY (c_id)
        LOOP
            a_id := a_id || rec.adjustment_id;
            a_sku := a_sku || rec.sku;
            a_delta := a_delta || rec.delta;
            a_status := a_status || rec.status;
            a_on_hand := a_on_hand || rec.on_hand_after;
            a_avail := a_avail || rec.available_after;
            a_part := a_part || rec.partition;
            a_epoch := a_epoch || rec.epoch;
            a_new := a_new || false;
        END LOOP;
    END IF;

    -- 5. Decide every command in arrival order, in memory.
    FOR k IN 1 .. n LOOP
        o_ord := k;
        o_replayed := false;
        o_status := NULL; o_sku := NULL; o_quantity := NULL; o_expires := NULL; o_epoch := NULL;
        o_partition := c_partition[k]; o_available := NULL; o_on_hand := NULL; o_detail := NULL;
        fp := array_position(ok_part, c_partition[k]);
        IF fp IS NULL THEN
            o_result := 'stale';
            o_epoch := cur_epoch[array_position(p_partitions, c_partition[k])];
            RETURN NEXT;
            CONTINUE;
        END IF;
        e := ok_epoch[fp];

        IF c_op[k] = 'reserve' THEN
            j := array_position(r_id, c_id[k]);
            s := array_position(i_sku, c_sku[k]);
            IF s IS NOT NULL AND i_part[s] <> c_partition[k] THEN
                s := NULL;
            END IF;
            IF j IS NOT NULL THEN
                IF r_sku[j] <> c_sku[k] OR r_qty[j] <> c_amount[k] OR r_ttl[j] <> c_ttl[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('reservation %s already exists for sku %s quantity %s ttl_seconds %s',
                                       c_id[k], r_sku[j], r_qty[j], r_ttl[j]);
                ELSIF r_status[j] = 'rejected' THEN
                    o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);
                ELSE
                    o_result := 'replayed'; o_replayed := true;
                    o_status := r_status[j]; o_sku := r_sku[j]; o_quantity := r_qty[j];
                    o_expires := r_exp[j]; o_epoch := r_epoch[j]; o_partition := r_part[j];
                END IF;
            ELSIF s IS NULL THEN
                -- Unknown SKU: nothing is recorded, not even in this batch's memory, so the same
                -- id works once the SKU is stocked, later in this batch as in a later one.
                o_result := 'not_found';
                o_detail := format('sku %s is not stocked', c_sku[k]);
            ELSE
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true; r_expired_by := r_expired_by || NULL::integer;
                j := array_length(r_id, 1);
                IF i_avail[s] >= c_amount[k] THEN
                    q := c_amount[k];
                    i_avail[s] := i_avail[s] - q; i_held[s] := i_held[s] + q; i_dirty[s] := true;
                    r_status := r_status || 'held'::text;
                    r_exp := r_exp || (t_now + c_ttl[k] * interval '1 second');
                    r_refusal := r_refusal || NULL::bigint;
                    l_sku := l_sku || c_sku[k]; l_part := l_part || c_partition[k]; l_kind := l_kind || 'reserve'::text;
                    l_rid := l_rid || c_id[k]; l_aid := l_aid || NULL::text;
                    l_on_hand := l_on_hand || 0::bigint; l_avail := l_avail || (-q); l_held := l_held || q;
                    l_conf := l_conf || 0::bigint; l_epoch := l_epoch || e;
                    o_result := 'created'; o_status := 'held'; o_sku := c_sku[k]; o_quantity := q;
                    o_expires := r_exp[j]; o_epoch := e;
                ELSE
                    r_status := r_status || 'rejected'::text; r_exp := r_exp || NULL::timestamptz;
                    r_refusal := r_refusal || i_avail[s];
                    o_result := 'insufficient'; o_available := i_avail[s];
                END IF;
            END IF;

        ELSIF c_op[k] IN ('confirm', 'release') THEN
            j := array_position(r_id, c_id[k]);
            IF j IS NULL OR r_part[j] <> c_partition[k] THEN
                o_result := 'not_found';
                o_detail := format('reservation %s does not exist', c_id[k]);
            ELSIF r_status[j] = 'rejected' THEN
                o_result := 'insufficient'; o_replayed := true; o_available := coalesce(r_refusal[j], 0);
            ELSIF r_status[j] = 'held' THEN
                s := array_position(i_sku, r_sku[j]);
                q := r_qty[j];
                v_target := CASE c_op[k] WHEN 'confirm' THEN 'confirmed' ELSE 'released' END;
                IF c_op[k] = 'confirm' THEN
                    i_held[s] := i_held[s] - q; i_conf[s] := i_conf[s] + q;
                    l_avail := l_avail || 0::bigint; l_held := l_held || (-q); l_conf := l_conf || q;
                ELSE
                    i_held[s] := i_held[s] - q; i_avail[s] := i_avail[s] + q;
                    l_avail := l_avail || q; l_held := l_held || (-q); l_conf := l_conf || 0::bigint;
                END IF;
                i_dirty[s] := true;
                l_sku := l_sku || r_sku[j]; l_part := l_part || r_part[j]; l_kind := l_kind || c_op[k];
                l_rid := l_rid || r_id[j]; l_aid := l_aid || NULL::text;
                l_on_hand := l_on_hand || 0::bigint; l_epoch := l_epoch || e;
                r_status[j] := v_target; r_epoch[j] := e; r_dirty[j] := true; res_changed := true;
                o_result := 'transitioned'; o_status := v_target; o_sku := r_sku[j]; o_quantity := q;
                o_expires := r_exp[j]; o_epoch := e; o_partition := r_part[j];
            ELSIF (c_op[k] = 'confirm' AND r_status[j] = 'confirmed')
               OR (c_op[k] = 'release' AND r_status[j] IN ('released', 'expired')) THEN
                -- Already where the client wants it (a released-or-expired hold is gone either way).
                o_result := 'replayed'; o_replayed := true;
                o_status := r_status[j]; o_sku := r_sku[j]; o_quantity := r_qty[j];
                o_expires := r_exp[j]; o_epoch := r_epoch[j]; o_partition := r_part[j];
            ELSE
                o_result := 'invalid_state'; o_status := r_status[j];
            END IF;

        ELSIF c_op[k] = 'adjust' THEN
            j := array_position(a_id, c_id[k]);
            IF j IS NOT NULL THEN
                IF a_sku[j] <> c_sku[k] OR a_delta[j] <> c_amount[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('adjustment %s already exists for sku %s delta %s',
                                       c_id[k], a_sku[j], a_delta[j]);
                ELSE
                    o_result := CASE a_status[j] WHEN 'refused' THEN 'shrink_refused' ELSE 'adjusted' END;
                    o_replayed := true; o_sku := a_sku[j]; o_quantity := a_delta[j];
                    o_on_hand := coalesce(a_on_hand[j], 0); o_available := coalesce(a_avail[j], 0);
                    o_epoch := a_epoch[j]; o_partition := a_part[j];
                END IF;
            ELSE
                s := array_position(i_sku, c_sku[k]);
                q := c_amount[k];
                IF s IS NOT NULL AND i_part[s] <> c_partition[k] THEN
                    s := NULL;
                END IF;
                IF s IS NULL AND q < 0 THEN
                    o_result := 'not_found';
                    o_detail := format('sku %s is not stocked; restock it first', c_sku[k]);
                ELSIF s IS NOT NULL AND q < 0 AND i_avail[s] < -q THEN
                    a_id := a_id || c_id[k]; a_sku := a_sku || c_sku[k]; a_delta := a_delta || q;
                    a_status := a_status || 'refused'::text; a_on_hand := a_on_hand || i_on_hand[s];
                    a_avail := a_avail || i_avail[s]; a_part := a_part || c_partition[k];
                    a_epoch := a_epoch || e; a_new := a_new || true;
                    o_result := 'shrink_refused'; o_sku := c_sku[k]; o_quantity := q;
                    o_on_hand := i_on_hand[s]; o_available := i_avail[s];
                ELSE
                    IF s IS NULL THEN
                        i_sku := i_sku || c_sku[k]; i_part := i_part || c_partition[k];
                        i_on_hand := i_on_hand || 0::bigint; i_avail := i_avail || 0::bigint;
                        i_held := i_held || 0::bigint; i_conf := i_conf || 0::bigint;
                        i_epoch := i_epoch || e; i_new := i_new || true; i_dirty := i_dirty || true;
                        s := array_length(i_sku, 1);
                    END IF;
                    i_on_hand[s] := i_on_hand[s] + q; i_avail[s] := i_avail[s] + q; i_dirty[s] := true;
                    a_id := a_id || c_id[k]; a_sku := a_sku || c_sku[k]; a_delta := a_delta || q;
                    a_status := a_status || 'applied'::text; a_on_hand := a_on_hand || i_on_hand[s];
                    a_avail := a_avail || i_avail[s]; a_part := a_part || c_partition[k];
                    a_epoch := a_epoch || e; a_new := a_new || true;
                    l_sku := l_sku || c_sku[k]; l_part := l_part || c_partition[k];
                    l_kind := l_kind || (CASE WHEN q > 0 THEN 'restock' ELSE 'shrink' END)::text;
                    l_rid := l_rid || NULL::text; l_aid := l_aid || c_id[k];
                    l_on_hand := l_on_hand || q; l_avail := l_avail || q; l_held := l_held || 0::bigint;
                    l_conf := l_conf || 0::bigint; l_epoch := l_epoch || e;
                    o_result := 'adjusted'; o_sku := c_sku[k]; o_quantity := q;
                    o_on_hand := i_on_hand[s]; o_available := i_avail[s]; o_epoch := e;
                END IF;
            END IF;

        ELSIF c_op[k] = 'expire' THEN
            cnt := 0;
            FOR j IN 1 .. coalesce(array_length(r_id, 1), 0) LOOP
                IF r_expired_by[j] = c_partition[k] THEN
                    cnt := cnt + 1;
                    r_expired_by[j] := -1;  -- counted once
                END IF;
            END LOOP;
            o_result := 'expired'; o_quantity := cnt;

        ELSE
            RAISE EXCEPTION 'unknown batch operation %', c_op[k] USING ERRCODE = '22023';
        END IF;
        RETURN NEXT;
    END LOOP;

    -- 6. Write: one statement per table, each only when it has rows (every statement has a fixed
    --    cost, and that is most of what a small batch pays).
    n_new := coalesce(array_length(array_positions(i_new, true), 1), 0);
    IF n_new > 0 THEN
        INSERT INTO inventory (sku, partition, on_hand, available, held, confirmed, highest_epoch)
        SELECT u.sku, u.part, u.on_hand, u.avail, u.held, u.conf,
               ok_epoch[array_position(ok_part, u.part)]
          FROM unnest(i_sku, i_part, i_on_hand, i_avail, i_held, i_conf, i_new)
               AS u(sku, part, on_hand, avail, held, conf, is_new)
         WHERE u.is_new
        ON CONFLICT (sku) DO NOTHING;
        GET DIAGNOSTICS cnt = ROW_COUNT;
        IF cnt <> n_new THEN
            RAISE EXCEPTION 'sku created concurrently' USING ERRCODE = 'FA004';
        END IF;
    END IF;

    IF true = ANY (i_dirty) THEN
        UPDATE inventory AS i
           SET on_hand = u.on_hand, available = u.avail, held = u.held, confirmed = u.conf,
               highest_epoch = ok_epoch[array_position(ok_part, u.part)]
          FROM unnest(i_sku, i_part, i_on_hand, i_avail, i_held, i_conf, i_new, i_dirty)
               AS u(sku, part, on_hand, avail, held, conf, is_new, dirty)
         WHERE i.sku = u.sku AND u.dirty AND NOT u.is_new;
    END IF;

    n_new := coalesce(array_length(array_positions(r_new, true), 1), 0);
    IF n_new > 0 THEN
        INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                                  ttl_seconds, request_fingerprint, available_at_refusal, expires_at)
        SELECT u.id, u.sku, u.part, u.qty, u.status, u.epoch, u.ttl,
               u.sku || '/' || u.qty || '/' || u.ttl, u.refusal, u.exp
          FROM unnest(r_id, r_sku, r_part, r_qty, r_status, r_epoch, r_ttl, r_refusal, r_exp, r_new)
               AS u(id, sku, part, qty, status, epoch, ttl, refusal, exp, is_new)
         WHERE u.is_new
        ON CONFLICT (reservation_id) DO NOTHING;
        GET DIAGNOSTICS cnt = ROW_COUNT;
        IF cnt <> n_new THEN
            RAISE EXCEPTION 'reservation id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;
    END IF;

    IF res_changed THEN
        UPDATE reservations AS r
           SET status = u.status, epoch = u.epoch, updated_at = t_now
          FROM unnest(r_id, r_status, r_epoch, r_new, r_dirty) AS u(id, status, epoch, is_new, dirty)
         WHERE r.reservation_id = u.id AND u.dirty AND NOT u.is_new;
    END IF;

    n_new := coalesce(array_length(array_positions(a_new, true), 1), 0);
    IF n_new > 0 THEN
        INSERT INTO adjustments (adjustment_id, sku, partition, delta, status, epoch,
                                 on_hand_after, available_after)
        SELECT u.id, u.sku, u.part, u.delta, u.status, u.epoch, u.on_hand, u.avail
          FROM unnest(a_id, a_sku, a_part, a_delta, a_status, a_epoch, a_on_hand, a_avail, a_new)
               AS u(id, sku, part, delta, status, epoch, on_hand, avail, is_new)
         WHERE u.is_new
        ON CONFLICT (adjustment_id) DO NOTHING;
        GET DIAGNOSTICS cnt = ROW_COUNT;
        IF cnt <> n_new THEN
            RAISE EXCEPTION 'adjustment id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;
    END IF;

    IF array_length(l_sku, 1) > 0 THEN
        INSERT INTO ledger (sku, partition, kind, reservation_id, adjustment_id,
                            d_on_hand, d_available, d_held, d_confirmed, epoch)
        SELECT * FROM unnest(l_sku, l_part, l_kind, l_rid, l_aid, l_on_hand, l_avail, l_held,
                             l_conf, l_epoch);
    END IF;
    RETURN;
END $$;
