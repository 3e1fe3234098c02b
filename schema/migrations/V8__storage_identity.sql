-- The database's identity and generation, for storage-level fencing (DESIGN.md §13).
--
-- cluster_id names this logical database. A standby made from it carries the same row; a
-- restored copy is given a new cluster_id before any service may use it (ops/restore.sh), so a
-- service that works with the live database refuses the copy even though PostgreSQL's system
-- identifier is the same. serving = false keeps every service away while a restored copy is
-- verified.
--
-- generation rises at every promotion: stamped by storage_stamp() when an allocator first
-- connects to a primary whose WAL timeline is newer than the one recorded here, or by the HA
-- manager's promotion hook (`SELECT storage_stamp(true)`), which is what orders primaries where
-- the timeline cannot be read.
CREATE TABLE storage_identity (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cluster_id    uuid NOT NULL DEFAULT gen_random_uuid(),
    generation    bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    -- The timeline the current generation was stamped on.
    timeline      integer NOT NULL,
    serving       boolean NOT NULL DEFAULT true,
    restored_from uuid,
    stamped_at    timestamptz NOT NULL DEFAULT now()
);

-- The WAL timeline this server writes: the name of the current WAL file carries it from the
-- moment of promotion (pg_control_checkpoint() only after the next checkpoint).
CREATE FUNCTION storage_timeline() RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;

INSERT INTO storage_identity (timeline) VALUES (storage_timeline());

-- A generation never goes back.
CREATE FUNCTION storage_identity_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'storage generation may not go back (% -> %)', OLD.generation, NEW.generation
            USING ERRCODE = 'FA020';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER storage_identity_guard BEFORE UPDATE ON storage_identity
    FOR EACH ROW EXECUTE FUNCTION storage_identity_guard();
CREATE FUNCTION storage_identity_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'storage_identity is never deleted or truncated' USING ERRCODE = 'FA020';
END $$;
CREATE TRIGGER storage_identity_no_delete BEFORE DELETE OR TRUNCATE ON storage_identity
    FOR EACH STATEMENT EXECUTE FUNCTION storage_identity_no_delete();

-- Stamp a new generation when this server writes a newer timeline than the recorded one (it was
-- promoted), or always with force => true (a promotion hook). Returns the row as it is now.
CREATE FUNCTION storage_stamp(force boolean DEFAULT false)
RETURNS TABLE (cluster_id uuid, generation bigint, timeline integer)
LANGUAGE sql VOLATILE AS $$
    UPDATE storage_identity s
       SET generation = s.generation + 1, timeline = storage_timeline(), stamped_at = now()
     WHERE force OR s.timeline < storage_timeline();
    SELECT s.cluster_id, s.generation, s.timeline FROM storage_identity s;
$$;
