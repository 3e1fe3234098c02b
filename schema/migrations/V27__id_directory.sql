-- V27: one id, one command in the whole cluster (DESIGN.md §12, I3 across shards), and hold
-- quotas counted over every shard (README "Security", DESIGN.md §9).
--
-- The id directory. In a cluster of several shards every reservation id and adjustment id is
-- claimed, before its fenced write, on the shard that holds the id's *home partition*
-- (partition_for(id), the SKU hash applied to the id): one row per (home partition, kind, id)
-- naming the command it was first used for (client, partition, SKU, quantity or delta, TTL). A
-- claim is INSERT ... ON CONFLICT DO NOTHING, then a comparison with the row that is there, so of
-- two uses of an id on two shards, concurrent or not, exactly one claims it. The rows carry their
-- home partition, so they move with it (the mover copies the table like the partition's other
-- rows). A one-database cluster never writes it. A claim is taken only while the shard holds the
-- home partition and no mover holds its lease: the mover's fence takes that row FOR UPDATE, so a
-- claim either commits before the snapshot the copy reads or is refused (and retried).
-- Retention removes a claim once its command's last possible change (created_at + its TTL) is
-- past the idempotency horizon, as it removes the reservation itself.
CREATE TABLE id_claims (
    -- The id's home partition: named `partition` like every partition-scoped table's column, so
    -- a move copies the rows of the partition it moves.
    partition int NOT NULL CHECK (partition >= 0),
    kind text NOT NULL CHECK (kind IN ('reservation', 'adjustment')),
    id text NOT NULL,
    owner text,
    sku_partition int NOT NULL CHECK (sku_partition >= 0),
    sku text NOT NULL,
    amount bigint NOT NULL,
    ttl_seconds bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    settled_by timestamptz NOT NULL,
    PRIMARY KEY (partition, kind, id)
);
CREATE INDEX id_claims_settled_by ON id_claims (settled_by);

-- Hold quotas over every shard. apply_fenced_batch takes, per reserve, what its client holds on
-- the cluster's other shards as its router read it just before (c_elsewhere; NULL: nothing, the
-- default, so an earlier build's call keeps its behaviour) and counts it with what the client
-- holds here. What it holds here counts only partitions this shard holds: a partition that moved
-- away leaves a frozen copy of its holds behind, which is no longer anybody's hold.
DO $migrate$
DECLARE
    definition text;
    edits constant text[][] := ARRAY[
        ARRAY['c_units bigint[] DEFAULT NULL::bigint[])',
              'c_units bigint[] DEFAULT NULL::bigint[], c_elsewhere bigint[] DEFAULT NULL::bigint[])',
              '1'],
        ARRAY[$o$               AND r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
             GROUP BY 1
        LOOP
            u_key := u_key || rec.owner;
            u_held := u_held || rec.held;
        END LOOP;$o$,
              $n$               AND r.status = 'held' AND r.owner IS NOT NULL AND r.expires_at > t_now
               AND EXISTS (SELECT 1 FROM leases l WHERE l.partition = r.partition)
             GROUP BY 1
        LOOP
            u_key := u_key || rec.owner;
            u_held := u_held || rec.held;
        END LOOP;
        -- V27: what the client holds on the other shards.
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
            RAISE EXCEPTION 'apply_fenced_batch: V27 edit % matches % times, expected %: %',
                i, found, edits[i][3], edits[i][1];
        END IF;
        definition := replace(definition, edits[i][1], edits[i][2]);
    END LOOP;
    DROP FUNCTION apply_fenced_batch(text, integer[], bigint[], integer[], text[], text[], text[],
                                     bigint[], integer[], text[], boolean[], bigint[], bigint[]);
    EXECUTE definition;
END $migrate$;
