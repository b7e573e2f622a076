//! The metrics split, written and read back through its public API: exact samples, last
//! write wins, Prometheus's matcher semantics, row order, and pruning by statistics and
//! bloom filters.

use bytes::Bytes;
use shale_metrics::{
    bucket_start_ms, read_split, Labels, MatchOp, Matcher, MetricsSplitWriter, Sample,
    SeriesSamples, STALE_NAN_BITS,
};

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::new(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())))
}

fn sample(timestamp_ms: i64, value: f64) -> Sample {
    Sample {
        timestamp_ms,
        value,
    }
}

fn read(bytes: &[u8], matchers: &[Matcher], start: i64, end: i64) -> Vec<SeriesSamples> {
    read_split(Bytes::copy_from_slice(bytes), matchers, start, end)
        .expect("a readable split")
        .series
}

fn names(series: &[SeriesSamples]) -> Vec<String> {
    series
        .iter()
        .map(|s| {
            s.labels
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

fn small_split() -> Vec<u8> {
    let mut writer = MetricsSplitWriter::new(vec!["host".to_string()]);
    let stale = f64::from_bits(STALE_NAN_BITS);
    writer.add(
        &labels(&[("__name__", "cpu"), ("host", "a"), ("env", "prod")]),
        [
            sample(1_000, 1.5),
            sample(2_000, f64::INFINITY),
            sample(3_000, stale),
        ],
    );
    writer.add(
        &labels(&[("__name__", "cpu"), ("host", "b")]),
        [
            sample(3_000, 30.0),
            sample(1_000, 10.0),
            sample(2_000, f64::NAN),
        ],
    );
    writer.add(
        &labels(&[("__name__", "mem"), ("host", "a")]),
        [sample(1_000, 7.0)],
    );
    // A later write of an existing (series, timestamp) replaces it.
    writer.add(
        &labels(&[("__name__", "mem"), ("host", "a")]),
        [sample(1_000, 8.0), sample(500, 5.0)],
    );
    assert_eq!(writer.num_added(), 9);
    let (bytes, summary) = writer.finish().expect("a split");
    assert_eq!(summary.num_samples, 8, "one duplicate dropped");
    assert_eq!(summary.num_series, 3);
    assert_eq!(summary.time_range_ms, Some((500, 3_000)));
    assert_eq!(
        summary.metric_names.iter().collect::<Vec<_>>(),
        vec!["cpu", "mem"]
    );
    assert_eq!(summary.size_bytes, bytes.len() as u64);
    let (low, high) = summary.sort_key_range.expect("a key range");
    assert!(low < high);
    bytes
}

#[test]
fn samples_read_back_exactly_and_last_write_wins() {
    let bytes = small_split();
    let all = read(&bytes, &[], i64::MIN, i64::MAX);
    assert_eq!(
        names(&all),
        vec![
            "__name__=cpu,env=prod,host=a",
            "__name__=cpu,host=b",
            "__name__=mem,host=a"
        ]
    );
    let a = &all[0].samples;
    assert_eq!(a[0], sample(1_000, 1.5));
    assert_eq!(a[1].value, f64::INFINITY);
    assert!(a[2].is_stale(), "the staleness marker's bits are kept");
    let b = &all[1].samples;
    assert_eq!(
        b.iter().map(|s| s.timestamp_ms).collect::<Vec<_>>(),
        vec![1_000, 2_000, 3_000],
        "sorted by time"
    );
    assert!(
        b[1].value.is_nan() && !b[1].is_stale(),
        "a plain NaN stays a value"
    );
    assert_eq!(all[2].samples, vec![sample(500, 5.0), sample(1_000, 8.0)]);
}

#[test]
fn matchers_have_prometheus_semantics() {
    let bytes = small_split();
    let m = |name: &str, op: MatchOp, value: &str| Matcher::new(name, op, value).expect("ok");
    let q = |matchers: &[Matcher]| names(&read(&bytes, matchers, i64::MIN, i64::MAX));
    assert_eq!(
        q(&[m("__name__", MatchOp::Equal, "cpu")]),
        vec!["__name__=cpu,env=prod,host=a", "__name__=cpu,host=b"]
    );
    assert_eq!(
        q(&[m("env", MatchOp::Equal, "")]),
        vec!["__name__=cpu,host=b", "__name__=mem,host=a"],
        "an empty value selects the series without the label"
    );
    assert_eq!(
        q(&[m("env", MatchOp::NotEqual, "")]),
        vec!["__name__=cpu,env=prod,host=a"]
    );
    assert_eq!(
        q(&[
            m("__name__", MatchOp::Regex, "c.*"),
            m("host", MatchOp::NotRegex, "a")
        ]),
        vec!["__name__=cpu,host=b"]
    );
    assert!(
        q(&[m("zone", MatchOp::Equal, "x")]).is_empty(),
        "no such label"
    );
    assert_eq!(q(&[m("zone", MatchOp::NotEqual, "x")]).len(), 3);
    assert!(q(&[
        m("host", MatchOp::Regex, "a|b"),
        m("__name__", MatchOp::Equal, "disk")
    ])
    .is_empty());
}

#[test]
fn a_time_range_keeps_the_samples_inside_it() {
    let bytes = small_split();
    let series = read(&bytes, &[], 1_500, 2_000);
    assert_eq!(
        names(&series),
        vec!["__name__=cpu,env=prod,host=a", "__name__=cpu,host=b"]
    );
    assert!(series
        .iter()
        .all(|s| s.samples.len() == 1 && s.samples[0].timestamp_ms == 2_000));
    assert!(read(&bytes, &[], 3_001, 9_000).is_empty());
}

/// 600 000 samples over three row groups, metric names in sort order: a selector on one
/// name decodes only the row groups that can hold it.
#[test]
fn row_groups_are_pruned_by_statistics_and_bloom_filters() {
    let mut writer = MetricsSplitWriter::new(vec!["host".to_string()]);
    let metric_names = ["m_a", "m_c", "m_e", "m_g", "m_i", "m_k"];
    for name in metric_names {
        for host in 0..100 {
            let series = labels(&[("__name__", name), ("host", &format!("h{host:03}"))]);
            writer.add(
                &series,
                (0..1_000).map(|i| sample(i * 10_000, (i * host) as f64)),
            );
        }
    }
    let (bytes, summary) = writer.finish().expect("a split");
    assert_eq!(summary.num_samples, 600_000);
    assert_eq!(summary.num_series, 600);
    let bytes = Bytes::from(bytes);
    let query = |matchers: &[Matcher], start: i64, end: i64| {
        read_split(bytes.clone(), matchers, start, end).expect("a read")
    };

    let all = query(&[], i64::MIN, i64::MAX);
    assert_eq!(all.stats.row_groups, 3);
    assert_eq!(all.stats.row_groups_read, 3);
    assert_eq!(all.stats.samples, 600_000);

    // Rows 0..100 000 are `m_a`, in the first row group of 262 144 rows.
    let first = query(&[Matcher::equal("__name__", "m_a")], i64::MIN, i64::MAX);
    assert_eq!(first.series.len(), 100);
    assert_eq!(first.stats.samples, 100_000);
    assert_eq!(
        first.stats.row_groups_read, 1,
        "statistics rule out the others"
    );
    // Rows 500 000..600 000 straddle the last two row groups.
    let last = query(&[Matcher::equal("__name__", "m_k")], i64::MIN, i64::MAX);
    assert_eq!(last.stats.samples, 100_000);
    assert_eq!(last.stats.row_groups_read, 2);

    // Between the names of a row group: only its bloom filter rules it out.
    let absent = query(&[Matcher::equal("__name__", "m_b")], i64::MIN, i64::MAX);
    assert!(absent.series.is_empty());
    assert_eq!(
        absent.stats.row_groups_read, 0,
        "the bloom filter rules it out"
    );

    let one = query(
        &[
            Matcher::equal("__name__", "m_e"),
            Matcher::equal("host", "h042"),
        ],
        5_000_000,
        5_050_000,
    );
    assert_eq!(one.series.len(), 1);
    assert_eq!(
        one.series[0].samples,
        (500..=505)
            .map(|i| sample(i * 10_000, (i * 42) as f64))
            .collect::<Vec<_>>()
    );
    assert!(query(&[], 10_000_000, 20_000_000).series.is_empty());
    assert_eq!(query(&[], 10_000_000, 20_000_000).stats.row_groups_read, 0);

    // One series of 1 000 rows: not the 262 144 of each row group `m_e` is in.
    assert!(one.stats.row_groups_read <= 2);
    // With the series index: only the series' own rows in the pages of the window.
    assert!(
        one.stats.rows_read <= 1_000,
        "{} rows decoded for one series",
        one.stats.rows_read
    );
    // The same through the footer cache, twice (the second from the cache), and without
    // pruning: the same answer.
    for _ in 0..2 {
        let cached = shale_metrics::read_split_cached(
            Some("split-under-test"),
            bytes.clone(),
            &[
                Matcher::equal("__name__", "m_e"),
                Matcher::equal("host", "h042"),
            ],
            5_000_000,
            5_050_000,
            true,
        )
        .expect("a read");
        assert_eq!(cached.series, one.series);
        assert_eq!(cached.stats.rows_read, one.stats.rows_read);
    }
    let unpruned = shale_metrics::read_split_with(
        bytes.clone(),
        &[
            Matcher::equal("__name__", "m_e"),
            Matcher::equal("host", "h042"),
        ],
        5_000_000,
        5_050_000,
        false,
    )
    .expect("a read");
    assert_eq!(unpruned.series, one.series);
    assert_eq!(unpruned.stats.rows_read, 600_000);
}

#[test]
fn samples_cost_few_bytes() {
    // 1 000 series × 720 samples at a 10 s interval: a counter and a gauge-like value.
    let mut writer = MetricsSplitWriter::new(vec!["service".to_string(), "host".to_string()]);
    for s in 0..1_000i64 {
        let series = labels(&[
            (
                "__name__",
                if s % 2 == 0 {
                    "http_requests_total"
                } else {
                    "cpu_usage"
                },
            ),
            ("service", &format!("svc{}", s % 10)),
            ("host", &format!("host-{s}")),
            ("region", "eu-west-1"),
        ]);
        writer.add(
            &series,
            (0..720i64).map(|i| sample(1_700_000_000_000 + i * 10_000, (i * (s % 7 + 1)) as f64)),
        );
    }
    let (bytes, summary) = writer.finish().expect("a split");
    let per_sample = bytes.len() as f64 / summary.num_samples as f64;
    assert!(per_sample < 4.0, "{per_sample:.2} bytes per sample");
}

#[test]
fn buckets_are_aligned_on_the_epoch() {
    assert_eq!(bucket_start_ms(1_700_000_123_456, 900), 1_700_000_100_000);
    assert_eq!(bucket_start_ms(-1, 900), -900_000);
}

#[test]
fn other_files_are_refused() {
    let err = read_split(Bytes::from_static(b"not parquet at all"), &[], 0, 1).expect_err("no");
    assert!(err.to_string().contains("parquet"), "{err}");
}

/// A split of 4 names × 100 hosts × 1 000 samples read by byte ranges under `key`: its
/// bytes, the bytes and requests fetched so far, and a read by ranges.
#[allow(clippy::type_complexity)]
fn ranged_split(
    key: &'static str,
) -> (
    Bytes,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    impl Fn(&[Matcher], i64, i64) -> shale_metrics::SplitRead,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let mut writer = MetricsSplitWriter::new(vec!["host".to_string()]);
    for name in ["m_a", "m_c", "m_e", "m_g"] {
        for host in 0..100 {
            let series = labels(&[("__name__", name), ("host", &format!("h{host:03}"))]);
            writer.add(
                &series,
                (0..1_000).map(|i| sample(i * 10_000, (i * host) as f64 + 0.5)),
            );
        }
    }
    let (bytes, _) = writer.finish().expect("a split");
    let bytes = Bytes::from(bytes);
    let fetched = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let reader = {
        let size = bytes.len() as u64;
        let (bytes, fetched, requests) = (bytes.clone(), fetched.clone(), requests.clone());
        let fetch: shale_metrics::FetchRange = Arc::new(move |range: std::ops::Range<u64>| {
            fetched.fetch_add(range.end - range.start, Ordering::Relaxed);
            requests.fetch_add(1, Ordering::Relaxed);
            let slice = usize::try_from(range.start)
                .ok()
                .zip(usize::try_from(range.end).ok())
                .filter(|(_, end)| *end <= bytes.len())
                .map(|(start, end)| bytes.slice(start..end))
                .ok_or_else(|| format!("range {range:?} out of the object"));
            Box::pin(async move { slice })
        });
        shale_metrics::RangeReader::new(size, fetch)
    };
    let ranged = move |matchers: &[Matcher], start: i64, end: i64| {
        futures::executor::block_on(shale_metrics::read_split_ranges(
            key,
            reader.clone(),
            matchers,
            start,
            end,
            true,
        ))
        .expect("a ranged read")
    };
    (bytes, fetched, requests, ranged)
}

/// Read by byte ranges, a split gives the same answers as read whole; once its footer is
/// cached, one series costs a small part of the object (pages only: the cache of decoded
/// columns is off here, see the next test).
#[test]
fn by_byte_ranges_a_series_fetches_a_small_part_of_the_split() {
    use std::sync::atomic::{AtomicU64, Ordering};

    shale_metrics::column_cache::set_column_cache_bytes(0);
    let (bytes, fetched, requests, ranged) = ranged_split("ranged-split-under-test");
    let one_series = [
        Matcher::equal("__name__", "m_e"),
        Matcher::equal("host", "h042"),
    ];
    let cases: Vec<(Vec<Matcher>, i64, i64)> = vec![
        (one_series.to_vec(), 5_000_000, 5_050_000),
        (vec![Matcher::equal("__name__", "m_c")], i64::MIN, i64::MAX),
        (vec![Matcher::equal("__name__", "m_b")], i64::MIN, i64::MAX),
        (vec![], 9_000_000, 9_990_000),
        (
            vec![Matcher::new("host", MatchOp::Regex, "h00[0-9]").expect("a regex")],
            0,
            100_000,
        ),
    ];
    // The first read of the split fetches its footer (with the series index) too.
    let cold_requests = |requests: &AtomicU64| {
        requests.store(0, Ordering::Relaxed);
        ranged(&one_series, 5_000_000, 5_050_000);
        requests.load(Ordering::Relaxed)
    };
    let cold = cold_requests(&requests);
    for (matchers, start, end) in &cases {
        let whole = read_split(bytes.clone(), matchers, *start, *end).expect("a read");
        let by_ranges = ranged(matchers, *start, *end);
        assert_eq!(by_ranges.series, whole.series, "{matchers:?}");
        assert_eq!(by_ranges.stats, whole.stats, "{matchers:?}");
    }
    // The footer is cached now: one series fetches the pages of its timestamps and values
    // only (a range per group of close pages, fetched concurrently).
    fetched.store(0, Ordering::Relaxed);
    requests.store(0, Ordering::Relaxed);
    let one = ranged(&one_series, 5_000_000, 5_050_000);
    assert_eq!(one.series.len(), 1);
    let cost = fetched.load(Ordering::Relaxed);
    assert!(
        cost * 10 < bytes.len() as u64,
        "{cost} of {} bytes fetched for one series",
        bytes.len()
    );
    let warm = requests.load(Ordering::Relaxed);
    assert!(
        (1..=2).contains(&warm) && warm < cold,
        "{warm} requests warm, {cold} cold"
    );
    // Another series of a cached name: its pages only, too.
    requests.store(0, Ordering::Relaxed);
    let other = [
        Matcher::equal("__name__", "m_e"),
        Matcher::equal("host", "h017"),
    ];
    let read = ranged(&other, 0, 9_990_000);
    assert_eq!(read.series.len(), 1);
    assert_eq!(
        read.series,
        read_split(bytes.clone(), &other, 0, 9_990_000)
            .expect("a read")
            .series
    );
    assert!(requests.load(Ordering::Relaxed) <= warm);
}

/// With the cache of decoded columns on, a split's first read fetches pages, its second
/// decodes its row groups whole, and later reads fetch nothing: every read answers as a read
/// of the whole split does.
#[test]
fn a_split_read_again_answers_from_its_decoded_columns() {
    use std::sync::atomic::Ordering;

    shale_metrics::column_cache::set_column_cache_bytes(64 << 20);
    let (bytes, fetched, _, ranged) = ranged_split("column-cached-split-under-test");
    let cases: Vec<(Vec<Matcher>, i64, i64)> = vec![
        (
            vec![
                Matcher::equal("__name__", "m_e"),
                Matcher::equal("host", "h042"),
            ],
            5_000_000,
            5_050_000,
        ),
        (
            vec![
                Matcher::equal("__name__", "m_a"),
                Matcher::new("host", MatchOp::Regex, "h0[1-3].").expect("a regex"),
            ],
            i64::MIN,
            i64::MAX,
        ),
        (
            vec![Matcher::equal("__name__", "m_g")],
            1_000_000,
            2_000_000,
        ),
        (vec![], 9_000_000, 9_990_000),
    ];
    let mut fetched_per_round = Vec::new();
    for round in 0..3 {
        fetched.store(0, Ordering::Relaxed);
        for (matchers, start, end) in &cases {
            let whole = read_split(bytes.clone(), matchers, *start, *end).expect("a read");
            let by_ranges = ranged(matchers, *start, *end);
            assert_eq!(
                by_ranges.series, whole.series,
                "round {round}: {matchers:?}"
            );
            assert_eq!(by_ranges.stats.samples, whole.stats.samples);
        }
        fetched_per_round.push(fetched.load(Ordering::Relaxed));
    }
    assert_eq!(fetched_per_round[2], 0, "{fetched_per_round:?}");
    let (groups, held) = shale_metrics::column_cache::column_cache_usage();
    assert!(groups >= 1 && held > 0, "{groups} row groups, {held} bytes");
}

/// Reads through the series index, by the page index (a split without the series index)
/// and with no pruning at all give the same series and samples, for random selectors and
/// windows over a split of two row groups whose series lack some labels.
#[test]
fn the_series_index_answers_as_a_full_scan_does() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let write = |indexed: bool| {
        let mut writer = MetricsSplitWriter::new(vec!["job".to_string()]);
        if !indexed {
            writer = writer.without_series_index();
        }
        for name in ["m_a", "m_b", "m_c"] {
            for host in 0..300 {
                let mut pairs = vec![
                    ("__name__", name.to_string()),
                    ("host", format!("h{host:03}")),
                    ("job", format!("j{}", host % 7)),
                ];
                if host % 3 == 0 {
                    pairs.push(("le", format!("{}", host % 5)));
                }
                let pairs: Vec<(&str, &str)> =
                    pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
                // 300 to 400 samples: the second row group starts within a series.
                let count = 300 + (host * 37) % 100;
                writer.add(
                    &labels(&pairs),
                    (0..count).map(|i| sample(i * 10_000 + host, (i * host) as f64)),
                );
            }
        }
        Bytes::from(writer.finish().expect("a split").0)
    };
    let (indexed, plain) = (write(true), write(false));
    let op = |rng: &mut rand::rngs::StdRng| {
        [
            MatchOp::Equal,
            MatchOp::NotEqual,
            MatchOp::Regex,
            MatchOp::NotRegex,
        ][rng.random_range(0..4)]
    };
    for case in 0..80 {
        let mut matchers = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            let (name, values): (&str, &[&str]) = match rng.random_range(0..5) {
                0 => ("__name__", &["m_a", "m_b", "m_c", "m_z", "m_.*", ""]),
                1 => ("host", &["h001", "h042", "h29.", "h1.*", ""]),
                2 => ("job", &["j3", "j[0-2]", "", "nope"]),
                3 => ("le", &["1", "", "[0-3]"]),
                _ => ("absent", &["", "x", ".*"]),
            };
            let value = values[rng.random_range(0..values.len())];
            matchers.push(Matcher::new(name, op(&mut rng), value).expect("a matcher"));
        }
        let start = rng.random_range(-10_000..4_000_000);
        let end = start + rng.random_range(0..4_000_000);
        let full = shale_metrics::read_split_with(indexed.clone(), &matchers, start, end, false)
            .expect("a read");
        let by_index = read_split(indexed.clone(), &matchers, start, end).expect("a read");
        let by_pages = read_split(plain.clone(), &matchers, start, end).expect("a read");
        assert_eq!(
            by_index.series, full.series,
            "case {case}: {matchers:?} {start}..{end}"
        );
        assert_eq!(
            by_pages.series, full.series,
            "case {case}: {matchers:?} {start}..{end}"
        );
        assert_eq!(by_index.stats.samples, full.stats.samples);
        assert!(by_index.stats.rows_read <= by_pages.stats.rows_read.max(full.stats.samples));
    }
}
