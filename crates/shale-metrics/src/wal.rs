//! The WAL record of a metrics index: a batch of series with their samples, written when a
//! remote-write or OTLP request is acknowledged and read back by the indexing pipeline.
//!
//! Layout (after the WAL's own record prefix): the byte `M`, the format version (1), the
//! number of series; per series its labels (count, then name and value as length-prefixed
//! UTF-8) and its samples (count, then per sample the timestamp as a zigzag varint delta from
//! the previous one — the first from 0 — and the value's 8 IEEE-754 bytes little-endian, so
//! that NaN payloads such as the staleness marker survive bit for bit). Counts and lengths
//! are LEB128 varints.

use crate::varint::{put_str, put_varint, ReadError, Reader};
use crate::{Labels, Sample};

/// First byte of a metrics record.
const MARKER: u8 = b'M';
/// The version written.
const VERSION: u8 = 1;

/// A record that does not decode (truncated, or not a metrics record).
#[derive(Debug, thiserror::Error)]
#[error("invalid metrics WAL record: {0}")]
pub struct WalRecordError(String);

/// Encodes `series` as records of about `target_bytes` each (a series is never split across
/// records, so a record may be larger when one series is).
pub fn encode_records(series: &[(Labels, Vec<Sample>)], target_bytes: usize) -> Vec<Vec<u8>> {
    let mut records = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for (i, (labels, samples)) in series.iter().enumerate() {
        let series_size = labels
            .iter()
            .map(|(n, v)| n.len() + v.len() + 2)
            .sum::<usize>()
            + samples.len() * 11
            + 4;
        if i > start && size + series_size > target_bytes {
            records.push(encode_record(&series[start..i]));
            start = i;
            size = 0;
        }
        size += series_size;
    }
    if start < series.len() {
        records.push(encode_record(&series[start..]));
    }
    records
}

/// Encodes `series` as one record.
pub fn encode_record(series: &[(Labels, Vec<Sample>)]) -> Vec<u8> {
    let mut out = vec![MARKER, VERSION];
    put_varint(&mut out, series.len() as u64);
    for (labels, samples) in series {
        put_varint(&mut out, labels.len() as u64);
        for (name, value) in labels.iter() {
            put_str(&mut out, name);
            put_str(&mut out, value);
        }
        put_varint(&mut out, samples.len() as u64);
        let mut previous = 0i64;
        for sample in samples {
            let delta = sample.timestamp_ms.wrapping_sub(previous);
            put_varint(&mut out, ((delta << 1) ^ (delta >> 63)) as u64);
            out.extend_from_slice(&sample.value.to_bits().to_le_bytes());
            previous = sample.timestamp_ms;
        }
    }
    out
}

/// Decodes a record written by [`encode_record`].
pub fn decode_record(bytes: &[u8]) -> Result<Vec<(Labels, Vec<Sample>)>, WalRecordError> {
    let mut series = Vec::new();
    visit_record(bytes, |pairs, samples| {
        let pairs = pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()));
        series.push((Labels::new(pairs), samples.to_vec()));
    })?;
    Ok(series)
}

/// The label sets of records decoded before, by series id: a record of series met before
/// decodes without building label strings (a series' labels are shared, not copied).
#[derive(Default)]
pub struct Interner {
    by_id: std::collections::HashMap<u64, Labels>,
}

/// Label sets an [`Interner`] keeps at most (then it starts over).
const MAX_INTERNED: usize = 1 << 20;

impl Interner {
    /// [`decode_record`], with the label sets met before shared.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<Vec<(Labels, Vec<Sample>)>, WalRecordError> {
        let mut series = Vec::new();
        let by_id = &mut self.by_id;
        visit_record(bytes, |pairs, samples| {
            let id = Labels::series_id_of(pairs);
            let labels = match by_id.get(&id) {
                Some(known) if known.same_pairs(pairs) => known.clone(),
                _ => {
                    let labels = Labels::new(
                        pairs
                            .iter()
                            .map(|(name, value)| (name.to_string(), value.to_string())),
                    );
                    if by_id.len() >= MAX_INTERNED {
                        by_id.clear();
                    }
                    by_id.insert(labels.series_id(), labels.clone());
                    labels
                }
            };
            series.push((labels, samples.to_vec()));
        })?;
        Ok(series)
    }
}

/// Calls `series` with each series of a record written by [`encode_record`] — its label
/// pairs as written (sorted, unique, no empty value: those of a [`Labels`]) and its samples —
/// borrowing them from `bytes`: a reader that already knows a series pays no allocation for
/// it (see [`Labels::same_pairs`]).
pub fn visit_record(
    bytes: &[u8],
    mut series: impl FnMut(&[(&str, &str)], &[Sample]),
) -> Result<(), WalRecordError> {
    let mut reader = Reader::new(bytes);
    if reader.byte()? != MARKER {
        return Err(WalRecordError("not a metrics record".to_string()));
    }
    let version = reader.byte()?;
    if version != VERSION {
        return Err(WalRecordError(format!("unknown version {version}")));
    }
    let num_series = reader.count()?;
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    for _ in 0..num_series {
        let num_labels = reader.count()?;
        pairs.clear();
        for _ in 0..num_labels {
            let name = reader.str()?;
            let value = reader.str()?;
            pairs.push((name, value));
        }
        let num_samples = reader.count()?;
        samples.clear();
        let mut previous = 0i64;
        for _ in 0..num_samples {
            let zigzag = reader.varint()?;
            let delta = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
            let timestamp_ms = previous.wrapping_add(delta);
            let value = f64::from_bits(u64::from_le_bytes(reader.array()?));
            samples.push(Sample {
                timestamp_ms,
                value,
            });
            previous = timestamp_ms;
        }
        series(&pairs, &samples);
    }
    if reader.left() != 0 {
        return Err(WalRecordError("trailing bytes".to_string()));
    }
    Ok(())
}

impl From<ReadError> for WalRecordError {
    fn from(err: ReadError) -> Self {
        WalRecordError(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, n: usize) -> (Labels, Vec<Sample>) {
        (
            Labels::new([
                ("__name__".to_string(), name.to_string()),
                ("job".to_string(), "ü".to_string()),
            ]),
            (0..n)
                .map(|i| Sample {
                    timestamp_ms: 1_700_000_000_000 - (i as i64 % 3) * 10_000 + i as i64,
                    value: if i == 1 {
                        f64::from_bits(crate::STALE_NAN_BITS)
                    } else {
                        i as f64 * -0.5
                    },
                })
                .collect(),
        )
    }

    #[test]
    fn records_round_trip_bit_for_bit_and_are_cut_by_size() {
        let input: Vec<_> = (0..50).map(|i| series(&format!("m{i}"), 20)).collect();
        let records = encode_records(&input, 1024);
        assert!(records.len() > 3, "{} records", records.len());
        let mut decoded = Vec::new();
        for record in &records {
            decoded.extend(decode_record(record).unwrap());
        }
        assert_eq!(decoded.len(), input.len());
        for ((l1, s1), (l2, s2)) in input.iter().zip(&decoded) {
            assert_eq!(l1, l2);
            let bits = |s: &Vec<Sample>| {
                s.iter()
                    .map(|s| (s.timestamp_ms, s.value.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(s1), bits(s2));
        }
        // Truncations and garbage are errors, never panics.
        let record = &records[0];
        for len in 0..record.len() {
            assert!(decode_record(&record[..len]).is_err());
        }
        assert!(decode_record(b"{\"json\": 1}").is_err());
    }
}
