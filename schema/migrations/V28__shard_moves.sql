-- V28: a move of a partition between shards is a recorded state machine (DESIGN.md §12, I13).
--
-- `shard_moves` lives on the catalog (every shard has the table; only the catalog's is used): one
-- row per move, in the states planned → fenced → copied → retired → flipped → released, or
-- aborted from any state before flipped. At most one move of a partition is in flight. A mover
-- claims the row for the length of its session (an advisory lock on the catalog keyed by the
-- partition) and writes under a holder id of its own, `move/<partition>/<attempt>`, so a second
-- mover at the same time is refused and a re-run resumes under a new holder at a higher epoch.
--
-- `leases.moving_in` marks, on the target shard, the lease row a move's copy wrote: the shard's
-- own record of a partition that is arriving but not yet its own. No allocator campaigns for
-- such a row and the shard's record does not count it, whether or not the mover's lease has
-- expired; the move's release clears the mark after the map's flip, its abort deletes the row.
CREATE TABLE shard_moves (
    move_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition int NOT NULL CHECK (partition >= 0),
    from_shard text NOT NULL,
    to_shard text NOT NULL CHECK (to_shard <> from_shard),
    state text NOT NULL
        CHECK (state IN ('planned', 'fenced', 'copied', 'retired', 'flipped', 'released',
                         'aborted')),
    attempt int NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    holder_id text NOT NULL,
    -- The highest epoch a mover of this move wrote on either shard (an abort after the retire
    -- restores the source's lease row above it).
    epoch bigint,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK ((finished_at IS NULL) = (state NOT IN ('released', 'aborted')))
);

CREATE UNIQUE INDEX shard_moves_one_in_flight ON shard_moves (partition)
    WHERE state NOT IN ('released', 'aborted');

ALTER TABLE leases ADD COLUMN moving_in boolean NOT NULL DEFAULT false;
