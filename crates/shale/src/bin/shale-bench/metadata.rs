//! `shale-bench metadata`: what the metastore costs a search and a planning round when an
//! index has 10 000 published splits and 1 000 delete tasks, on SQLite and PostgreSQL.
//!
//! A search reads what `SearchService::search` reads before it opens a split: the index,
//! the Published splits of its time range (with the count of all, for the pruning figure),
//! and the delete tasks above the least clean split it keeps. A planning round is the
//! leader's real `plan_round`. Two states of the same metadata are measured:
//!
//! - **bounded** (what Shale keeps now): the splits are recorded clean of the tasks they
//!   cannot reach or that were applied, and the tasks every split is past were forgotten but
//!   the newest — a search lists no task, the delete planning lists no split;
//! - **unbounded** (the baseline: before the delete history was bounded): the same splits
//!   clean of nothing and all 1 000 tasks kept — every search lists every task, every
//!   planning round lists every split.
//!
//! The tasks are young (inside the index's one-hour time-travel window): the planning round
//! weighs them against the splits it lists but counts no document (the bench has no split
//! objects). Printed per backend: p50/p99 of a search's metastore reads (whole index and a 1 % time
//! range) and of a planning round, in each state, and the ratios.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Instant;

use shale_compaction::service::{plan_round, CompactionEnv};
use shale_config::{CompactionConfig, IndexConfig};
use shale_metastore::{open_metastore, ListSplitsQuery, Metastore};
use shale_storage::{IndexStorages, SplitCache, StorageResolver};
use shale_types::{DeleteQuery, SplitMaturity, SplitMetadata, SplitState, TimeRange};

use crate::ingest::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Published splits.
    #[arg(long, default_value_t = 10_000)]
    splits: usize,
    /// Delete tasks.
    #[arg(long, default_value_t = 1_000)]
    delete_tasks: usize,
    /// Searches (and planning rounds) per figure.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// PostgreSQL server URL (`postgres://user@host:port/db`); default:
    /// `SHALE_TEST_POSTGRES_URL`, else a private cluster started for the run.
    #[arg(long)]
    postgres_url: Option<String>,
}

const T0: i64 = 1_700_000_000;
/// Each split covers 10 minutes of a contiguous history.
const SPLIT_SECS: i64 = 600;

fn index_config() -> anyhow::Result<IndexConfig> {
    Ok(IndexConfig::parse(
        br#"
index_id: metadata-bench
doc_mapping:
  field_mappings:
    - {name: ts, type: datetime, input_formats: [unix_timestamp], fast: true}
    - {name: service, type: text, tokenizer: raw}
    - {name: body, type: text}
  timestamp_field: ts
  tag_fields: [service]
search_settings:
  default_search_fields: [body]
time_travel_retention: 1h
"#,
    )?)
}

fn split(index: &shale_types::IndexUid, i: usize) -> SplitMetadata {
    let start = T0 + i as i64 * SPLIT_SECS;
    SplitMetadata {
        split_id: format!("{:08}-{}", i, ulid::Ulid::new()),
        index_uid: index.clone(),
        source_id: shale_types::INGEST_API_SOURCE_ID.to_string(),
        node_id: "bench".to_string(),
        partition_id: 0,
        doc_mapping_uid: String::new(),
        num_docs: 100_000,
        size_bytes: 30_000_000,
        uncompressed_docs_size_bytes: 60_000_000,
        time_range: Some(TimeRange {
            start,
            end: start + SPLIT_SECS - 1,
        }),
        tags: BTreeSet::from([format!("service:svc-{}", i % 12)]),
        create_timestamp: shale_types::now_unix_secs(),
        // Mature: the merge policy has nothing to do, the figure is the reads.
        maturity: SplitMaturity::Mature,
        num_merge_ops: 0,
        delete_opstamp: 0,
        footer_offsets: (0, 0),
        time_bucket_start: None,
        sort_key_min: None,
        sort_key_max: None,
        key_level: 0,
        sort_fields: None,
        tag_fields: None,
        format: Default::default(),
        num_series: None,
    }
}

/// Fills `metastore`: the index, its splits (published by batches of 500) and its tasks.
async fn fill(
    metastore: &Arc<dyn Metastore>,
    args: &Args,
) -> anyhow::Result<(shale_types::IndexUid, Vec<SplitMetadata>)> {
    let mut config = index_config()?;
    config.doc_mapping.doc_mapping_uid = String::new();
    let index = metastore.create_index(config).await?;
    let uid = index.index_uid.clone();
    let mut splits = Vec::with_capacity(args.splits);
    for chunk_start in (0..args.splits).step_by(500) {
        let chunk: Vec<SplitMetadata> = (chunk_start..(chunk_start + 500).min(args.splits))
            .map(|i| {
                let mut split = split(&uid, i);
                split.doc_mapping_uid = index.index_config.doc_mapping.doc_mapping_uid.clone();
                split
            })
            .collect();
        metastore.stage_splits(&uid, chunk.clone()).await?;
        let ids: Vec<String> = chunk.iter().map(|s| s.split_id.clone()).collect();
        metastore.publish_splits(&uid, &ids, &[], None).await?;
        splits.extend(chunk);
    }
    for i in 0..args.delete_tasks {
        metastore
            .create_delete_task(
                &uid,
                DeleteQuery {
                    query: format!("body:secret-{i}"),
                    ..Default::default()
                },
                shale_types::now_unix_secs(),
            )
            .await?;
    }
    Ok((uid, splits))
}

/// The metastore reads of one search, as `SearchService::search` makes them; returns the
/// tasks it had to list.
async fn search_reads(
    metastore: &Arc<dyn Metastore>,
    uid: &shale_types::IndexUid,
    time_range: Option<(i64, i64)>,
) -> anyhow::Result<usize> {
    let index = metastore
        .index_metadata_without_checkpoints(&uid.index_id)
        .await?;
    let mut query =
        ListSplitsQuery::for_index(index.index_uid.clone()).with_states(&[SplitState::Published]);
    if let Some((start, end)) = time_range {
        query.time_range_start = Some(start);
        query.time_range_end = Some(end);
    }
    let all =
        ListSplitsQuery::for_index(index.index_uid.clone()).with_states(&[SplitState::Published]);
    let (splits, _) = tokio::try_join!(metastore.list_splits(query), async {
        if time_range.is_some() {
            metastore.count_splits(all).await.map(Some)
        } else {
            Ok(None)
        }
    })?;
    let min_clean = splits
        .iter()
        .map(|s| s.split_metadata.delete_opstamp)
        .min()
        .unwrap_or(u64::MAX);
    let tasks = if min_clean == u64::MAX {
        Vec::new()
    } else {
        metastore
            .list_delete_tasks(&index.index_uid, min_clean)
            .await?
    };
    Ok(tasks.len())
}

struct Figures {
    search_all: (f64, f64, usize),
    search_narrow: (f64, f64, usize),
    planning: (f64, f64),
}

fn p50_p99(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

async fn measure(
    metastore: &Arc<dyn Metastore>,
    env: &CompactionEnv,
    uid: &shale_types::IndexUid,
    args: &Args,
) -> anyhow::Result<Figures> {
    let span = args.splits as i64 * SPLIT_SECS;
    // A 1 % time range in the middle of the history.
    let narrow = (T0 + span / 2, T0 + span / 2 + span / 100);
    let mut figures = Vec::new();
    for range in [None, Some(narrow)] {
        search_reads(metastore, uid, range).await?;
        let mut samples = Vec::with_capacity(args.iterations);
        let mut tasks = 0;
        for _ in 0..args.iterations {
            let started = Instant::now();
            tasks = search_reads(metastore, uid, range).await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let (p50, p99) = p50_p99(samples);
        figures.push((p50, p99, tasks));
    }
    let live: HashSet<String> = HashSet::from(["bench".to_string()]);
    let now = shale_types::now_unix_secs();
    plan_round(env, metastore, &live, now).await?;
    let mut samples = Vec::with_capacity(args.iterations);
    for _ in 0..args.iterations {
        let started = Instant::now();
        plan_round(env, metastore, &live, now).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Figures {
        search_all: figures[0],
        search_narrow: figures[1],
        planning: p50_p99(samples),
    })
}

async fn bench_backend(name: &str, uri: &str, args: &Args) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let metastore = open_metastore(uri).await?;
    let started = Instant::now();
    let (uid, splits) = fill(&metastore, args).await?;
    eprintln!(
        "{name}: {} splits and {} delete tasks recorded in {:.1} s",
        splits.len(),
        args.delete_tasks,
        started.elapsed().as_secs_f64()
    );
    let env = CompactionEnv {
        node_id: "bench".into(),
        worker_id: "bench#1".into(),
        metastore: metastore.clone(),
        storages: IndexStorages::new(
            StorageResolver::default(),
            format!("file://{}/indexes", work.path().display()),
        ),
        cache: Arc::new(SplitCache::open(&work.path().join("cache"), 1 << 30)?),
        scratch_dir: work.path().join("merging"),
        config: CompactionConfig::default(),
        delete_counts: Default::default(),
    };

    // Unbounded: every split clean of nothing, every task kept (inside the index's
    // time-travel window, so that the delete planning lists every split and weighs every
    // task against it without counting documents).
    let unbounded = measure(&metastore, &env, &uid, args).await?;

    // Bounded: what the planner records (the tasks cannot reach the splits) and the
    // leader's purge leave: splits clean of every task, the newest task only.
    let last = args.delete_tasks as u64;
    let advanced: Vec<(SplitMetadata, u64)> = splits
        .iter()
        .map(|split| {
            let mut clean = split.clone();
            clean.delete_opstamp = last;
            (clean, 0)
        })
        .collect();
    for chunk in advanced.chunks(500) {
        metastore.advance_split_delete_opstamps(&uid, chunk).await?;
    }
    let purged = metastore
        .purge_delete_tasks(&uid, last, shale_types::now_unix_secs())
        .await?;
    let bounded = measure(&metastore, &env, &uid, args).await?;

    println!(
        "\n{name}: {} published splits, {} delete tasks ({purged} forgotten once applied)",
        splits.len(),
        args.delete_tasks
    );
    println!(
        "{:<34} {:>22} {:>22} {:>10}",
        "metastore cost", "bounded p50/p99 ms", "unbounded p50/p99 ms", "ratio p50"
    );
    let row = |what: &str, b: (f64, f64), u: (f64, f64)| {
        println!(
            "{what:<34} {:>10.2} / {:<9.2} {:>10.2} / {:<9.2} {:>9.2}x",
            b.0,
            b.1,
            u.0,
            u.1,
            u.0 / b.0.max(1e-9)
        );
    };
    row(
        &format!(
            "search, whole index ({} / {} tasks)",
            bounded.search_all.2, unbounded.search_all.2
        ),
        (bounded.search_all.0, bounded.search_all.1),
        (unbounded.search_all.0, unbounded.search_all.1),
    );
    row(
        &format!(
            "search, 1 % time ({} / {} tasks)",
            bounded.search_narrow.2, unbounded.search_narrow.2
        ),
        (bounded.search_narrow.0, bounded.search_narrow.1),
        (unbounded.search_narrow.0, unbounded.search_narrow.1),
    );
    row("planning round", bounded.planning, unbounded.planning);
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let sqlite_dir = tempfile::tempdir()?;
    let sqlite = format!("sqlite://{}/metastore.db", sqlite_dir.path().display());
    bench_backend("SQLite", &sqlite, &args).await?;
    let postgres = match args.postgres_url.clone() {
        Some(url) => Some(url),
        None => shale_testkit::postgres::test_database_url().await,
    };
    match postgres {
        Some(url) => bench_backend("PostgreSQL", &url, &args).await?,
        None => println!("\nPostgreSQL: skipped (no server: pass --postgres-url)"),
    }
    Ok(())
}
