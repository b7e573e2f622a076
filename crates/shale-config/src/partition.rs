//! Partition keys: the `doc_mapping.partition_key` expression and the partition id it gives a
//! document.
//!
//! Three forms are accepted (whitespace tolerant):
//!
//! * `field`: one partition per distinct value of `field` (id = hash of the value);
//! * `hash_mod(field, N)`: `N` partitions, id = `hash(value) % N`;
//! * `hash_mod((a, b, c), N)`: `N` partitions over the tuple of values.
//!
//! The hash is SipHash-2-4 with fixed keys `(0, 0)` over a canonical, prefix-free encoding of the
//! values, so a given document always gets the same id, on every node and across releases. This
//! matches Quickwit's *behaviour* (deterministic routing of documents to partitions), not
//! necessarily its exact hash values.
//!
//! Canonical encoding: strings, numbers and booleans hash by their text (`42`, `"42"` and `42.0`
//! land in the same partition, as do `true` and `"true"`); a missing field or `null` hashes as a
//! distinct null marker; arrays and objects hash by their JSON text. A field name containing dots
//! (`resource.service`) is looked up literally first, then as a path into nested objects.

use std::fmt;
use std::hash::Hasher;

use serde_json::{Map, Value};
use siphasher::sip::SipHasher;

use crate::ConfigError;

/// Partition id shared by every document whose partition would exceed
/// `doc_mapping.max_num_partitions` distinct partitions in a split (the catch-all partition).
///
/// `hash_mod` ids are `< N`, so they never collide with it; a plain `field` key could in theory
/// hash to it (probability 2^-64).
pub const OTHER_PARTITION_ID: u64 = u64::MAX;

/// A parsed `partition_key` expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionKey {
    /// `field`: the id is the hash of the field's value.
    Field(String),
    /// `hash_mod(field, N)` or `hash_mod((a, b, c), N)`: the id is the hash of the values mod `N`.
    HashMod {
        /// The hashed fields, in order.
        fields: Vec<String>,
        /// Number of partitions (≥ 1).
        modulo: u64,
    },
}

const FIELD_ERROR: &str = "doc_mapping.partition_key";

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid {
        field: FIELD_ERROR.to_string(),
        message,
    }
}

fn is_field_char(c: char) -> bool {
    !(c.is_whitespace() || matches!(c, '(' | ')' | ','))
}

/// A tiny cursor over the expression.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn skip_ws(&mut self) {
        let rest = &self.text[self.pos..];
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.text[self.pos..].starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), ConfigError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(invalid(format!(
                "`{}`: expected `{c}` at position {}",
                self.text, self.pos
            )))
        }
    }

    fn word(&mut self) -> &'a str {
        self.skip_ws();
        let rest = &self.text[self.pos..];
        let len = rest.find(|c| !is_field_char(c)).unwrap_or(rest.len());
        self.pos += len;
        &rest[..len]
    }

    fn field(&mut self) -> Result<String, ConfigError> {
        let word = self.word();
        if word.is_empty() {
            return Err(invalid(format!(
                "`{}`: expected a field name at position {}",
                self.text, self.pos
            )));
        }
        Ok(word.to_string())
    }

    fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos == self.text.len()
    }
}

impl PartitionKey {
    /// Parses `field`, `hash_mod(field, N)` or `hash_mod((a, b, c), N)`; `N` must be ≥ 1.
    pub fn parse(expr: &str) -> Result<PartitionKey, ConfigError> {
        let mut cursor = Cursor { text: expr, pos: 0 };
        let first = cursor.word();
        if first.is_empty() {
            return Err(invalid(format!(
                "`{expr}`: expected `field`, `hash_mod(field, N)` or `hash_mod((a, b), N)`"
            )));
        }
        if cursor.at_end() {
            return Ok(PartitionKey::Field(first.to_string()));
        }
        if first != "hash_mod" {
            return Err(invalid(format!(
                "`{expr}`: unknown function `{first}` (expected `hash_mod`)"
            )));
        }
        cursor.expect('(')?;
        let fields = if cursor.eat('(') {
            let mut fields = vec![cursor.field()?];
            while cursor.eat(',') {
                fields.push(cursor.field()?);
            }
            cursor.expect(')')?;
            fields
        } else {
            vec![cursor.field()?]
        };
        cursor.expect(',')?;
        let number = cursor.word();
        let modulo: u64 = number
            .parse()
            .map_err(|_| invalid(format!("`{expr}`: `{number}` is not a positive integer")))?;
        if modulo == 0 {
            return Err(invalid(format!(
                "`{expr}`: the number of partitions must be at least 1"
            )));
        }
        cursor.expect(')')?;
        if !cursor.at_end() {
            return Err(invalid(format!(
                "`{expr}`: unexpected `{}`",
                &expr[cursor.pos..]
            )));
        }
        Ok(PartitionKey::HashMod { fields, modulo })
    }

    /// The fields the key reads, in order.
    pub fn fields(&self) -> &[String] {
        match self {
            PartitionKey::Field(field) => std::slice::from_ref(field),
            PartitionKey::HashMod { fields, .. } => fields,
        }
    }

    /// The partition id of a document; deterministic (see the module docs).
    pub fn partition_id(&self, doc: &Map<String, Value>) -> u64 {
        let mut hasher = SipHasher::new_with_keys(0, 0);
        for field in self.fields() {
            hash_value(&mut hasher, lookup(doc, field));
        }
        let hash = hasher.finish();
        match self {
            PartitionKey::Field(_) => hash,
            PartitionKey::HashMod { modulo, .. } => hash % modulo,
        }
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionKey::Field(field) => f.write_str(field),
            PartitionKey::HashMod { fields, modulo } if fields.len() == 1 => {
                write!(f, "hash_mod({}, {modulo})", fields[0])
            }
            PartitionKey::HashMod { fields, modulo } => {
                write!(f, "hash_mod(({}), {modulo})", fields.join(", "))
            }
        }
    }
}

impl std::str::FromStr for PartitionKey {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PartitionKey::parse(s)
    }
}

/// Finds `field` literally, else as a dotted path into nested objects.
fn lookup<'a>(doc: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(value) = doc.get(field) {
        return Some(value);
    }
    let mut parts = field.split('.');
    let mut current = doc.get(parts.next()?)?;
    for part in parts {
        current = current.as_object()?.get(part)?;
    }
    Some(current)
}

const TAG_NULL: u8 = 0;
const TAG_SCALAR: u8 = 1;
const TAG_COMPOSITE: u8 = 2;

fn write_bytes(hasher: &mut SipHasher, tag: u8, bytes: &[u8]) {
    hasher.write_u8(tag);
    hasher.write_u64(bytes.len() as u64);
    hasher.write(bytes);
}

fn hash_value(hasher: &mut SipHasher, value: Option<&Value>) {
    match value {
        None | Some(Value::Null) => hasher.write_u8(TAG_NULL),
        Some(Value::String(text)) => write_bytes(hasher, TAG_SCALAR, text.as_bytes()),
        Some(Value::Bool(flag)) => {
            write_bytes(hasher, TAG_SCALAR, if *flag { b"true" } else { b"false" })
        }
        Some(Value::Number(number)) => {
            let text = match number.as_f64() {
                Some(float)
                    if !number.is_i64()
                        && !number.is_u64()
                        && float.fract() == 0.0
                        && float.abs() < 9.0e15 =>
                {
                    // 42.0 hashes like 42.
                    (float as i64).to_string()
                }
                _ => number.to_string(),
            };
            write_bytes(hasher, TAG_SCALAR, text.as_bytes())
        }
        Some(composite @ (Value::Array(_) | Value::Object(_))) => {
            write_bytes(hasher, TAG_COMPOSITE, composite.to_string().as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            PartitionKey::parse("tenant_id").unwrap(),
            PartitionKey::Field("tenant_id".into())
        );
        assert_eq!(
            PartitionKey::parse("  hash_mod( tenant_id ,10 ) ").unwrap(),
            PartitionKey::HashMod {
                fields: vec!["tenant_id".into()],
                modulo: 10
            }
        );
        let key = PartitionKey::parse("hash_mod((a, b.c,d), 7)").unwrap();
        assert_eq!(
            key,
            PartitionKey::HashMod {
                fields: vec!["a".into(), "b.c".into(), "d".into()],
                modulo: 7
            }
        );
        assert_eq!(key.fields(), ["a", "b.c", "d"]);
        assert_eq!(key.to_string(), "hash_mod((a, b.c, d), 7)");
        assert_eq!(PartitionKey::parse(&key.to_string()).unwrap(), key);
        let single: PartitionKey = "hash_mod(x,3)".parse().unwrap();
        assert_eq!(single.to_string(), "hash_mod(x, 3)");
    }

    #[test]
    fn rejects_bad_expressions() {
        for (expr, needle) in [
            ("", "expected `field`"),
            ("hash_mod(a, 0)", "at least 1"),
            ("hash_mod(a, -1)", "not a positive integer"),
            ("hash_mod(a, x)", "not a positive integer"),
            ("hash_mod(a)", "expected `,`"),
            ("hash_mod(a, 3", "expected `)`"),
            ("hash_mod((a, b), 3) extra", "unexpected `extra`"),
            ("hash_mod((), 3)", "expected a field name"),
            ("sum(a, 3)", "unknown function `sum`"),
            ("a b", "unknown function `a`"),
        ] {
            let err = PartitionKey::parse(expr).unwrap_err().to_string();
            assert!(err.contains("doc_mapping.partition_key"), "{expr}: {err}");
            assert!(err.contains(needle), "{expr}: {err}");
        }
    }

    #[test]
    fn partition_ids_are_deterministic() {
        let key = PartitionKey::parse("tenant").unwrap();
        let a = key.partition_id(&doc(json!({"tenant": "acme", "x": 1})));
        let b = key.partition_id(&doc(json!({"x": 2, "tenant": "acme"})));
        let c = key.partition_id(&doc(json!({"tenant": "globex"})));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Fixed value: the hash must never change across releases.
        let expected = {
            let mut hasher = SipHasher::new_with_keys(0, 0);
            hasher.write_u8(TAG_SCALAR);
            hasher.write_u64(4);
            hasher.write(b"acme");
            hasher.finish()
        };
        assert_eq!(a, expected);

        // Missing and null are the same, distinct from the string "null".
        let missing = key.partition_id(&doc(json!({})));
        assert_eq!(missing, key.partition_id(&doc(json!({"tenant": null}))));
        assert_ne!(missing, key.partition_id(&doc(json!({"tenant": "null"}))));
        assert_ne!(missing, key.partition_id(&doc(json!({"tenant": ""}))));

        // Textual form: 42, "42" and 42.0 are the same partition.
        let n = key.partition_id(&doc(json!({"tenant": 42})));
        assert_eq!(n, key.partition_id(&doc(json!({"tenant": "42"}))));
        assert_eq!(n, key.partition_id(&doc(json!({"tenant": 42.0}))));
    }

    #[test]
    fn hash_mod_spreads_over_n_partitions() {
        let key = PartitionKey::parse("hash_mod((service, host), 4)").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let id = key.partition_id(&doc(
                json!({"service": format!("svc-{}", i % 10), "host": i}),
            ));
            assert!(id < 4);
            seen.insert(id);
        }
        assert_eq!(seen.len(), 4);
        // The tuple is ordered and prefix-free: ("ab", "c") != ("a", "bc").
        let wide = PartitionKey::parse("hash_mod((service, host), 1000000)").unwrap();
        assert_ne!(
            wide.partition_id(&doc(json!({"service": "ab", "host": "c"}))),
            wide.partition_id(&doc(json!({"service": "a", "host": "bc"})))
        );
    }

    #[test]
    fn dotted_fields_walk_nested_objects() {
        let key = PartitionKey::parse("resource.service").unwrap();
        let nested = key.partition_id(&doc(json!({"resource": {"service": "api"}})));
        let flat = key.partition_id(&doc(json!({"resource.service": "api"})));
        assert_eq!(nested, flat);
        assert_ne!(nested, key.partition_id(&doc(json!({"resource": {}}))));
    }
}
