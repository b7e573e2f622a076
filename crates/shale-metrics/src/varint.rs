//! The building blocks of this crate's compact binary forms (the WAL record, the series
//! index): LEB128 varints and length-prefixed UTF-8 strings, written to a buffer and read
//! back with every read checked against the bytes left.

/// Appends `value` as a LEB128 varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends `text` as its length (a varint) then its bytes.
pub(crate) fn put_str(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

/// Why a read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReadError {
    /// Fewer bytes left than the read needs.
    #[error("truncated")]
    Truncated,
    /// A varint of more than 64 bits.
    #[error("varint too long")]
    VarintTooLong,
    /// A string that is not UTF-8.
    #[error("label is not UTF-8")]
    NotUtf8,
}

/// Reads a buffer front to back.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn byte(&mut self) -> Result<u8, ReadError> {
        let byte = *self.bytes.get(self.pos).ok_or(ReadError::Truncated)?;
        self.pos += 1;
        Ok(byte)
    }

    pub(crate) fn varint(&mut self) -> Result<u64, ReadError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(ReadError::VarintTooLong)
    }

    /// A count or length, bounded by the bytes left (each item takes at least one byte).
    pub(crate) fn count(&mut self) -> Result<usize, ReadError> {
        let value = self.varint()?;
        usize::try_from(value)
            .ok()
            .filter(|&n| n <= self.left())
            .ok_or(ReadError::Truncated)
    }

    pub(crate) fn string(&mut self) -> Result<String, ReadError> {
        self.str().map(str::to_string)
    }

    /// A length-prefixed UTF-8 string, borrowed.
    pub(crate) fn str(&mut self) -> Result<&'a str, ReadError> {
        let len = self.count()?;
        let bytes = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        std::str::from_utf8(bytes).map_err(|_| ReadError::NotUtf8)
    }

    /// The next 8 bytes.
    pub(crate) fn array(&mut self) -> Result<[u8; 8], ReadError> {
        let bytes = self
            .bytes
            .get(self.pos..self.pos + 8)
            .ok_or(ReadError::Truncated)?;
        self.pos += 8;
        let mut out = [0u8; 8];
        out.copy_from_slice(bytes);
        Ok(out)
    }
}
