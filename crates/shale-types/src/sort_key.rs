//! The sort key of a locality index, as bytes whose order is the order of the key: the values
//! of the index's `sort_fields`, then the timestamp descending. A split of such an index is
//! sorted by this key and records its smallest and largest key, so that a query on the
//! leading sort fields can skip the splits whose key range cannot hold a match.
//!
//! Encoding, per sort field: a tag byte (`0x00` missing, `0x01` present: missing values sort
//! first) then the value — text escaped (`0x00` → `0x00 0xFF`) and terminated by `0x00 0x01`,
//! so that a prefix sorts before its extensions; integers and timestamps big-endian with the
//! sign bit flipped; booleans one byte. Then the timestamp, bit-complemented so that recent
//! documents come first (missing: tag `0x00`). Every component starts with a byte ≤ `0x01`,
//! so `prefix ++ [0xFF]` is above every key that starts with `prefix`.

use serde::{Deserialize, Serialize};

/// The type of one sort field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortFieldType {
    /// A raw (untokenized) text field.
    Text,
    /// An unsigned integer.
    U64,
    /// A signed integer.
    I64,
    /// A boolean.
    Bool,
    /// A timestamp, in the field's stored unit.
    DateTime,
}

/// One value of a sort field.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SortValue {
    /// The document has no value.
    Missing,
    /// A boolean.
    Bool(bool),
    /// An unsigned integer.
    U64(u64),
    /// A signed integer or a timestamp.
    I64(i64),
    /// A text value.
    Text(String),
}

/// An encoded sort key, written as lowercase hex in JSON (split metadata, the splits API).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SortKey(pub Vec<u8>);

impl Serialize for SortKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut hex = String::with_capacity(self.0.len() * 2);
        for byte in &self.0 {
            hex.push_str(&format!("{byte:02x}"));
        }
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for SortKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        if hex.len() % 2 != 0 {
            return Err(serde::de::Error::custom(
                "a sort key is an even number of hex digits",
            ));
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom(format!("not hex: `{hex}`")))
            })
            .collect::<Result<Vec<u8>, _>>()
            .map(SortKey)
    }
}

const MISSING: u8 = 0x00;
const PRESENT: u8 = 0x01;
const ESCAPE: u8 = 0xFF;
const TEXT_END: u8 = 0x01;

/// An encoded key is malformed (a stored key from another version, or corrupt bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed sort key: {0}")]
pub struct SortKeyError(String);

fn push_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(&((value as u64) ^ (1 << 63)).to_be_bytes());
}

/// Appends the encoding of one sort field's value of type `kind`; a value of another type
/// than `kind` is encoded as missing.
pub fn push_value(out: &mut Vec<u8>, kind: SortFieldType, value: &SortValue) {
    match (kind, value) {
        (SortFieldType::Text, SortValue::Text(text)) => {
            out.push(PRESENT);
            for &byte in text.as_bytes() {
                out.push(byte);
                if byte == 0x00 {
                    out.push(ESCAPE);
                }
            }
            out.extend_from_slice(&[0x00, TEXT_END]);
        }
        (SortFieldType::U64, SortValue::U64(n)) => {
            out.push(PRESENT);
            out.extend_from_slice(&n.to_be_bytes());
        }
        (SortFieldType::I64 | SortFieldType::DateTime, SortValue::I64(n)) => {
            out.push(PRESENT);
            push_i64(out, *n);
        }
        (SortFieldType::Bool, SortValue::Bool(b)) => {
            out.push(PRESENT);
            out.push(u8::from(*b));
        }
        _ => out.push(MISSING),
    }
}

/// Appends the timestamp component: recent first.
pub fn push_timestamp(out: &mut Vec<u8>, timestamp: Option<i64>) {
    match timestamp {
        None => out.push(MISSING),
        Some(ts) => {
            out.push(PRESENT);
            out.extend_from_slice(&(!((ts as u64) ^ (1 << 63))).to_be_bytes());
        }
    }
}

/// The whole key of a document: its sort field values (in `kinds` order), then its timestamp.
pub fn encode(kinds: &[SortFieldType], values: &[SortValue], timestamp: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 * kinds.len() + 9);
    for (i, kind) in kinds.iter().enumerate() {
        push_value(
            &mut out,
            *kind,
            values.get(i).unwrap_or(&SortValue::Missing),
        );
    }
    push_timestamp(&mut out, timestamp);
    out
}

/// The smallest byte string above every key that starts with `prefix` (a whole number of
/// encoded components).
pub fn prefix_upper_bound(prefix: &[u8]) -> Vec<u8> {
    let mut bound = Vec::with_capacity(prefix.len() + 1);
    bound.extend_from_slice(prefix);
    bound.push(0xFF);
    bound
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], SortKeyError> {
    if bytes.len() < n {
        return Err(SortKeyError(format!(
            "expected {n} more bytes, found {}",
            bytes.len()
        )));
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Ok(head)
}

fn take_u64(bytes: &mut &[u8]) -> Result<u64, SortKeyError> {
    let raw = take(bytes, 8)?;
    let mut buf = [0u8; 8];
    buf.copy_from_slice(raw);
    Ok(u64::from_be_bytes(buf))
}

/// The length of `key`'s sort-field part (everything before the timestamp component): two
/// keys with the same prefix hold the same sort field values.
pub fn prefix_len(kinds: &[SortFieldType], key: &[u8]) -> Result<usize, SortKeyError> {
    let mut rest = key;
    for kind in kinds {
        let tag = take(&mut rest, 1)?[0];
        if tag == MISSING {
            continue;
        }
        if tag != PRESENT {
            return Err(SortKeyError(format!("unknown tag {tag:#04x}")));
        }
        match kind {
            SortFieldType::Text => loop {
                if take(&mut rest, 1)?[0] == 0x00 && take(&mut rest, 1)?[0] == TEXT_END {
                    break;
                }
            },
            SortFieldType::U64 | SortFieldType::I64 | SortFieldType::DateTime => {
                take(&mut rest, 8)?;
            }
            SortFieldType::Bool => {
                take(&mut rest, 1)?;
            }
        }
    }
    Ok(key.len() - rest.len())
}

/// The sort field values of a key, or of a key bound that stops after them (a level-1
/// split's widened range: a prefix, or a prefix followed by `0xFF`).
pub fn decode_values(kinds: &[SortFieldType], key: &[u8]) -> Result<Vec<SortValue>, SortKeyError> {
    let len = prefix_len(kinds, key)?;
    let mut values_only = key[..len].to_vec();
    values_only.push(MISSING);
    decode(kinds, &values_only).map(|(values, _)| values)
}

impl std::fmt::Display for SortValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SortValue::Missing => f.write_str("-"),
            SortValue::Text(text) => f.write_str(text),
            SortValue::U64(n) => write!(f, "{n}"),
            SortValue::I64(n) => write!(f, "{n}"),
            SortValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// Decodes a key back into its sort field values and timestamp.
pub fn decode(
    kinds: &[SortFieldType],
    mut bytes: &[u8],
) -> Result<(Vec<SortValue>, Option<i64>), SortKeyError> {
    let mut values = Vec::with_capacity(kinds.len());
    for kind in kinds {
        let tag = take(&mut bytes, 1)?[0];
        if tag == MISSING {
            values.push(SortValue::Missing);
            continue;
        }
        if tag != PRESENT {
            return Err(SortKeyError(format!("unknown tag {tag:#04x}")));
        }
        let value = match kind {
            SortFieldType::Text => {
                let mut text = Vec::new();
                loop {
                    let byte = take(&mut bytes, 1)?[0];
                    if byte != 0x00 {
                        text.push(byte);
                        continue;
                    }
                    match take(&mut bytes, 1)?[0] {
                        ESCAPE => text.push(0x00),
                        TEXT_END => break,
                        other => {
                            return Err(SortKeyError(format!(
                                "0x00 followed by {other:#04x} in a text value"
                            )))
                        }
                    }
                }
                SortValue::Text(
                    String::from_utf8(text).map_err(|err| SortKeyError(err.to_string()))?,
                )
            }
            SortFieldType::U64 => SortValue::U64(take_u64(&mut bytes)?),
            SortFieldType::I64 | SortFieldType::DateTime => {
                SortValue::I64((take_u64(&mut bytes)? ^ (1 << 63)) as i64)
            }
            SortFieldType::Bool => SortValue::Bool(take(&mut bytes, 1)?[0] != 0),
        };
        values.push(value);
    }
    let timestamp = match take(&mut bytes, 1)?[0] {
        MISSING => None,
        PRESENT => Some(((!take_u64(&mut bytes)?) ^ (1 << 63)) as i64),
        other => return Err(SortKeyError(format!("unknown timestamp tag {other:#04x}"))),
    };
    if !bytes.is_empty() {
        return Err(SortKeyError(format!("{} trailing bytes", bytes.len())));
    }
    Ok((values, timestamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const KINDS: [SortFieldType; 4] = [
        SortFieldType::Text,
        SortFieldType::I64,
        SortFieldType::Bool,
        SortFieldType::U64,
    ];

    fn random_value(rng: &mut StdRng, kind: SortFieldType) -> SortValue {
        if rng.random_range(0..8) == 0 {
            return SortValue::Missing;
        }
        match kind {
            SortFieldType::Text => {
                // Short strings over a tiny alphabet with 0x00 in it: prefixes and escapes
                // collide often.
                let len = rng.random_range(0..4) as usize;
                let alphabet = ["\0", "a", "b", "\u{7f}", "é"];
                SortValue::Text(
                    (0..len)
                        .map(|_| alphabet[rng.random_range(0..alphabet.len() as u64) as usize])
                        .collect(),
                )
            }
            SortFieldType::I64 | SortFieldType::DateTime => SortValue::I64(
                [i64::MIN, -2, -1, 0, 1, 2, i64::MAX][rng.random_range(0..7) as usize],
            ),
            SortFieldType::U64 => {
                SortValue::U64([0, 1, 255, 256, u64::MAX][rng.random_range(0..5) as usize])
            }
            SortFieldType::Bool => SortValue::Bool(rng.random_range(0..2) == 1),
        }
    }

    /// The order the encoding must reproduce: values in field order (missing first), then the
    /// timestamp descending (missing first).
    fn tuple_order(
        a: &(Vec<SortValue>, Option<i64>),
        b: &(Vec<SortValue>, Option<i64>),
    ) -> std::cmp::Ordering {
        let text_bytes = |v: &SortValue| match v {
            SortValue::Text(t) => Some(t.as_bytes().to_vec()),
            _ => None,
        };
        for (x, y) in a.0.iter().zip(&b.0) {
            let ord = match (x, y) {
                (SortValue::Missing, SortValue::Missing) => std::cmp::Ordering::Equal,
                (SortValue::Missing, _) => std::cmp::Ordering::Less,
                (_, SortValue::Missing) => std::cmp::Ordering::Greater,
                (SortValue::Text(_), SortValue::Text(_)) => text_bytes(x).cmp(&text_bytes(y)),
                _ => x.cmp(y),
            };
            if ord.is_ne() {
                return ord;
            }
        }
        match (a.1, b.1) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => y.cmp(&x),
        }
    }

    #[test]
    fn byte_order_is_key_order_and_keys_decode_back() {
        let mut rng = StdRng::seed_from_u64(7);
        let keys: Vec<(Vec<SortValue>, Option<i64>)> = (0..400)
            .map(|_| {
                let values = KINDS.iter().map(|k| random_value(&mut rng, *k)).collect();
                let ts = match rng.random_range(0..5) {
                    0 => None,
                    1 => Some(i64::MIN),
                    2 => Some(i64::MAX),
                    _ => Some(rng.random_range(0..5) as i64 - 2),
                };
                (values, ts)
            })
            .collect();
        let encoded: Vec<Vec<u8>> = keys.iter().map(|(v, t)| encode(&KINDS, v, *t)).collect();
        for (key, bytes) in keys.iter().zip(&encoded) {
            assert_eq!(&decode(&KINDS, bytes).expect("decodes"), key);
            // The prefix is the encoding of the values alone.
            let values_only = encode(&KINDS, &key.0, None);
            let len = prefix_len(&KINDS, bytes).expect("prefix");
            assert_eq!(&bytes[..len], &values_only[..values_only.len() - 1]);
            assert_eq!(decode_values(&KINDS, bytes).expect("values"), key.0);
            let widened = prefix_upper_bound(&bytes[..len]);
            assert_eq!(decode_values(&KINDS, &widened).expect("values"), key.0);
        }
        for i in 0..keys.len() {
            for j in 0..keys.len() {
                assert_eq!(
                    encoded[i].cmp(&encoded[j]),
                    tuple_order(&keys[i], &keys[j]),
                    "{:?} vs {:?}",
                    keys[i],
                    keys[j]
                );
            }
        }
    }

    #[test]
    fn a_prefix_bounds_exactly_the_keys_that_start_with_it() {
        let kinds = [SortFieldType::Text, SortFieldType::Text];
        let mut prefix = Vec::new();
        push_value(
            &mut prefix,
            SortFieldType::Text,
            &SortValue::Text("api".into()),
        );
        let upper = prefix_upper_bound(&prefix);
        let key = |service: &str, host: SortValue, ts: Option<i64>| {
            encode(&kinds, &[SortValue::Text(service.into()), host], ts)
        };
        for inside in [
            key("api", SortValue::Missing, None),
            key("api", SortValue::Text(String::new()), Some(i64::MIN)),
            key("api", SortValue::Text("\u{10ffff}".into()), Some(i64::MAX)),
        ] {
            assert!(prefix <= inside && inside < upper, "{inside:?}");
        }
        for outside in [
            key("ap", SortValue::Text("z".into()), None),
            key("api\0", SortValue::Missing, None),
            key("apia", SortValue::Missing, None),
            key("b", SortValue::Missing, None),
        ] {
            assert!(!(prefix <= outside && outside < upper), "{outside:?}");
        }
    }

    #[test]
    fn keys_are_hex_in_json() {
        let key = SortKey(vec![0x00, 0x1f, 0xff]);
        let json = serde_json::to_string(&key).expect("json");
        assert_eq!(json, "\"001fff\"");
        assert_eq!(serde_json::from_str::<SortKey>(&json).expect("back"), key);
        for bad in ["\"0\"", "\"zz\"", "\"é1\"", "3"] {
            assert!(serde_json::from_str::<SortKey>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_keys_are_errors_not_panics() {
        let kinds = [SortFieldType::Text, SortFieldType::U64];
        let good = encode(
            &kinds,
            &[SortValue::Text("a".into()), SortValue::U64(3)],
            Some(1),
        );
        for cut in 0..good.len() {
            assert!(decode(&kinds, &good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(decode(&kinds, &trailing).is_err());
        assert!(decode(&kinds, &[0x07]).is_err());
    }
}
