//! FST vs SSTable term dictionaries, on the corpus and index config of `shale-bench`. Built
//! twice (README.md): `cargo run --release` (FST, what Shale ships) and `cargo run --release
//! --features sstable`. Each build indexes the same documents with Shale's doc mapper into one
//! Tantivy index on every core and prints: build time, index and dictionary bytes per field,
//! the bytes a first lookup of one term reads from the dictionary (what a search of a split
//! on object storage fetches by range), and the latency of term lookups and of a term query.

#[path = "../../../crates/shale/src/bin/shale-bench/corpus.rs"]
mod corpus;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use shale_config::IndexConfig;
use shale_index::DocMapper;
use tantivy::collector::Count;
use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    DirectoryLock, FileHandle, Lock, MmapDirectory, OwnedBytes, WatchCallback, WatchHandle,
    WritePtr,
};
use tantivy::query::TermQuery;
use tantivy::schema::IndexRecordOption;
use tantivy::{Directory, HasLen, Index, IndexWriter, Term};

/// Bytes read per file extension since the last reset.
type Reads = Arc<Mutex<BTreeMap<String, u64>>>;

/// A directory counting the bytes read from each kind of file.
#[derive(Clone, Debug)]
struct CountingDirectory {
    inner: MmapDirectory,
    reads: Reads,
}

#[derive(Debug)]
struct CountingHandle {
    kind: String,
    inner: Arc<dyn FileHandle>,
    reads: Reads,
}

impl HasLen for CountingHandle {
    fn len(&self) -> usize {
        self.inner.len()
    }
}

impl FileHandle for CountingHandle {
    fn read_bytes(&self, range: Range<usize>) -> std::io::Result<OwnedBytes> {
        *self
            .reads
            .lock()
            .unwrap()
            .entry(self.kind.clone())
            .or_default() += range.len() as u64;
        self.inner.read_bytes(range)
    }
}

impl Directory for CountingDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        let kind = path
            .extension()
            .map_or("other".to_string(), |e| e.to_string_lossy().to_string());
        Ok(Arc::new(CountingHandle {
            kind,
            inner: self.inner.get_file_handle(path)?,
            reads: self.reads.clone(),
        }))
    }
    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.inner.delete(path)
    }
    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }
    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        self.inner.open_write(path)
    }
    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        self.inner.atomic_read(path)
    }
    fn atomic_write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        self.inner.atomic_write(path, data)
    }
    fn sync_directory(&self) -> std::io::Result<()> {
        self.inner.sync_directory()
    }
    fn acquire_lock(&self, lock: &Lock) -> Result<DirectoryLock, LockError> {
        self.inner.acquire_lock(lock)
    }
    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let docs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(500_000);
    let dictionary = if cfg!(feature = "sstable") {
        "SSTable"
    } else {
        "FST"
    };
    let lines = corpus::generate(docs, 42);
    let config = IndexConfig::parse(corpus::INDEX_YAML.as_bytes())?;
    let mapper = DocMapper::for_index(&config)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir: PathBuf = std::env::temp_dir().join(format!("termdict-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let started = Instant::now();
    let index = Index::builder()
        .schema(mapper.schema().clone())
        .settings(mapper.index_settings())
        .create_in_dir(&dir)?;
    let mut writer: IndexWriter = index.writer_with_num_threads(threads, threads * (128 << 20))?;
    for line in &lines {
        writer.add_document(mapper.parse_doc(line.as_bytes())?.doc)?;
    }
    writer.commit()?;
    writer.wait_merging_threads()?;
    let build = started.elapsed().as_secs_f64();

    let reads: Reads = Arc::default();
    let index = Index::open(CountingDirectory {
        inner: MmapDirectory::open(&dir)?,
        reads: reads.clone(),
    })?;
    let searcher = index.reader()?.searcher();
    let usage = searcher.space_usage()?;
    let mut index_bytes = 0;
    let mut per_field: BTreeMap<String, u64> = BTreeMap::new();
    for segment in usage.segments() {
        index_bytes += segment.total().get_bytes();
        for field_usage in segment.termdict().fields() {
            *per_field
                .entry(field_usage.field_name().to_string())
                .or_default() += field_usage.total().get_bytes();
        }
    }
    let dict_bytes: u64 = per_field.values().sum();
    println!(
        "{dictionary}: {docs} docs, {} segments, built in {build:.2} s on {threads} threads",
        searcher.segment_readers().len()
    );
    println!(
        "index {:.2} MB, term dictionaries {:.2} MB ({:.1} %)",
        index_bytes as f64 / 1e6,
        dict_bytes as f64 / 1e6,
        dict_bytes as f64 * 100.0 / index_bytes as f64
    );
    for (field, bytes) in &per_field {
        println!("  {field:<24} {:>10.1} KB", *bytes as f64 / 1e3);
    }

    // A first lookup in each field's dictionary: the bytes read from the `.term` files.
    let schema = mapper.schema();
    let samples = [
        ("message", "timeout"),
        ("trace_id", "0"),
        ("host", "payment-07.prod.internal"),
    ];
    for (name, text) in samples {
        let field = schema.get_field(name)?;
        reads.lock().unwrap().clear();
        for segment in searcher.segment_readers() {
            let inverted = segment.inverted_index(field)?;
            std::hint::black_box(inverted.get_term_info(&Term::from_field_text(field, text))?);
        }
        let term_bytes = reads.lock().unwrap().get("term").copied().unwrap_or(0);
        println!(
            "first lookup of {name}:{text}: {:.1} KB read from the dictionaries",
            term_bytes as f64 / 1e3
        );
    }

    // Warm lookups of random trace ids (the high-cardinality field), and a term query.
    let trace_id = schema.get_field("trace_id")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut lookups = Vec::new();
    for _ in 0..2_000 {
        let line = &lines[rng.random_range(0..lines.len())];
        let value: serde_json::Value = serde_json::from_str(line)?;
        let term = Term::from_field_text(trace_id, value["trace_id"].as_str().unwrap_or(""));
        let started = Instant::now();
        let mut found = 0;
        for segment in searcher.segment_readers() {
            found += segment
                .inverted_index(trace_id)?
                .get_term_info(&term)?
                .is_some() as usize;
        }
        lookups.push(started.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(found == 1, "trace id not found");
    }
    lookups.sort_by(f64::total_cmp);
    let message = schema.get_field("message")?;
    let query = TermQuery::new(
        Term::from_field_text(message, "timeout"),
        IndexRecordOption::Basic,
    );
    let mut counts = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        std::hint::black_box(searcher.search(&query, &Count)?);
        counts.push(started.elapsed().as_secs_f64() * 1e3);
    }
    counts.sort_by(f64::total_cmp);
    println!(
        "trace_id lookup p50 {:.1} us p99 {:.1} us; message:timeout count p50 {:.2} ms",
        percentile(&lookups, 0.5),
        percentile(&lookups, 0.99),
        percentile(&counts, 0.5)
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
