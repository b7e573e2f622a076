//! `cargo bench -p shale-ingest --bench live`: what keeping acknowledged samples in memory
//! for PromQL costs on the write path, against decoding the same WAL records alone (the
//! baseline every reader of the WAL pays), and what a one-series select costs.
//!
//! The workload is `shale-bench metrics`'s shape: 10 000 series of 5 labels, records of 2 000
//! samples (one per series), 100 records per series (`SERIES`, `RECORDS` override).

use std::time::Instant;

use shale_ingest::LiveSamples;
use shale_metrics::{Labels, Matcher, Sample};
use shale_types::SourceCheckpoint;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn labels(i: usize) -> Labels {
    Labels::new([
        (
            "__name__".to_string(),
            format!("node_metric_{}_total", i % 20),
        ),
        ("instance".to_string(), format!("host-{:04}:9100", i / 100)),
        ("job".to_string(), "node".to_string()),
        (
            "mode".to_string(),
            ["idle", "user", "system", "iowait", "irq"][i % 5].to_string(),
        ),
        ("device".to_string(), format!("d{}", (i / 20) % 5)),
    ])
}

fn main() {
    let series = env("SERIES", 10_000);
    let records = env("RECORDS", 100);
    let per_record = 2_000.min(series);
    let all: Vec<Labels> = (0..series).map(labels).collect();
    // Record r holds one sample of `per_record` series, round robin.
    let encoded: Vec<Vec<u8>> = (0..records)
        .map(|r| {
            let batch: Vec<(Labels, Vec<Sample>)> = (0..per_record)
                .map(|k| {
                    let i = (r * per_record + k) % series;
                    let round = (r * per_record + k) / series;
                    (
                        all[i].clone(),
                        vec![Sample {
                            timestamp_ms: 1_700_000_000_000 + round as i64 * 10_000,
                            value: (round * i) as f64,
                        }],
                    )
                })
                .collect();
            shale_metrics::wal::encode_record(&batch)
        })
        .collect();
    let samples = (records * per_record) as f64;

    let started = Instant::now();
    for record in &encoded {
        let decoded = shale_metrics::wal::decode_record(record).expect("a record");
        std::hint::black_box(decoded);
    }
    let decode = started.elapsed();

    let live = LiveSamples::new(4 << 30);
    live.serve("index", "queue", None);
    let started = Instant::now();
    for (position, record) in encoded.iter().enumerate() {
        live.insert_encoded(
            "index",
            "queue",
            position as u64,
            0,
            std::slice::from_ref(record),
        );
    }
    let insert = started.elapsed();
    let stats = live.stats();

    let one = [
        Matcher::equal("__name__", "node_metric_7_total"),
        Matcher::equal("instance", "host-0042:9100"),
    ];
    let checkpoint = SourceCheckpoint::default();
    let runs = 200;
    let started = Instant::now();
    for _ in 0..runs {
        let found = live
            .select("index", &checkpoint, &one, i64::MIN, i64::MAX, &[])
            .expect("a select");
        std::hint::black_box(found);
    }
    let select = started.elapsed() / runs;

    println!(
        "{records} records × {per_record} samples ({series} series): decode alone {:.0} samples/s ({:.2} µs/sample); decode + keep {:.0} samples/s ({:.2} µs/sample, {:.2}x the decode); {} MB held for {} samples ({:.1} bytes/sample); one-series select {:.1} µs",
        samples / decode.as_secs_f64(),
        decode.as_secs_f64() * 1e6 / samples,
        samples / insert.as_secs_f64(),
        insert.as_secs_f64() * 1e6 / samples,
        insert.as_secs_f64() / decode.as_secs_f64(),
        stats.bytes / 1_000_000,
        stats.samples,
        stats.bytes as f64 / stats.samples.max(1) as f64,
        select.as_secs_f64() * 1e6,
    );
}
