//! `shale-bench search`: Shale's search against raw in-process Tantivy on the same splits.
//!
//! The corpus is ingested into a node in this process (embedded defaults); then, for each
//! query, three timings over the same published splits, already in the split cache:
//!
//! 1. raw Tantivy: the splits opened once, each searched on its own thread for the exact
//!    count and the top 20 by timestamp (or the aggregation), merged — what the machine can
//!    do with Tantivy's own queries (a time range is its range query on the timestamp
//!    column; the range + tag query is also run with Shale's time filter, to show Shale's
//!    own cost around the same search work);
//! 2. Shale in process: `SearchService::search` (root + leaf, no HTTP);
//! 3. Shale over HTTP: `POST /api/v1/bench-logs/search`, the response parsed.
//!
//! It prints p50/p99 of each and the ratios (every query computed: the partial-result cache
//! is off for this table); then workloads over HTTP against raw Tantivy on the same
//! sequence — a search repeated and ten pages in turn (the cache on), a different term or
//! phrase or time window each time (the cache off), each against Quickwit's figure on this
//! machine; then 100 concurrent searches, one repeated and the varied mix; then where a
//! search's time goes at the root (metastore reads); last, the targets, met or not.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use shale_config::{IndexConfig, NodeConfig};
use shale_search::SearchRequest;
use tantivy::aggregation::agg_req::Aggregations;
use tantivy::aggregation::AggregationCollector;
use tantivy::collector::{Count, TopDocs};
use tantivy::{Order, Searcher};

use crate::corpus;
use crate::ingest::{create_and_ingest, percentile, published_splits, start_node};

#[derive(clap::Args)]
pub struct Args {
    /// Documents in the corpus.
    #[arg(long, default_value_t = 1_000_000)]
    docs: usize,
    /// Iterations per query and engine.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Seed of the corpus generator.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Cut a split every this many documents (several splits, as a live index has).
    #[arg(long, default_value_t = 250_000)]
    split_docs: usize,
    /// Only the queries of the first table whose name contains this (e.g. `range`), and
    /// nothing after that table: a short run to profile one query.
    #[arg(long)]
    only: Option<String>,
}

fn summary(samples: &mut [f64]) -> (f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    (percentile(samples, 0.5), percentile(samples, 0.99))
}

/// Raw Tantivy over `searchers`, one thread per split: the count and the top `offset + 20`
/// by timestamp of each split (or the aggregation), merged; then the page's 20 documents are
/// fetched, as a search returns them.
fn raw_search(
    searchers: &[Searcher],
    query: &dyn tantivy::query::Query,
    aggs: Option<&Aggregations>,
    offset: usize,
) -> u64 {
    type Hits = Vec<(Option<tantivy::DateTime>, tantivy::DocAddress)>;
    let per_split: Vec<(u64, Hits)> = std::thread::scope(|scope| {
        let handles: Vec<_> = searchers
            .iter()
            .map(|searcher| {
                scope.spawn(move || -> (u64, Hits) {
                    match aggs {
                        Some(aggs) => {
                            let collector = AggregationCollector::from_aggs(
                                aggs.clone(),
                                shale_search::aggs::context(),
                            );
                            let (count, _) = searcher
                                .search(query, &(Count, collector))
                                .unwrap_or_default();
                            (count as u64, Vec::new())
                        }
                        None => {
                            let top = TopDocs::with_limit(offset + 20)
                                .order_by_fast_field::<tantivy::DateTime>("timestamp", Order::Desc);
                            let (count, hits) =
                                searcher.search(query, &(Count, top)).unwrap_or_default();
                            (count as u64, hits)
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut page: Vec<(Option<tantivy::DateTime>, usize, tantivy::DocAddress)> = per_split
        .iter()
        .enumerate()
        .flat_map(|(split, (_, hits))| hits.iter().map(move |(ts, doc)| (*ts, split, *doc)))
        .collect();
    page.sort_by_key(|b| std::cmp::Reverse(b.0));
    for (_, split, doc) in page.into_iter().skip(offset).take(20) {
        let _ = searchers[split].doc::<tantivy::TantivyDocument>(doc);
    }
    per_split.iter().map(|(count, _)| count).sum()
}

/// The query the node builds for `request` (its parser, the time range), for raw Tantivy:
/// the time range as Tantivy's own range query on the timestamp column.
fn raw_query(
    mapper: &shale_index::DocMapper,
    request: &SearchRequest,
) -> anyhow::Result<Arc<dyn tantivy::query::Query>> {
    query_with_time_filter(mapper, request, false)
}

/// The query of `request` with its time range as Tantivy's range query, or (`shale_filter`)
/// as the node runs it: Shale's block-skipping time filter.
fn query_with_time_filter(
    mapper: &shale_index::DocMapper,
    request: &SearchRequest,
    shale_filter: bool,
) -> anyhow::Result<Arc<dyn tantivy::query::Query>> {
    let user = mapper.parse_query(&request.query, None)?;
    let range = mapper
        .time_range_query(request.start_timestamp, request.end_timestamp)
        .map(
            |filter| match filter.downcast_ref::<shale_index::TimeFilterQuery>() {
                Some(time) if !shale_filter => Box::new(time.as_range_query()),
                _ => filter,
            },
        );
    let query: Box<dyn tantivy::query::Query> = match range {
        Some(range) => Box::new(tantivy::query::BooleanQuery::new(vec![
            (tantivy::query::Occur::Must, user),
            (tantivy::query::Occur::Must, range),
        ])),
        None => user,
    };
    Ok(Arc::from(query))
}

/// p50 of raw Tantivy running `queries` (query, page offset) in turn, `iterations` times.
async fn raw_p50(
    searchers: &Arc<Vec<Searcher>>,
    queries: Vec<(Arc<dyn tantivy::query::Query>, usize)>,
    iterations: usize,
) -> anyhow::Result<f64> {
    let searchers = searchers.clone();
    let mut samples = tokio::task::spawn_blocking(move || {
        for (query, offset) in &queries {
            raw_search(&searchers, query.as_ref(), None, *offset);
        }
        (0..iterations)
            .map(|i| {
                let (query, offset) = &queries[i % queries.len()];
                let started = Instant::now();
                raw_search(&searchers, query.as_ref(), None, *offset);
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect::<Vec<f64>>()
    })
    .await?;
    Ok(summary(&mut samples).0)
}

/// p50 of Shale over HTTP answering `requests` in turn, `iterations` times (after each was
/// sent once, so every split is open and in the split cache).
async fn http_p50(
    client: &reqwest::Client,
    url: &str,
    requests: &[SearchRequest],
    iterations: usize,
) -> anyhow::Result<f64> {
    let send = |request: &SearchRequest| {
        let body = serde_json::to_value(request);
        let client = client.clone();
        let url = url.to_string();
        async move {
            let resp = client.post(&url).json(&body?).send().await?;
            anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
            resp.bytes().await?;
            anyhow::Ok(())
        }
    };
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let started = Instant::now();
        send(&requests[i % requests.len()]).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(summary(&mut samples).0)
}

/// Runs the search benchmark.
pub async fn run(args: Args) -> anyhow::Result<()> {
    eprintln!("generating {} documents…", args.docs);
    let lines = corpus::generate(args.docs, args.seed);
    let yaml = corpus::INDEX_YAML.replace(
        "  commit_timeout_secs: 30\n",
        &format!(
            "  commit_timeout_secs: 30\n  split_num_docs_target: {}\n  merge_policy:\n    type: no_merge\n",
            args.split_docs
        ),
    );
    let config = IndexConfig::parse(yaml.as_bytes())?;
    let mapper = shale_index::DocMapper::for_index(&config)?;

    let data = tempfile::tempdir()?;
    let node_config = NodeConfig {
        node_id: "bench".into(),
        ..NodeConfig::with_data_dir(data.path())
    };
    let (node, base, client) = start_node(node_config).await?;
    eprintln!("ingesting…");
    create_and_ingest(&client, &base, yaml.clone(), &lines).await?;
    drop(lines);

    // The published splits, opened for the raw baseline from the node's own split files.
    let (index, splits) = published_splits(&node, "bench-logs").await?;
    let storage = node
        .storages
        .for_index("bench-logs", index.index_config.index_uri.as_deref())?;
    let raw_dir = tempfile::tempdir()?;
    let mut searchers = Vec::new();
    for split in &splits {
        let path = raw_dir
            .path()
            .join(format!("{}.split", split.split_metadata.split_id));
        storage
            .get_to_file(&format!("{}.split", split.split_metadata.split_id), &path)
            .await?;
        let index = shale_index::open_split(&path)?;
        searchers.push(index.reader()?.searcher());
    }
    let searchers = Arc::new(searchers);
    println!(
        "corpus: {} docs in {} splits; {} iterations per query",
        args.docs,
        splits.len(),
        args.iterations
    );

    let mid = corpus::T0 + corpus::SPAN_SECS / 2;
    let histogram =
        json!({"h": {"date_histogram": {"field": "timestamp", "fixed_interval": "10m"}}});
    let cases: Vec<(&str, SearchRequest)> = vec![
        (
            "term message:timeout",
            SearchRequest {
                query: "message:timeout".into(),
                max_hits: 20,
                ..Default::default()
            },
        ),
        (
            "phrase \"connection refused\"",
            SearchRequest {
                query: "message:\"connection refused\"".into(),
                max_hits: 20,
                ..Default::default()
            },
        ),
        (
            "boolean a AND NOT b",
            SearchRequest {
                query: "level:ERROR AND NOT service:payment".into(),
                max_hits: 20,
                ..Default::default()
            },
        ),
        (
            RANGE_TAG,
            SearchRequest {
                query: "service:payment".into(),
                start_timestamp: Some(mid),
                end_timestamp: Some(mid + 600),
                max_hits: 20,
                ..Default::default()
            },
        ),
        (
            "date_histogram 10m",
            SearchRequest {
                query: "*".into(),
                max_hits: 0,
                aggs: Some(histogram.clone()),
                ..Default::default()
            },
        ),
    ];

    let cases: Vec<(&str, SearchRequest)> = cases
        .into_iter()
        .filter(|(name, _)| {
            args.only
                .as_ref()
                .is_none_or(|only| name.contains(only.as_str()))
        })
        .collect();
    anyhow::ensure!(!cases.is_empty(), "no query matches --only");

    // The floor of an HTTP round trip here: the same client, a route that does nothing.
    let mut floor = Vec::with_capacity(args.iterations);
    for _ in 0..args.iterations {
        let started = Instant::now();
        let resp = client.get(format!("{base}/health/livez")).send().await?;
        resp.bytes().await?;
        floor.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    println!();
    println!(
        "HTTP round trip floor (GET /health/livez, same client and process), p50: {:.3} ms",
        summary(&mut floor).0
    );

    let mut targets: Vec<Target> = Vec::new();
    // Every query of this table is computed: the partial-result cache is off (the variants
    // below show what it saves).
    let cache_bytes = NodeConfig::default().partial_result_cache_max_bytes;
    node.search.set_partial_result_cache(0);
    println!();
    println!("each query computed (partial-result cache off):");
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "query (ms)",
        "raw p50",
        "raw p99",
        "svc p50",
        "svc p99",
        "http p50",
        "http p99",
        "svc/raw",
        "http/raw"
    );
    let mut same_filter_note = None;
    for (name, request) in &cases {
        let query = raw_query(&mapper, request)?;
        let aggs: Option<Aggregations> = match &request.aggs {
            Some(aggs) => {
                Some(shale_search::aggs::parse_aggs(&mapper, aggs).map_err(anyhow::Error::msg)?)
            }
            None => None,
        };
        let raw = {
            let (searchers, query, aggs, iterations) = (
                searchers.clone(),
                query.clone(),
                aggs.clone(),
                args.iterations,
            );
            tokio::task::spawn_blocking(move || {
                let warm = raw_search(&searchers, query.as_ref(), aggs.as_ref(), 0);
                let mut samples = Vec::with_capacity(iterations);
                for _ in 0..iterations {
                    let started = Instant::now();
                    raw_search(&searchers, query.as_ref(), aggs.as_ref(), 0);
                    samples.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                (warm, samples)
            })
            .await?
        };
        let (raw_count, mut raw_samples) = raw;

        let warm = node.search.search("bench-logs", request.clone()).await?;
        anyhow::ensure!(
            warm.num_hits == raw_count,
            "{name}: Shale counts {} hits, raw Tantivy {raw_count}",
            warm.num_hits
        );
        let mut svc_samples = Vec::with_capacity(args.iterations);
        for _ in 0..args.iterations {
            let started = Instant::now();
            node.search.search("bench-logs", request.clone()).await?;
            svc_samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let url = format!("{base}/api/v1/bench-logs/search");
        let body = serde_json::to_value(request)?;
        let mut http_samples = Vec::with_capacity(args.iterations);
        for _ in 0..args.iterations {
            let started = Instant::now();
            let resp = client.post(&url).json(&body).send().await?;
            anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
            let parsed: Value = resp.json().await?;
            anyhow::ensure!(parsed["num_hits"] == json!(raw_count), "{parsed}");
            http_samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let (raw50, raw99) = summary(&mut raw_samples);
        let (svc50, svc99) = summary(&mut svc_samples);
        let (http50, http99) = summary(&mut http_samples);
        if *name == RANGE_TAG {
            targets.push(Target::at_most(
                "range + tag, computed: in process p50 / raw p50",
                svc50 / raw50,
                1.2,
            ));
            targets.push(Target::at_most(
                "range + tag, computed: HTTP p50 / raw p50",
                http50 / raw50,
                1.2,
            ));
            // The same query with Shale's time filter run by raw Tantivy: what Shale adds
            // around the same search work (its fixed cost per search).
            let filtered = query_with_time_filter(&mapper, request, true)?;
            let (searchers, iterations) = (searchers.clone(), args.iterations);
            let mut same_filter = tokio::task::spawn_blocking(move || {
                raw_search(&searchers, filtered.as_ref(), None, 0);
                (0..iterations)
                    .map(|_| {
                        let started = Instant::now();
                        raw_search(&searchers, filtered.as_ref(), None, 0);
                        started.elapsed().as_secs_f64() * 1000.0
                    })
                    .collect::<Vec<f64>>()
            })
            .await?;
            let same50 = summary(&mut same_filter).0;
            same_filter_note = Some(format!(
                "{name}: raw Tantivy running Shale's time filter (the same search work as the \
                 node) p50 {same50:.2} ms; Shale in process {:.2}x of it, HTTP {:.2}x \
                 (raw above runs Tantivy's range query on the timestamp column)",
                svc50 / same50,
                http50 / same50
            ));
        }
        println!(
            "{:<28} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>6.2}x {:>6.2}x   ({} hits, {} splits)",
            name,
            raw50,
            raw99,
            svc50,
            svc99,
            http50,
            http99,
            svc50 / raw50,
            http50 / raw50,
            raw_count,
            warm.num_splits_searched
        );
    }

    if let Some(note) = same_filter_note {
        println!("{note}");
    }

    if args.only.is_some() {
        print_targets(&targets);
        return Ok(());
    }

    // Variants of a workload, top 20 by timestamp over HTTP against raw Tantivy on the same
    // sequence: a search repeated (a refreshing dashboard: the partial-result cache answers
    // it), a different term or phrase each time (nothing to reuse: the cache is off), ten
    // pages of one search in turn.
    let url = format!("{base}/api/v1/bench-logs/search");
    let request = |query: String, offset: usize| SearchRequest {
        query,
        max_hits: 20,
        start_offset: offset,
        ..Default::default()
    };
    let words = corpus::WORDS;
    let range_tag = |start: i64| SearchRequest {
        query: "service:payment".into(),
        start_timestamp: Some(start),
        end_timestamp: Some(start + 600),
        max_hits: 20,
        ..Default::default()
    };
    // (name, cache on, requests in turn, Quickwit's p50 on this machine and corpus: the
    // figures of issue 26, the bar of each).
    let variants: Vec<(&str, bool, Vec<SearchRequest>, f64)> = vec![
        (
            "term, repeated",
            true,
            vec![request("message:timeout".into(), 0)],
            3.7,
        ),
        (
            "phrase, repeated",
            true,
            vec![request("message:\"connection refused\"".into(), 0)],
            4.8,
        ),
        (
            "term, varied",
            false,
            words
                .iter()
                .map(|w| request(format!("message:{w}"), 0))
                .collect(),
            7.5,
        ),
        (
            "phrase, varied",
            false,
            words
                .windows(2)
                .map(|pair| request(format!("message:\"{} {}\"", pair[0], pair[1]), 0))
                .collect(),
            18.4,
        ),
        (
            "term, 10 pages in turn",
            true,
            (0..10)
                .map(|page| request("message:timeout".into(), page * 20))
                .collect(),
            // Quickwit's figure of the repeated term (it measured no paging).
            3.7,
        ),
        ("range + tag, repeated", true, vec![range_tag(mid)], 5.5),
        (
            "range + tag, varied",
            false,
            (0..36).map(|i| range_tag(corpus::T0 + i * 600)).collect(),
            7.5,
        ),
    ];
    println!();
    println!(
        "{:<28} {:>9} {:>9} {:>8} {:>9}  (top 20 by timestamp; cache on for repeated and paged, off for varied)",
        "workload (ms)", "raw p50", "http p50", "http/raw", "Quickwit"
    );
    for (name, cached, requests, quickwit) in &variants {
        node.search
            .set_partial_result_cache(if *cached { cache_bytes } else { 0 });
        let queries = requests
            .iter()
            .map(|r| Ok((raw_query(&mapper, r)?, r.start_offset)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let raw = raw_p50(&searchers, queries, args.iterations).await?;
        // Each request once first: splits open, and (repeated, paged) the cache filled.
        http_p50(&client, &url, requests, requests.len()).await?;
        let http = http_p50(&client, &url, requests, args.iterations).await?;
        println!(
            "{:<28} {:>9.2} {:>9.2} {:>7.2}x {:>9.2}",
            name,
            raw,
            http,
            http / raw,
            quickwit
        );
        targets.push(Target::at_most(
            format!("{name}: HTTP p50 ms <= Quickwit's"),
            http,
            *quickwit,
        ));
    }
    node.search.set_partial_result_cache(cache_bytes);

    // 100 searches at once through HTTP (the default max_concurrent_searches): latency under
    // load, throughput, and the memory they take; first one search repeated (the cache
    // answers), then the bench's mix with a different term, phrase or window each time (every
    // search computed), against raw Tantivy running the same mix one search after another.
    let concurrency = 100;
    let repeated = vec![serde_json::from_value::<SearchRequest>(json!({
        "query": "message:timeout", "max_hits": 20,
        "aggs": {"per_10m": {"date_histogram": {"field": "timestamp", "fixed_interval": "10m"}}}
    }))?];
    let mut mix = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let next = words[(i + 1) % words.len()];
        mix.push(request(format!("message:{word}"), 0));
        mix.push(request(format!("message:\"{word} {next}\""), 0));
        mix.push(request(format!("level:ERROR AND NOT message:{word}"), 0));
        mix.push(range_tag(corpus::T0 + (i as i64 % 36) * 600));
        mix.push(SearchRequest {
            query: format!("message:{word}"),
            max_hits: 0,
            aggs: Some(histogram.clone()),
            ..Default::default()
        });
    }
    println!();
    for (name, cached, requests) in [
        (
            "term + date_histogram, repeated (cache on)",
            true,
            &repeated,
        ),
        ("the mix, varied (cache off)", false, &mix),
    ] {
        node.search
            .set_partial_result_cache(if cached { cache_bytes } else { 0 });
        let rss_before = crate::ingest::peak_rss_mb();
        crate::ingest::reset_peak_rss();
        let per_client = (args.iterations / 10).max(1);
        // Each request once first, as in the workloads above: splits open, the cache filled.
        http_p50(&client, &url, requests, requests.len()).await?;
        let started = Instant::now();
        let mut samples =
            concurrent_searches(&client, &url, requests, concurrency, per_client).await?;
        let elapsed = started.elapsed().as_secs_f64();
        let (p50, p99) = summary(&mut samples);
        let throughput = samples.len() as f64 / elapsed;
        // Raw Tantivy: the same requests one after another (each on one thread per split).
        let raw_throughput = {
            let queries = requests
                .iter()
                .map(|r| {
                    let aggs = match &r.aggs {
                        Some(a) => Some(
                            shale_search::aggs::parse_aggs(&mapper, a)
                                .map_err(anyhow::Error::msg)?,
                        ),
                        None => None,
                    };
                    Ok((raw_query(&mapper, r)?, aggs))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let searchers = searchers.clone();
            let n = requests.len().max(200);
            tokio::task::spawn_blocking(move || {
                let started = Instant::now();
                for i in 0..n {
                    let (query, aggs) = &queries[i % queries.len()];
                    raw_search(&searchers, query.as_ref(), aggs.as_ref(), 0);
                }
                n as f64 / started.elapsed().as_secs_f64()
            })
            .await?
        };
        println!(
            "{concurrency} concurrent HTTP searches, {name}, {} in all: {throughput:.0} searches/s \
             (raw Tantivy, one at a time: {raw_throughput:.0}/s, {:.2}x), p50 {p50:.1} ms, p99 \
             {p99:.1} ms, peak RSS {:.0} MB (before: {rss_before:.0} MB)",
            samples.len(),
            throughput / raw_throughput,
            crate::ingest::peak_rss_mb()
        );
    }
    node.search.set_partial_result_cache(cache_bytes);

    // Where the root's time goes before any split is opened: the one read a search makes
    // while the index is unchanged, and what it reads to bring its view up to date after a
    // write — the index whole (first search) or only the changes.
    let mut version_reads = Vec::new();
    for _ in 0..args.iterations {
        let t = Instant::now();
        node.metastore.index_version("bench-logs").await?;
        version_reads.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!();
    println!(
        "root metastore reads, p50: per search, the index version {:.3} ms",
        summary(&mut version_reads).0
    );
    view_refresh(&node, &config, &splits[0].split_metadata, args.iterations).await?;
    print_targets(&targets);
    Ok(())
}

/// The targets measured in this run, met or not.
fn print_targets(targets: &[Target]) {
    println!();
    println!("targets (issue 26):");
    for target in targets {
        println!(
            "  {:<52} {:>8.2} (target <= {:.2})  {}",
            target.name,
            target.measured,
            target.bar,
            if target.measured <= target.bar {
                "met"
            } else {
                "NOT met"
            }
        );
    }
}

/// `clients` concurrent clients, each sending `per_client` of `requests` in turn (each
/// starting at its own place in the list); the latency of every search, in ms.
async fn concurrent_searches(
    client: &reqwest::Client,
    url: &str,
    requests: &[SearchRequest],
    clients: usize,
    per_client: usize,
) -> anyhow::Result<Vec<f64>> {
    let bodies: Arc<Vec<Value>> = Arc::new(
        requests
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?,
    );
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (client, url, bodies) = (client.clone(), url.to_string(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let body = &bodies[(c * 7 + i) % bodies.len()];
                let t = Instant::now();
                let resp = client.post(&url).json(body).send().await?;
                anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
                resp.bytes().await?;
                samples.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await??);
    }
    Ok(samples)
}

/// A figure the issue sets a bar for: met when the measured value is at most the bar.
struct Target {
    name: String,
    measured: f64,
    bar: f64,
}

impl Target {
    fn at_most(name: impl Into<String>, measured: f64, bar: f64) -> Self {
        Target {
            name: name.into(),
            measured,
            bar,
        }
    }
}

/// The name of the range + tag query of the main table.
const RANGE_TAG: &str = "10 min range + tag";

/// How a root's view of an index is brought up to date after one write (a split published),
/// at 4 and 10 000 Published splits: the index read whole against only the changes. The
/// splits are metadata rows copied from `template` into an index of their own (no objects).
async fn view_refresh(
    node: &shale_server::Node,
    config: &IndexConfig,
    template: &shale_types::SplitMetadata,
    iterations: usize,
) -> anyhow::Result<()> {
    let metastore = &node.metastore;
    let mut config = config.clone();
    config.index_id = "bench-view".to_string();
    let index = metastore.create_index(config).await?;
    let published = std::cell::Cell::new(0usize);
    let publish = |count: usize| {
        let splits: Vec<shale_types::SplitMetadata> = (0..count)
            .map(|_| {
                published.set(published.get() + 1);
                let mut split = template.clone();
                split.split_id = format!("view-{:08}", published.get());
                split.index_uid = index.index_uid.clone();
                split
            })
            .collect();
        let index_uid = index.index_uid.clone();
        async move {
            let ids: Vec<String> = splits.iter().map(|s| s.split_id.clone()).collect();
            metastore.stage_splits(&index_uid, splits).await?;
            metastore
                .publish_splits(&index_uid, &ids, &[], None)
                .await?;
            anyhow::Ok(())
        }
    };
    for target in [4usize, 10_000] {
        while published.get() < target {
            publish((target - published.get()).min(500)).await?;
        }
        let runs = if target > 1000 {
            iterations.min(30)
        } else {
            iterations
        };
        let (mut whole, mut changes) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            metastore.index_changes("bench-view", None, 0).await?;
            whole.push(t.elapsed().as_secs_f64() * 1000.0);
            let before = metastore.index_version("bench-view").await?;
            publish(1).await?;
            let t = Instant::now();
            let read = metastore
                .index_changes("bench-view", Some(&before), u64::MAX)
                .await?;
            changes.push(t.elapsed().as_secs_f64() * 1000.0);
            if !matches!(&read.splits, shale_metastore::SplitChanges::Since(rows) if rows.len() == 1)
            {
                anyhow::bail!("the changes after one publish are not that one split");
            }
        }
        let (whole, changes) = (summary(&mut whole).0, summary(&mut changes).0);
        println!(
            "  view after a publish at {target} splits, p50: whole index {whole:.3} ms, only the \
             changes {changes:.3} ms ({:.1}x less)",
            whole / changes
        );
    }
    Ok(())
}
