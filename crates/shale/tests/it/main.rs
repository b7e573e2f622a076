//! The integration tests of `shale`, in one binary (one link of the whole dependency
//! graph instead of one per file): each module is one area.

mod common;

mod chaos;
mod cli;
mod cluster;
mod compaction_crash;
mod crash;
mod data_dir;
mod delete_crash;
mod metrics_crash;
mod plan;
mod secrets;
mod simulate;
mod tls;
mod version;
