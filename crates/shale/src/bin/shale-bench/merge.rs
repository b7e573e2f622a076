//! `shale-bench merge`: 10 splits x 100 000 documents merged through Shale's merge worker
//! (claim → download through the split cache → merge → upload → atomic publish, on a real
//! SQLite metastore and local-FS storage) vs raw Tantivy `merge_indices` of the same inputs,
//! measured in the same run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use shale_compaction::service::{execute_merge, CompactionEnv};
use shale_config::{CompactionConfig, IndexConfig};
use shale_index::{DocMapper, SplitBuilder};
use shale_metastore::{open_metastore, NewMergeTask};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::{new_ulid, now_unix_secs, CheckpointDelta, SplitMaturity, SplitMetadata};
use tantivy::directory::MmapDirectory;

use crate::corpus;

#[derive(clap::Args)]
pub struct Args {
    /// Input splits.
    #[arg(long, default_value_t = 10)]
    splits: usize,
    /// Documents per input split.
    #[arg(long, default_value_t = 100_000)]
    docs_per_split: usize,
    /// Runs of each merge (the best is reported).
    #[arg(long, default_value_t = 2)]
    runs: usize,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let total = args.splits * args.docs_per_split;
    eprintln!("generating {total} documents…");
    let lines = corpus::generate(total, 7);
    let config = IndexConfig::parse(corpus::INDEX_YAML.as_bytes())?;
    let mapper = Arc::new(DocMapper::for_index(&config)?);
    let work = tempfile::tempdir()?;

    eprintln!("building {} input splits…", args.splits);
    let mut bundles: Vec<(PathBuf, shale_index::BuiltSplit)> = Vec::new();
    for (i, chunk) in lines.chunks(args.docs_per_split).enumerate() {
        let mapper = mapper.clone();
        let dir = work.path().join(format!("input-{i}"));
        let chunk = chunk.to_vec();
        let built = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut builder = SplitBuilder::new(mapper.clone(), &dir, 128 * 1024 * 1024)?;
            for line in &chunk {
                builder.add(mapper.parse_doc(line.as_bytes())?)?;
            }
            Ok(builder.finish()?)
        })
        .await??;
        bundles.push((built.path.clone(), built));
    }
    let input_bytes: u64 = bundles.iter().map(|(_, b)| b.size_bytes).sum();

    // Baseline: raw Tantivy merge_indices of the same inputs (unpacked to plain directories).
    let mut raw_best = f64::MAX;
    for run in 0..args.runs {
        let dirs: Vec<PathBuf> = (0..bundles.len())
            .map(|i| work.path().join(format!("raw-{run}-in-{i}")))
            .collect();
        for ((bundle, _), dir) in bundles.iter().zip(&dirs) {
            std::fs::create_dir_all(dir)?;
            shale_index::unpack_split(bundle, dir)?;
        }
        let out = work.path().join(format!("raw-{run}-out"));
        std::fs::create_dir_all(&out)?;
        let elapsed = tokio::task::spawn_blocking(move || -> anyhow::Result<f64> {
            let indices = dirs
                .iter()
                .map(tantivy::Index::open_in_dir)
                .collect::<Result<Vec<_>, _>>()?;
            let started = Instant::now();
            let merged = tantivy::indexer::merge_indices(&indices, MmapDirectory::open(&out)?)?;
            let elapsed = started.elapsed().as_secs_f64();
            anyhow::ensure!(
                merged.reader()?.searcher().num_docs() as usize == total,
                "raw merge lost documents"
            );
            Ok(elapsed)
        })
        .await??;
        raw_best = raw_best.min(elapsed);
    }

    // Shale: the same inputs as published splits, merged by the worker.
    let data = work.path().join("node");
    let metastore = open_metastore(&format!("sqlite://{}/metastore.db", data.display())).await?;
    let storages = IndexStorages::new(
        StorageResolver::default(),
        format!("file://{}/indexes", data.display()),
    );
    let cache = Arc::new(SplitCache::open(&data.join("cache"), 64 << 30)?);
    let env = CompactionEnv {
        node_id: "bench".into(),
        worker_id: "bench#1".into(),
        metastore: metastore.clone(),
        storages: storages.clone(),
        cache: cache.clone(),
        scratch_dir: data.join("merging"),
        config: CompactionConfig::default(),
        delete_counts: Default::default(),
    };
    let mut shale_best = f64::MAX;
    let mut output_bytes = 0;
    let mut phases = String::new();
    for run in 0..args.runs {
        let mut index_config = config.clone();
        index_config.index_id = format!("merge-bench-{run}");
        let index = metastore.create_index(index_config).await?;
        let storage = storages.for_index(index.index_id(), None)?;
        let mut ids = Vec::new();
        let mut metas = Vec::new();
        for (bundle, built) in &bundles {
            let split_id = new_ulid();
            storage
                .put_file(&shale_types::split_object_key(&split_id), bundle)
                .await?;
            metas.push(SplitMetadata {
                split_id: split_id.clone(),
                index_uid: index.index_uid.clone(),
                source_id: shale_types::INGEST_API_SOURCE_ID.into(),
                node_id: "bench".into(),
                partition_id: 0,
                doc_mapping_uid: index.index_config.doc_mapping.doc_mapping_uid.clone(),
                num_docs: built.num_docs,
                size_bytes: built.size_bytes,
                uncompressed_docs_size_bytes: built.uncompressed_docs_size_bytes,
                time_range: built.time_range,
                tags: built.tags.clone(),
                create_timestamp: now_unix_secs(),
                maturity: SplitMaturity::Immature {
                    maturation_period_secs: 48 * 3600,
                },
                num_merge_ops: 0,
                delete_opstamp: 0,
                footer_offsets: built.footer_offsets,
                time_bucket_start: None,
                sort_key_min: None,
                sort_key_max: None,
                key_level: 0,
                sort_fields: None,
                tag_fields: None,
                format: Default::default(),
                num_series: None,
            });
            ids.push(split_id);
        }
        let scope = metas[0].merge_scope(false);
        metastore.stage_splits(&index.index_uid, metas).await?;
        metastore
            .publish_splits(
                &index.index_uid,
                &ids,
                &[],
                None::<(String, CheckpointDelta)>,
            )
            .await?;
        metastore
            .create_merge_tasks(&index.index_uid, vec![NewMergeTask::new(scope, ids)], 1)
            .await?;
        let task = metastore
            .claim_merge_task(
                "bench#1",
                3600,
                now_unix_secs(),
                Some(&index.index_uid),
                None,
                false,
            )
            .await?
            .ok_or_else(|| anyhow::anyhow!("no task to claim"))?;
        let started = Instant::now();
        let outcome = execute_merge(&env, task).await?;
        let elapsed = started.elapsed().as_secs_f64();
        if elapsed < shale_best {
            phases = format!(
                "download {:.2}s, merge+bundle {:.2}s, upload+publish {:.2}s",
                outcome.download.as_secs_f64(),
                outcome.merge.as_secs_f64(),
                outcome.upload_publish.as_secs_f64()
            );
        }
        shale_best = shale_best.min(elapsed);
        anyhow::ensure!(
            outcome.outputs.iter().map(|s| s.num_docs).sum::<u64>() as usize == total,
            "merge lost documents"
        );
        output_bytes = outcome.bytes_written;
    }

    println!();
    println!(
        "merge of {} splits x {} docs ({:.1} MB in, {:.1} MB out), best of {}",
        args.splits,
        args.docs_per_split,
        input_bytes as f64 / 1e6,
        output_bytes as f64 / 1e6,
        args.runs
    );
    println!("                                  time      docs/s");
    println!(
        "raw tantivy merge_indices    {:>8.2}s {:>11.0}",
        raw_best,
        total as f64 / raw_best
    );
    println!(
        "shale merge worker           {:>8.2}s {:>11.0}   (download + merge + bundle + upload + publish)",
        shale_best,
        total as f64 / shale_best
    );
    println!("  shale phases: {phases}");
    println!(
        "ratio shale / raw (throughput) {:>6.2}x",
        raw_best / shale_best
    );
    Ok(())
}
