-- V24: partitions moved in from another shard (`allocator shards move`, DESIGN.md §12). A move
-- copies the partition's ledger rows up to the move from the source, which keeps its own copy
-- and settles it; this shard must not settle the copied range again. One row per move in: the
-- positions of the partition's ledger copied from `source_shard`.
CREATE TABLE partition_moves_in (
    partition int NOT NULL CHECK (partition >= 0),
    from_position bigint NOT NULL,
    through_position bigint NOT NULL CHECK (through_position >= from_position),
    source_shard text NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, from_position)
);
