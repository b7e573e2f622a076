//! Data dirs whose names a URI would misread (`%41`, `?`, `#`, spaces, non-ASCII): the node
//! starts, and its metastore and splits are inside the data dir given.

use crate::common;

use common::{TestNode, LOGS_INDEX};

const T0: i64 = 1_700_000_000;

#[tokio::test]
async fn a_node_keeps_its_metastore_and_splits_in_a_data_dir_of_any_name() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "odd%41dir",
        "what?mode=ro",
        "hash#tag",
        "with space",
        "données-日本",
    ] {
        let data_dir = tmp.path().join(name);
        let node = TestNode::start_with(common::config_in(&data_dir)).await;
        node.create_index(LOGS_INDEX).await;
        node.ingest("logs", &common::log_docs(0, 5, T0, "api"), "force")
            .await;
        assert_eq!(node.count("logs", "*").await, 5, "{name}");
        node.stop().await;
        assert!(
            data_dir.join("metastore.db").is_file(),
            "{name}: no metastore in the data dir"
        );
        let splits = std::fs::read_dir(data_dir.join("indexes").join("logs"))
            .unwrap_or_else(|err| panic!("{name}: no split directory in the data dir: {err}"))
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".split"))
            .count();
        assert!(splits > 0, "{name}: no split in the data dir");
    }
    // Nothing was written beside them (`odd%41dir` read as `oddAdir`, say).
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "données-日本",
            "hash#tag",
            "odd%41dir",
            "what?mode=ro",
            "with space"
        ]
    );
}
