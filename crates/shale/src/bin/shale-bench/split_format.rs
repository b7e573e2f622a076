//! `shale-bench split-format`: what the document store options cost and save. The same
//! corpus is built into one split per option (`docstore_compression_level`,
//! `docstore_blocksize`) by Shale's split builder on every core; each option prints its build
//! time (parse, index, compress, bundle) against the first option's, the split's bytes and its
//! parts (document store, term dictionaries, the rest), and the time to fetch documents:
//! one at a random doc id with no block cache (a search's hit in a block it has not read)
//! and the 20 newest hits of a term query.

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use shale_config::IndexConfig;
use shale_index::{DocMapper, DocStoreSettings, SplitBuilder};
use tantivy::collector::TopDocs;
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{Order, Term};

use crate::corpus;
use crate::ingest::percentile;

#[derive(clap::Args)]
pub struct Args {
    /// Documents in the corpus (one split per option).
    #[arg(long, default_value_t = 500_000)]
    docs: usize,
    /// Random single-document fetches per option.
    #[arg(long, default_value_t = 300)]
    fetches: usize,
    /// Seed of the corpus generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// The options measured: Tantivy's default first (the baseline), Quickwit's default last.
const OPTIONS: [(&str, Option<i32>, usize); 8] = [
    ("lz4, 16 KB blocks (Tantivy)", None, 16_384),
    ("lz4, 64 KB", None, 65_536),
    ("zstd 1, 64 KB", Some(1), 65_536),
    ("zstd 3, 64 KB", Some(3), 65_536),
    ("zstd 3, 256 KB", Some(3), 262_144),
    ("zstd 3, 1 MB", Some(3), 1_000_000),
    ("zstd 8, 64 KB", Some(8), 65_536),
    ("zstd 8, 1 MB (Quickwit)", Some(8), 1_000_000),
];

/// What one option measured.
struct Measured {
    build_secs: f64,
    split_bytes: u64,
    store_bytes: u64,
    termdict_bytes: u64,
    fetch_one_ms: (f64, f64),
    fetch_top20_ms: f64,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = Arc::new(corpus::generate(args.docs, args.seed));
    let corpus_bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    let config = IndexConfig::parse(corpus::INDEX_YAML.as_bytes())?;
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    println!(
        "corpus: {} docs, {:.1} MB; one split per option, built on {threads} threads",
        args.docs,
        corpus_bytes as f64 / 1e6
    );
    let defaults = DocStoreSettings::default();
    println!(
        "Shale's default: {} on {} KB blocks",
        defaults
            .zstd_level
            .map_or("lz4".to_string(), |l| format!("zstd {l}")),
        defaults.blocksize / 1024
    );
    println!();
    println!(
        "{:<30} {:>8} {:>7} {:>10} {:>7} {:>10} {:>10} {:>14} {:>11}",
        "document store",
        "build s",
        "ratio",
        "split MB",
        "ratio",
        "store MB",
        "termdict",
        "1 doc p50/p99",
        "top 20 p50"
    );
    let mut baseline: Option<(f64, u64)> = None;
    for (name, zstd_level, blocksize) in OPTIONS {
        let mapper = Arc::new(DocMapper::for_index(&config)?.with_docstore_settings(
            DocStoreSettings {
                zstd_level,
                blocksize,
            },
        ));
        let lines = lines.clone();
        let fetches = args.fetches;
        let m = tokio::task::spawn_blocking(move || measure(&mapper, &lines, threads, fetches))
            .await??;
        let (base_secs, base_bytes) = *baseline.get_or_insert((m.build_secs, m.split_bytes));
        println!(
            "{:<30} {:>8.2} {:>6.2}x {:>10.1} {:>6.2}x {:>10.1} {:>7.1} MB {:>6.3}/{:<6.3} ms {:>8.2} ms",
            name,
            m.build_secs,
            m.build_secs / base_secs,
            m.split_bytes as f64 / 1e6,
            m.split_bytes as f64 / base_bytes as f64,
            m.store_bytes as f64 / 1e6,
            m.termdict_bytes as f64 / 1e6,
            m.fetch_one_ms.0,
            m.fetch_one_ms.1,
            m.fetch_top20_ms,
        );
    }
    println!();
    println!(
        "term dictionaries are Tantivy's FST in every split above (one dictionary type is \
         compiled into Tantivy); the SSTable alternative is measured apart (README)"
    );
    Ok(())
}

fn measure(
    mapper: &Arc<DocMapper>,
    lines: &[String],
    threads: usize,
    fetches: usize,
) -> anyhow::Result<Measured> {
    let work = tempfile::tempdir()?;
    let started = Instant::now();
    let mut builder =
        SplitBuilder::with_threads(mapper.clone(), &work.path().join("s"), 256 << 20, threads)?;
    for line in lines {
        builder.add(mapper.parse_doc(line.as_bytes())?)?;
    }
    let built = builder.finish()?;
    let build_secs = started.elapsed().as_secs_f64();

    let index = shale_index::open_split(&built.path)?;
    let searcher = index.reader()?.searcher();
    let usage = searcher.space_usage()?;
    let (mut store_bytes, mut termdict_bytes) = (0, 0);
    for segment in usage.segments() {
        store_bytes += segment.store().total().get_bytes();
        termdict_bytes += segment.termdict().total().get_bytes();
    }

    // One document at a random address, with no block cache: a block read and decompressed.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let segments = searcher.segment_readers();
    let stores = segments
        .iter()
        .map(|s| s.get_store_reader(0))
        .collect::<Result<Vec<_>, _>>()?;
    let mut samples = Vec::with_capacity(fetches);
    for _ in 0..fetches {
        let ord = rng.random_range(0..segments.len());
        let doc_id = rng.random_range(0..segments[ord].max_doc());
        let started = Instant::now();
        let bytes = stores[ord].get_document_bytes(doc_id)?;
        samples.push(started.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(bytes);
    }
    samples.sort_by(f64::total_cmp);

    // The 20 newest hits of a term query, fetched with a searcher's block cache.
    let message = mapper
        .schema()
        .get_field("message")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let query = TermQuery::new(
        Term::from_field_text(message, "timeout"),
        IndexRecordOption::Basic,
    );
    let collector =
        TopDocs::with_limit(20).order_by_fast_field::<tantivy::DateTime>("timestamp", Order::Desc);
    let mut top20 = Vec::new();
    for _ in 0..20 {
        let fresh = index.reader()?.searcher();
        let hits = fresh.search(&query, &collector)?;
        let started = Instant::now();
        for (_, address) in &hits {
            let doc: tantivy::TantivyDocument = fresh.doc::<tantivy::TantivyDocument>(*address)?;
            std::hint::black_box(doc);
        }
        top20.push(started.elapsed().as_secs_f64() * 1e3);
    }
    top20.sort_by(f64::total_cmp);
    Ok(Measured {
        build_secs,
        split_bytes: built.size_bytes,
        store_bytes,
        termdict_bytes,
        fetch_one_ms: (percentile(&samples, 0.5), percentile(&samples, 0.99)),
        fetch_top20_ms: percentile(&top20, 0.5),
    })
}
