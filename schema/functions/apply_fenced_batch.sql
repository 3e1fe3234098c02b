-- apply_fenced_batch: one fenced batch of commands for one or more partitions, in one statement.
--
-- This file is the function's text, whole. `allocator migrate` installs it after the migrations
-- (schema/src/functions.rs) and records its revision and SHA-256 in `schema_functions`; no
-- migration edits the function any more. A change to this text is a new revision: raise the
-- function's revision in schema/src/functions.rs with it, keep the signature (a replica of the
-- previous release calls it with the arguments it knows during a rolling upgrade; every argument
-- added since V2 defaults to NULL for that reason), and keep the negative control's edits
-- matching (allocator/src/negative_control.rs). Its history up to revision 1 is in the
-- migrations: V2 created it, V7 rewrote it, V12, V18-V22, V26 and V27 changed parts of it.
--
-- Why one statement: as an autocommit statement it is one round trip and one transaction, so a
-- batch of any size costs what one command costs, and the fence check commits with the writes.
-- The set-based reserve statement (allocator/src/fenced/fast.rs) writes groups of plain reserves
-- with the same fence; everything else comes here.
--
-- Commands arrive as parallel arrays, in arrival order (index k):
--   c_partition  the command's partition (one of p_partitions)
--   c_op         'reserve' | 'confirm' | 'release' | 'adjust' | 'expire'
--   c_id         reservation or adjustment id (NULL for 'expire')
--   c_sku        SKU of a reserve or adjust (NULL otherwise)
--   c_amount     quantity (reserve), delta (adjust), most holds to expire (expire)
--   c_ttl        hold TTL in seconds (reserve)
--   c_owner      the calling client (V18; NULL: anonymous or unknown)
--   c_any        whether the caller may act on every client's rows (V18, `admin`; NULL: yes)
--   c_quota      the client's max_held_per_sku for a reserve (V19; NULL: none)
--   c_units      the client's max_held_units for a reserve (V22; NULL: none)
--   c_elsewhere  what the client holds on the cluster's other shards (V27; NULL: nothing)
-- and one fence (p_partitions[i], p_epochs[i]) per partition of the group, all for p_replica.
--
-- Results, one row per command (o_ord = its 1-based index):
--   created | replayed | transitioned        o_status and the reservation's fields
--   insufficient                             o_available (o_replayed for a stored refusal)
--   quota | quota_units                      o_quantity = the quota, o_available = what the
--                                            client held (o_replayed for a stored refusal)
--   mismatch | not_found                     o_detail
--   invalid_state                            o_status = current state
--   adjusted | shrink_refused                o_on_hand / o_available (o_replayed)
--   expired                                  o_quantity = holds expired by this command
--   stale                                    o_epoch = the lease's current epoch
-- SQLSTATE FA004: a new id or SKU was inserted concurrently by another transaction; nothing was
-- written and the caller retries the batch (the id then replays).
-- SQLSTATE FA005: the group names a partition twice (two tenures); refused whole.
CREATE OR REPLACE FUNCTION apply_fenced_batch(
    p_replica    text,
    p_partitions integer[],
    p_epochs     bigint[],
    c_partition  integer[],
    c_op         text[],
    c_id         text[],
    c_sku        text[],
    c_amount     bigint[],
    c_ttl        integer[],
    c_owner      text[] DEFAULT NULL,
    c_any        boolean[] DEFAULT NULL,
    c_quota      bigint[] DEFAULT NULL,
    c_units      bigint[] DEFAULT NULL,
    c_elsewhere  bigint[] DEFAULT NULL)
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
    n           integer := coalesce(array_length(c_op, 1), 0);
    -- One clock for the whole batch: expiry and the lease check agree on what "now" is.
    t_now       timestamptz := now();
    -- The partitions whose fence held, with their epochs, and the current epoch of the others.
    ok_part     integer[] := '{}';
    ok_epoch    bigint[] := '{}';
    cur_epoch   bigint[] := '{}';
    -- Reservations touched by the batch, one index j across these arrays: the loaded ones
    -- first, then the ones the batch creates (r_new).
    r_id        text[] := '{}';
    r_sku       text[] := '{}';
    r_part      integer[] := '{}';
    r_qty       bigint[] := '{}';
    r_status    text[] := '{}';
    r_epoch     bigint[] := '{}';
    r_ttl       integer[] := '{}';
    r_exp       timestamptz[] := '{}';
    r_refusal   bigint[] := '{}';
    r_fp        text[] := '{}';
    r_owner     text[] := '{}';    -- the client that made it (NULL: anonymous or unknown)
    r_quota     bigint[] := '{}';  -- the quota a stored refusal was refused by (NULL: stock)
    r_qname     text[] := '{}';    -- which quota (NULL on rows from before V22: max_held_per_sku)
    r_new       boolean[] := '{}';
    r_dirty     boolean[] := '{}';
    r_expired_by integer[] := '{}';  -- partition whose sweep expired it (for counting)
    -- This batch's quota refusals, set on their rows after the insert.
    z_id        text[] := '{}';
    z_limit     bigint[] := '{}';
    z_name      text[] := '{}';
    -- What each client with a per-SKU quota holds, by 'owner/sku' (neither has a '/').
    q_key       text[] := '{}';
    q_held      bigint[] := '{}';
    qi          integer;
    -- What each client with max_held_units holds over every partition, by owner.
    u_key       text[] := '{}';
    u_held      bigint[] := '{}';
    ui          integer;
    -- Inventory rows, locked; one index s.
    i_sku       text[] := '{}';
    i_part      integer[] := '{}';
    i_on_hand   bigint[] := '{}';
    i_avail     bigint[] := '{}';
    i_held      bigint[] := '{}';
    i_conf      bigint[] := '{}';
    i_epoch     bigint[] := '{}';
    i_new       boolean[] := '{}';
    i_dirty     boolean[] := '{}';
    -- Adjustments touched.
    a_id        text[] := '{}';
    a_sku       text[] := '{}';
    a_delta     bigint[] := '{}';
    a_status    text[] := '{}';
    a_on_hand   bigint[] := '{}';
    a_avail     bigint[] := '{}';
    a_part      integer[] := '{}';
    a_epoch     bigint[] := '{}';
    a_new       boolean[] := '{}';
    a_owner     text[] := '{}';    -- who made a new one (NULL: anonymous or unknown)
    -- Ledger rows to append, in decision order.
    l_sku       text[] := '{}';
    l_part      integer[] := '{}';
    l_kind      text[] := '{}';
    l_rid       text[] := '{}';
    l_aid       text[] := '{}';
    l_on_hand   bigint[] := '{}';
    l_avail     bigint[] := '{}';
    l_held      bigint[] := '{}';
    l_conf      bigint[] := '{}';
    l_epoch     bigint[] := '{}';
    k           integer;
    j           integer;
    s           integer;
    fp          integer;
    e           bigint;
    q           bigint;
    cnt         integer;
    n_new       integer;
    res_changed boolean := false;  -- an existing reservation row changed
    sweep_part  integer[] := '{}';
    sweep_limit bigint[] := '{}';
    rec         record;
    v_target    text;
BEGIN
    -- A group carries one tenure per partition. Two batches of one partition (an ended tenure's
    -- and its successor's) would share one fence check, so one of them would be answered or
    -- written under the other's epoch: the group is refused whole instead.
    IF cardinality(p_partitions) <> (SELECT count(DISTINCT x) FROM unnest(p_partitions) AS x) THEN
        RAISE EXCEPTION 'a group names a partition twice: %', p_partitions USING ERRCODE = 'FA005';
    END IF;

    -- 1. Fences, one per partition of the group. A partition may be written only while its
    --    lease row names this replica (holder), at the epoch the replica acquired it with, and
    --    has not expired by the database's clock. The row is read FOR KEY SHARE: that conflicts
    --    with the FOR UPDATE an acquisition takes, so a newer owner either acquired before this
    --    check (and the check sees its epoch) or waits until this transaction ends; no write of
    --    an old tenure commits after a newer epoch exists (I4). It does not conflict with a
    --    renewal (a plain non-key UPDATE), so a stuck batch never fails its owner's renewals.
    --    A partition that fails is answered 'stale' and writes nothing; the other partitions of
    --    the group go on.
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
    --    statement; `swept_by` names the partition whose sweep picked a row up. Named rows are
    --    loaded whatever their partition, so a replay is answered from the stored row.
    FOR k IN 1 .. n LOOP
        IF c_op[k] = 'expire' AND c_partition[k] = ANY (ok_part) THEN
            sweep_part := sweep_part || c_partition[k];
            sweep_limit := sweep_limit || c_amount[k];
        END IF;
    END LOOP;
    FOR rec IN
        SELECT named.*, NULL::integer AS swept_by
          FROM (SELECT r.reservation_id, r.sku, r.partition, r.quantity, r.status, r.epoch,
                       r.ttl_seconds, r.expires_at, r.available_at_refusal, r.owner,
                       r.refused_quota, r.refused_quota_name
                  FROM reservations r
                 WHERE r.reservation_id = ANY (c_id)
                   FOR UPDATE) AS named
        UNION ALL
        SELECT due.*, sweep.part
          FROM unnest(sweep_part, sweep_limit) AS sweep(part, lim)
         CROSS JOIN LATERAL (
                SELECT r.reservation_id, r.sku, r.partition, r.quantity, r.status, r.epoch,
                       r.ttl_seconds, r.expires_at, r.available_at_refusal, r.owner,
                       r.refused_quota, r.refused_quota_name
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
        r_owner := r_owner || rec.owner;
        r_quota := r_quota || rec.refused_quota;
        r_qname[array_length(r_id, 1)] := rec.refused_quota_name;
        r_new := r_new || false;
        r_dirty := r_dirty || false;
        r_expired_by := r_expired_by || rec.swept_by;
    END LOOP;

    -- 3. Lock every inventory row the batch may change, in one statement and in SKU order (two
    --    lanes locking the same SKUs never deadlock). Only rows of fenced partitions: a stale
    --    partition's commands never touch stock.
    FOR rec IN
        SELECT x.* FROM (
            SELECT i.sku, i.partition, i.on_hand, i.available, i.held, i.confirmed,
                   i.highest_epoch
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
            l_sku := l_sku || r_sku[j];
            l_part := l_part || r_part[j];
            l_kind := l_kind || 'expire'::text;
            l_rid := l_rid || r_id[j];
            l_aid := l_aid || NULL::text;
            l_on_hand := l_on_hand || 0::bigint;
            l_avail := l_avail || q;
            l_held := l_held || (-q);
            l_conf := l_conf || 0::bigint;
            l_epoch := l_epoch || e;
        ELSIF r_expired_by[j] IS NOT NULL AND r_expired_by[j] >= 0 THEN
            r_expired_by[j] := NULL;  -- no longer due (renewed status); not counted
        END IF;
    END LOOP;

    -- Adjustments named by the batch.
    IF 'adjust' = ANY (c_op) THEN
        FOR rec IN
            SELECT a.adjustment_id, a.sku, a.delta, a.status, a.on_hand_after, a.available_after,
                   a.partition, a.epoch, a.owner
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
            a_owner := a_owner || rec.owner;
        END LOOP;
    END IF;

    -- What the clients with a per-SKU quota hold of the SKUs they reserve, read under the
    -- inventory row locks taken above: every writer of a hold of a SKU updates that row, so the
    -- count cannot change until this batch commits (V19).
    IF c_quota IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(c_quota) AS x WHERE x IS NOT NULL) THEN
        FOR rec IN
            SELECT r.owner || '/' || r.sku AS key, sum(r.quantity)::bigint AS held
              FROM (SELECT DISTINCT u.o, u.s
                      FROM unnest(c_owner, c_sku, c_quota) AS u(o, s, q)
                     WHERE u.q IS NOT NULL AND u.o IS NOT NULL AND u.s IS NOT NULL) AS w
              JOIN reservations r ON r.owner = w.o AND r.sku = w.s
             WHERE r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
               AND r.partition = ANY (ok_part)
             GROUP BY 1
        LOOP
            q_key := q_key || rec.key;
            q_held := q_held || rec.held;
        END LOOP;
    END IF;

    -- What the clients with max_held_units hold, unexpired, over every partition this shard
    -- holds (a partition that moved away leaves a frozen copy of its holds behind), plus what
    -- their router read of the other shards (V22, V27; how exact this is: V22's comment).
    IF c_units IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(c_units) AS x WHERE x IS NOT NULL) THEN
        FOR rec IN
            SELECT r.owner, sum(r.quantity)::bigint AS held
              FROM reservations r
             WHERE r.owner IN (SELECT u.o FROM unnest(c_owner, c_units) AS u(o, q)
                                WHERE u.q IS NOT NULL AND u.o IS NOT NULL)
               AND r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
               AND EXISTS (SELECT 1 FROM leases l WHERE l.partition = r.partition)
             GROUP BY 1
        LOOP
            u_key := u_key || rec.owner;
            u_held := u_held || rec.held;
        END LOOP;
        IF c_elsewhere IS NOT NULL THEN
            FOR rec IN
                SELECT e.o AS owner, max(e.n)::bigint AS held
                  FROM unnest(c_owner, c_units, c_elsewhere) AS e(o, q, n)
                 WHERE e.o IS NOT NULL AND e.q IS NOT NULL AND e.n IS NOT NULL
                 GROUP BY 1
            LOOP
                ui := array_position(u_key, rec.owner);
                IF ui IS NULL THEN
                    u_key := u_key || rec.owner;
                    u_held := u_held || rec.held;
                ELSE
                    u_held[ui] := u_held[ui] + rec.held;
                END IF;
            END LOOP;
        END IF;
    END IF;

    -- 5. Decide every command in arrival order, in memory: each one sees what the commands
    --    before it decided, so a group answers exactly as the same commands one per batch.
    --    Everything a command writes carries its partition's fenced epoch `e`.
    FOR k IN 1 .. n LOOP
        o_ord := k;
        o_replayed := false;
        o_status := NULL; o_sku := NULL; o_quantity := NULL; o_expires := NULL; o_epoch := NULL;
        o_partition := c_partition[k]; o_available := NULL; o_on_hand := NULL; o_detail := NULL;
        fp := array_position(ok_part, c_partition[k]);
        IF fp IS NULL THEN
            -- The fence failed: the caller learns the lease's current epoch (421 upstream).
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
            IF j IS NOT NULL AND NOT (coalesce(c_any[k], true) OR r_owner[j] IS NULL
                                      OR r_owner[j] IS NOT DISTINCT FROM c_owner[k]) THEN
                -- Another client's id: answered as an unknown reservation (V18__owners.sql).
                o_result := 'not_found';
                o_detail := format('reservation %s does not exist', c_id[k]);
            ELSIF j IS NOT NULL THEN
                -- A known id replays its stored outcome, whatever happened since; the same id
                -- with another payload is a mismatch (422), never a second reservation.
                IF r_sku[j] <> c_sku[k] OR r_qty[j] <> c_amount[k] OR r_ttl[j] <> c_ttl[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('reservation %s already exists for sku %s quantity %s ttl_seconds %s',
                                       c_id[k], r_sku[j], r_qty[j], r_ttl[j]);
                ELSIF r_status[j] = 'rejected' AND r_qname[j] = 'max_held_units' THEN
                    o_result := 'quota_units'; o_replayed := true; o_quantity := r_quota[j];
                    o_available := coalesce(r_refusal[j], 0);
                    o_detail := format('reservation %s was refused: its client held %s units; its max_held_units was %s',
                                       c_id[k], o_available, r_quota[j]);
                ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                    o_result := 'quota'; o_replayed := true; o_quantity := r_quota[j];
                    o_available := coalesce(r_refusal[j], 0);
                    o_detail := format('reservation %s was refused: its client held %s of sku %s; its max_held_per_sku was %s',
                                       c_id[k], o_available, r_sku[j], r_quota[j]);
                ELSIF r_status[j] = 'rejected' THEN
                    o_result := 'insufficient'; o_replayed := true;
                    o_available := coalesce(r_refusal[j], 0);
                ELSE
                    o_result := 'replayed'; o_replayed := true;
                    o_status := r_status[j]; o_sku := r_sku[j]; o_quantity := r_qty[j];
                    o_expires := r_exp[j]; o_epoch := r_epoch[j]; o_partition := r_part[j];
                END IF;
            ELSIF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL AND s IS NOT NULL
              AND coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0)
                  + c_amount[k] > c_quota[k] THEN
                -- Over the client's max_held_per_sku: stored as a refusal (V21), so a late
                -- duplicate of the id replays it.
                o_result := 'quota'; o_quantity := c_quota[k];
                o_available := coalesce(q_held[array_position(q_key, c_owner[k] || '/' || c_sku[k])], 0);
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true;
                r_expired_by := r_expired_by || NULL::integer;
                r_owner := r_owner || c_owner[k];
                r_status := r_status || 'rejected'::text; r_exp := r_exp || NULL::timestamptz;
                r_refusal := r_refusal || o_available;
                r_quota[array_length(r_id, 1)] := c_quota[k];
                r_qname[array_length(r_id, 1)] := 'max_held_per_sku';
                z_id := z_id || c_id[k]; z_limit := z_limit || c_quota[k];
                z_name := z_name || 'max_held_per_sku'::text;
                o_detail := format('client %s holds %s of sku %s and asked for %s more; its max_held_per_sku is %s',
                                   c_owner[k], o_available, c_sku[k], c_amount[k], c_quota[k]);
            ELSIF c_units[k] IS NOT NULL AND c_owner[k] IS NOT NULL AND s IS NOT NULL
              AND coalesce(u_held[array_position(u_key, c_owner[k])], 0) + c_amount[k] > c_units[k] THEN
                -- Over the client's max_held_units: stored as a refusal (V22).
                o_result := 'quota_units'; o_quantity := c_units[k];
                o_available := coalesce(u_held[array_position(u_key, c_owner[k])], 0);
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true;
                r_expired_by := r_expired_by || NULL::integer;
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
                -- Unknown SKU: nothing is recorded, not even in this batch's memory, so the same
                -- id works once the SKU is stocked, later in this batch as in a later one.
                o_result := 'not_found';
                o_detail := format('sku %s is not stocked', c_sku[k]);
            ELSE
                -- A new id: decrement if available, else a durable refusal ('rejected'), so a
                -- retry of the id always gets the same outcome.
                r_id := r_id || c_id[k]; r_sku := r_sku || c_sku[k]; r_part := r_part || c_partition[k];
                r_qty := r_qty || c_amount[k]; r_epoch := r_epoch || e; r_ttl := r_ttl || c_ttl[k];
                r_new := r_new || true; r_dirty := r_dirty || true;
                r_expired_by := r_expired_by || NULL::integer;
                r_owner := r_owner || c_owner[k];
                j := array_length(r_id, 1);
                IF i_avail[s] >= c_amount[k] THEN
                    q := c_amount[k];
                    i_avail[s] := i_avail[s] - q; i_held[s] := i_held[s] + q; i_dirty[s] := true;
                    r_status := r_status || 'held'::text;
                    r_exp := r_exp || (t_now + c_ttl[k] * interval '1 second');
                    r_refusal := r_refusal || NULL::bigint;
                    l_sku := l_sku || c_sku[k]; l_part := l_part || c_partition[k];
                    l_kind := l_kind || 'reserve'::text;
                    l_rid := l_rid || c_id[k]; l_aid := l_aid || NULL::text;
                    l_on_hand := l_on_hand || 0::bigint; l_avail := l_avail || (-q);
                    l_held := l_held || q; l_conf := l_conf || 0::bigint; l_epoch := l_epoch || e;
                    o_result := 'created'; o_status := 'held'; o_sku := c_sku[k]; o_quantity := q;
                    -- The grant counts against the client's quotas for the commands after it.
                    IF c_units[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        ui := array_position(u_key, c_owner[k]);
                        IF ui IS NULL THEN
                            u_key := u_key || c_owner[k];
                            u_held := u_held || q;
                        ELSE
                            u_held[ui] := u_held[ui] + q;
                        END IF;
                    END IF;
                    IF c_quota[k] IS NOT NULL AND c_owner[k] IS NOT NULL THEN
                        qi := array_position(q_key, c_owner[k] || '/' || c_sku[k]);
                        IF qi IS NULL THEN
                            q_key := q_key || (c_owner[k] || '/' || c_sku[k]);
                            q_held := q_held || q;
                        ELSE
                            q_held[qi] := q_held[qi] + q;
                        END IF;
                    END IF;
                    o_expires := r_exp[j]; o_epoch := e;
                ELSE
                    r_status := r_status || 'rejected'::text; r_exp := r_exp || NULL::timestamptz;
                    r_refusal := r_refusal || i_avail[s];
                    o_result := 'insufficient'; o_available := i_avail[s];
                END IF;
            END IF;

        ELSIF c_op[k] IN ('confirm', 'release') THEN
            j := array_position(r_id, c_id[k]);
            IF j IS NULL OR r_part[j] <> c_partition[k]
               OR NOT (coalesce(c_any[k], true) OR r_owner[j] IS NULL
                       OR r_owner[j] IS NOT DISTINCT FROM c_owner[k]) THEN
                o_result := 'not_found';
                o_detail := format('reservation %s does not exist', c_id[k]);
            ELSIF r_status[j] = 'rejected' AND r_qname[j] = 'max_held_units' THEN
                o_result := 'quota_units'; o_replayed := true; o_quantity := r_quota[j];
                o_available := coalesce(r_refusal[j], 0);
                o_detail := format('reservation %s was refused by its client''s max_held_units (%s)',
                                   c_id[k], r_quota[j]);
            ELSIF r_status[j] = 'rejected' AND r_quota[j] IS NOT NULL THEN
                o_result := 'quota'; o_replayed := true; o_quantity := r_quota[j];
                o_available := coalesce(r_refusal[j], 0);
                o_detail := format('reservation %s was refused by its client''s max_held_per_sku (%s)',
                                   c_id[k], r_quota[j]);
            ELSIF r_status[j] = 'rejected' THEN
                o_result := 'insufficient'; o_replayed := true;
                o_available := coalesce(r_refusal[j], 0);
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
                -- The hold no longer counts against its client's quotas.
                qi := array_position(q_key, r_owner[j] || '/' || r_sku[j]);
                IF qi IS NOT NULL THEN
                    q_held[qi] := q_held[qi] - q;
                END IF;
                ui := array_position(u_key, r_owner[j]);
                IF ui IS NOT NULL THEN
                    u_held[ui] := u_held[ui] - q;
                END IF;
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
            IF j IS NOT NULL AND c_owner[k] IS NOT NULL AND a_owner[j] IS NOT NULL
               AND a_owner[j] <> c_owner[k] THEN
                -- Another client's adjustment id: answered as an unknown one (V26).
                o_result := 'not_found';
                o_detail := format('adjustment %s does not exist', c_id[k]);
            ELSIF j IS NOT NULL THEN
                IF a_sku[j] <> c_sku[k] OR a_delta[j] <> c_amount[k] THEN
                    o_result := 'mismatch';
                    o_detail := format('adjustment %s already exists with another sku or delta',
                                       c_id[k]);
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
                    -- A shrink below what is available is refused, and the refusal stored.
                    a_id := a_id || c_id[k]; a_sku := a_sku || c_sku[k]; a_delta := a_delta || q;
                    a_status := a_status || 'refused'::text; a_on_hand := a_on_hand || i_on_hand[s];
                    a_avail := a_avail || i_avail[s]; a_part := a_part || c_partition[k];
                    a_epoch := a_epoch || e; a_new := a_new || true;
                    a_owner := a_owner || c_owner[k];
                    o_result := 'shrink_refused'; o_sku := c_sku[k]; o_quantity := q;
                    o_on_hand := i_on_hand[s]; o_available := i_avail[s];
                ELSE
                    IF s IS NULL THEN
                        -- The first restock of a SKU creates its row.
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
                    a_owner := a_owner || c_owner[k];
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
            -- The sweep's holds were expired in step 4; count the ones this partition's sweep
            -- picked up.
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
    --    cost, and that is most of what a small batch pays). A hot SKU costs one row update per
    --    batch, however many commands touched it.
    --
    --    Every inventory row written records its partition's fenced epoch in highest_epoch. The
    --    row's trigger (inventory_epoch_fence, V1) refuses a lower epoch than the row carries,
    --    whoever the writer: once a newer tenure wrote a SKU, no write of an older one can land on
    --    it, even one that got past a lease check it should not have passed. That second fence
    --    aborts the whole statement (SQLSTATE FA001) rather than write part of it.
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

    -- New reservations, refusals included: the id's primary key decides a race between two
    -- writers of one id (FA004, and the retry replays).
    n_new := coalesce(array_length(array_positions(r_new, true), 1), 0);
    IF n_new > 0 THEN
        INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                                  ttl_seconds, request_fingerprint, available_at_refusal,
                                  expires_at, owner)
        SELECT u.id, u.sku, u.part, u.qty, u.status, u.epoch, u.ttl,
               u.sku || '/' || u.qty || '/' || u.ttl, u.refusal, u.exp, u.owner
          FROM unnest(r_id, r_sku, r_part, r_qty, r_status, r_epoch, r_ttl, r_refusal, r_exp,
                      r_new, r_owner)
               AS u(id, sku, part, qty, status, epoch, ttl, refusal, exp, is_new, owner)
         WHERE u.is_new
        ON CONFLICT (reservation_id) DO NOTHING;
        GET DIAGNOSTICS cnt = ROW_COUNT;
        IF cnt <> n_new THEN
            RAISE EXCEPTION 'reservation id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;
        IF array_length(z_id, 1) > 0 THEN
            UPDATE reservations AS r
               SET refused_quota = z.lim, refused_quota_name = z.name
              FROM unnest(z_id, z_limit, z_name) AS z(id, lim, name)
             WHERE r.reservation_id = z.id;
        END IF;
    END IF;

    IF res_changed THEN
        UPDATE reservations AS r
           SET status = u.status, epoch = u.epoch, updated_at = t_now
          FROM unnest(r_id, r_status, r_epoch, r_new, r_dirty)
               AS u(id, status, epoch, is_new, dirty)
         WHERE r.reservation_id = u.id AND u.dirty AND NOT u.is_new;
    END IF;

    n_new := coalesce(array_length(array_positions(a_new, true), 1), 0);
    IF n_new > 0 THEN
        INSERT INTO adjustments (adjustment_id, sku, partition, delta, status, epoch,
                                 on_hand_after, available_after, owner)
        SELECT u.id, u.sku, u.part, u.delta, u.status, u.epoch, u.on_hand, u.avail, u.owner
          FROM unnest(a_id, a_sku, a_part, a_delta, a_status, a_epoch, a_on_hand, a_avail, a_new,
                      a_owner)
               AS u(id, sku, part, delta, status, epoch, on_hand, avail, is_new, owner)
         WHERE u.is_new
        ON CONFLICT (adjustment_id) DO NOTHING;
        GET DIAGNOSTICS cnt = ROW_COUNT;
        IF cnt <> n_new THEN
            RAISE EXCEPTION 'adjustment id inserted concurrently' USING ERRCODE = 'FA004';
        END IF;
    END IF;

    IF array_length(l_sku, 1) > 0 THEN
        -- Number the rows per partition, in decision order, from the partition's counter
        -- (V12__ledger_positions.sql); the counter row stays locked until commit, so positions
        -- are gap-free and in commit order per partition.
        WITH rows AS (
                 SELECT u.*
                   FROM unnest(l_sku, l_part, l_kind, l_rid, l_aid, l_on_hand, l_avail, l_held,
                               l_conf, l_epoch)
                        WITH ORDINALITY AS u(sku, part, kind, rid, aid, on_hand, avail, held,
                                             conf, epoch, ord)),
             counts AS (
                 SELECT part, count(*) AS n FROM rows GROUP BY part ORDER BY part),
             numbered AS (
                 UPDATE ledger_positions AS p
                    SET last_position = p.last_position + c.n
                   FROM counts AS c
                  WHERE p.partition = c.part
              RETURNING p.partition, p.last_position - c.n AS base)
        INSERT INTO ledger (sku, partition, kind, reservation_id, adjustment_id,
                            d_on_hand, d_available, d_held, d_confirmed, epoch, position)
        SELECT r.sku, r.part, r.kind, r.rid, r.aid, r.on_hand, r.avail, r.held, r.conf, r.epoch,
               b.base + row_number() OVER (PARTITION BY r.part ORDER BY r.ord)
          FROM rows AS r
          LEFT JOIN numbered AS b ON b.partition = r.part
         ORDER BY r.ord;
    END IF;
    RETURN;
END $$;
