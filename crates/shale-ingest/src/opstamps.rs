//! What this node knows of each index's delete history: the last delete opstamp, stamped on
//! every document it acknowledges (in its WAL record), so that a delete task reaches exactly
//! the documents acknowledged before it.
//!
//! The guarantee rests on one lock: appends hold a read guard from the moment they read the
//! opstamp until their records are in the WAL; [`DeleteOpstamps::advance`] takes the write
//! guard. So once `advance(o)` returns, every append still in flight has finished (its
//! documents carry an older opstamp: the task reaches them) and every later append carries
//! `o` or more (the task does not). The delete API advances every node hosting a shard of the
//! index before it answers; a periodic refresh from the metastore catches up a node that
//! missed the call.
//!
//! WAL record format: `0x00`, the opstamp as 8 little-endian bytes, then the JSON document.
//! A record without the marker (written before deletes existed) has opstamp 0.

use std::collections::HashMap;

use shale_types::IndexUid;
use tokio::sync::{RwLock, RwLockReadGuard};

/// First byte of a record that carries an opstamp (a JSON document never starts with it).
const OPSTAMP_MARKER: u8 = 0x00;
/// Length of the record prefix.
pub const RECORD_PREFIX_LEN: usize = 9;

/// The prefix of the WAL records of documents acknowledged at `opstamp`.
pub fn record_prefix(opstamp: u64) -> [u8; RECORD_PREFIX_LEN] {
    let mut prefix = [0u8; RECORD_PREFIX_LEN];
    prefix[0] = OPSTAMP_MARKER;
    prefix[1..].copy_from_slice(&opstamp.to_le_bytes());
    prefix
}

/// A WAL record's opstamp and document.
pub fn decode_record(record: &[u8]) -> (u64, &[u8]) {
    match record {
        [OPSTAMP_MARKER, rest @ ..] if rest.len() >= 8 => {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&rest[..8]);
            (u64::from_le_bytes(bytes), &rest[8..])
        }
        _ => (0, record),
    }
}

/// The last delete opstamp this node knows, per index.
#[derive(Debug, Default)]
pub struct DeleteOpstamps {
    known: RwLock<HashMap<IndexUid, u64>>,
}

/// A read guard: the opstamps cannot advance while it is held.
pub struct OpstampGuard<'a>(RwLockReadGuard<'a, HashMap<IndexUid, u64>>);

impl OpstampGuard<'_> {
    /// The last opstamp known for `index_uid` (0 if none).
    pub fn get(&self, index_uid: &IndexUid) -> u64 {
        self.0.get(index_uid).copied().unwrap_or(0)
    }
}

impl DeleteOpstamps {
    /// Nothing known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the opstamps still (for the duration of an append).
    pub async fn read(&self) -> OpstampGuard<'_> {
        OpstampGuard(self.known.read().await)
    }

    /// Records that `index_uid`'s delete history reached `opstamp` (never goes back); returns
    /// once no append that read an older value is still in flight.
    pub async fn advance(&self, index_uid: &IndexUid, opstamp: u64) {
        let mut known = self.known.write().await;
        let entry = known.entry(index_uid.clone()).or_default();
        *entry = (*entry).max(opstamp);
    }

    /// Advances every index to `last` (from the metastore); returns how many moved.
    pub async fn advance_all(&self, last: impl IntoIterator<Item = (IndexUid, u64)>) -> usize {
        let last: Vec<(IndexUid, u64)> = last.into_iter().collect();
        {
            let known = self.known.read().await;
            if last
                .iter()
                .all(|(index_uid, opstamp)| known.get(index_uid).copied().unwrap_or(0) >= *opstamp)
            {
                return 0;
            }
        }
        let mut known = self.known.write().await;
        let mut moved = 0;
        for (index_uid, opstamp) in last {
            let entry = known.entry(index_uid).or_default();
            if opstamp > *entry {
                *entry = opstamp;
                moved += 1;
            }
        }
        moved
    }

    /// The last opstamp known for `index_uid`.
    pub async fn get(&self, index_uid: &IndexUid) -> u64 {
        self.read().await.get(index_uid)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn records_round_trip_and_old_records_have_opstamp_zero() {
        let mut record = record_prefix(42).to_vec();
        record.extend_from_slice(br#"{"a":1}"#);
        assert_eq!(decode_record(&record), (42, &br#"{"a":1}"#[..]));
        assert_eq!(decode_record(br#"{"a":1}"#), (0, &br#"{"a":1}"#[..]));
        assert_eq!(decode_record(b""), (0, &b""[..]));
    }

    #[tokio::test]
    async fn advancing_waits_for_appends_in_flight_and_never_goes_back() {
        let opstamps = Arc::new(DeleteOpstamps::new());
        let index = IndexUid::new("logs");
        opstamps.advance(&index, 3).await;
        let guard = opstamps.read().await;
        assert_eq!(guard.get(&index), 3);
        let advancing = {
            let opstamps = opstamps.clone();
            let index = index.clone();
            tokio::spawn(async move { opstamps.advance(&index, 4).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !advancing.is_finished(),
            "an append in flight holds the opstamp"
        );
        drop(guard);
        advancing.await.unwrap();
        assert_eq!(opstamps.get(&index).await, 4);
        opstamps.advance(&index, 2).await;
        assert_eq!(opstamps.get(&index).await, 4);
        assert_eq!(opstamps.advance_all([(index.clone(), 4)]).await, 0);
        assert_eq!(opstamps.advance_all([(index.clone(), 6)]).await, 1);
        assert_eq!(opstamps.get(&index).await, 6);
    }
}
