//! What locality compaction will rely on in Tantivy 0.27, checked on Tantivy itself so that an
//! upgrade that changes it fails here first:
//!
//! 1. an index sorted by a bytes fast field (`IndexSettings.sort_by_field`) has every segment
//!    in key order, whatever order the documents were added in;
//! 2. `merge_filtered_segments` over sorted inputs, with a target sorted the same way and one
//!    alive bitset per input, writes exactly the selected documents, in key order — so an
//!    m → n merge cut at key boundaries is one filtered merge per output.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tantivy::directory::OwnedBytes;
use tantivy::fastfield::{write_alive_bitset, AliveBitSet};
use tantivy::indexer::merge_filtered_segments;
use tantivy::schema::{Schema, FAST, STORED};
use tantivy::{
    BitSet, Index, IndexSettings, IndexSortByField, IndexWriter, Order, Segment, SegmentReader,
    TantivyDocument,
};

/// A key range: from the lower bound (included) to the upper one (excluded); `None` is open.
type KeyRange<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

fn sorted_settings() -> IndexSettings {
    IndexSettings {
        sort_by_field: Some(IndexSortByField {
            field: "_sk".to_string(),
            order: Order::Asc,
        }),
        ..IndexSettings::default()
    }
}

fn schema() -> Schema {
    let mut builder = Schema::builder();
    builder.add_bytes_field("_sk", FAST);
    builder.add_u64_field("id", FAST | STORED);
    builder.build()
}

/// A key like the locality sort key: a service, a host, then a timestamp.
fn key(rng: &mut StdRng) -> Vec<u8> {
    let service = format!("svc-{:02}", rng.random::<u64>() % 20);
    let host = format!("host-{:03}", rng.random::<u64>() % 200);
    let mut key = Vec::new();
    key.extend_from_slice(service.as_bytes());
    key.extend_from_slice(&[0, 1]);
    key.extend_from_slice(host.as_bytes());
    key.extend_from_slice(&[0, 1]);
    key.extend_from_slice(&rng.random::<u64>().to_be_bytes());
    key
}

/// An index of `docs` documents with random keys, added in random order, committed in
/// several segments; returns it with every (key, id).
fn sorted_index(rng: &mut StdRng, first_id: u64, docs: u64) -> (Index, Vec<(Vec<u8>, u64)>) {
    let schema = schema();
    let sk = schema.get_field("_sk").expect("_sk");
    let id = schema.get_field("id").expect("id");
    let index = Index::builder()
        .schema(schema)
        .settings(sorted_settings())
        .create_in_ram()
        .expect("index");
    let mut writer: IndexWriter<TantivyDocument> = index
        .writer_with_num_threads(1, 15_000_000)
        .expect("writer");
    writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
    let mut all = Vec::new();
    for i in 0..docs {
        let k = key(rng);
        let mut doc = TantivyDocument::default();
        doc.add_bytes(sk, &k);
        doc.add_u64(id, first_id + i);
        writer.add_document(doc).expect("add");
        all.push((k, first_id + i));
        if i % 700 == 699 {
            writer.commit().expect("commit");
        }
    }
    writer.commit().expect("commit");
    (index, all)
}

/// The (key, id) of every alive document of a segment, in doc id order.
fn segment_docs(reader: &SegmentReader) -> Vec<(Vec<u8>, u64)> {
    let keys = reader
        .fast_fields()
        .bytes("_sk")
        .expect("column")
        .expect("bytes column");
    let ids = reader.fast_fields().u64("id").expect("id column");
    reader
        .doc_ids_alive()
        .map(|doc| {
            let ord = keys.ords().first(doc).expect("one key per doc");
            let mut k = Vec::new();
            keys.ord_to_bytes(ord, &mut k).expect("ord");
            (k, ids.first(doc).expect("one id per doc"))
        })
        .collect()
}

fn assert_in_key_order(docs: &[(Vec<u8>, u64)]) {
    for pair in docs.windows(2) {
        assert!(pair[0].0 <= pair[1].0, "out of order: {pair:?}");
    }
}

#[test]
fn every_segment_of_a_sorted_index_is_in_key_order() {
    let mut rng = StdRng::seed_from_u64(1);
    let (index, all) = sorted_index(&mut rng, 0, 3000);
    let searcher = index.reader().expect("reader").searcher();
    assert!(searcher.segment_readers().len() >= 4, "several segments");
    let mut seen = 0;
    for reader in searcher.segment_readers() {
        let docs = segment_docs(reader);
        assert_in_key_order(&docs);
        seen += docs.len();
    }
    assert_eq!(seen, all.len());
}

#[test]
fn filtered_merges_cut_sorted_inputs_into_sorted_key_ranges() {
    let mut rng = StdRng::seed_from_u64(2);
    let (a, docs_a) = sorted_index(&mut rng, 0, 2500);
    let (b, docs_b) = sorted_index(&mut rng, 10_000, 1800);
    let segments: Vec<Segment> = [&a, &b]
        .iter()
        .flat_map(|index| index.searchable_segments().expect("segments"))
        .collect();
    let readers: Vec<SegmentReader> = segments
        .iter()
        .map(|segment| SegmentReader::open(segment).expect("reader"))
        .collect();
    // Cut the key space at two service boundaries: three outputs.
    let cuts: [&[u8]; 2] = [b"svc-07", b"svc-14"];
    let ranges: Vec<KeyRange> = vec![
        (None, Some(cuts[0])),
        (Some(cuts[0]), Some(cuts[1])),
        (Some(cuts[1]), None),
    ];
    let in_range =
        |k: &[u8], (lo, hi): KeyRange| lo.is_none_or(|lo| k >= lo) && hi.is_none_or(|hi| k < hi);
    let mut total = 0;
    for range in &ranges {
        let filters: Vec<Option<AliveBitSet>> = readers
            .iter()
            .map(|reader| {
                let mut bits = BitSet::with_max_value(reader.max_doc());
                for (doc, (k, _)) in segment_docs(reader).iter().enumerate() {
                    if in_range(k, *range) {
                        bits.insert(doc as u32);
                    }
                }
                let mut bytes = Vec::new();
                write_alive_bitset(&bits, &mut bytes).expect("bitset");
                Some(AliveBitSet::open(OwnedBytes::new(bytes)))
            })
            .collect();
        let output = merge_filtered_segments(
            &segments,
            sorted_settings(),
            filters,
            tantivy::directory::RamDirectory::default(),
        )
        .expect("filtered merge");
        let searcher = output.reader().expect("reader").searcher();
        assert_eq!(searcher.segment_readers().len(), 1, "one output segment");
        let docs = segment_docs(&searcher.segment_readers()[0]);
        assert_in_key_order(&docs);
        let expected: BTreeSet<u64> = docs_a
            .iter()
            .chain(&docs_b)
            .filter(|(k, _)| in_range(k, *range))
            .map(|(_, id)| *id)
            .collect();
        let got: BTreeSet<u64> = docs.iter().map(|(_, id)| *id).collect();
        assert_eq!(got.len(), docs.len(), "no document twice");
        assert_eq!(got, expected, "exactly the documents of the range");
        // The stored fields followed the documents.
        let stored = searcher
            .doc::<TantivyDocument>(tantivy::DocAddress::new(0, 0))
            .expect("stored doc");
        let id_field = output.schema().get_field("id").expect("id");
        assert_eq!(
            tantivy::schema::Value::as_u64(&stored.get_first(id_field).expect("id")),
            Some(docs[0].1)
        );
        total += docs.len();
    }
    assert_eq!(total, docs_a.len() + docs_b.len(), "rows conserved");
}
