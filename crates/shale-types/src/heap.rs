//! An estimate of the heap a value holds, read off its serde shape: what query work reserves
//! from the [`crate::memory::MemoryBudget`] for results it keeps (aggregation results above
//! all, whose nested maps weigh tens of times their encoded size).
//!
//! The estimate walks the value once with a serializer that writes nothing: each map costs a
//! table (hash tables allocate a few slots even for one entry) and each entry a slot, each
//! sequence element a slot, each string its bytes. The costs are set so that the estimate is
//! at or above what Tantivy's intermediate aggregation results and `serde_json` values
//! measure (a test of `shale-search` checks it against a counting allocator).

use serde::ser::{self, Serialize};

/// What one map that is not empty costs besides its entries (a hash table's smallest
/// allocation).
pub const MAP_TABLE_BYTES: u64 = 768;
/// What each map entry costs (its slot: key, value and the table's spare capacity).
pub const MAP_ENTRY_BYTES: u64 = 256;
/// What each sequence element costs (its slot), unless it is a number, a bool or a char.
pub const SEQ_ELEMENT_BYTES: u64 = 48;
/// What a number, bool or char in a sequence costs (packed vectors of them are common).
pub const SEQ_SCALAR_BYTES: u64 = 8;
/// What each string or byte string costs besides its bytes (its allocation).
pub const STRING_BYTES: u64 = 16;

/// The estimated heap bytes `value` holds (0 if it cannot be serialized).
pub fn estimated_heap_bytes<T: Serialize + ?Sized>(value: &T) -> u64 {
    let mut counter = Counter {
        bytes: 0,
        scalar: false,
    };
    match value.serialize(&mut counter) {
        Ok(()) => counter.bytes,
        Err(_) => 0,
    }
}

struct Counter {
    bytes: u64,
    /// The last value serialized was a scalar (a number, bool or char).
    scalar: bool,
}

/// Never raised: counting cannot fail.
#[derive(Debug)]
struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("unreachable")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Never
    }
}

impl Counter {
    fn add(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

macro_rules! inline_scalars {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method(self, _v: $ty) -> Result<(), Never> {
            self.scalar = true;
            Ok(())
        })*
    };
}

impl ser::Serializer for &mut Counter {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    inline_scalars!(
        serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_i128: i128, serialize_u8: u8, serialize_u16: u16,
        serialize_u32: u32, serialize_u64: u64, serialize_u128: u128, serialize_f32: f32,
        serialize_f64: f64, serialize_char: char
    );

    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.add(STRING_BYTES + v.len() as u64);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Never> {
        self.add(STRING_BYTES + v.len() as u64);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Never> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Never> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Never> {
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Never> {
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
    ) -> Result<(), Never> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Never> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<(), Never> {
        value.serialize(self)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, Never> {
        self.add(STRING_BYTES);
        Ok(self)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self, Never> {
        Ok(self)
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self, Never> {
        Ok(self)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        Ok(self)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self, Never> {
        // An empty map allocates nothing.
        if len != Some(0) {
            self.add(MAP_TABLE_BYTES);
        }
        Ok(self)
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self, Never> {
        Ok(self)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self, Never> {
        Ok(self)
    }
}

impl ser::SerializeSeq for &mut Counter {
    type Ok = ();
    type Error = Never;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        self.scalar = false;
        value.serialize(&mut **self)?;
        self.add(if self.scalar {
            SEQ_SCALAR_BYTES
        } else {
            SEQ_ELEMENT_BYTES
        });
        self.scalar = false;
        Ok(())
    }

    fn end(self) -> Result<(), Never> {
        Ok(())
    }
}

/// Tuples, tuple structs and structs live inline in their parent's slot: only what they
/// point to counts.
macro_rules! inline_compound {
    ($($trait:ident :: $method:ident),*) => {
        $(
            impl<'a> ser::$trait for &'a mut Counter {
                type Ok = ();
                type Error = Never;

                fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
                    value.serialize(&mut **self)
                }

                fn end(self) -> Result<(), Never> {
                    Ok(())
                }
            }
        )*
    };
}

inline_compound!(
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// Structs (of variants too) live inline in their parent's slot as tuples do.
macro_rules! inline_struct {
    ($($trait:ident),*) => {
        $(
            impl ser::$trait for &mut Counter {
                type Ok = ();
                type Error = Never;

                fn serialize_field<T: Serialize + ?Sized>(
                    &mut self,
                    _key: &'static str,
                    value: &T,
                ) -> Result<(), Never> {
                    value.serialize(&mut **self)
                }

                fn end(self) -> Result<(), Never> {
                    Ok(())
                }
            }
        )*
    };
}

inline_struct!(SerializeStruct, SerializeStructVariant);

impl ser::SerializeMap for &mut Counter {
    type Ok = ();
    type Error = Never;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Never> {
        self.add(MAP_ENTRY_BYTES);
        key.serialize(&mut **self)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Never> {
        value.serialize(&mut **self)
    }

    fn end(self) -> Result<(), Never> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn maps_cost_a_table_and_a_slot_per_entry_strings_their_bytes() {
        let empty: HashMap<String, u64> = HashMap::new();
        assert_eq!(estimated_heap_bytes(&empty), 0);
        let one: HashMap<String, u64> = [("abc".to_string(), 1)].into();
        assert_eq!(
            estimated_heap_bytes(&one),
            MAP_TABLE_BYTES + MAP_ENTRY_BYTES + STRING_BYTES + 3
        );
        let seq = vec![1u64, 2, 3];
        assert_eq!(
            estimated_heap_bytes(&seq),
            STRING_BYTES + 3 * SEQ_SCALAR_BYTES
        );
        let strings = vec!["ab".to_string()];
        assert_eq!(
            estimated_heap_bytes(&strings),
            STRING_BYTES + SEQ_ELEMENT_BYTES + STRING_BYTES + 2
        );
        assert_eq!(estimated_heap_bytes(&7u64), 0);
    }

    #[test]
    fn nested_values_count_every_level() {
        let value = serde_json::json!({"a": [{"b": "xy"}, {"b": "z"}]});
        let inner = |s: &str| {
            MAP_TABLE_BYTES + MAP_ENTRY_BYTES + STRING_BYTES + 1 + STRING_BYTES + s.len() as u64
        };
        let expected = MAP_TABLE_BYTES
            + MAP_ENTRY_BYTES
            + STRING_BYTES
            + 1
            + STRING_BYTES
            + 2 * SEQ_ELEMENT_BYTES
            + inner("xy")
            + inner("z");
        assert_eq!(estimated_heap_bytes(&value), expected);
    }
}
