//! shale-ingest (being written).
