-- The ledger partitioned by time, so that settled history can be archived and dropped a
-- partition at a time (DESIGN.md §8a, "The ledger by time").
--
-- Partition key: recorded_at, the transaction start a row is stamped with (now()). Settlement
-- cuts its windows by recorded_at (V4), so "every window of this partition is settled" is one
-- comparison: the settled range reaches the partition's end. written_at (clock_timestamp() at
-- insert) would put a confirmation stamped before a window's end into a partition after it.
-- Settlement's window query also prunes to the partitions of its window.
--
-- Layout: the partition holding everything before the first boundary after this migration
-- (on an existing database the old ledger itself, attached without copying a row: one scan
-- validates the bound), then one partition per span (ledger_partitioning.span, 1 day unless
-- `allocator migrate --ledger-partition-span-secs` says otherwise), aligned to the Unix epoch
-- and created ahead by ledger_ensure_partitions(), which every replica runs.
--
-- A partitioned table's unique indexes must contain the partition key, so the two unique keys
-- of the old table (entry_id; partition and position, the relay's read path, V12) become
-- unique indexes of each partition (ledger_guard_partition()): a position is unique within the
-- partition its transaction started in, and the partition's counter (V12) makes it unique in
-- its stream. The other indexes (ledger_sku, ledger_adjustment_id, settlement's
-- ledger_confirmed_at and any added before this migration) are recreated on the parent from the
-- old table's catalog, so every partition has them; every column, default and CHECK the ledger
-- has when this runs is carried over (LIKE), and so are its triggers: the row triggers (append
-- only, V12's numbering) on the parent, which gives them to every partition; TRUNCATE, a
-- statement-level event of each table, is refused on the parent and on every partition.

CREATE TABLE ledger_partitioning (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Length of each partition from now on; whole seconds.
    span      interval NOT NULL CHECK (extract(epoch FROM span) >= 1
                                       AND extract(epoch FROM span) = trunc(extract(epoch FROM span)))
);

-- The attached partitions and their bounds, oldest first; the first has no lower bound.
CREATE TABLE ledger_partitions (
    name        text PRIMARY KEY,
    range_start timestamptz,
    range_end   timestamptz NOT NULL UNIQUE,
    CHECK (range_start IS NULL OR range_start < range_end)
);

-- Every archived partition: what its file holds (rows, entry ids, sums) and the file's SHA-256.
-- Archived partitions are always the oldest, so the ledger in the database is the history from
-- the last range_end on.
CREATE TABLE ledger_archives (
    name           text PRIMARY KEY,
    range_start    timestamptz,
    range_end      timestamptz NOT NULL UNIQUE,
    rows           bigint NOT NULL CHECK (rows >= 0),
    first_entry_id bigint,
    last_entry_id  bigint,
    d_on_hand      bigint NOT NULL,
    d_available    bigint NOT NULL,
    d_held         bigint NOT NULL,
    d_confirmed    bigint NOT NULL,
    file           text NOT NULL,
    sha256         text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    archived_at    timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER ledger_archives_append_only BEFORE UPDATE OR DELETE ON ledger_archives
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
CREATE TRIGGER ledger_archives_no_truncate BEFORE TRUNCATE ON ledger_archives
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();

-- Per SKU, the sums of every archived row: with them the ledger in the database still sums to
-- each inventory row (archived totals + live rows), and a checker replays from them.
CREATE TABLE ledger_archived_totals (
    sku         text PRIMARY KEY,
    rows        bigint NOT NULL,
    d_on_hand   bigint NOT NULL,
    d_available bigint NOT NULL,
    d_held      bigint NOT NULL,
    d_confirmed bigint NOT NULL
);

-- The per-partition guards and unique keys (see above). Idempotent.
CREATE FUNCTION ledger_guard_partition(p text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass(quote_ident(p || '_entry_id')) IS NULL THEN
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (entry_id)', p || '_entry_id', p);
    END IF;
    IF to_regclass(quote_ident(p || '_partition_position')) IS NULL THEN
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I (partition, position)',
                       p || '_partition_position', p);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                    WHERE tgrelid = p::regclass AND tgname = 'ledger_no_truncate') THEN
        EXECUTE format('CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON %I
                            FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only()', p);
    END IF;
END $$;

-- Create partitions until the last one ends at least max(3 spans, 1 minute) from now; returns how
-- many it created. Each is created as a table of its own and then attached, which locks the
-- ledger only in SHARE UPDATE EXCLUSIVE mode: inserts go on meanwhile. One caller at a time
-- (the others return 0 at once).
CREATE FUNCTION ledger_ensure_partitions() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s        interval;
    last_end timestamptz;
    p        text;
    made     integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(4993105122470401617) THEN
        RETURN 0;
    END IF;
    SELECT span INTO s FROM ledger_partitioning;
    SELECT max(range_end) INTO last_end FROM ledger_partitions;
    WHILE last_end < now() + greatest(3 * s, interval '1 minute') LOOP
        p := 'ledger_' || to_char(last_end AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
        EXECUTE format('CREATE TABLE %I (LIKE ledger INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                         INCLUDING GENERATED)', p);
        PERFORM ledger_guard_partition(p);
        EXECUTE format('ALTER TABLE ledger ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       p, last_end, last_end + s);
        INSERT INTO ledger_partitions (name, range_start, range_end)
        VALUES (p, last_end, last_end + s);
        last_end := last_end + s;
        made := made + 1;
    END LOOP;
    RETURN made;
END $$;

-- The conversion. The old ledger becomes the first partition, everything before first_end.
DO $convert$
DECLARE
    span constant interval := coalesce(
        nullif(current_setting('allocator.ledger_partition_span', true), '')::interval,
        interval '1 day');
    secs      constant double precision := extract(epoch FROM span);
    first_end constant timestamptz := to_timestamp((floor(extract(epoch FROM now()) / secs) + 1) * secs);
    first     constant text := 'ledger_before_' || to_char(first_end AT TIME ZONE 'UTC',
                                                             'YYYYMMDD"_"HH24MISS');
    ix        record;
    tg        record;
    cols      text;
    parent_ix text[] := '{}';
    parent_tg text[] := '{}';
    def       text;
BEGIN
    LOCK TABLE ledger IN ACCESS EXCLUSIVE MODE;
    FOR ix IN
        SELECT c.relname AS name, i.indisunique AS uniq, i.indpred IS NOT NULL AS partial,
               pg_get_indexdef(i.indexrelid) AS def,
               (SELECT string_agg(a.attname, ',' ORDER BY k.n)
                  FROM unnest(i.indkey) WITH ORDINALITY AS k(att, n)
                  JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.att) AS cols
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE i.indrelid = 'ledger'::regclass
    LOOP
        IF ix.uniq THEN
            IF ix.partial OR ix.cols NOT IN ('entry_id', 'partition,position') THEN
                RAISE EXCEPTION 'ledger index % is unique on (%): a partitioned ledger cannot keep it',
                    ix.name, ix.cols;
            END IF;
            cols := CASE ix.cols WHEN 'entry_id' THEN '_entry_id' ELSE '_partition_position' END;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.name, first || cols);
        ELSE
            parent_ix := parent_ix || ix.def;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', ix.name,
                           first || '_' || regexp_replace(ix.name, '^ledger_', ''));
        END IF;
    END LOOP;
    FOR tg IN
        SELECT tgname, pg_get_triggerdef(oid) AS def, (tgtype & 1) = 1 AS per_row
          FROM pg_trigger WHERE tgrelid = 'ledger'::regclass AND NOT tgisinternal
    LOOP
        parent_tg := parent_tg || tg.def;
        -- A row trigger of the parent is given to every partition on attach.
        IF tg.per_row THEN
            EXECUTE format('DROP TRIGGER %I ON ledger', tg.tgname);
        END IF;
    END LOOP;

    EXECUTE format('ALTER TABLE ledger RENAME TO %I', first);
    EXECUTE format('CREATE TABLE ledger (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                         INCLUDING GENERATED INCLUDING COMMENTS)
                        PARTITION BY RANGE (recorded_at)', first);
    -- The entry_id sequence belongs to the parent, so dropping an archived partition keeps it.
    EXECUTE format('ALTER SEQUENCE %s OWNED BY ledger.entry_id',
                   pg_get_serial_sequence(first, 'entry_id'));
    -- The definitions name the table as `ledger`, now the parent.
    FOREACH def IN ARRAY parent_ix LOOP
        EXECUTE def;
    END LOOP;
    FOREACH def IN ARRAY parent_tg LOOP
        EXECUTE def;
    END LOOP;

    PERFORM ledger_guard_partition(first);
    EXECUTE format('ALTER TABLE ledger ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%L)',
                   first, first_end);
    INSERT INTO ledger_partitioning (span) VALUES (span);
    INSERT INTO ledger_partitions (name, range_start, range_end) VALUES (first, NULL, first_end);
END $convert$;

SELECT ledger_ensure_partitions();

-- Why the oldest partition `p` cannot be archived yet, or NULL when it can: its rows must all be
-- older than the horizon, every settlement window over them settled, and, when the cluster
-- relays change events (`require_relay`, or any stream ever published), every position in it
-- published. Only the oldest partition can go, so the ledger stays one contiguous history.
CREATE FUNCTION ledger_archive_refusal(p text, horizon interval, require_relay boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    part     ledger_partitions;
    settled  timestamptz;
    behind   text;
BEGIN
    SELECT * INTO part FROM ledger_partitions WHERE name = p;
    IF NOT FOUND THEN
        RETURN format('%s is not an attached ledger partition', p);
    END IF;
    IF EXISTS (SELECT 1 FROM ledger_partitions WHERE range_end < part.range_end) THEN
        RETURN format('%s is not the oldest partition', p);
    END IF;
    IF part.range_end > now() - horizon THEN
        RETURN format('inside the idempotency horizon: it ends at %s, the horizon reaches back to %s',
                      part.range_end, now() - horizon);
    END IF;
    SELECT max(window_end) INTO settled FROM settlement_runs WHERE status = 'settled';
    IF settled IS NULL OR settled < part.range_end THEN
        RETURN format('not settled: it ends at %s, settlement has settled up to %s',
                      part.range_end, coalesce(settled::text, 'nothing'));
    END IF;
    IF require_relay OR EXISTS (SELECT 1 FROM event_relay_progress WHERE published > 0) THEN
        EXECUTE format(
            'SELECT string_agg(format(''%%s published to %%s of %%s'', e.stream, e.published, m.top), '', '')
               FROM event_relay_progress AS e
              CROSS JOIN LATERAL (SELECT max(position) AS top FROM %I
                                   WHERE partition = split_part(e.stream, ''/'', 2)::integer) AS m
              WHERE e.stream LIKE ''partition/%%'' AND m.top > e.published', p)
            INTO behind;
        IF behind IS NOT NULL THEN
            RETURN 'not relayed: ' || behind;
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- Archive the oldest partition `p` once its export is written: refused (the reason returned,
-- nothing changed) unless ledger_archive_refusal() allows it; fails if the partition does not
-- hold exactly the `exported` rows the file holds. Records the archive and adds the partition's
-- per-SKU sums to ledger_archived_totals, then detaches and drops it, in one transaction: the
-- rows are either in the ledger or in the archive's record, never both or neither. The detach
-- takes the ledger's ACCESS EXCLUSIVE lock until commit (catalog changes only); the caller bounds
-- the wait with lock_timeout.
CREATE FUNCTION ledger_archive_detach(p text, horizon interval, require_relay boolean,
                                      exported bigint, file text, sha256 text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    refusal text;
    part    ledger_partitions;
    a       record;
BEGIN
    refusal := ledger_archive_refusal(p, horizon, require_relay);
    IF refusal IS NOT NULL THEN
        RETURN refusal;
    END IF;
    SELECT * INTO part FROM ledger_partitions WHERE name = p;
    EXECUTE format('SELECT count(*) AS rows, min(entry_id) AS first, max(entry_id) AS last,
                           coalesce(sum(d_on_hand), 0) AS on_hand,
                           coalesce(sum(d_available), 0) AS available,
                           coalesce(sum(d_held), 0) AS held,
                           coalesce(sum(d_confirmed), 0) AS confirmed
                      FROM %I', p) INTO a;
    IF a.rows <> exported THEN
        RAISE EXCEPTION 'ledger partition % holds % rows, its export %', p, a.rows, exported;
    END IF;
    EXECUTE format('INSERT INTO ledger_archived_totals AS t
                        (sku, rows, d_on_hand, d_available, d_held, d_confirmed)
                    SELECT sku, count(*), sum(d_on_hand), sum(d_available), sum(d_held),
                           sum(d_confirmed)
                      FROM %I GROUP BY sku
                    ON CONFLICT (sku) DO UPDATE
                       SET rows = t.rows + EXCLUDED.rows,
                           d_on_hand = t.d_on_hand + EXCLUDED.d_on_hand,
                           d_available = t.d_available + EXCLUDED.d_available,
                           d_held = t.d_held + EXCLUDED.d_held,
                           d_confirmed = t.d_confirmed + EXCLUDED.d_confirmed', p);
    INSERT INTO ledger_archives (name, range_start, range_end, rows, first_entry_id,
                                 last_entry_id, d_on_hand, d_available, d_held, d_confirmed,
                                 file, sha256)
    VALUES (p, part.range_start, part.range_end, a.rows, a.first, a.last, a.on_hand,
            a.available, a.held, a.confirmed, file, sha256);
    EXECUTE format('ALTER TABLE ledger DETACH PARTITION %I', p);
    EXECUTE format('DROP TABLE %I', p);
    DELETE FROM ledger_partitions WHERE name = p;
    RETURN NULL;
END $$;
