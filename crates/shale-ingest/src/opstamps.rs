//! What this node knows of each index's delete history: the last delete opstamp, stamped on
//! every document it acknowledges (in its WAL record), so that a delete task reaches exactly
//! the documents acknowledged before it.
//!
//! The guarantee rests on one lock: appends hold a read guard from the moment they read the
//! opstamp until their records are in the WAL; [`DeleteOpstamps::advance`] takes the write
//! guard. So once `advance(o)` returns, every append still in flight has finished (its
//! documents carry an older opstamp: the task reaches them) and every later append carries
//! `o` or more (the task does not).
//!
//! The delete API advances every node it can reach before it answers. A node it cannot reach
//! must not go on stamping documents below the task, so what a node knows is good only for a
//! **lease** ([`DeleteOpstamps::with_lease`]): each refresh from the metastore that follows a
//! successful heartbeat confirms it for `lease` from the start of that heartbeat; an append
//! when the knowledge is not confirmed is refused (nothing appended, retry later). The delete
//! API therefore answers once every node it could not reach has either no heartbeat younger
//! than the lease (its knowledge has lapsed) or been waited for until it lapsed.
//!
//! WAL record format: `0x01`, the opstamp as 8 little-endian bytes, the length of the doc
//! mapping uid the document was validated with (one byte), that uid, then the JSON document:
//! a record is indexed with the mapping it was accepted under, whatever updates come between.
//! Older formats still read: `0x00` + opstamp + JSON (no mapping recorded), and bare JSON
//! (written before deletes existed: opstamp 0).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use shale_types::IndexUid;
use tokio::sync::{RwLock, RwLockReadGuard};

/// First byte of a record that carries an opstamp only (a JSON document never starts with it).
const OPSTAMP_MARKER: u8 = 0x00;
/// First byte of a record that carries an opstamp and a doc mapping uid.
const MAPPED_MARKER: u8 = 0x01;

/// The prefix of the WAL records of documents acknowledged at `opstamp`, validated with the
/// doc mapping `doc_mapping_uid`.
pub fn record_prefix(opstamp: u64, doc_mapping_uid: &str) -> Vec<u8> {
    let uid = doc_mapping_uid.as_bytes();
    let mut prefix = Vec::with_capacity(10 + uid.len());
    match u8::try_from(uid.len()) {
        Ok(len) => {
            prefix.push(MAPPED_MARKER);
            prefix.extend_from_slice(&opstamp.to_le_bytes());
            prefix.push(len);
            prefix.extend_from_slice(uid);
        }
        // Never for a ULID; such a record is read with the shard's current mapping.
        Err(_) => {
            prefix.push(OPSTAMP_MARKER);
            prefix.extend_from_slice(&opstamp.to_le_bytes());
        }
    }
    prefix
}

/// A WAL record, decoded.
#[derive(Debug, PartialEq, Eq)]
pub struct WalRecord<'a> {
    /// The delete opstamp of the document.
    pub opstamp: u64,
    /// The doc mapping it was validated with (`None` for older records).
    pub doc_mapping_uid: Option<&'a str>,
    /// The document as ingested.
    pub json: &'a [u8],
}

/// Decodes a WAL record (any format).
pub fn decode_record(record: &[u8]) -> WalRecord<'_> {
    let opstamp_of = |bytes: &[u8]| {
        let mut le = [0u8; 8];
        le.copy_from_slice(&bytes[..8]);
        u64::from_le_bytes(le)
    };
    match record {
        [MAPPED_MARKER, rest @ ..] if rest.len() >= 9 => {
            let len = rest[8] as usize;
            let uid = rest
                .get(9..9 + len)
                .and_then(|uid| std::str::from_utf8(uid).ok());
            match uid {
                Some(uid) => WalRecord {
                    opstamp: opstamp_of(rest),
                    doc_mapping_uid: Some(uid),
                    json: &rest[9 + len..],
                },
                None => WalRecord {
                    opstamp: 0,
                    doc_mapping_uid: None,
                    json: record,
                },
            }
        }
        [OPSTAMP_MARKER, rest @ ..] if rest.len() >= 8 => WalRecord {
            opstamp: opstamp_of(rest),
            doc_mapping_uid: None,
            json: &rest[8..],
        },
        _ => WalRecord {
            opstamp: 0,
            doc_mapping_uid: None,
            json: record,
        },
    }
}

/// The last delete opstamp this node knows, per index.
#[derive(Debug, Default)]
pub struct DeleteOpstamps {
    known: RwLock<HashMap<IndexUid, u64>>,
    /// How long a confirmation holds; `None`: no lease (a node alone with its metastore).
    lease: Option<Duration>,
    /// Until when what is known is confirmed.
    confirmed_until: std::sync::Mutex<Option<Instant>>,
}

/// What a node knows of the delete history is not confirmed by the metastore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unconfirmed {
    /// How long ago the confirmation lapsed (`None`: never confirmed).
    pub lapsed_for: Option<Duration>,
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
    /// Nothing known yet; no lease (appends need no confirmation).
    pub fn new() -> Self {
        Self::default()
    }

    /// Nothing known yet; appends need a confirmation younger than `lease` (see the module
    /// docs).
    pub fn with_lease(lease: Duration) -> Self {
        DeleteOpstamps {
            lease: Some(lease),
            ..Self::default()
        }
    }

    /// The lease, if any.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// Records that what is known now was current at `since` (the start of a heartbeat the
    /// metastore took, followed by a refresh): confirmed until `since + lease`.
    pub fn confirm(&self, since: Instant) {
        let Some(lease) = self.lease else {
            return;
        };
        let until = since + lease;
        let mut confirmed = self
            .confirmed_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if confirmed.is_none_or(|current| current < until) {
            *confirmed = Some(until);
        }
    }

    /// Whether documents may be stamped with what is known now.
    pub fn check_confirmed(&self) -> Result<(), Unconfirmed> {
        if self.lease.is_none() {
            return Ok(());
        }
        let confirmed = *self
            .confirmed_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match confirmed {
            Some(until) if until > now => Ok(()),
            Some(until) => Err(Unconfirmed {
                lapsed_for: Some(now - until),
            }),
            None => Err(Unconfirmed { lapsed_for: None }),
        }
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
    fn records_round_trip_and_old_records_still_read() {
        let mut record = record_prefix(42, "01HMAPPING").to_vec();
        record.extend_from_slice(br#"{"a":1}"#);
        assert_eq!(
            decode_record(&record),
            WalRecord {
                opstamp: 42,
                doc_mapping_uid: Some("01HMAPPING"),
                json: &br#"{"a":1}"#[..]
            }
        );
        // The format before doc mappings were recorded.
        let mut old = vec![OPSTAMP_MARKER];
        old.extend_from_slice(&7u64.to_le_bytes());
        old.extend_from_slice(br#"{"a":1}"#);
        assert_eq!(
            decode_record(&old),
            WalRecord {
                opstamp: 7,
                doc_mapping_uid: None,
                json: &br#"{"a":1}"#[..]
            }
        );
        // Before deletes existed: bare JSON.
        let bare = decode_record(br#"{"a":1}"#);
        assert_eq!((bare.opstamp, bare.json), (0, &br#"{"a":1}"#[..]));
        assert_eq!(decode_record(b"").json, b"");
    }

    #[test]
    fn a_lease_confirms_for_its_duration_only() {
        assert!(DeleteOpstamps::new().check_confirmed().is_ok(), "no lease");
        let opstamps = DeleteOpstamps::with_lease(Duration::from_millis(200));
        assert_eq!(
            opstamps.check_confirmed(),
            Err(Unconfirmed { lapsed_for: None })
        );
        let start = Instant::now();
        opstamps.confirm(start);
        assert!(opstamps.check_confirmed().is_ok());
        // An older confirmation never shortens a newer one.
        opstamps.confirm(start - Duration::from_secs(10));
        assert!(opstamps.check_confirmed().is_ok());
        std::thread::sleep(Duration::from_millis(250));
        assert!(opstamps.check_confirmed().unwrap_err().lapsed_for.is_some());
        opstamps.confirm(Instant::now());
        assert!(opstamps.check_confirmed().is_ok());
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
