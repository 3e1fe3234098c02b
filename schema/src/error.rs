//! The one error of the schema's PostgreSQL side: migrating, initialising and reading the
//! cluster's own records. Its own module so that the readers (`shard::store`) and `migrate`,
//! which uses them, both depend on it and not on each other.

use crate::partition::MAX_PARTITIONS;
use crate::shard::ShardError;

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("database error: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
    #[error(
        "cluster was initialised with {existing} partitions; refusing to change it to {requested}"
    )]
    PartitionCountMismatch { existing: u32, requested: u32 },
    #[error("partition count must be between 1 and {MAX_PARTITIONS}, got {0}")]
    InvalidPartitionCount(u32),
    #[error("cluster is not initialised: run `allocator migrate` first")]
    NotInitialised,
    #[error("the ledger's partition span must be a whole number of seconds, at least 1")]
    InvalidLedgerSpan,
    #[error("{0}")]
    Shard(#[from] ShardError),
    /// A file's text changed without a new revision: databases that installed the revision
    /// would otherwise hold two texts under one number.
    #[error(
        "schema/functions/{name}.sql is not the text revision {revision} installed in this \
         database; a changed function needs a new revision (schema/src/functions/mod.rs)"
    )]
    FunctionFileChanged { name: &'static str, revision: i32 },
    #[error("schema/functions/{name}.sql did not leave one function named {name}")]
    FunctionFileDefinesNothing { name: &'static str },
}
