//! The metrics merge through its public API: every sample conserved (the later input wins a
//! shared timestamp), outputs sorted and readable, cut at series boundaries into key ranges
//! that do not overlap, fixed ranges kept clear, and the same answer as a plain
//! read-sort-write.

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shale_metrics::merge::{read_sort_write, samples_by_series};
use shale_metrics::{
    merge_splits, read_split, series_sort_key, Labels, MatchOp, Matcher, MergeCut,
    MetricsSplitWriter, Sample,
};

fn sort_labels() -> Vec<String> {
    vec!["job".to_string(), "instance".to_string()]
}

fn series_labels(i: usize) -> Labels {
    let mut pairs = vec![
        ("__name__".to_string(), format!("metric_{}", i % 3)),
        ("job".to_string(), format!("job-{}", i % 5)),
        ("instance".to_string(), format!("host-{}", i % 7)),
        ("series".to_string(), i.to_string()),
    ];
    if i.is_multiple_of(4) {
        // Some series lack a sort label or carry a label others do not.
        pairs.retain(|(name, _)| name != "instance");
        pairs.push(("extra".to_string(), "x".to_string()));
    }
    Labels::new(pairs)
}

/// `inputs` random splits over `series` series, overlapping in series and timestamps (with
/// different values, so the winner is visible); returns them oldest first with the samples
/// the merge must keep (the last written per series and timestamp).
fn random_inputs(
    rng: &mut StdRng,
    inputs: usize,
    series: usize,
) -> (Vec<Bytes>, BTreeMap<Labels, BTreeMap<i64, u64>>) {
    let mut expected: BTreeMap<Labels, BTreeMap<i64, u64>> = BTreeMap::new();
    let mut out = Vec::new();
    for input in 0..inputs {
        let mut writer = MetricsSplitWriter::new(sort_labels());
        for s in 0..series {
            if rng.random_bool(0.4) {
                continue;
            }
            let labels = series_labels(s);
            let samples: Vec<Sample> = (0..rng.random_range(1..40))
                .map(|_| Sample {
                    timestamp_ms: 1_000 * rng.random_range(0..60i64),
                    value: (input * 1000 + rng.random_range(0..1000)) as f64,
                })
                .collect();
            // Within a split, the last added of one timestamp wins.
            for sample in &samples {
                expected
                    .entry(labels.clone())
                    .or_default()
                    .insert(sample.timestamp_ms, sample.value.to_bits());
            }
            writer.add(&labels, samples);
        }
        let (bytes, _) = writer.finish().expect("write");
        out.push(Bytes::from(bytes));
    }
    (out, expected)
}

fn output_bytes(outputs: &[shale_metrics::MergedOutput]) -> Vec<Bytes> {
    outputs
        .iter()
        .map(|o| Bytes::from(o.bytes.clone()))
        .collect()
}

#[test]
fn a_merge_conserves_samples_and_the_later_input_wins() {
    let mut rng = StdRng::seed_from_u64(7);
    for round in 0..20 {
        let (inputs, expected) = random_inputs(&mut rng, 2 + round % 5, 60);
        let (outputs, stats) =
            merge_splits(&inputs, &sort_labels(), &MergeCut::default(), &[]).expect("merge");
        assert_eq!(outputs.len(), 1, "no target: one output");
        let kept: u64 = expected.values().map(|s| s.len() as u64).sum();
        assert_eq!(stats.samples_out, kept);
        assert_eq!(stats.samples_in, stats.samples_out + stats.duplicates);
        assert_eq!(
            samples_by_series(&output_bytes(&outputs)).unwrap(),
            expected,
            "round {round}"
        );
        // The same as the plain read-sort-write.
        let (plain, _) = read_sort_write(&inputs, &sort_labels()).unwrap();
        assert_eq!(samples_by_series(&[Bytes::from(plain)]).unwrap(), expected);
    }
}

#[test]
fn outputs_are_cut_at_series_boundaries_into_disjoint_key_ranges() {
    let mut rng = StdRng::seed_from_u64(11);
    let (inputs, expected) = random_inputs(&mut rng, 4, 300);
    let total: u64 = inputs.iter().map(|b| b.len() as u64).sum();
    let cut = MergeCut {
        target_bytes: Some(total / 6),
        locality: true,
        ..MergeCut::default()
    };
    let (outputs, _) = merge_splits(&inputs, &sort_labels(), &cut, &[]).expect("merge");
    assert!(outputs.len() >= 3, "{} outputs", outputs.len());
    assert_eq!(
        samples_by_series(&output_bytes(&outputs)).unwrap(),
        expected
    );
    let mut previous_max: Option<Vec<u8>> = None;
    let mut seen: BTreeMap<Labels, usize> = BTreeMap::new();
    for (i, output) in outputs.iter().enumerate() {
        assert_eq!(output.key_level, 1);
        let (min, max) = output.key_range.clone().expect("a key range");
        assert!(min < max);
        if let Some(previous) = &previous_max {
            assert!(*previous < min, "output {i} overlaps the one before");
        }
        previous_max = Some(max.clone());
        let read = read_split(Bytes::from(output.bytes.clone()), &[], i64::MIN, i64::MAX)
            .expect("readable");
        for series in read.series {
            let prefix = series_sort_key(
                &sort_labels(),
                &series.labels,
                series.labels.series_id(),
                None,
            );
            assert!(
                min <= prefix && prefix <= max,
                "a series outside its output's range"
            );
            assert!(
                seen.insert(series.labels, i).is_none(),
                "a series split over two outputs"
            );
        }
    }
    // Selectors still read the outputs (bloom filters and statistics are written).
    let selector = [Matcher::new("job", MatchOp::Equal, "job-3").unwrap()];
    let found: usize = output_bytes(&outputs)
        .into_iter()
        .map(|b| {
            read_split(b, &selector, i64::MIN, i64::MAX)
                .unwrap()
                .series
                .len()
        })
        .sum();
    let wanted = expected
        .keys()
        .filter(|l| l.get("job") == Some("job-3"))
        .count();
    assert_eq!(found, wanted);
}

#[test]
fn fixed_ranges_are_kept_clear_of_level_one_outputs() {
    let mut rng = StdRng::seed_from_u64(3);
    let (inputs, expected) = random_inputs(&mut rng, 3, 120);
    // A level-1 split of the bucket owns the series of `metric_1`, job-2.
    let fixed_labels = series_labels(7); // metric_1, job-2
    let low = series_sort_key(
        &sort_labels(),
        &Labels::new([
            ("__name__".to_string(), "metric_1".to_string()),
            ("job".to_string(), "job-2".to_string()),
        ]),
        0,
        None,
    );
    let high = shale_types::sort_key::prefix_upper_bound(&series_sort_key(
        &sort_labels(),
        &Labels::new([
            ("__name__".to_string(), "metric_1".to_string()),
            ("job".to_string(), "job-2".to_string()),
            ("instance".to_string(), "zzz".to_string()),
        ]),
        u64::MAX,
        None,
    ));
    assert_eq!(fixed_labels.metric_name(), "metric_1");
    let cut = MergeCut {
        target_bytes: None,
        fixed_ranges: vec![(low.clone(), high.clone())],
        locality: true,
        plain_level: 0,
    };
    let (outputs, _) = merge_splits(&inputs, &sort_labels(), &cut, &[]).expect("merge");
    assert_eq!(
        samples_by_series(&output_bytes(&outputs)).unwrap(),
        expected
    );
    assert_eq!(outputs.len(), 3, "below, inside, above the fixed range");
    for output in &outputs {
        let (min, max) = output.key_range.clone().unwrap();
        let overlaps = min <= high && low <= max;
        if output.key_level == 1 {
            assert!(!overlaps, "a level-1 output overlaps the fixed range");
        } else {
            let read =
                read_split(Bytes::from(output.bytes.clone()), &[], i64::MIN, i64::MAX).unwrap();
            assert!(read
                .series
                .iter()
                .all(|s| s.labels.metric_name() == "metric_1"
                    && s.labels.get("job") == Some("job-2")));
        }
    }
}
