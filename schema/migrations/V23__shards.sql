-- V23: shards. Every database is one shard of the cluster: `shard_identity` is its own record
-- (its name, and whether it is the catalog); the partitions it holds are its partition lease
-- rows, which only its `allocator migrate` creates. The catalog database (the first shard) also
-- holds the shard map: the shards, and which shard holds each partition, under a revision that
-- rises with every change. One database is the default: a shard named `main`, holding every
-- partition, that is its own catalog.
--
-- The tables are created empty; `allocator migrate` fills them (schema::migrate), because the
-- lease rows a shard holds are created there too.

CREATE TABLE shard_identity (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    shard text NOT NULL CHECK (shard ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    catalog boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE shards (
    shard text PRIMARY KEY CHECK (shard ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    ordinal int NOT NULL UNIQUE CHECK (ordinal >= 0)
);

CREATE TABLE shard_map (
    partition int PRIMARY KEY CHECK (partition >= 0),
    shard text NOT NULL REFERENCES shards (shard),
    revision bigint NOT NULL
);

CREATE SEQUENCE shard_map_revision;
