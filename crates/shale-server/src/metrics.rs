//! The `/metrics` endpoint: the Prometheus default registry (ingest and search register
//! there) plus gauges refreshed at scrape time (splits by state, WAL size).

use std::sync::LazyLock;

use prometheus::{register_int_gauge_vec, Encoder, IntGaugeVec, TextEncoder};
use shale_metastore::ListSplitsQuery;
use shale_types::SplitState;

use crate::node::Node;

static SPLITS_BY_STATE: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "shale_splits",
        "Splits in the metastore, by index and state.",
        &["index", "state"]
    )
    .expect("metric registered once")
});

/// Registers every metric of the node, so a scrape shows them all from the start.
pub fn register_all() {
    LazyLock::force(&SPLITS_BY_STATE);
    shale_ingest::metrics::register();
    shale_search::register_metrics();
}

/// Refreshes scrape-time gauges.
pub async fn refresh(node: &Node) {
    node.router.update_wal_metrics().await;
    let Ok(indexes) = node.metastore.list_indexes().await else {
        return;
    };
    SPLITS_BY_STATE.reset();
    for index in indexes {
        let Ok(splits) = node
            .metastore
            .list_splits(ListSplitsQuery::for_index(index.index_uid.clone()))
            .await
        else {
            continue;
        };
        for state in [
            SplitState::Staged,
            SplitState::Published,
            SplitState::MarkedForDeletion,
        ] {
            let count = splits.iter().filter(|s| s.split_state == state).count();
            SPLITS_BY_STATE
                .with_label_values(&[index.index_id(), state.as_str()])
                .set(count as i64);
        }
    }
}

/// Renders the default registry in the Prometheus text format.
pub fn render() -> Result<String, String> {
    register_all();
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&prometheus::gather(), &mut buf)
        .map_err(|err| err.to_string())?;
    String::from_utf8(buf).map_err(|err| err.to_string())
}
