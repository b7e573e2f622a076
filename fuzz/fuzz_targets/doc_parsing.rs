//! Document parsing on the ingest path: `DocMapper::parse_doc` (what
//! `shale_ingest::router::validate` calls per document) on arbitrary bytes, for the
//! representative index; a parsed document is rendered back as a hit and indexed.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use shale_index::SplitBuilder;

thread_local! {
    /// Documents that parsed are indexed into a builder, cut every few hundred documents.
    static BUILDER: RefCell<Option<(tempfile::TempDir, SplitBuilder)>> = const { RefCell::new(None) };
}

fuzz_target!(|data: &[u8]| {
    let mapper = shale_fuzz::doc_mapper();
    match mapper.parse_doc(data) {
        Ok(parsed) => {
            let _ = mapper.doc_to_json(&parsed.doc);
            BUILDER.with(|cell| {
                let mut cell = cell.borrow_mut();
                let (_, builder) = cell.get_or_insert_with(|| {
                    let dir = tempfile::tempdir().expect("a scratch dir");
                    let builder = SplitBuilder::new(mapper.clone(), dir.path(), 15_000_000)
                        .expect("a split builder");
                    (dir, builder)
                });
                // One time bucket per split (the indexer keeps a builder per bucket).
                if builder.add(parsed).is_err() || builder.num_docs() >= 500 {
                    if let Some((_dir, builder)) = cell.take() {
                        builder.finish().expect("the split is built");
                    }
                }
            });
        }
        Err(err) => assert!(!err.to_string().is_empty(), "an error without a message"),
    }
});
