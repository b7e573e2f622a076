//! `shale-bench`: Shale's benchmarks, printed (never asserted), each against a baseline
//! measured in the same run.
//!
//! - `shale-bench ingest --docs 1000000`: HTTP ingest end to end vs raw Tantivy indexing, and
//!   search latency.
//! - `shale-bench merge`: a merge of 10 splits x 100 000 docs through Shale's merge worker vs
//!   raw Tantivy `merge_indices` of the same inputs.
//! - `shale-bench compaction --docs 2000000`: sustained ingest with the default merge policy:
//!   split count and write amplification, search before and after compaction.
//! - `shale-bench cluster`: three `shale run` processes vs one on the same corpus: ingest
//!   throughput, a query over ≥ 50 splits through one root, placement balance, cache hits.
//! - `shale-bench locality`: `stable_log` vs `locality` compaction on the same replayed corpus:
//!   splits opened and latency of single-key queries, split count, bytes, write
//!   amplification, locality merge throughput vs raw Tantivy `merge_indices`.
//! - `shale-bench deletes`: deletes of 1 %, 10 % and 30 % of 1 M documents: search latency
//!   before vs after the purge, a delete compaction vs a raw Tantivy rewrite of the same
//!   split, bytes reclaimed.
//! - `shale-bench remote`: search on S3 (moto unless `--s3-endpoint`): 10 splits x 100 000
//!   docs read by byte ranges vs downloaded whole, cold and warm, latency and bytes fetched.
//! - `shale-bench metadata`: the metastore cost of a search and of a planning round with
//!   10 000 published splits and 1 000 delete tasks, with the delete history bounded as Shale
//!   keeps it vs unbounded, on SQLite and PostgreSQL.
//! - `shale-bench split-format`: one split of the same corpus per document store option
//!   (zstd level, block size): build time, split bytes by part, document fetch latency.
//! - `shale-bench metrics`: Prometheus remote write of 10 000 series every 10 s for 2 h into
//!   Shale, Prometheus 2.42 and VictoriaMetrics 1.79 (started by the bench when on `PATH`):
//!   samples/s, bytes per sample (Shale before and after compaction), `query_range` p50/p99
//!   of three shapes, Shale's metrics merge vs a plain read-sort-write, the ratios and targets.

mod cluster;
mod compaction;
mod corpus;
mod deletes;
mod ingest;
mod locality;
mod merge;
mod metadata;
mod metrics;
mod remote;
mod search;
mod split_format;

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Ingest throughput vs raw Tantivy, and search latency.
    Ingest(ingest::Args),
    /// Merge throughput vs raw Tantivy merge_indices.
    Merge(merge::Args),
    /// Compaction under sustained ingest.
    Compaction(compaction::Args),
    /// Three nodes vs one: ingest, distributed search, placement, cache affinity.
    Cluster(cluster::Args),
    /// stable_log vs locality compaction: splits opened by single-key queries, and more.
    Locality(locality::Args),
    /// Deletes of 1 %, 10 %, 30 %: search before/after purge, delete compaction vs raw.
    Deletes(deletes::Args),
    /// Search latency vs raw in-process Tantivy on the same splits.
    Search(search::Args),
    /// Search on S3: splits read by byte ranges vs downloaded whole (cold and warm).
    Remote(remote::Args),
    /// Metastore cost of a search and a planning round with 10 000 splits and 1 000 delete
    /// tasks, bounded vs unbounded delete history, SQLite and PostgreSQL.
    Metadata(metadata::Args),
    /// Document store options: build time, split bytes, document fetch latency per option.
    SplitFormat(split_format::Args),
    /// Remote write and PromQL: Shale vs Prometheus and VictoriaMetrics on the same samples
    /// (ingest, bytes per sample, query latency), before and after compaction.
    Metrics(metrics::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("SHALE_LOG").unwrap_or_else(|_| "warn".into()),
        ))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Ingest(args) => ingest::run(args).await,
        Command::Merge(args) => merge::run(args).await,
        Command::Compaction(args) => compaction::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
        Command::Locality(args) => locality::run(args).await,
        Command::Deletes(args) => deletes::run(args).await,
        Command::Search(args) => search::run(args).await,
        Command::Remote(args) => remote::run(args).await,
        Command::Metadata(args) => metadata::run(args).await,
        Command::Metrics(args) => metrics::run(args).await,
        Command::SplitFormat(args) => split_format::run(args).await,
    }
}
