//! Ingestion: the write-ahead log (one mrecordlog queue per shard), the router that validates
//! documents and appends them to their shard, and the indexing pipeline that drains shards into
//! splits: WAL → parse → split builder (per partition) → upload → publish with the checkpoint
//! delta (one metastore transaction) → truncate the WAL.

pub mod live;
pub mod metrics;
pub mod opstamps;
pub mod pipeline;
pub mod router;
pub mod wal;

pub use live::{LiveError, LiveSamples};
pub use opstamps::DeleteOpstamps;
pub use pipeline::{PipelineEnv, PipelineHandle, PipelineParams};
pub use router::{
    validate, CommitMode, InFlightPermit, IngestError, IngestLimits, IngestOutcome, IngestRouter,
    ShardStatus, Validated,
};
pub use wal::{PersistPolicy, Wal, WalError};
