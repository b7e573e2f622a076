//! The conformance suite: what every [`Metastore`] backend must do, as test cases.
//!
//! Each case is a `pub async fn(Arc<dyn Metastore>)` that panics on failure and works on a
//! fresh, empty metastore. [`metastore_conformance_tests!`](crate::metastore_conformance_tests)
//! expands to one `#[tokio::test]` per case, given a setup function returning
//! `Option<Fixture>` (`None` skips the case, e.g. when no PostgreSQL server is available outside
//! CI):
//!
//! ```ignore
//! async fn setup() -> Option<Fixture> { /* a fresh metastore */ }
//! shale_metastore::metastore_conformance_tests!(setup);
//! ```
//!
//! The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a dev-dependency.

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;

use shale_config::IndexConfig;
use shale_types::{
    CheckpointDelta, IndexUid, MergeKind, MergeScope, Split, SplitId, SplitMaturity, SplitMetadata,
    SplitState, TimeRange,
};
use tokio::sync::Barrier;

use crate::{
    Fence, IndexMetadata, ListSplitsQuery, MergeTask, MergeTaskState, Metastore, MetastoreError,
    NewMergeTask, NodeIdentity, NodeRecord, ShardKey, ShardState, LEADER_LEASE,
};

/// A metastore under test, and whatever must live as long as it (e.g. its temp directory).
pub struct Fixture {
    /// The metastore, empty.
    pub metastore: Arc<dyn Metastore>,
    _guard: Option<Box<dyn Any + Send>>,
}

impl Fixture {
    /// A fixture owning nothing else.
    pub fn new(metastore: Arc<dyn Metastore>) -> Self {
        Fixture {
            metastore,
            _guard: None,
        }
    }

    /// Keeps `guard` alive until the test ends.
    pub fn with_guard(mut self, guard: impl Any + Send) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }
}

/// Expands to one `#[tokio::test]` per conformance case; `$setup` is an
/// `async fn() -> Option<Fixture>`.
#[macro_export]
macro_rules! metastore_conformance_tests {
    ($setup:path) => {
        $crate::metastore_conformance_tests!(@cases $setup;
            create_index_assigns_uids,
            create_index_fails_if_index_id_exists,
            index_metadata_of_unknown_index_is_not_found,
            index_version_rises_with_every_write_to_the_index,
            index_changes_bring_a_view_to_the_listed_splits,
            index_templates_are_created_listed_updated_and_deleted,
            list_indexes_orders_by_index_id,
            update_index_config_renews_doc_mapping_uid_iff_doc_mapping_changed,
            doc_mapping_versions_are_kept_and_sort_fields_make_a_new_one,
            delete_tasks_are_bound_to_the_settings_of_their_creation,
            delete_tasks_are_purged_only_behind_every_split_and_the_newest_is_kept,
            update_index_config_rejects_index_id_change,
            update_split_maturities_changes_published_splits_only,
            delete_index_returns_its_splits_and_forgets_everything,
            stage_splits_requires_the_index,
            stage_splits_updates_a_staged_split,
            stage_splits_fails_on_non_staged_split_and_writes_nothing,
            stage_splits_rejects_split_of_another_index,
            split_metadata_round_trips,
            metrics_index_and_split_metadata_round_trip,
            metric_metadata_keeps_the_last_written_per_family,
            publish_splits_publishes_replaces_and_checkpoints,
            publish_splits_checks_split_states,
            failed_publish_changes_nothing,
            checkpoint_deltas_must_chain,
            concurrent_publishes_replacing_one_split_one_wins,
            concurrent_publishes_of_one_checkpoint_delta_one_wins,
            list_splits_filters_by_index_and_state,
            list_splits_filters_by_time_range,
            list_splits_filters_by_time_range_end,
            list_splits_filters_by_partition_maturity_and_update_time,
            list_splits_orders_by_split_id,
            mark_splits_for_deletion_marks_any_state,
            delete_splits_refuses_published_splits,
            split_operations_on_unknown_index_are_not_found,
            create_merge_tasks_creates_tasks_and_skips_unavailable_splits,
            concurrent_create_merge_tasks_never_share_a_split,
            claim_merge_task_takes_the_oldest_task_with_a_lease,
            claim_merge_task_can_be_limited_to_a_node_scope,
            release_merge_tasks_releases_only_claimable_tasks,
            mark_staged_splits_for_deletion_touches_only_staged_splits,
            split_stats_count_splits_by_state_scope_and_maturity,
            expired_leases_are_reclaimed_until_max_attempts,
            concurrent_claimers_each_claim_a_task_once,
            claim_fails_tasks_whose_inputs_are_no_longer_published,
            publish_merge_publishes_the_output_and_completes_the_task,
            publish_merge_after_another_node_reclaimed_fails_and_changes_nothing,
            publish_merge_checks_inputs_outputs_and_owner_and_changes_nothing,
            fail_merge_task_retries_or_gives_up,
            renew_merge_task_lease_requires_the_owner,
            list_merge_tasks_filters_and_orders_newest_first,
            delete_merge_tasks_deletes_finished_tasks_only,
            delete_index_deletes_its_merge_tasks,
            nodes_register_with_growing_generations_and_heartbeat,
            the_metastore_clock_is_read_in_milliseconds,
            leader_lease_has_one_holder_and_a_growing_fencing_token,
            concurrent_lease_candidates_elect_one,
            fenced_writes_are_refused_once_the_fence_is_gone,
            shards_open_close_and_delete,
            merge_tasks_of_dead_workers_are_requeued,
            delete_tasks_are_numbered_per_index_and_listed_by_opstamp,
            concurrent_delete_tasks_get_distinct_opstamps,
            merge_tasks_record_their_trigger_and_compaction,
            compactions_are_recorded_listed_and_updated,
            list_splits_visible_at_a_past_second,
        );
    };
    (@cases $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some(fixture) = $setup().await else {
                    return;
                };
                $crate::conformance::$case(fixture.metastore.clone()).await;
                drop(fixture);
            }
        )*
    };
}

// ----- helpers -----

/// A minimal index config for `index_id`.
pub fn index_config(index_id: &str) -> IndexConfig {
    let config = serde_json::json!({
        "index_id": index_id,
        "doc_mapping": {
            "field_mappings": [
                {"name": "timestamp", "type": "datetime", "fast": true},
                {"name": "body", "type": "text"},
            ],
            "timestamp_field": "timestamp",
        },
    });
    match serde_json::from_value(config) {
        Ok(config) => config,
        Err(err) => panic!("the conformance index config does not parse: {err}"),
    }
}

/// Split metadata of `index_uid`, immature for an hour, covering no time range.
pub fn split_metadata(index_uid: &IndexUid, split_id: &str) -> SplitMetadata {
    SplitMetadata {
        split_id: split_id.to_string(),
        index_uid: index_uid.clone(),
        source_id: "source".to_string(),
        node_id: "node-1".to_string(),
        partition_id: 0,
        doc_mapping_uid: "doc-mapping".to_string(),
        num_docs: 10,
        size_bytes: 1000,
        uncompressed_docs_size_bytes: 2000,
        time_range: None,
        tags: BTreeSet::new(),
        create_timestamp: shale_types::now_unix_secs(),
        maturity: SplitMaturity::Immature {
            maturation_period_secs: 3600,
        },
        num_merge_ops: 0,
        delete_opstamp: 0,
        footer_offsets: (0, 0),
        time_bucket_start: None,
        sort_key_min: None,
        sort_key_max: None,
        key_level: 0,
        sort_fields: None,
        tag_fields: None,
        format: Default::default(),
        num_series: None,
    }
}

fn ids(split_ids: &[&str]) -> Vec<SplitId> {
    split_ids.iter().map(|id| id.to_string()).collect()
}

async fn create(metastore: &Arc<dyn Metastore>, index_id: &str) -> IndexMetadata {
    metastore
        .create_index(index_config(index_id))
        .await
        .expect("create_index")
}

async fn stage(metastore: &Arc<dyn Metastore>, index_uid: &IndexUid, split_ids: &[&str]) {
    let splits = split_ids
        .iter()
        .map(|id| split_metadata(index_uid, id))
        .collect();
    metastore
        .stage_splits(index_uid, splits)
        .await
        .expect("stage_splits");
}

async fn publish(metastore: &Arc<dyn Metastore>, index_uid: &IndexUid, split_ids: &[&str]) {
    metastore
        .publish_splits(index_uid, &ids(split_ids), &[], None)
        .await
        .expect("publish_splits");
}

async fn splits_of(metastore: &Arc<dyn Metastore>, index_uid: &IndexUid) -> Vec<Split> {
    metastore
        .list_splits(ListSplitsQuery::for_index(index_uid.clone()))
        .await
        .expect("list_splits")
}

/// `(split_id, state)` of every split of the index, by id.
async fn states(metastore: &Arc<dyn Metastore>, index_uid: &IndexUid) -> Vec<(String, SplitState)> {
    splits_of(metastore, index_uid)
        .await
        .into_iter()
        .map(|s| (s.split_metadata.split_id, s.split_state))
        .collect()
}

async fn listed_ids(metastore: &Arc<dyn Metastore>, query: ListSplitsQuery) -> Vec<String> {
    metastore
        .list_splits(query)
        .await
        .expect("list_splits")
        .into_iter()
        .map(|s| s.split_metadata.split_id)
        .collect()
}

fn assert_failed_precondition<T: std::fmt::Debug>(result: Result<T, MetastoreError>) {
    match result {
        Err(MetastoreError::FailedPrecondition(_)) => {}
        other => panic!("expected FailedPrecondition, got {other:?}"),
    }
}

fn assert_not_found<T: std::fmt::Debug>(result: Result<T, MetastoreError>) {
    match result {
        Err(MetastoreError::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

fn assert_recent(timestamp: i64) {
    let now = shale_types::now_unix_secs();
    assert!(
        (now - 60..=now).contains(&timestamp),
        "timestamp {timestamp} is not within the last minute (now: {now})"
    );
}

fn is_ulid(s: &str) -> bool {
    ulid::Ulid::from_string(s).is_ok()
}

// ----- indexes -----

/// `create_index` assigns a fresh uid and doc mapping uid and records the creation time.
pub async fn create_index_assigns_uids(metastore: Arc<dyn Metastore>) {
    let mut config = index_config("logs");
    config.doc_mapping.doc_mapping_uid = "caller-provided".to_string();
    let created = metastore.create_index(config).await.expect("create_index");
    assert_eq!(created.index_uid.index_id, "logs");
    assert!(is_ulid(&created.index_uid.incarnation));
    assert!(is_ulid(&created.index_config.doc_mapping.doc_mapping_uid));
    assert_eq!(created.index_config.index_id, "logs");
    assert!(created.checkpoints.is_empty());
    assert_recent(created.create_timestamp);

    let read = metastore
        .index_metadata("logs")
        .await
        .expect("index_metadata");
    assert_eq!(read, created);

    let other = create(&metastore, "traces").await;
    assert_ne!(
        other.index_config.doc_mapping.doc_mapping_uid,
        created.index_config.doc_mapping.doc_mapping_uid
    );
}

/// A second index with the same id is `AlreadyExists`; after deletion the id is free again,
/// with a new incarnation.
pub async fn create_index_fails_if_index_id_exists(metastore: Arc<dyn Metastore>) {
    let first = create(&metastore, "logs").await;
    match metastore.create_index(index_config("logs")).await {
        Err(MetastoreError::AlreadyExists { kind, id }) => {
            assert_eq!(kind, "index");
            assert_eq!(id, "logs");
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(metastore.list_indexes().await.expect("list").len(), 1);

    metastore
        .delete_index(&first.index_uid)
        .await
        .expect("delete_index");
    let second = create(&metastore, "logs").await;
    assert_ne!(second.index_uid, first.index_uid);
    assert_eq!(second.index_uid.index_id, "logs");
}

/// Unknown index ids are `NotFound`.
pub async fn index_metadata_of_unknown_index_is_not_found(metastore: Arc<dyn Metastore>) {
    assert_not_found(metastore.index_metadata("nope").await);
    assert_not_found(metastore.index_metadata_without_checkpoints("nope").await);
    assert!(metastore.list_indexes().await.expect("list").is_empty());
}

/// `index_version`: the same while nothing is written to the index (reads, writes to other
/// indexes), higher after each write to it (stage, publish, mark, delete task, config
/// update); `NotFound` for an unknown index; a new uid for an index created again.
pub async fn index_version_rises_with_every_write_to_the_index(metastore: Arc<dyn Metastore>) {
    assert_not_found(metastore.index_version("nope").await);
    let index = create(&metastore, "versioned").await;
    let other = create(&metastore, "other").await;
    let version = || async { metastore.index_version("versioned").await.expect("version") };
    let mut last = version().await;
    assert_eq!(last.index_uid, index.index_uid);
    fn rose(last: &mut crate::IndexVersion, now: crate::IndexVersion, what: &str) {
        assert!(now.version > last.version, "{what}: {now:?} after {last:?}");
        *last = now;
    }
    stage(&metastore, &index.index_uid, &["a", "b"]).await;
    rose(&mut last, version().await, "stage");
    publish(&metastore, &index.index_uid, &["a", "b"]).await;
    rose(&mut last, version().await, "publish");
    // Reads and another index's writes leave it.
    splits_of(&metastore, &index.index_uid).await;
    metastore.index_metadata("versioned").await.expect("read");
    stage(&metastore, &other.index_uid, &["c"]).await;
    assert_eq!(version().await, last);
    metastore
        .mark_splits_for_deletion(&index.index_uid, &ids(&["a"]))
        .await
        .expect("mark");
    rose(&mut last, version().await, "mark");
    let delete: shale_types::DeleteQuery =
        serde_json::from_value(serde_json::json!({"query": "body:x"})).expect("delete query");
    metastore
        .create_delete_task(&index.index_uid, delete, T0)
        .await
        .expect("delete task");
    rose(&mut last, version().await, "delete task");
    metastore
        .update_index_config(&index.index_uid, index_config("versioned"))
        .await
        .expect("update");
    rose(&mut last, version().await, "config update");
    metastore
        .delete_index(&index.index_uid)
        .await
        .expect("delete index");
    assert_not_found(metastore.index_version("versioned").await);
    let again = create(&metastore, "versioned").await;
    assert_eq!(version().await.index_uid, again.index_uid);
}

/// A reader's view of an index: Published splits by id and delete tasks, at a version.
#[derive(Clone, Debug, Default)]
struct View {
    version: Option<crate::IndexVersion>,
    splits: std::collections::BTreeMap<SplitId, SplitMetadata>,
    delete_tasks: Vec<u64>,
}

impl View {
    /// Applies the changes since this view's version; returns whether they were the whole
    /// index and how many split rows they held.
    async fn refresh(&mut self, metastore: &Arc<dyn Metastore>, index_id: &str) -> (bool, usize) {
        let last_opstamp = self.delete_tasks.last().copied().unwrap_or(0);
        let changes = metastore
            .index_changes(index_id, self.version.as_ref(), last_opstamp)
            .await
            .expect("index_changes");
        let outcome = match changes.splits {
            crate::SplitChanges::All(splits) => {
                let n = splits.len();
                self.splits = splits
                    .into_iter()
                    .map(|split| (split.split_id.clone(), split))
                    .collect();
                self.delete_tasks.clear();
                (true, n)
            }
            crate::SplitChanges::Since(rows) => {
                let n = rows.len();
                for row in rows {
                    if row.split_state == SplitState::Published {
                        let split = row.split_metadata;
                        self.splits.insert(split.split_id.clone(), split);
                    } else {
                        self.splits.remove(&row.split_metadata.split_id);
                    }
                }
                (false, n)
            }
        };
        assert_eq!(changes.index.index_config.index_id, index_id);
        let now = metastore.index_metadata(index_id).await.expect("index");
        assert_eq!(
            changes.index.checkpoints, now.checkpoints,
            "the splits' checkpoints"
        );
        self.delete_tasks
            .extend(changes.delete_tasks.iter().map(|task| task.opstamp));
        self.version = Some(changes.version);
        outcome
    }

    /// Asserts the view holds exactly what the metastore lists now.
    async fn assert_current(&self, metastore: &Arc<dyn Metastore>, index_uid: &IndexUid) {
        let published: Vec<SplitMetadata> = metastore
            .list_splits(
                ListSplitsQuery::for_index(index_uid.clone()).with_states(&[SplitState::Published]),
            )
            .await
            .expect("list_splits")
            .into_iter()
            .map(|split| split.split_metadata)
            .collect();
        let viewed: Vec<SplitMetadata> = self.splits.values().cloned().collect();
        assert_eq!(viewed, published, "the view's splits");
        let tasks: Vec<u64> = metastore
            .list_delete_tasks(index_uid, 0)
            .await
            .expect("list_delete_tasks")
            .iter()
            .map(|task| task.opstamp)
            .collect();
        assert_eq!(self.delete_tasks, tasks, "the view's delete tasks");
    }
}

/// `index_changes`: a view refreshed from the changes alone stays exactly the Published
/// splits and delete tasks the metastore lists, through every kind of split write (stage,
/// publish, replace, merge, maturity, delete opstamp, mark, row deletion); no change gives
/// nothing to apply; a view older than deleted split rows, or of a deleted index, gets the
/// index whole.
pub async fn index_changes_bring_a_view_to_the_listed_splits(metastore: Arc<dyn Metastore>) {
    assert_not_found(metastore.index_changes("nope", None, 0).await);
    let index = create(&metastore, "viewed").await;
    let uid = index.index_uid.clone();
    let other = create(&metastore, "other").await;
    let mut view = View::default();
    assert_eq!(view.refresh(&metastore, "viewed").await, (true, 0));
    view.assert_current(&metastore, &uid).await;

    stage(&metastore, &uid, &["a", "b"]).await;
    assert_eq!(
        view.refresh(&metastore, "viewed").await,
        (false, 2),
        "staged rows"
    );
    view.assert_current(&metastore, &uid).await;
    publish(&metastore, &uid, &["a", "b"]).await;
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 2));
    view.assert_current(&metastore, &uid).await;
    // A publish with a checkpoint: the changes say what the splits cover, in the same
    // snapshot.
    stage(&metastore, &uid, &["p"]).await;
    metastore
        .publish_splits(
            &uid,
            &ids(&["p"]),
            &[],
            Some(("src".to_string(), CheckpointDelta::single("q", None, 9))),
        )
        .await
        .expect("publish with a checkpoint");
    let changes = metastore
        .index_changes("viewed", None, 0)
        .await
        .expect("changes");
    assert_eq!(changes.index.checkpoint("src").position("q"), Some(9));
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 1));
    view.assert_current(&metastore, &uid).await;
    // Nothing written: nothing to apply; another index's writes are not this one's.
    stage(&metastore, &other.index_uid, &["z"]).await;
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 0));

    metastore
        .create_delete_task(&uid, delete_query("body:x"), T0)
        .await
        .expect("delete task");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 0));
    assert_eq!(view.delete_tasks.len(), 1);
    view.assert_current(&metastore, &uid).await;

    // A publish that replaces: only the new split and the replaced one are read.
    stage(&metastore, &uid, &["c"]).await;
    metastore
        .publish_splits(&uid, &ids(&["c"]), &ids(&["a"]), None)
        .await
        .expect("replace");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 2));
    view.assert_current(&metastore, &uid).await;
    // A merge through a merge task.
    let task = create_tasks(&metastore, &uid, &[&["b", "c"]], 3).await;
    assert_eq!(task.len(), 1);
    let task = claimed(claim(&metastore, "node-1", T0, Some(&uid)).await);
    stage(&metastore, &uid, &["bc"]).await;
    metastore
        .publish_merge(
            &uid,
            &task.task_id,
            "node-1",
            &ids(&["bc"]),
            &ids(&["b", "c"]),
            T0,
        )
        .await
        .expect("publish_merge");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 3));
    view.assert_current(&metastore, &uid).await;
    assert_eq!(view.splits.keys().collect::<Vec<_>>(), ["bc", "p"]);

    // Metadata rewritten in place: maturity, delete opstamp.
    let mut bc = view.splits["bc"].clone();
    bc.maturity = SplitMaturity::Mature;
    metastore
        .update_split_maturities(&uid, std::slice::from_ref(&bc))
        .await
        .expect("maturities");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 1));
    view.assert_current(&metastore, &uid).await;
    let expected = bc.delete_opstamp;
    bc.delete_opstamp = view.delete_tasks[0];
    metastore
        .advance_split_delete_opstamps(&uid, &[(bc.clone(), expected)])
        .await
        .expect("advance");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 1));
    view.assert_current(&metastore, &uid).await;
    assert_eq!(view.splits["bc"].delete_opstamp, bc.delete_opstamp);

    // Rows deleted after the view saw their last write: still only changes.
    stage(&metastore, &uid, &["d"]).await;
    publish(&metastore, &uid, &["d"]).await;
    view.refresh(&metastore, "viewed").await;
    let old_view = view.clone();
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["d"]))
        .await
        .expect("mark");
    view.refresh(&metastore, "viewed").await;
    let marked_view = view.clone();
    metastore
        .delete_splits(&uid, &ids(&["a", "b", "c"]))
        .await
        .expect("delete a, b, c");
    assert_eq!(view.refresh(&metastore, "viewed").await, (false, 0));
    view.assert_current(&metastore, &uid).await;
    metastore
        .delete_splits(&uid, &ids(&["d"]))
        .await
        .expect("delete d");
    // The view saw `d` marked: the deletion has nothing to tell it.
    let mut seen_mark = marked_view.clone();
    assert_eq!(seen_mark.refresh(&metastore, "viewed").await, (false, 0));
    seen_mark.assert_current(&metastore, &uid).await;
    // A view from before `d` was marked cannot learn of it from changes: the index whole.
    let mut stale = old_view;
    assert!(stale.splits.contains_key("d"));
    // What is left: `bc` and `p`.
    assert_eq!(stale.refresh(&metastore, "viewed").await, (true, 2));
    stale.assert_current(&metastore, &uid).await;

    // The index deleted and created again: a view of the old one gets the new one whole.
    metastore.delete_index(&uid).await.expect("delete index");
    assert_not_found(
        metastore
            .index_changes("viewed", view.version.as_ref(), 0)
            .await,
    );
    let again = create(&metastore, "viewed").await;
    stage(&metastore, &again.index_uid, &["n"]).await;
    publish(&metastore, &again.index_uid, &["n"]).await;
    assert_eq!(view.refresh(&metastore, "viewed").await, (true, 1));
    view.assert_current(&metastore, &again.index_uid).await;
}

/// Index templates: create (`AlreadyExists` twice), get, list by id, update (`NotFound` for
/// an unknown id), delete all or none.
pub async fn index_templates_are_created_listed_updated_and_deleted(metastore: Arc<dyn Metastore>) {
    let template = |id: &str, pattern: &str, priority: usize| -> shale_config::IndexTemplate {
        serde_json::from_value(serde_json::json!({
            "template_id": id,
            "index_id_patterns": [pattern],
            "priority": priority,
            "doc_mapping": {"mode": "dynamic"},
            "indexing_settings": {"commit_timeout_secs": 1},
        }))
        .expect("template")
    };
    assert!(metastore
        .list_index_templates()
        .await
        .expect("list")
        .is_empty());
    metastore
        .create_index_template(template("tpl-b", "b-*", 1))
        .await
        .expect("create b");
    metastore
        .create_index_template(template("tpl-a", "a-*", 2))
        .await
        .expect("create a");
    match metastore
        .create_index_template(template("tpl-a", "other-*", 0))
        .await
    {
        Err(MetastoreError::AlreadyExists { .. }) => {}
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    let listed = metastore.list_index_templates().await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|t| t.template_id.as_str()).collect();
    assert_eq!(ids, ["tpl-a", "tpl-b"]);
    assert_eq!(listed[0], template("tpl-a", "a-*", 2), "round trip");
    assert_not_found(metastore.index_template("nope").await);

    metastore
        .update_index_template(template("tpl-a", "aa-*", 7))
        .await
        .expect("update");
    let updated = metastore.index_template("tpl-a").await.expect("get");
    assert_eq!(updated.index_id_patterns, ["aa-*"]);
    assert_eq!(updated.priority, 7);
    assert_not_found(
        metastore
            .update_index_template(template("nope", "x-*", 0))
            .await,
    );

    // All or none.
    assert_not_found(
        metastore
            .delete_index_templates(&["tpl-a".to_string(), "nope".to_string()])
            .await,
    );
    assert_eq!(
        metastore.list_index_templates().await.expect("list").len(),
        2
    );
    metastore
        .delete_index_templates(&["tpl-a".to_string(), "tpl-b".to_string()])
        .await
        .expect("delete");
    assert!(metastore
        .list_index_templates()
        .await
        .expect("list")
        .is_empty());
}

/// `list_indexes` returns every index, ordered by id, with its checkpoints.
pub async fn list_indexes_orders_by_index_id(metastore: Arc<dyn Metastore>) {
    for index_id in ["index-b", "index-c", "index-a"] {
        create(&metastore, index_id).await;
    }
    let b = metastore.index_metadata("index-b").await.expect("index-b");
    metastore
        .publish_splits(
            &b.index_uid,
            &[],
            &[],
            Some(("src".to_string(), CheckpointDelta::single("p", None, 7))),
        )
        .await
        .expect("publish checkpoint");
    let indexes = metastore.list_indexes().await.expect("list_indexes");
    let index_ids: Vec<&str> = indexes.iter().map(|i| i.index_id()).collect();
    assert_eq!(index_ids, ["index-a", "index-b", "index-c"]);
    assert_eq!(indexes[1].checkpoint("src").position("p"), Some(7));
    assert!(indexes[0].checkpoints.is_empty());
    // The search read: the same index, without checkpoints.
    let light = metastore
        .index_metadata_without_checkpoints("index-b")
        .await
        .expect("index_metadata_without_checkpoints");
    assert_eq!(light.index_uid, indexes[1].index_uid);
    assert_eq!(light.index_config, indexes[1].index_config);
    assert!(light.checkpoints.is_empty());
}

/// The doc mapping uid survives updates that keep the doc mapping (whatever uid the caller
/// sends) and is renewed when the doc mapping changes.
pub async fn update_index_config_renews_doc_mapping_uid_iff_doc_mapping_changed(
    metastore: Arc<dyn Metastore>,
) {
    let created = create(&metastore, "logs").await;
    let uid0 = created.index_config.doc_mapping.doc_mapping_uid.clone();

    let mut config = created.index_config.clone();
    config.indexing_settings.commit_timeout_secs = 5;
    config.doc_mapping.doc_mapping_uid = "caller-provided".to_string();
    let updated = metastore
        .update_index_config(&created.index_uid, config)
        .await
        .expect("update (settings)");
    assert_eq!(updated.index_config.doc_mapping.doc_mapping_uid, uid0);
    assert_eq!(
        updated.index_config.indexing_settings.commit_timeout_secs,
        5
    );
    assert_eq!(updated.index_uid, created.index_uid);
    assert_eq!(updated.create_timestamp, created.create_timestamp);

    let mut config = updated.index_config.clone();
    config.doc_mapping.tag_fields.push("body".to_string());
    let updated = metastore
        .update_index_config(&created.index_uid, config)
        .await
        .expect("update (doc mapping)");
    let uid1 = updated.index_config.doc_mapping.doc_mapping_uid.clone();
    assert_ne!(uid1, uid0);
    assert!(is_ulid(&uid1));

    let read = metastore
        .index_metadata("logs")
        .await
        .expect("index_metadata");
    assert_eq!(read, updated);
    assert_eq!(read.index_config.doc_mapping.tag_fields, ["body"]);
    assert_eq!(read.index_config.indexing_settings.commit_timeout_secs, 5);
}

/// Every doc mapping version stays readable with the config of its day; a change of the
/// sort fields of a locality index is a new version (its splits' keys are encoded
/// differently).
pub async fn doc_mapping_versions_are_kept_and_sort_fields_make_a_new_one(
    metastore: Arc<dyn Metastore>,
) {
    let created = create(&metastore, "logs").await;
    let uid0 = created.index_config.doc_mapping.doc_mapping_uid.clone();
    let v0 = metastore
        .doc_mapping_version(&created.index_uid, &uid0)
        .await
        .expect("version")
        .expect("the first version is recorded at creation");
    assert_eq!(v0, created.index_config);

    let mut config = created.index_config.clone();
    config.doc_mapping.tag_fields.push("body".to_string());
    let updated = metastore
        .update_index_config(&created.index_uid, config)
        .await
        .expect("update");
    let uid1 = updated.index_config.doc_mapping.doc_mapping_uid.clone();
    assert_ne!(uid1, uid0);
    let v1 = metastore
        .doc_mapping_version(&created.index_uid, &uid1)
        .await
        .expect("version")
        .expect("recorded");
    assert_eq!(v1.doc_mapping.tag_fields, ["body"]);
    let v0_again = metastore
        .doc_mapping_version(&created.index_uid, &uid0)
        .await
        .expect("version")
        .expect("still recorded");
    assert!(v0_again.doc_mapping.tag_fields.is_empty());

    // Same doc mapping, other sort fields: a new version.
    let locality = |fields: &[&str]| {
        let mut config = updated.index_config.clone();
        let settings = serde_json::json!({"sort_fields": fields});
        config.indexing_settings.merge_policy = shale_config::MergePolicyConfig::Locality(
            shale_config::LocalityConfig::parse(settings.as_object().expect("object"))
                .expect("locality settings"),
        );
        config
    };
    let by_body = metastore
        .update_index_config(&created.index_uid, locality(&["body"]))
        .await
        .expect("update");
    let uid2 = by_body.index_config.doc_mapping.doc_mapping_uid.clone();
    assert_ne!(
        uid2, uid1,
        "a new merge policy with sort fields is a new layout"
    );
    let mut same = by_body.index_config.clone();
    same.indexing_settings.commit_timeout_secs = 3;
    let same = metastore
        .update_index_config(&created.index_uid, same)
        .await
        .expect("update");
    assert_eq!(same.index_config.doc_mapping.doc_mapping_uid, uid2);
    let by_timestamp = metastore
        .update_index_config(&created.index_uid, locality(&["timestamp"]))
        .await
        .expect("update");
    assert_ne!(by_timestamp.index_config.doc_mapping.doc_mapping_uid, uid2);
    assert!(metastore
        .doc_mapping_version(&created.index_uid, "unknown")
        .await
        .expect("version")
        .is_none());
    // Deleting the index forgets its versions.
    metastore
        .delete_index(&created.index_uid)
        .await
        .expect("delete");
    let again = create(&metastore, "logs").await;
    assert!(metastore
        .doc_mapping_version(&again.index_uid, &uid0)
        .await
        .expect("version")
        .is_none());
}

/// A delete task records the default search fields and doc mapping of its creation; a later
/// update of the index does not change them.
pub async fn delete_tasks_are_bound_to_the_settings_of_their_creation(
    metastore: Arc<dyn Metastore>,
) {
    let mut config = index_config("logs");
    config.search_settings.default_search_fields = vec!["body".to_string()];
    let created = metastore.create_index(config).await.expect("create");
    let unfielded = shale_types::DeleteQuery {
        query: "secret".to_string(),
        ..Default::default()
    };
    let task = metastore
        .create_delete_task(&created.index_uid, unfielded.clone(), T0)
        .await
        .expect("create");
    assert_eq!(
        task.default_search_fields.as_deref(),
        Some(&["body".to_string()][..])
    );
    assert_eq!(
        task.doc_mapping_uid.as_deref(),
        Some(created.index_config.doc_mapping.doc_mapping_uid.as_str())
    );
    assert_eq!(task.search_fields(), Some(&["body".to_string()][..]));

    let mut updated = created.index_config.clone();
    updated.search_settings.default_search_fields = vec!["timestamp".to_string()];
    updated.doc_mapping.tag_fields.push("body".to_string());
    metastore
        .update_index_config(&created.index_uid, updated)
        .await
        .expect("update");
    let listed = metastore
        .list_delete_tasks(&created.index_uid, 0)
        .await
        .expect("list");
    assert_eq!(listed, std::slice::from_ref(&task));
    let later = metastore
        .create_delete_task(&created.index_uid, unfielded, T0 + 1)
        .await
        .expect("create");
    assert_eq!(later.search_fields(), Some(&["timestamp".to_string()][..]));
}

/// Purging forgets the tasks every split is clean of, never the newest (opstamps keep
/// growing), never one a split is not clean of; a split's `delete_opstamp` advances without
/// a rewrite only from the value the caller saw, and only while Published.
pub async fn delete_tasks_are_purged_only_behind_every_split_and_the_newest_is_kept(
    metastore: Arc<dyn Metastore>,
) {
    let uid = create(&metastore, "logs").await.index_uid;
    let query = |q: &str| shale_types::DeleteQuery {
        query: q.to_string(),
        ..Default::default()
    };
    for i in 1..=5 {
        let task = metastore
            .create_delete_task(&uid, query(&format!("body:t{i}")), T0 + i)
            .await
            .expect("create");
        assert_eq!(task.opstamp, i as u64);
    }
    let mut a = split_metadata(&uid, "a");
    a.delete_opstamp = 3;
    let mut b = split_metadata(&uid, "b");
    b.delete_opstamp = 5;
    metastore
        .stage_splits(&uid, vec![a.clone(), b])
        .await
        .expect("stage");
    publish(&metastore, &uid, &["a", "b"]).await;
    let remaining = |metastore: Arc<dyn Metastore>, uid: IndexUid| async move {
        metastore
            .list_delete_tasks(&uid, 0)
            .await
            .expect("list")
            .iter()
            .map(|t| t.opstamp)
            .collect::<Vec<_>>()
    };
    // The splits not clean of a task are listed by `delete_opstamp_lt`.
    let not_clean_of = |opstamp: u64| ListSplitsQuery {
        delete_opstamp_lt: Some(opstamp),
        ..ListSplitsQuery::for_index(uid.clone())
    };
    assert_eq!(listed_ids(&metastore, not_clean_of(4)).await, ["a"]);
    assert_eq!(listed_ids(&metastore, not_clean_of(6)).await, ["a", "b"]);
    // Split a is clean up to 3 only.
    assert_eq!(
        metastore
            .purge_delete_tasks(&uid, 10, 0)
            .await
            .expect("purge"),
        3
    );
    assert_eq!(remaining(metastore.clone(), uid.clone()).await, [4, 5]);
    // An advance from a value the split no longer has changes nothing.
    let mut advanced = a.clone();
    advanced.delete_opstamp = 5;
    assert_eq!(
        metastore
            .advance_split_delete_opstamps(&uid, &[(advanced.clone(), 2)])
            .await
            .expect("advance"),
        0
    );
    assert_eq!(
        metastore
            .advance_split_delete_opstamps(&uid, &[(advanced, 3)])
            .await
            .expect("advance"),
        1
    );
    let stored = splits_of(&metastore, &uid).await;
    assert!(stored.iter().all(|s| s.split_metadata.delete_opstamp == 5));
    // Every split clean up to 5: all but the newest go.
    assert_eq!(
        metastore
            .purge_delete_tasks(&uid, 10, 0)
            .await
            .expect("purge"),
        1
    );
    assert_eq!(remaining(metastore.clone(), uid.clone()).await, [5]);
    assert_eq!(
        metastore
            .purge_delete_tasks(&uid, 10, 0)
            .await
            .expect("purge"),
        0
    );
    // Opstamps go on after the newest kept.
    let next = metastore
        .create_delete_task(&uid, query("body:t6"), T0 + 6)
        .await
        .expect("create");
    assert_eq!(next.opstamp, 6);
    assert_eq!(
        metastore
            .last_delete_opstamps()
            .await
            .expect("last")
            .get(&uid),
        Some(&6)
    );
    // Splits in every state count: one marked for deletion (its documents may still be
    // searched) or being staged with documents older than the tasks.
    let mut staged = split_metadata(&uid, "c");
    staged.delete_opstamp = 4;
    metastore
        .stage_splits(&uid, vec![staged])
        .await
        .expect("stage");
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["c"]))
        .await
        .expect("mark");
    assert_eq!(
        metastore
            .purge_delete_tasks(&uid, 5, 0)
            .await
            .expect("purge"),
        0
    );
    assert_eq!(remaining(metastore.clone(), uid.clone()).await, [5, 6]);
}

/// Maturities are rewritten for Published splits only; the maturity filter of
/// `list_splits` sees the new ones.
pub async fn update_split_maturities_changes_published_splits_only(metastore: Arc<dyn Metastore>) {
    let created = create(&metastore, "logs").await;
    let uid = created.index_uid.clone();
    let mut published = split_metadata(&uid, "published");
    published.maturity = SplitMaturity::Mature;
    let mut staged = split_metadata(&uid, "staged");
    staged.maturity = SplitMaturity::Mature;
    metastore
        .stage_splits(&uid, vec![published.clone(), staged.clone()])
        .await
        .expect("stage");
    publish(&metastore, &uid, &["published"]).await;
    let now = shale_types::now_unix_secs();
    let immature_query = || {
        let mut query = ListSplitsQuery::for_index(uid.clone());
        query.immature_at = Some(now);
        query
    };
    assert!(metastore
        .list_splits(immature_query())
        .await
        .unwrap()
        .is_empty());
    for split in [&mut published, &mut staged] {
        split.maturity = SplitMaturity::Immature {
            maturation_period_secs: 3600,
        };
        split.create_timestamp = now;
    }
    let updated = metastore
        .update_split_maturities(&uid, &[published.clone(), staged.clone()])
        .await
        .expect("update maturities");
    assert_eq!(updated, 1);
    let immature = metastore.list_splits(immature_query()).await.unwrap();
    assert_eq!(immature.len(), 1);
    assert_eq!(immature[0].split_metadata.split_id, "published");
    assert_eq!(immature[0].split_metadata.maturity, published.maturity);
}

/// The index id cannot change; unknown indexes are `NotFound`.
pub async fn update_index_config_rejects_index_id_change(metastore: Arc<dyn Metastore>) {
    let created = create(&metastore, "logs").await;
    let mut config = created.index_config.clone();
    config.index_id = "renamed".to_string();
    assert_failed_precondition(
        metastore
            .update_index_config(&created.index_uid, config)
            .await,
    );
    assert_eq!(
        metastore.index_metadata("logs").await.expect("logs"),
        created
    );
    assert_not_found(metastore.index_metadata("renamed").await);

    let stale = IndexUid::new("logs");
    assert_not_found(
        metastore
            .update_index_config(&stale, created.index_config.clone())
            .await,
    );
}

/// `delete_index` returns the splits it had, in every state, and removes the index, its
/// splits and its checkpoints; a second delete is `NotFound`.
pub async fn delete_index_returns_its_splits_and_forgets_everything(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let other = create(&metastore, "other").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["a", "b", "c"]).await;
    metastore
        .publish_splits(
            uid,
            &ids(&["a"]),
            &[],
            Some(("src".to_string(), CheckpointDelta::single("p", None, 3))),
        )
        .await
        .expect("publish");
    metastore
        .mark_splits_for_deletion(uid, &ids(&["b"]))
        .await
        .expect("mark");
    stage(&metastore, &other.index_uid, &["z"]).await;

    let deleted = metastore.delete_index(uid).await.expect("delete_index");
    let deleted: Vec<(String, SplitState)> = deleted
        .into_iter()
        .map(|s| (s.split_metadata.split_id, s.split_state))
        .collect();
    assert_eq!(
        deleted,
        [
            ("a".to_string(), SplitState::Published),
            ("b".to_string(), SplitState::MarkedForDeletion),
            ("c".to_string(), SplitState::Staged),
        ]
    );
    assert_not_found(metastore.index_metadata("logs").await);
    assert!(splits_of(&metastore, uid).await.is_empty());
    assert_not_found(metastore.delete_index(uid).await);
    // The other index is untouched.
    assert_eq!(
        states(&metastore, &other.index_uid).await,
        [("z".to_string(), SplitState::Staged)]
    );
    // A new incarnation starts from scratch, split ids included.
    let recreated = create(&metastore, "logs").await;
    assert!(recreated.checkpoints.is_empty());
    stage(&metastore, &recreated.index_uid, &["a"]).await;
}

// ----- staging -----

/// Staging into an unknown index (or a deleted incarnation) is `NotFound`.
pub async fn stage_splits_requires_the_index(metastore: Arc<dyn Metastore>) {
    let unknown = IndexUid::new("nope");
    assert_not_found(
        metastore
            .stage_splits(&unknown, vec![split_metadata(&unknown, "a")])
            .await,
    );
    let index = create(&metastore, "logs").await;
    let stale = IndexUid::new("logs");
    assert_not_found(
        metastore
            .stage_splits(&stale, vec![split_metadata(&stale, "a")])
            .await,
    );
    assert!(splits_of(&metastore, &index.index_uid).await.is_empty());
    assert!(metastore
        .list_splits(ListSplitsQuery::default())
        .await
        .expect("list")
        .is_empty());
}

/// Re-staging a Staged split replaces its metadata.
pub async fn stage_splits_updates_a_staged_split(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["a"]).await;
    let mut split = split_metadata(uid, "a");
    split.num_docs = 20;
    split.size_bytes = 4321;
    split.time_range = Some(TimeRange { start: 5, end: 9 });
    metastore
        .stage_splits(uid, vec![split.clone()])
        .await
        .expect("re-stage");
    let splits = splits_of(&metastore, uid).await;
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0].split_state, SplitState::Staged);
    assert_eq!(splits[0].split_metadata, split);
    assert_eq!(splits[0].publish_timestamp, None);
    assert_recent(splits[0].update_timestamp);
}

/// Staging a split that exists in another state fails, and nothing of the batch is written.
pub async fn stage_splits_fails_on_non_staged_split_and_writes_nothing(
    metastore: Arc<dyn Metastore>,
) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["a", "m"]).await;
    publish(&metastore, uid, &["a"]).await;
    metastore
        .mark_splits_for_deletion(uid, &ids(&["m"]))
        .await
        .expect("mark");
    let before = splits_of(&metastore, uid).await;

    for existing in ["a", "m"] {
        let mut changed = split_metadata(uid, existing);
        changed.num_docs = 999;
        let result = metastore
            .stage_splits(uid, vec![split_metadata(uid, "b"), changed])
            .await;
        assert_failed_precondition(result);
        assert_eq!(splits_of(&metastore, uid).await, before);
    }
}

/// A split whose metadata names another index cannot be staged, and a split id taken by
/// another index cannot be reused.
pub async fn stage_splits_rejects_split_of_another_index(metastore: Arc<dyn Metastore>) {
    let logs = create(&metastore, "logs").await;
    let traces = create(&metastore, "traces").await;
    assert_failed_precondition(
        metastore
            .stage_splits(
                &logs.index_uid,
                vec![split_metadata(&traces.index_uid, "a")],
            )
            .await,
    );
    stage(&metastore, &traces.index_uid, &["shared"]).await;
    assert_failed_precondition(
        metastore
            .stage_splits(
                &logs.index_uid,
                vec![split_metadata(&logs.index_uid, "shared")],
            )
            .await,
    );
    assert!(splits_of(&metastore, &logs.index_uid).await.is_empty());
    assert_eq!(
        states(&metastore, &traces.index_uid).await,
        [("shared".to_string(), SplitState::Staged)]
    );
}

/// Every field of the split metadata comes back as staged, extreme values included.
pub async fn split_metadata_round_trips(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    let mut split = split_metadata(uid, "01HZZZZZZZZZZZZZZZZZZZZZZZ");
    split.partition_id = u64::MAX;
    split.num_docs = u64::MAX;
    split.size_bytes = 1 << 40;
    split.uncompressed_docs_size_bytes = 1 << 41;
    split.time_range = Some(TimeRange {
        start: -5,
        end: i64::MAX,
    });
    split.tags = ["service:api", "level:error", "host!"]
        .into_iter()
        .map(String::from)
        .collect();
    split.create_timestamp = 1_700_000_000;
    split.maturity = SplitMaturity::Mature;
    split.num_merge_ops = 7;
    split.delete_opstamp = u64::MAX - 1;
    split.footer_offsets = (123, 456);
    split.doc_mapping_uid = index.index_config.doc_mapping.doc_mapping_uid.clone();
    metastore
        .stage_splits(uid, vec![split.clone()])
        .await
        .expect("stage");
    let splits = splits_of(&metastore, uid).await;
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0].split_metadata, split);
    let query = ListSplitsQuery {
        partition_id: Some(u64::MAX),
        ..ListSplitsQuery::for_index(uid.clone())
    };
    assert_eq!(
        listed_ids(&metastore, query).await,
        [split.split_id.clone()]
    );
}

/// A metrics index's config and its Parquet splits' metadata (format, series count, bucket,
/// sort-key range and fields, metric-name tags) come back as written, and time-range listing
/// finds them.
/// Metric metadata: upserted per family (the last written wins), listed by family, refused
/// for an unknown index, forgotten with the index.
pub async fn metric_metadata_keeps_the_last_written_per_family(metastore: Arc<dyn Metastore>) {
    let config = IndexConfig::parse(b"index_id: prom-meta\nmetrics: {}\n").expect("config");
    let index = metastore.create_index(config).await.expect("create");
    let uid = &index.index_uid;
    let meta = |family: &str, kind: &str, help: &str| shale_types::MetricMetadata {
        metric_family: family.to_string(),
        metric_type: kind.to_string(),
        help: help.to_string(),
        unit: String::new(),
    };
    assert!(metastore
        .list_metric_metadata(uid)
        .await
        .expect("list")
        .is_empty());
    metastore
        .upsert_metric_metadata(
            uid,
            &[
                meta("up", "gauge", "1 if the target is up"),
                meta("http_requests_total", "counter", "requests"),
            ],
        )
        .await
        .expect("upsert");
    metastore
        .upsert_metric_metadata(uid, &[meta("up", "gauge", "scrape health")])
        .await
        .expect("upsert again");
    assert_eq!(
        metastore.list_metric_metadata(uid).await.expect("list"),
        vec![
            meta("http_requests_total", "counter", "requests"),
            meta("up", "gauge", "scrape health"),
        ]
    );
    let unknown = IndexUid::new("nope");
    assert!(matches!(
        metastore
            .upsert_metric_metadata(&unknown, &[meta("up", "gauge", "")])
            .await,
        Err(MetastoreError::NotFound { .. })
    ));
    metastore.delete_index(uid).await.expect("delete");
    assert!(metastore
        .list_metric_metadata(uid)
        .await
        .expect("list")
        .is_empty());
}

pub async fn metrics_index_and_split_metadata_round_trip(metastore: Arc<dyn Metastore>) {
    let config = IndexConfig::parse(
        b"index_id: prom\nmetrics:\n  sort_labels: [job, instance]\n  time_bucket: 5m\n",
    )
    .expect("metrics config");
    let index = metastore
        .create_index(config.clone())
        .await
        .expect("create");
    let read = metastore.index_metadata("prom").await.expect("read");
    assert_eq!(read.index_config.metrics, config.metrics);
    let uid = &index.index_uid;
    let mut split = split_metadata(uid, "01HZZZZZZZZZZZZZZZZZZZZZZY");
    split.format = shale_types::SplitFormat::Parquet;
    split.num_series = Some(12_345);
    split.num_docs = 1_234_567;
    split.time_bucket_start = Some(1_800_000_000);
    split.time_range = Some(TimeRange {
        start: 1_800_000_000,
        end: 1_800_000_299,
    });
    split.sort_key_min = Some(shale_types::sort_key::SortKey(vec![0, 1, 2]));
    split.sort_key_max = Some(shale_types::sort_key::SortKey(vec![0xff; 40]));
    split.sort_fields = Some(vec![
        "__name__".to_string(),
        "job".to_string(),
        "instance".to_string(),
        "__series_id__".to_string(),
    ]);
    split.tag_fields = Some(vec!["__name__".to_string()]);
    split.tags = ["__name__:up", "__name__:http_requests_total"]
        .into_iter()
        .map(String::from)
        .collect();
    split.doc_mapping_uid = index.index_config.doc_mapping.doc_mapping_uid.clone();
    metastore
        .stage_splits(uid, vec![split.clone()])
        .await
        .expect("stage");
    let splits = splits_of(&metastore, uid).await;
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0].split_metadata, split);
    assert_eq!(
        splits[0].split_metadata.object_key(),
        format!("{}.parquet", split.split_id)
    );
    let mut query = ListSplitsQuery::for_index(uid.clone());
    query.time_range_start = Some(1_800_000_100);
    query.time_range_end = Some(1_800_000_101);
    assert_eq!(
        listed_ids(&metastore, query).await,
        [split.split_id.clone()]
    );
    let mut query = ListSplitsQuery::for_index(uid.clone());
    query.time_range_start = Some(1_800_000_300);
    assert!(listed_ids(&metastore, query).await.is_empty());
}

// ----- publishing -----

/// Publishing moves staged splits to Published, replaced ones to MarkedForDeletion, and
/// stores the checkpoint, with timestamps.
pub async fn publish_splits_publishes_replaces_and_checkpoints(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["a", "b"]).await;
    metastore
        .publish_splits(
            uid,
            &ids(&["a", "b"]),
            &[],
            Some((
                "src".to_string(),
                CheckpointDelta::single("shard-1", None, 41),
            )),
        )
        .await
        .expect("publish a, b");
    let splits = splits_of(&metastore, uid).await;
    for split in &splits {
        assert_eq!(split.split_state, SplitState::Published);
        let published_at = split.publish_timestamp.expect("publish timestamp");
        assert_recent(published_at);
        assert_eq!(split.update_timestamp, published_at);
    }
    let checkpoint = metastore
        .index_metadata("logs")
        .await
        .expect("index")
        .checkpoint("src");
    assert_eq!(checkpoint.position("shard-1"), Some(41));

    // A merge: publish its output, replace its inputs, no checkpoint.
    stage(&metastore, uid, &["merged"]).await;
    metastore
        .publish_splits(uid, &ids(&["merged"]), &ids(&["a", "b"]), None)
        .await
        .expect("publish merge");
    assert_eq!(
        states(&metastore, uid).await,
        [
            ("a".to_string(), SplitState::MarkedForDeletion),
            ("b".to_string(), SplitState::MarkedForDeletion),
            ("merged".to_string(), SplitState::Published),
        ]
    );
    for split in splits_of(&metastore, uid).await {
        assert_recent(split.update_timestamp);
    }
    let index = metastore.index_metadata("logs").await.expect("index");
    assert_eq!(index.checkpoint("src").position("shard-1"), Some(41));
    assert_eq!(index.checkpoints.len(), 1);
}

/// Staged ids must be Staged and replaced ids Published — existing in the index — else
/// `FailedPrecondition`; an unknown index is `NotFound`.
pub async fn publish_splits_checks_split_states(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let other = create(&metastore, "other").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["staged", "published", "marked"]).await;
    publish(&metastore, uid, &["published"]).await;
    metastore
        .mark_splits_for_deletion(uid, &ids(&["marked"]))
        .await
        .expect("mark");
    stage(&metastore, &other.index_uid, &["foreign"]).await;
    let before = splits_of(&metastore, uid).await;

    let cases: [(&[&str], &[&str]); 8] = [
        (&["published"], &[]),
        (&["marked"], &[]),
        (&["missing"], &[]),
        (&["foreign"], &[]),
        (&[], &["staged"]),
        (&[], &["marked"]),
        (&[], &["missing"]),
        (&["staged"], &["staged"]),
    ];
    for (staged, replaced) in cases {
        let result = metastore
            .publish_splits(uid, &ids(staged), &ids(replaced), None)
            .await;
        assert!(
            matches!(result, Err(MetastoreError::FailedPrecondition(_))),
            "publish {staged:?} replacing {replaced:?}: expected FailedPrecondition, got {result:?}"
        );
        assert_eq!(splits_of(&metastore, uid).await, before);
    }
    assert_not_found(
        metastore
            .publish_splits(&IndexUid::new("nope"), &[], &[], None)
            .await,
    );
}

/// A publish that fails for any reason changes neither splits nor checkpoints.
pub async fn failed_publish_changes_nothing(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["a", "b", "c"]).await;
    metastore
        .publish_splits(
            uid,
            &ids(&["a"]),
            &[],
            Some(("src".to_string(), CheckpointDelta::single("p", None, 10))),
        )
        .await
        .expect("publish a");
    let splits_before = splits_of(&metastore, uid).await;
    let index_before = metastore.index_metadata("logs").await.expect("index");

    let good_delta = || {
        let mut delta = CheckpointDelta::single("p", Some(10), 20);
        delta.per_partition.insert(
            "q".to_string(),
            shale_types::PartitionDelta { from: None, to: 5 },
        );
        Some(("src".to_string(), delta))
    };
    // Valid splits, a delta not starting where the checkpoint is (for one partition of two).
    let mut bad_delta = CheckpointDelta::single("p", Some(9), 20);
    bad_delta.per_partition.insert(
        "q".to_string(),
        shale_types::PartitionDelta { from: None, to: 5 },
    );
    assert_failed_precondition(
        metastore
            .publish_splits(
                uid,
                &ids(&["c"]),
                &ids(&["a"]),
                Some(("src".to_string(), bad_delta)),
            )
            .await,
    );
    // A valid delta, but a replaced split that is not Published.
    assert_failed_precondition(
        metastore
            .publish_splits(uid, &ids(&["c"]), &ids(&["b"]), good_delta())
            .await,
    );
    // A valid delta, but one staged split unknown.
    assert_failed_precondition(
        metastore
            .publish_splits(uid, &ids(&["c", "unknown"]), &ids(&["a"]), good_delta())
            .await,
    );
    assert_eq!(splits_of(&metastore, uid).await, splits_before);
    assert_eq!(
        metastore.index_metadata("logs").await.expect("index"),
        index_before
    );

    // And the same publish with everything right succeeds.
    metastore
        .publish_splits(uid, &ids(&["c"]), &ids(&["a"]), good_delta())
        .await
        .expect("valid publish");
    let checkpoint = metastore
        .index_metadata("logs")
        .await
        .expect("index")
        .checkpoint("src");
    assert_eq!(checkpoint.position("p"), Some(20));
    assert_eq!(checkpoint.position("q"), Some(5));
}

/// Each delta must start where the stored checkpoint of its source ends; sources are
/// independent.
pub async fn checkpoint_deltas_must_chain(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    let publish_delta = |source: &str, from: Option<u64>, to: u64| {
        let metastore = metastore.clone();
        let uid = uid.clone();
        let source = source.to_string();
        async move {
            metastore
                .publish_splits(
                    &uid,
                    &[],
                    &[],
                    Some((source, CheckpointDelta::single("shard", from, to))),
                )
                .await
        }
    };
    publish_delta("s1", None, 10).await.expect("s1 None→10");
    assert_failed_precondition(publish_delta("s1", None, 5).await);
    assert_failed_precondition(publish_delta("s1", Some(9), 15).await);
    publish_delta("s1", Some(10), 20).await.expect("s1 10→20");
    publish_delta("s2", None, 3).await.expect("s2 None→3");
    assert_failed_precondition(publish_delta("s2", Some(20), 30).await);
    // A huge position round-trips.
    publish_delta("s2", Some(3), u64::MAX)
        .await
        .expect("s2 3→max");

    let index = metastore.index_metadata("logs").await.expect("index");
    assert_eq!(index.checkpoint("s1").position("shard"), Some(20));
    assert_eq!(index.checkpoint("s2").position("shard"), Some(u64::MAX));
    assert_eq!(index.checkpoint("s3").position("shard"), None);
}

/// Two publishes racing to replace the same split: exactly one succeeds.
pub async fn concurrent_publishes_replacing_one_split_one_wins(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    const ROUNDS: usize = 8;
    const RACERS: usize = 3;
    for round in 0..ROUNDS {
        let input = format!("input-{round}");
        stage(&metastore, &uid, &[&input]).await;
        publish(&metastore, &uid, &[&input]).await;
        let outputs: Vec<String> = (0..RACERS).map(|i| format!("output-{round}-{i}")).collect();
        let output_refs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        stage(&metastore, &uid, &output_refs).await;

        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = outputs
            .iter()
            .map(|output| {
                let (metastore, uid, barrier) = (metastore.clone(), uid.clone(), barrier.clone());
                let (output, input) = (output.clone(), input.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    metastore
                        .publish_splits(&uid, &[output], &[input], None)
                        .await
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(()) => winners += 1,
                Err(MetastoreError::FailedPrecondition(_)) => {}
                Err(err) => panic!("round {round}: unexpected error {err:?}"),
            }
        }
        assert_eq!(winners, 1, "round {round}: exactly one publish must win");
        let states = states(&metastore, &uid).await;
        let state_of = |id: &str| {
            states
                .iter()
                .find(|(split_id, _)| split_id == id)
                .map(|(_, state)| *state)
        };
        assert_eq!(state_of(&input), Some(SplitState::MarkedForDeletion));
        let published = outputs
            .iter()
            .filter(|o| state_of(o) == Some(SplitState::Published))
            .count();
        let staged = outputs
            .iter()
            .filter(|o| state_of(o) == Some(SplitState::Staged))
            .count();
        assert_eq!((published, staged), (1, RACERS - 1), "round {round}");
    }
}

/// Publishes racing with the same checkpoint delta (e.g. a retried upload): exactly one
/// succeeds, and only its split is published.
pub async fn concurrent_publishes_of_one_checkpoint_delta_one_wins(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    const RACERS: usize = 4;
    let splits: Vec<String> = (0..RACERS).map(|i| format!("split-{i}")).collect();
    let split_refs: Vec<&str> = splits.iter().map(String::as_str).collect();
    stage(&metastore, &uid, &split_refs).await;
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = splits
        .iter()
        .map(|split| {
            let (metastore, uid, barrier) = (metastore.clone(), uid.clone(), barrier.clone());
            let split = split.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let delta = CheckpointDelta::single("shard", None, 100);
                metastore
                    .publish_splits(&uid, &[split], &[], Some(("src".to_string(), delta)))
                    .await
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(()) => winners += 1,
            Err(MetastoreError::FailedPrecondition(_)) => {}
            Err(err) => panic!("unexpected error {err:?}"),
        }
    }
    assert_eq!(winners, 1);
    let published = states(&metastore, &uid)
        .await
        .into_iter()
        .filter(|(_, state)| *state == SplitState::Published)
        .count();
    assert_eq!(published, 1);
    let index = metastore.index_metadata("logs").await.expect("index");
    assert_eq!(index.checkpoint("src").position("shard"), Some(100));
}

// ----- listing -----

/// Index and state filters; no filter lists every split of every index.
pub async fn list_splits_filters_by_index_and_state(metastore: Arc<dyn Metastore>) {
    let logs = create(&metastore, "logs").await;
    let traces = create(&metastore, "traces").await;
    stage(&metastore, &logs.index_uid, &["l1", "l2", "l3"]).await;
    publish(&metastore, &logs.index_uid, &["l2"]).await;
    metastore
        .mark_splits_for_deletion(&logs.index_uid, &ids(&["l3"]))
        .await
        .expect("mark");
    stage(&metastore, &traces.index_uid, &["t1"]).await;
    publish(&metastore, &traces.index_uid, &["t1"]).await;

    let all = listed_ids(&metastore, ListSplitsQuery::default()).await;
    assert_eq!(all, ["l1", "l2", "l3", "t1"]);
    let logs_query = ListSplitsQuery::for_index(logs.index_uid.clone());
    assert_eq!(
        listed_ids(&metastore, logs_query.clone()).await,
        ["l1", "l2", "l3"]
    );
    let by_state = |states: &[SplitState]| logs_query.clone().with_states(states);
    assert_eq!(
        listed_ids(&metastore, by_state(&[SplitState::Staged])).await,
        ["l1"]
    );
    assert_eq!(
        listed_ids(&metastore, by_state(&[SplitState::Published])).await,
        ["l2"]
    );
    assert_eq!(
        listed_ids(
            &metastore,
            by_state(&[SplitState::Staged, SplitState::MarkedForDeletion])
        )
        .await,
        ["l1", "l3"]
    );
    let published_everywhere = ListSplitsQuery::default().with_states(&[SplitState::Published]);
    assert_eq!(
        listed_ids(&metastore, published_everywhere).await,
        ["l2", "t1"]
    );
}

async fn stage_time_ranges(metastore: &Arc<dyn Metastore>) -> IndexUid {
    let index = create(metastore, "logs").await;
    let uid = index.index_uid.clone();
    let ranges = [
        ("r10-20", Some((10, 20))),
        ("r30-40", Some((30, 40))),
        ("r20-30", Some((20, 30))),
        ("none", None),
    ];
    let splits = ranges
        .iter()
        .map(|(id, range)| {
            let mut split = split_metadata(&uid, id);
            split.time_range = range.map(|(start, end)| TimeRange { start, end });
            split
        })
        .collect();
    metastore.stage_splits(&uid, splits).await.expect("stage");
    uid
}

/// A split matches `[start, end)` if it has no time range or its inclusive range intersects.
pub async fn list_splits_filters_by_time_range(metastore: Arc<dyn Metastore>) {
    let uid = stage_time_ranges(&metastore).await;
    let query = |start: Option<i64>, end: Option<i64>| ListSplitsQuery {
        time_range_start: start,
        time_range_end: end,
        ..ListSplitsQuery::for_index(uid.clone())
    };
    let cases: [(Option<i64>, Option<i64>, &[&str]); 8] = [
        (None, None, &["none", "r10-20", "r20-30", "r30-40"]),
        (Some(21), Some(30), &["none", "r20-30"]),
        (Some(20), Some(21), &["none", "r10-20", "r20-30"]),
        (Some(41), None, &["none"]),
        (Some(40), None, &["none", "r30-40"]),
        (None, Some(10), &["none"]),
        (None, Some(11), &["none", "r10-20"]),
        (Some(0), Some(1000), &["none", "r10-20", "r20-30", "r30-40"]),
    ];
    for (start, end, expected) in cases {
        assert_eq!(
            listed_ids(&metastore, query(start, end)).await,
            expected,
            "time range [{start:?}, {end:?})"
        );
        // Counting applies the same filters.
        assert_eq!(
            metastore
                .count_splits(query(start, end))
                .await
                .expect("count_splits"),
            expected.len() as u64,
            "count of time range [{start:?}, {end:?})"
        );
    }
}

/// `time_range_end_lt` matches only splits whose range ends strictly before the bound.
pub async fn list_splits_filters_by_time_range_end(metastore: Arc<dyn Metastore>) {
    let uid = stage_time_ranges(&metastore).await;
    let query = |lt: i64| ListSplitsQuery {
        time_range_end_lt: Some(lt),
        ..ListSplitsQuery::for_index(uid.clone())
    };
    let empty: &[&str] = &[];
    assert_eq!(listed_ids(&metastore, query(20)).await, empty);
    assert_eq!(listed_ids(&metastore, query(21)).await, ["r10-20"]);
    assert_eq!(
        listed_ids(&metastore, query(i64::MAX)).await,
        ["r10-20", "r20-30", "r30-40"]
    );
}

/// Partition, maturity (`maturity_timestamp > now`) and update-time filters, combined.
pub async fn list_splits_filters_by_partition_maturity_and_update_time(
    metastore: Arc<dyn Metastore>,
) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    let now = shale_types::now_unix_secs();
    let specs = [
        (
            "p1-immature",
            1,
            SplitMaturity::Immature {
                maturation_period_secs: 1000,
            },
        ),
        ("p1-mature", 1, SplitMaturity::Mature),
        (
            "p2-immature",
            2,
            SplitMaturity::Immature {
                maturation_period_secs: 1000,
            },
        ),
        (
            "p2-matured",
            2,
            SplitMaturity::Immature {
                maturation_period_secs: 10,
            },
        ),
    ];
    let splits = specs
        .iter()
        .map(|(id, partition_id, maturity)| {
            let mut split = split_metadata(&uid, id);
            split.partition_id = *partition_id;
            split.maturity = *maturity;
            split.create_timestamp = now - 100;
            split
        })
        .collect();
    metastore.stage_splits(&uid, splits).await.expect("stage");
    let base = ListSplitsQuery::for_index(uid.clone());

    let partition = |p: u64| ListSplitsQuery {
        partition_id: Some(p),
        ..base.clone()
    };
    assert_eq!(
        listed_ids(&metastore, partition(1)).await,
        ["p1-immature", "p1-mature"]
    );
    assert_eq!(
        listed_ids(&metastore, partition(2)).await,
        ["p2-immature", "p2-matured"]
    );
    assert!(listed_ids(&metastore, partition(3)).await.is_empty());

    let immature_at = |at: i64| ListSplitsQuery {
        immature_at: Some(at),
        ..base.clone()
    };
    assert_eq!(
        listed_ids(&metastore, immature_at(now)).await,
        ["p1-immature", "p2-immature"]
    );
    assert_eq!(
        listed_ids(&metastore, immature_at(now - 95)).await,
        ["p1-immature", "p2-immature", "p2-matured"]
    );
    assert!(listed_ids(&metastore, immature_at(now + 1000))
        .await
        .is_empty());
    let combined = ListSplitsQuery {
        partition_id: Some(2),
        immature_at: Some(now),
        ..base.clone()
    };
    assert_eq!(listed_ids(&metastore, combined).await, ["p2-immature"]);

    let updated_before = |lte: i64| ListSplitsQuery {
        update_timestamp_lte: Some(lte),
        ..base.clone()
    };
    assert!(listed_ids(&metastore, updated_before(now - 120))
        .await
        .is_empty());
    assert_eq!(
        listed_ids(&metastore, updated_before(now + 120))
            .await
            .len(),
        4
    );
}

/// Splits are listed by split id, whatever the order they were staged in.
pub async fn list_splits_orders_by_split_id(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    let mut split_ids: Vec<String> = (0..30).map(|_| shale_types::new_ulid()).collect();
    let shuffled: Vec<&str> = split_ids.iter().rev().map(String::as_str).collect();
    stage(&metastore, &uid, &shuffled[..15]).await;
    stage(&metastore, &uid, &shuffled[15..]).await;
    split_ids.sort();
    assert_eq!(
        listed_ids(&metastore, ListSplitsQuery::for_index(uid)).await,
        split_ids
    );
}

// ----- deletion -----

/// Splits in any state can be marked; unknown ids are ignored; splits already marked keep
/// their update timestamp.
pub async fn mark_splits_for_deletion_marks_any_state(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["staged", "published", "marked", "kept"]).await;
    publish(&metastore, uid, &["published", "kept"]).await;
    metastore
        .mark_splits_for_deletion(uid, &ids(&["marked"]))
        .await
        .expect("mark");
    let marked_at = splits_of(&metastore, uid).await[1].update_timestamp;

    // Timestamps are in seconds: make a second pass.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    metastore
        .mark_splits_for_deletion(uid, &ids(&["staged", "published", "marked", "unknown"]))
        .await
        .expect("mark again");
    let splits = splits_of(&metastore, uid).await;
    let summary: Vec<(&str, SplitState)> = splits
        .iter()
        .map(|s| (s.split_metadata.split_id.as_str(), s.split_state))
        .collect();
    assert_eq!(
        summary,
        [
            ("kept", SplitState::Published),
            ("marked", SplitState::MarkedForDeletion),
            ("published", SplitState::MarkedForDeletion),
            ("staged", SplitState::MarkedForDeletion),
        ]
    );
    assert_eq!(splits[1].update_timestamp, marked_at);
    assert!(splits[2].update_timestamp > marked_at);
    // Marking nothing is fine.
    metastore
        .mark_splits_for_deletion(uid, &[])
        .await
        .expect("mark nothing");
}

/// Staged and MarkedForDeletion splits can be deleted; a Published one fails the whole call.
pub async fn delete_splits_refuses_published_splits(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = &index.index_uid;
    stage(&metastore, uid, &["staged", "published", "marked"]).await;
    publish(&metastore, uid, &["published"]).await;
    metastore
        .mark_splits_for_deletion(uid, &ids(&["marked"]))
        .await
        .expect("mark");
    let before = splits_of(&metastore, uid).await;

    assert_failed_precondition(
        metastore
            .delete_splits(uid, &ids(&["staged", "published", "marked"]))
            .await,
    );
    assert_eq!(splits_of(&metastore, uid).await, before);

    metastore
        .delete_splits(uid, &ids(&["staged", "marked", "unknown"]))
        .await
        .expect("delete");
    assert_eq!(
        states(&metastore, uid).await,
        [("published".to_string(), SplitState::Published)]
    );
    // A deleted split id can be staged again.
    stage(&metastore, uid, &["staged"]).await;
}

/// Split operations on an unknown index are `NotFound`.
pub async fn split_operations_on_unknown_index_are_not_found(metastore: Arc<dyn Metastore>) {
    let unknown = IndexUid::new("nope");
    assert_not_found(
        metastore
            .mark_splits_for_deletion(&unknown, &ids(&["a"]))
            .await,
    );
    assert_not_found(metastore.delete_splits(&unknown, &ids(&["a"])).await);
    assert_not_found(metastore.delete_index(&unknown).await);
    assert!(splits_of(&metastore, &unknown).await.is_empty());
}

// ----- merge tasks -----

/// A fixed clock for lease arithmetic (merge task methods take `now` explicitly).
const T0: i64 = 1_000_000;
/// Lease of the merge task tests, in seconds.
const LEASE: u64 = 60;

/// An index `index_id` whose splits `split_ids` are Published.
async fn index_with_published(
    metastore: &Arc<dyn Metastore>,
    index_id: &str,
    split_ids: &[&str],
) -> IndexUid {
    let index = create(metastore, index_id).await;
    stage(metastore, &index.index_uid, split_ids).await;
    publish(metastore, &index.index_uid, split_ids).await;
    index.index_uid
}

/// The merge scope `src/0/dm` of `index_uid`, cluster-wide or of `node`.
pub fn scope_of(index_uid: &IndexUid, node: Option<&str>) -> MergeScope {
    MergeScope {
        node_id: node.map(str::to_string),
        index_uid: index_uid.clone(),
        source_id: "src".to_string(),
        partition_id: 0,
        doc_mapping_uid: "dm".to_string(),
    }
}

fn new_task(index_uid: &IndexUid, split_ids: &[&str]) -> NewMergeTask {
    NewMergeTask::new(scope_of(index_uid, None), ids(split_ids))
}

/// Creates one task per entry of `tasks`; returns those created.
async fn create_tasks(
    metastore: &Arc<dyn Metastore>,
    index_uid: &IndexUid,
    tasks: &[&[&str]],
    max_attempts: u32,
) -> Vec<MergeTask> {
    let tasks = tasks
        .iter()
        .map(|split_ids| new_task(index_uid, split_ids))
        .collect();
    metastore
        .create_merge_tasks(index_uid, tasks, max_attempts)
        .await
        .expect("create_merge_tasks")
}

async fn claim(
    metastore: &Arc<dyn Metastore>,
    node_id: &str,
    now: i64,
    index_uid: Option<&IndexUid>,
) -> Option<MergeTask> {
    metastore
        .claim_merge_task(node_id, LEASE, now, index_uid, None, false)
        .await
        .expect("claim_merge_task")
}

/// Every merge task, newest first.
async fn all_tasks(metastore: &Arc<dyn Metastore>) -> Vec<MergeTask> {
    metastore
        .list_merge_tasks(None, &[], None)
        .await
        .expect("list_merge_tasks")
}

/// The stored task `task_id`.
async fn stored_task(metastore: &Arc<dyn Metastore>, task_id: &str) -> MergeTask {
    match all_tasks(metastore)
        .await
        .into_iter()
        .find(|task| task.task_id == task_id)
    {
        Some(task) => task,
        None => panic!("merge task `{task_id}` not found"),
    }
}

fn task_ids(tasks: &[MergeTask]) -> Vec<String> {
    tasks.iter().map(|task| task.task_id.clone()).collect()
}

fn inputs(tasks: &[MergeTask]) -> Vec<Vec<String>> {
    tasks.iter().map(|task| task.split_ids.clone()).collect()
}

fn claimed(task: Option<MergeTask>) -> MergeTask {
    match task {
        Some(task) => task,
        None => panic!("expected to claim a merge task, got none"),
    }
}

/// Created tasks are Pending, in the given order; a task is skipped when one of its splits is
/// not a Published split of the index or is already in a live task (even one created earlier
/// in the same call). Invalid tasks fail the call, creating nothing.
pub async fn create_merge_tasks_creates_tasks_and_skips_unavailable_splits(
    metastore: Arc<dyn Metastore>,
) {
    let splits = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let uid = index_with_published(&metastore, "logs", &splits).await;
    stage(&metastore, &uid, &["staged", "marked"]).await;
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["marked"]))
        .await
        .expect("mark");
    index_with_published(&metastore, "other", &["foreign"]).await;

    let mut partition_7 = scope_of(&uid, Some("node-1"));
    partition_7.partition_id = 7;
    let tasks = vec![
        new_task(&uid, &["b", "a"]),
        new_task(&uid, &["a", "c"]),
        NewMergeTask::new(partition_7.clone(), ids(&["c", "d"])),
        new_task(&uid, &["e", "staged"]),
        new_task(&uid, &["e", "marked"]),
        new_task(&uid, &["e", "missing"]),
        new_task(&uid, &["e", "foreign"]),
        new_task(&uid, &["f", "e"]).with_kind(MergeKind::Locality),
    ];
    let created = metastore
        .create_merge_tasks(&uid, tasks, 3)
        .await
        .expect("create_merge_tasks");
    // The merge kind round-trips.
    assert_eq!(created[0].kind, MergeKind::Merge);
    assert_eq!(created[2].kind, MergeKind::Locality);
    assert_eq!(
        stored_task(&metastore, &created[2].task_id).await.kind,
        MergeKind::Locality
    );
    assert_eq!(
        inputs(&created),
        [ids(&["b", "a"]), ids(&["c", "d"]), ids(&["f", "e"])]
    );
    // The typed scope round-trips.
    assert_eq!(created[0].scope, scope_of(&uid, None));
    assert_eq!(created[1].scope, partition_7);
    assert_eq!(
        stored_task(&metastore, &created[1].task_id).await.scope,
        partition_7
    );
    for task in &created {
        assert!(is_ulid(&task.task_id), "{}", task.task_id);
        assert_eq!(task.index_uid, uid);
        assert_eq!(task.state, MergeTaskState::Pending);
        assert!(task.is_live());
        assert_eq!(task.lease_owner, None);
        assert_eq!(task.lease_expires_at, None);
        assert_eq!((task.attempts, task.max_attempts), (0, 3));
        assert_eq!(task.output_split_id, None);
        assert!(task.output_split_ids.is_empty());
        assert_eq!(task.error, None);
        assert_recent(task.create_timestamp);
        assert_eq!(task.update_timestamp, task.create_timestamp);
    }
    let created_ids = task_ids(&created);
    let mut sorted = created_ids.clone();
    sorted.sort();
    assert_eq!(created_ids, sorted, "task ids sort in creation order");
    // Stored as returned; listed newest first.
    let mut listed = metastore
        .list_merge_tasks(Some(&uid), &[], None)
        .await
        .expect("list");
    listed.reverse();
    assert_eq!(listed, created);

    // A later call: `b` is in a live task, `g` and `h` are free.
    let again = create_tasks(&metastore, &uid, &[&["b", "g"], &["g", "h"]], 3).await;
    assert_eq!(inputs(&again), [ids(&["g", "h"])]);
    // Nothing to create is fine.
    assert!(create_tasks(&metastore, &uid, &[], 3).await.is_empty());
    // Invalid requests fail and create nothing, valid tasks of the batch included.
    let other_uid = metastore
        .index_metadata("other")
        .await
        .expect("other index")
        .index_uid;
    let invalid: [(Vec<NewMergeTask>, u32); 4] = [
        (vec![new_task(&uid, &["staged"]), new_task(&uid, &[])], 3),
        (
            vec![
                new_task(&uid, &["marked"]),
                new_task(&uid, &["x", "y", "x"]),
            ],
            3,
        ),
        (vec![new_task(&uid, &["staged"])], 0),
        // A scope of another index.
        (vec![new_task(&other_uid, &["g", "h"])], 3),
    ];
    for (tasks, max_attempts) in invalid {
        assert_failed_precondition(
            metastore
                .create_merge_tasks(&uid, tasks, max_attempts)
                .await,
        );
    }
    assert_eq!(all_tasks(&metastore).await.len(), 4);
    let nope = IndexUid::new("nope");
    assert_not_found(
        metastore
            .create_merge_tasks(&nope, vec![new_task(&nope, &["a"])], 3)
            .await,
    );
}

/// Concurrent calls creating tasks over overlapping splits: no split ends up in two live
/// tasks.
pub async fn concurrent_create_merge_tasks_never_share_a_split(metastore: Arc<dyn Metastore>) {
    const SPLITS: usize = 24;
    const CALLERS: usize = 8;
    let splits: Vec<String> = (0..SPLITS).map(|i| format!("split-{i:02}")).collect();
    let split_refs: Vec<&str> = splits.iter().map(String::as_str).collect();
    let uid = index_with_published(&metastore, "logs", &split_refs).await;

    let barrier = Arc::new(Barrier::new(CALLERS));
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (metastore, uid, barrier) = (metastore.clone(), uid.clone(), barrier.clone());
            // Groups of 3 consecutive splits, starting at offset 0, 1 or 2: callers with
            // different offsets overlap partially, callers with the same offset fully.
            let tasks: Vec<NewMergeTask> = (caller % 3..SPLITS - 2)
                .step_by(3)
                .map(|start| {
                    NewMergeTask::new(
                        scope_of(&uid, Some(&format!("caller-{caller}"))),
                        splits[start..start + 3].to_vec(),
                    )
                })
                .collect();
            tokio::spawn(async move {
                barrier.wait().await;
                metastore.create_merge_tasks(&uid, tasks, 3).await
            })
        })
        .collect();
    let mut created = Vec::new();
    for caller in callers {
        created.extend(caller.await.expect("task").expect("create_merge_tasks"));
    }
    assert!(!created.is_empty());
    let mut seen = BTreeSet::new();
    for task in &created {
        for split_id in &task.split_ids {
            assert!(
                seen.insert(split_id.clone()),
                "split `{split_id}` in two live tasks"
            );
        }
    }
    let mut listed = metastore
        .list_merge_tasks(Some(&uid), &[MergeTaskState::Pending], None)
        .await
        .expect("list");
    listed.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    created.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(listed, created);
}

/// Claims take the oldest claimable task (of one index, if asked), set the lease and count
/// the attempt; unexpired Running tasks are not claimable.
pub async fn claim_merge_task_takes_the_oldest_task_with_a_lease(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d", "e", "f"]).await;
    let other = index_with_published(&metastore, "other", &["x", "y"]).await;
    let first = create_tasks(&metastore, &uid, &[&["a", "b"], &["c", "d"]], 3).await;
    let second = create_tasks(&metastore, &uid, &[&["e", "f"]], 3).await;
    let other_task = create_tasks(&metastore, &other, &[&["x", "y"]], 3).await;

    let task = claimed(claim(&metastore, "node-1", T0, Some(&uid)).await);
    assert_eq!(task.task_id, first[0].task_id);
    assert_eq!(task.state, MergeTaskState::Running);
    assert_eq!(task.lease_owner.as_deref(), Some("node-1"));
    assert_eq!(task.lease_expires_at, Some(T0 + 60));
    assert_eq!(task.attempts, 1);
    assert_eq!(task.update_timestamp, T0);
    assert_eq!(task.split_ids, ids(&["a", "b"]));
    assert_eq!(task.create_timestamp, first[0].create_timestamp);
    assert_eq!(stored_task(&metastore, &task.task_id).await, task);

    let task = claimed(claim(&metastore, "node-2", T0, Some(&uid)).await);
    assert_eq!(task.task_id, first[1].task_id);
    let task = claimed(claim(&metastore, "node-3", T0, None).await);
    assert_eq!(task.task_id, second[0].task_id);
    // The leases of `logs`'s tasks run until T0 + 60.
    assert_eq!(claim(&metastore, "node-3", T0 + 59, Some(&uid)).await, None);
    let task = claimed(claim(&metastore, "node-3", T0 + 59, None).await);
    assert_eq!(task.task_id, other_task[0].task_id);
    assert_eq!(claim(&metastore, "node-3", T0 + 59, None).await, None);
    assert_eq!(
        claim(&metastore, "node-3", T0, Some(&IndexUid::new("nope"))).await,
        None
    );
    let running = metastore
        .list_merge_tasks(None, &[MergeTaskState::Running], None)
        .await
        .expect("list");
    assert_eq!(running.len(), 4);
}

/// With a scope node (`node_local` mode), a node claims only the tasks of its own splits;
/// without, any task.
pub async fn claim_merge_task_can_be_limited_to_a_node_scope(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d", "e", "f"]).await;
    let scoped = |node: Option<&str>, split_ids: &[&str]| {
        NewMergeTask::new(scope_of(&uid, node), ids(split_ids))
    };
    let created = metastore
        .create_merge_tasks(
            &uid,
            vec![
                scoped(Some("node_a"), &["a", "b"]),
                scoped(None, &["c", "d"]),
                scoped(Some("node-b"), &["e", "f"]),
            ],
            3,
        )
        .await
        .expect("create_merge_tasks");
    assert_eq!(created.len(), 3);
    let claim_scoped = |node: &'static str| {
        let metastore = metastore.clone();
        async move {
            metastore
                .claim_merge_task(node, LEASE, T0, None, Some(node), false)
                .await
                .expect("claim_merge_task")
        }
    };
    let task = claimed(claim_scoped("node-b").await);
    assert_eq!(task.task_id, created[2].task_id);
    assert_eq!(claim_scoped("node-b").await, None);
    assert_eq!(claim_scoped("node-c").await, None);
    // `_` is not a wildcard, and a cluster-scope task is nobody's own.
    assert_eq!(claim_scoped("node%").await, None);
    let task = claimed(claim_scoped("node_a").await);
    assert_eq!(task.task_id, created[0].task_id);
    assert_eq!(claim_scoped("node_a").await, None);
    let task = claimed(claim(&metastore, "anyone", T0, None).await);
    assert_eq!(task.task_id, created[1].task_id);
}

/// Releasing tasks gives up the claimable ones (Pending, or Running with an expired lease)
/// and frees their splits; running and finished tasks are left alone.
pub async fn release_merge_tasks_releases_only_claimable_tasks(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d", "e", "f"]).await;
    let created = create_tasks(
        &metastore,
        &uid,
        &[&["a", "b"], &["c", "d"], &["e", "f"]],
        3,
    )
    .await;
    // created[0] runs under a live lease, created[1] under a lease that expires at T0,
    // created[2] stays Pending.
    let all: Vec<String> = task_ids(&created);
    let running = claimed(claim(&metastore, "node-2", T0, None).await);
    assert_eq!(running.task_id, created[0].task_id);
    let expiring = claimed(claim(&metastore, "node-3", T0 - LEASE as i64, None).await);
    assert_eq!(expiring.task_id, created[1].task_id);
    let mut released = metastore
        .release_merge_tasks(
            &[all.clone(), vec!["unknown".to_string()]].concat(),
            "released: scope mode changed",
            T0,
        )
        .await
        .expect("release");
    released.sort();
    let mut expected = vec![created[2].task_id.clone(), expiring.task_id.clone()];
    expected.sort();
    assert_eq!(released, expected);
    for task_id in &expected {
        let task = stored_task(&metastore, task_id).await;
        assert_eq!(task.state, MergeTaskState::Failed);
        assert_eq!(task.error.as_deref(), Some("released: scope mode changed"));
    }
    assert_eq!(
        stored_task(&metastore, &running.task_id).await.state,
        MergeTaskState::Running
    );
    // The released splits can be planned again.
    let again = create_tasks(
        &metastore,
        &uid,
        &[&["a", "b"], &["c", "d"], &["e", "f"]],
        3,
    )
    .await;
    assert_eq!(again.len(), 2, "{:?}", inputs(&again));
}

/// Only splits still Staged are marked: a split published meanwhile is left alone, and a
/// marked split can no longer be published.
pub async fn mark_staged_splits_for_deletion_touches_only_staged_splits(
    metastore: Arc<dyn Metastore>,
) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    stage(&metastore, &uid, &["stale", "published"]).await;
    publish(&metastore, &uid, &["published"]).await;
    let marked = metastore
        .mark_staged_splits_for_deletion(&uid, &ids(&["stale", "published", "unknown"]))
        .await
        .expect("mark staged");
    assert_eq!(marked, ids(&["stale"]));
    let states: Vec<(String, SplitState)> = metastore
        .list_splits(ListSplitsQuery::for_index(uid.clone()))
        .await
        .expect("list")
        .into_iter()
        .map(|s| (s.split_metadata.split_id, s.split_state))
        .collect();
    assert_eq!(
        states,
        [
            ("published".to_string(), SplitState::Published),
            ("stale".to_string(), SplitState::MarkedForDeletion),
        ]
    );
    // The late publish of the marked upload fails.
    assert_failed_precondition(
        metastore
            .publish_splits(&uid, &ids(&["stale"]), &[], None)
            .await,
    );
}

/// Split counts are grouped by index, state, scope (with the node), maturity and level.
pub async fn split_stats_count_splits_by_state_scope_and_maturity(metastore: Arc<dyn Metastore>) {
    let index = create(&metastore, "logs").await;
    let uid = index.index_uid.clone();
    let mut splits = Vec::new();
    for (split_id, node, mature, level) in [
        ("a", "n1", false, 0),
        ("b", "n1", false, 0),
        ("c", "n1", true, 2),
        ("d", "n2", false, 0),
        ("e", "n1", true, 3),
    ] {
        let mut split = split_metadata(&uid, split_id);
        split.node_id = node.to_string();
        split.num_merge_ops = level;
        split.num_docs = 10;
        split.size_bytes = 100;
        split.create_timestamp = T0;
        split.maturity = if mature {
            SplitMaturity::Mature
        } else {
            SplitMaturity::Immature {
                maturation_period_secs: 3600,
            }
        };
        splits.push(split);
    }
    metastore.stage_splits(&uid, splits).await.expect("stage");
    publish(&metastore, &uid, &["a", "b", "c", "e"]).await;
    let stats = metastore.split_stats(T0).await.expect("stats");
    /// (state, node, mature, merge ops, splits, bytes, docs) of one group.
    type Group = (SplitState, Option<String>, bool, u32, u64, u64, u64);
    let summary: Vec<Group> = stats
        .iter()
        .map(|s| {
            assert_eq!(s.scope.index_uid, uid);
            (
                s.split_state,
                s.scope.node_id.clone(),
                s.mature,
                s.num_merge_ops,
                s.num_splits,
                s.size_bytes,
                s.num_docs,
            )
        })
        .collect();
    let n1 = || Some("n1".to_string());
    let expected = [
        (SplitState::Published, n1(), false, 0, 2, 200, 20),
        (SplitState::Published, n1(), true, 2, 1, 100, 10),
        (SplitState::Published, n1(), true, 3, 1, 100, 10),
        (
            SplitState::Staged,
            Some("n2".to_string()),
            false,
            0,
            1,
            100,
            10,
        ),
    ];
    for row in &expected {
        assert!(summary.contains(row), "{row:?} missing from {summary:?}");
    }
    assert_eq!(summary.len(), expected.len(), "{summary:?}");
    // An hour later, every split is mature.
    let later = metastore.split_stats(T0 + 3600).await.expect("stats");
    assert!(later.iter().all(|s| s.mature), "{later:?}");
}

/// A Running task whose lease expired is claimed again (one more attempt); once attempts
/// reach `max_attempts`, the next claim fails it instead, releasing its splits.
pub async fn expired_leases_are_reclaimed_until_max_attempts(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b"]).await;
    let created = create_tasks(&metastore, &uid, &[&["a", "b"]], 2).await;
    let task_id = created[0].task_id.clone();

    let first = claimed(claim(&metastore, "node-1", T0, None).await);
    assert_eq!((first.attempts, first.lease_expires_at), (1, Some(T0 + 60)));
    assert_eq!(claim(&metastore, "node-2", T0 + 59, None).await, None);
    let second = claimed(claim(&metastore, "node-2", T0 + 60, None).await);
    assert_eq!(second.task_id, task_id);
    assert_eq!(second.lease_owner.as_deref(), Some("node-2"));
    assert_eq!(
        (second.attempts, second.lease_expires_at),
        (2, Some(T0 + 120))
    );

    assert_eq!(claim(&metastore, "node-3", T0 + 120, None).await, None);
    let failed = stored_task(&metastore, &task_id).await;
    assert_eq!(failed.state, MergeTaskState::Failed);
    assert_eq!(failed.attempts, 2);
    assert_eq!(failed.lease_expires_at, None);
    assert_eq!(failed.update_timestamp, T0 + 120);
    let error = failed.error.unwrap_or_default();
    assert!(error.contains("max_attempts"), "{error}");
    // Its splits are free for a new task.
    let again = create_tasks(&metastore, &uid, &[&["a", "b"]], 2).await;
    assert_eq!(again.len(), 1);
}

/// Many claimers racing for fewer tasks: each task is claimed exactly once.
pub async fn concurrent_claimers_each_claim_a_task_once(metastore: Arc<dyn Metastore>) {
    const TASKS: usize = 8;
    const CLAIMERS: usize = 16;
    const ROUNDS: usize = 3;
    let splits: Vec<String> = (0..ROUNDS * TASKS * 2)
        .map(|i| format!("split-{i:03}"))
        .collect();
    let split_refs: Vec<&str> = splits.iter().map(String::as_str).collect();
    let uid = index_with_published(&metastore, "logs", &split_refs).await;
    for round in 0..ROUNDS {
        let pairs: Vec<&[&str]> = split_refs[round * TASKS * 2..(round + 1) * TASKS * 2]
            .chunks(2)
            .collect();
        let created = create_tasks(&metastore, &uid, &pairs, 3).await;
        assert_eq!(created.len(), TASKS);

        let barrier = Arc::new(Barrier::new(CLAIMERS));
        let claimers: Vec<_> = (0..CLAIMERS)
            .map(|i| {
                let (metastore, barrier) = (metastore.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let node_id = format!("node-{i}");
                    // Leases outlive the test: nothing becomes claimable again.
                    let task = metastore
                        .claim_merge_task(&node_id, 1_000_000, T0, None, None, false)
                        .await;
                    (node_id, task)
                })
            })
            .collect();
        let mut claims = Vec::new();
        for claimer in claimers {
            let (node_id, task) = claimer.await.expect("task");
            if let Some(task) = task.expect("claim_merge_task") {
                assert_eq!(task.lease_owner.as_deref(), Some(node_id.as_str()));
                claims.push(task);
            }
        }
        let mut claimed_ids = task_ids(&claims);
        claimed_ids.sort();
        assert_eq!(claimed_ids, task_ids(&created), "round {round}");
        for task in &claims {
            let stored = stored_task(&metastore, &task.task_id).await;
            assert_eq!(&stored, task);
            assert_eq!(stored.attempts, 1);
        }
    }
}

/// Claiming fails (and skips) tasks whose inputs are no longer all Published: replaced,
/// marked for deletion or deleted meanwhile (those calls leave tasks alone).
pub async fn claim_fails_tasks_whose_inputs_are_no_longer_published(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(
        &metastore,
        "logs",
        &["a", "b", "c", "d", "e", "f", "g", "h"],
    )
    .await;
    let created = create_tasks(
        &metastore,
        &uid,
        &[&["a", "b"], &["c", "d"], &["e", "f"], &["g", "h"]],
        3,
    )
    .await;
    stage(&metastore, &uid, &["x"]).await;
    metastore
        .publish_splits(&uid, &ids(&["x"]), &ids(&["a"]), None)
        .await
        .expect("replace a");
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["c", "e"]))
        .await
        .expect("mark");
    metastore
        .delete_splits(&uid, &ids(&["e"]))
        .await
        .expect("delete e");
    // Those calls left the tasks alone.
    assert_eq!(
        metastore
            .list_merge_tasks(Some(&uid), &[MergeTaskState::Pending], None)
            .await
            .expect("list")
            .len(),
        4
    );

    let task = claimed(claim(&metastore, "node-1", T0, Some(&uid)).await);
    assert_eq!(task.task_id, created[3].task_id);
    for stale in &created[..3] {
        let stored = stored_task(&metastore, &stale.task_id).await;
        assert_eq!(
            stored.state,
            MergeTaskState::Failed,
            "{:?}",
            stored.split_ids
        );
        let error = stored.error.clone().unwrap_or_default();
        assert!(error.starts_with("inputs no longer published"), "{error}");
        assert_eq!((stored.attempts, stored.update_timestamp), (0, T0));
        assert_eq!(stored.lease_owner, None);
    }
    assert_eq!(claim(&metastore, "node-1", T0, None).await, None);
    // Their inputs that are still Published are free again.
    let again = create_tasks(&metastore, &uid, &[&["b", "d", "f"]], 3).await;
    assert_eq!(again.len(), 1);

    // A Running task whose lease expired is failed, not re-claimed, if its inputs changed.
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["g"]))
        .await
        .expect("mark g");
    let next = claimed(claim(&metastore, "node-2", T0 + 60, None).await);
    assert_eq!(next.task_id, again[0].task_id);
    let stored = stored_task(&metastore, &task.task_id).await;
    assert_eq!(stored.state, MergeTaskState::Failed);
    assert_eq!(stored.lease_owner.as_deref(), Some("node-1"));
    assert_eq!(stored.attempts, 1);
}

/// `publish_merge` publishes the outputs, marks the inputs for deletion and completes the
/// task, in one transaction; the owner may publish after its lease expired as long as no
/// other node claimed the task.
pub async fn publish_merge_publishes_the_output_and_completes_the_task(
    metastore: Arc<dyn Metastore>,
) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d"]).await;
    create_tasks(&metastore, &uid, &[&["a", "b"], &["c", "d"]], 3).await;
    let task = claimed(claim(&metastore, "node-1", T0, None).await);
    stage(&metastore, &uid, &["out-1", "out-2"]).await;
    metastore
        .publish_merge(
            &uid,
            &task.task_id,
            "node-1",
            &ids(&["out-1", "out-2"]),
            &ids(&["b", "a"]),
            T0 + 10,
        )
        .await
        .expect("publish_merge");
    assert_eq!(
        states(&metastore, &uid).await,
        [
            ("a".to_string(), SplitState::MarkedForDeletion),
            ("b".to_string(), SplitState::MarkedForDeletion),
            ("c".to_string(), SplitState::Published),
            ("d".to_string(), SplitState::Published),
            ("out-1".to_string(), SplitState::Published),
            ("out-2".to_string(), SplitState::Published),
        ]
    );
    for split in splits_of(&metastore, &uid).await {
        if ["a", "b"].contains(&split.split_metadata.split_id.as_str()) {
            assert_eq!(split.update_timestamp, T0 + 10);
        }
        if split.split_metadata.split_id.starts_with("out-") {
            assert_eq!(split.publish_timestamp, Some(T0 + 10));
        }
    }
    let done = stored_task(&metastore, &task.task_id).await;
    assert_eq!(done.state, MergeTaskState::Succeeded);
    assert_eq!(done.output_split_id.as_deref(), Some("out-1"));
    assert_eq!(done.output_split_ids, ids(&["out-1", "out-2"]));
    assert_eq!(done.lease_owner.as_deref(), Some("node-1"));
    assert_eq!(done.lease_expires_at, None);
    assert_eq!((done.attempts, done.update_timestamp), (1, T0 + 10));
    assert_eq!(done.split_ids, ids(&["a", "b"]));
    // Publishing again fails: the task is no longer Running.
    stage(&metastore, &uid, &["out-3"]).await;
    assert_failed_precondition(
        metastore
            .publish_merge(
                &uid,
                &task.task_id,
                "node-1",
                &ids(&["out-3"]),
                &ids(&["a", "b"]),
                T0 + 11,
            )
            .await,
    );

    // Lease expired long ago, nobody else claimed: the owner still publishes.
    let late = claimed(claim(&metastore, "node-2", T0 + 20, None).await);
    assert_eq!(late.split_ids, ids(&["c", "d"]));
    metastore
        .publish_merge(
            &uid,
            &late.task_id,
            "node-2",
            &ids(&["out-3"]),
            &ids(&["c", "d"]),
            T0 + 1000,
        )
        .await
        .expect("publish_merge after lease expiry");
    assert_eq!(
        stored_task(&metastore, &late.task_id).await.state,
        MergeTaskState::Succeeded
    );
    assert!(metastore
        .list_merge_tasks(
            None,
            &[MergeTaskState::Pending, MergeTaskState::Running],
            None
        )
        .await
        .expect("list")
        .is_empty());
    // A merge may produce no split at all (e.g. every document deleted).
    let uid2 = index_with_published(&metastore, "empty", &["e1", "e2"]).await;
    create_tasks(&metastore, &uid2, &[&["e1", "e2"]], 3).await;
    let task = claimed(claim(&metastore, "node-1", T0, Some(&uid2)).await);
    metastore
        .publish_merge(&uid2, &task.task_id, "node-1", &[], &ids(&["e1", "e2"]), T0)
        .await
        .expect("publish_merge without output");
    let done = stored_task(&metastore, &task.task_id).await;
    assert_eq!(
        (done.state, done.output_split_id),
        (MergeTaskState::Succeeded, None)
    );
}

/// After the lease expired and another node claimed the task, the first owner's publish is
/// `FailedPrecondition` and changes nothing; the new owner's publish succeeds.
pub async fn publish_merge_after_another_node_reclaimed_fails_and_changes_nothing(
    metastore: Arc<dyn Metastore>,
) {
    // A locality merge: several outputs per attempt.
    let uid = index_with_published(&metastore, "logs", &["a", "b"]).await;
    let task = new_task(&uid, &["a", "b"]).with_kind(MergeKind::Locality);
    metastore
        .create_merge_tasks(&uid, vec![task], 3)
        .await
        .expect("create");
    let first = claimed(claim(&metastore, "node-1", T0, None).await);
    let second = claimed(claim(&metastore, "node-2", T0 + 60, None).await);
    assert_eq!(first.task_id, second.task_id);
    assert_eq!(second.kind, MergeKind::Locality);
    stage(
        &metastore,
        &uid,
        &["out-1a", "out-1b", "out-2a", "out-2b", "out-2c"],
    )
    .await;
    let splits_before = splits_of(&metastore, &uid).await;

    let zombie_publish = |at: i64| {
        let metastore = metastore.clone();
        let (uid, task_id) = (uid.clone(), first.task_id.clone());
        async move {
            metastore
                .publish_merge(
                    &uid,
                    &task_id,
                    "node-1",
                    &ids(&["out-1a", "out-1b"]),
                    &ids(&["a", "b"]),
                    at,
                )
                .await
        }
    };
    assert_failed_precondition(zombie_publish(T0 + 70).await);
    assert_eq!(splits_of(&metastore, &uid).await, splits_before);
    assert_eq!(stored_task(&metastore, &first.task_id).await, second);

    metastore
        .publish_merge(
            &uid,
            &second.task_id,
            "node-2",
            &ids(&["out-2a", "out-2b", "out-2c"]),
            &ids(&["a", "b"]),
            T0 + 80,
        )
        .await
        .expect("publish_merge by the new owner");
    // The zombie never publishes, not even after the winner did.
    assert_failed_precondition(zombie_publish(T0 + 90).await);
    assert_eq!(
        states(&metastore, &uid).await,
        [
            ("a".to_string(), SplitState::MarkedForDeletion),
            ("b".to_string(), SplitState::MarkedForDeletion),
            ("out-1a".to_string(), SplitState::Staged),
            ("out-1b".to_string(), SplitState::Staged),
            ("out-2a".to_string(), SplitState::Published),
            ("out-2b".to_string(), SplitState::Published),
            ("out-2c".to_string(), SplitState::Published),
        ]
    );
    let done = stored_task(&metastore, &first.task_id).await;
    assert_eq!(done.output_split_ids, ids(&["out-2a", "out-2b", "out-2c"]));
}

/// `publish_merge` requires the owner, the task's inputs still Published and Staged outputs;
/// otherwise it is `FailedPrecondition` (`NotFound` for unknown tasks or indexes) and nothing
/// changes.
pub async fn publish_merge_checks_inputs_outputs_and_owner_and_changes_nothing(
    metastore: Arc<dyn Metastore>,
) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c"]).await;
    let other = index_with_published(&metastore, "other", &["x"]).await;
    create_tasks(&metastore, &uid, &[&["a", "b"]], 3).await;
    let task = claimed(claim(&metastore, "node-1", T0, None).await);
    stage(&metastore, &uid, &["out"]).await;
    let splits_before = splits_of(&metastore, &uid).await;

    let cases: [(&IndexUid, &str, &[&str], &[&str]); 7] = [
        (&uid, "node-2", &["out"], &["a", "b"]),
        (&uid, "node-1", &["out"], &["a"]),
        (&uid, "node-1", &["out"], &["a", "b", "c"]),
        (&uid, "node-1", &["missing"], &["a", "b"]),
        (&uid, "node-1", &["c"], &["a", "b"]),
        (&uid, "node-1", &["out", "a"], &["a", "b"]),
        (&other, "node-1", &["out"], &["a", "b"]),
    ];
    for (index_uid, node_id, output, replaced) in cases {
        let result = metastore
            .publish_merge(
                index_uid,
                &task.task_id,
                node_id,
                &ids(output),
                &ids(replaced),
                T0 + 1,
            )
            .await;
        assert!(
            matches!(result, Err(MetastoreError::FailedPrecondition(_))),
            "{node_id} publishing {output:?} replacing {replaced:?}: expected \
             FailedPrecondition, got {result:?}"
        );
        assert_eq!(splits_of(&metastore, &uid).await, splits_before);
        assert_eq!(stored_task(&metastore, &task.task_id).await, task);
    }
    assert_not_found(
        metastore
            .publish_merge(&uid, "unknown", "node-1", &ids(&["out"]), &ids(&["a"]), T0)
            .await,
    );
    assert_not_found(
        metastore
            .publish_merge(
                &IndexUid::new("nope"),
                &task.task_id,
                "node-1",
                &ids(&["out"]),
                &ids(&["a", "b"]),
                T0,
            )
            .await,
    );

    // An input was marked for deletion meanwhile: the merge cannot be published.
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["a"]))
        .await
        .expect("mark a");
    let splits_before = splits_of(&metastore, &uid).await;
    assert_failed_precondition(
        metastore
            .publish_merge(
                &uid,
                &task.task_id,
                "node-1",
                &ids(&["out"]),
                &ids(&["a", "b"]),
                T0 + 2,
            )
            .await,
    );
    assert_eq!(splits_of(&metastore, &uid).await, splits_before);
    assert_eq!(
        states(&metastore, &uid).await,
        [
            ("a".to_string(), SplitState::MarkedForDeletion),
            ("b".to_string(), SplitState::Published),
            ("c".to_string(), SplitState::Published),
            ("out".to_string(), SplitState::Staged),
        ]
    );
    assert_eq!(stored_task(&metastore, &task.task_id).await, task);
}

/// Failing with `retry` and attempts left puts the task back to Pending; otherwise it is
/// Failed and its splits are released. Only the owner of a Running task may fail it.
pub async fn fail_merge_task_retries_or_gives_up(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d"]).await;
    let created = create_tasks(&metastore, &uid, &[&["a", "b"]], 3).await;
    let task_id = created[0].task_id.clone();
    claimed(claim(&metastore, "node-1", T0, None).await);

    let retried = metastore
        .fail_merge_task(&task_id, "node-1", "boom", true, T0 + 1)
        .await
        .expect("fail with retry");
    assert_eq!(retried.state, MergeTaskState::Pending);
    assert_eq!(
        (retried.lease_owner, retried.lease_expires_at),
        (None, None)
    );
    assert_eq!(retried.error.as_deref(), Some("boom"));
    assert_eq!((retried.attempts, retried.update_timestamp), (1, T0 + 1));
    let stored = stored_task(&metastore, &task_id).await;
    assert_eq!(stored.state, MergeTaskState::Pending);
    assert_eq!(stored.error.as_deref(), Some("boom"));
    // A Pending task cannot be failed.
    assert_failed_precondition(
        metastore
            .fail_merge_task(&task_id, "node-1", "again", true, T0 + 2)
            .await,
    );
    let again = claimed(claim(&metastore, "node-2", T0 + 2, None).await);
    assert_eq!(
        (again.task_id.as_str(), again.attempts),
        (task_id.as_str(), 2)
    );
    let failed = metastore
        .fail_merge_task(&task_id, "node-2", "fatal", false, T0 + 3)
        .await
        .expect("fail without retry");
    assert_eq!(failed.state, MergeTaskState::Failed);
    assert_eq!(failed.error.as_deref(), Some("fatal"));
    assert_eq!(failed.lease_expires_at, None);
    assert_eq!(failed.attempts, 2);
    assert_eq!(stored_task(&metastore, &task_id).await, failed);
    assert_eq!(claim(&metastore, "node-1", T0 + 3, None).await, None);

    // Released splits: a new task, which retries until max_attempts.
    let created = create_tasks(&metastore, &uid, &[&["a", "b"]], 2).await;
    let task_id = created[0].task_id.clone();
    claimed(claim(&metastore, "node-1", T0, None).await);
    let retried = metastore
        .fail_merge_task(&task_id, "node-1", "first", true, T0)
        .await
        .expect("fail 1");
    assert_eq!(retried.state, MergeTaskState::Pending);
    claimed(claim(&metastore, "node-1", T0, None).await);
    let failed = metastore
        .fail_merge_task(&task_id, "node-1", "second", true, T0)
        .await
        .expect("fail 2");
    assert_eq!((failed.state, failed.attempts), (MergeTaskState::Failed, 2));

    // Only the owner may fail a task.
    let created = create_tasks(&metastore, &uid, &[&["c", "d"]], 3).await;
    let task = claimed(claim(&metastore, "node-1", T0, None).await);
    assert_eq!(task.task_id, created[0].task_id);
    assert_failed_precondition(
        metastore
            .fail_merge_task(&task.task_id, "node-2", "not mine", false, T0)
            .await,
    );
    assert_eq!(stored_task(&metastore, &task.task_id).await, task);
    assert_not_found(
        metastore
            .fail_merge_task("unknown", "node-1", "boom", true, T0)
            .await,
    );
}

/// Only the owner of a Running task may renew its lease — even after expiry, until another
/// node claims the task.
pub async fn renew_merge_task_lease_requires_the_owner(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b"]).await;
    let created = create_tasks(&metastore, &uid, &[&["a", "b"]], 5).await;
    let task_id = created[0].task_id.clone();
    assert_failed_precondition(
        metastore
            .renew_merge_task_lease(&task_id, "node-1", LEASE, T0)
            .await,
    );
    let task = claimed(claim(&metastore, "node-1", T0, None).await);
    assert_failed_precondition(
        metastore
            .renew_merge_task_lease(&task_id, "node-2", LEASE, T0 + 30)
            .await,
    );
    assert_eq!(stored_task(&metastore, &task_id).await, task);

    metastore
        .renew_merge_task_lease(&task_id, "node-1", LEASE, T0 + 50)
        .await
        .expect("renew");
    let renewed = stored_task(&metastore, &task_id).await;
    assert_eq!(renewed.lease_expires_at, Some(T0 + 110));
    assert_eq!((renewed.update_timestamp, renewed.attempts), (T0 + 50, 1));
    assert_eq!(claim(&metastore, "node-2", T0 + 100, None).await, None);
    // Expired at T0 + 110, but nobody claimed it since: the owner may still renew.
    metastore
        .renew_merge_task_lease(&task_id, "node-1", LEASE, T0 + 120)
        .await
        .expect("renew after expiry");
    assert_eq!(claim(&metastore, "node-2", T0 + 179, None).await, None);
    let reclaimed = claimed(claim(&metastore, "node-2", T0 + 180, None).await);
    assert_eq!(reclaimed.task_id, task_id);
    assert_failed_precondition(
        metastore
            .renew_merge_task_lease(&task_id, "node-1", LEASE, T0 + 181)
            .await,
    );
    assert_not_found(
        metastore
            .renew_merge_task_lease("unknown", "node-1", LEASE, T0)
            .await,
    );
}

/// Listing filters by index and states, orders newest first, and honours the limit.
pub async fn list_merge_tasks_filters_and_orders_newest_first(metastore: Arc<dyn Metastore>) {
    let logs = index_with_published(
        &metastore,
        "logs",
        &["a", "b", "c", "d", "e", "f", "g", "h"],
    )
    .await;
    let traces = index_with_published(&metastore, "traces", &["x1", "x2", "x3", "x4"]).await;
    let l = create_tasks(
        &metastore,
        &logs,
        &[&["a", "b"], &["c", "d"], &["e", "f"], &["g", "h"]],
        3,
    )
    .await;
    let t = create_tasks(&metastore, &traces, &[&["x1", "x2"], &["x3", "x4"]], 3).await;
    let l = task_ids(&l);
    let t = task_ids(&t);
    // l[0] Running, l[1] Failed, l[2] Succeeded, l[3] and traces' Pending.
    claimed(claim(&metastore, "node-1", T0, Some(&logs)).await);
    claimed(claim(&metastore, "node-1", T0, Some(&logs)).await);
    metastore
        .fail_merge_task(&l[1], "node-1", "boom", false, T0)
        .await
        .expect("fail");
    claimed(claim(&metastore, "node-1", T0, Some(&logs)).await);
    stage(&metastore, &logs, &["out"]).await;
    metastore
        .publish_merge(
            &logs,
            &l[2],
            "node-1",
            &ids(&["out"]),
            &ids(&["e", "f"]),
            T0,
        )
        .await
        .expect("publish_merge");

    let list = |index_uid: Option<IndexUid>, states: Vec<MergeTaskState>, limit: Option<usize>| {
        let metastore = metastore.clone();
        async move {
            task_ids(
                &metastore
                    .list_merge_tasks(index_uid.as_ref(), &states, limit)
                    .await
                    .expect("list_merge_tasks"),
            )
        }
    };
    use MergeTaskState::*;
    /// Index filter, state filter, limit, expected task ids.
    type Case<'a> = (
        Option<IndexUid>,
        Vec<MergeTaskState>,
        Option<usize>,
        Vec<&'a String>,
    );
    let cases: Vec<Case> = vec![
        (
            None,
            vec![],
            None,
            vec![&t[1], &t[0], &l[3], &l[2], &l[1], &l[0]],
        ),
        (
            Some(logs.clone()),
            vec![],
            None,
            vec![&l[3], &l[2], &l[1], &l[0]],
        ),
        (
            Some(logs.clone()),
            vec![Pending, Running],
            None,
            vec![&l[3], &l[0]],
        ),
        (None, vec![Pending], None, vec![&t[1], &t[0], &l[3]]),
        (Some(logs.clone()), vec![], Some(2), vec![&l[3], &l[2]]),
        (None, vec![Failed, Succeeded], Some(1), vec![&l[2]]),
        (None, vec![Failed], None, vec![&l[1]]),
        (Some(traces.clone()), vec![Running], None, vec![]),
        (Some(IndexUid::new("nope")), vec![], None, vec![]),
        (None, vec![], Some(0), vec![]),
    ];
    for (index_uid, states, limit, expected) in cases {
        let description = format!("{index_uid:?} {states:?} {limit:?}");
        let expected: Vec<String> = expected.into_iter().cloned().collect();
        assert_eq!(
            list(index_uid, states, limit).await,
            expected,
            "{description}"
        );
    }
}

/// `delete_merge_tasks` deletes Succeeded and Failed tasks last updated strictly before the
/// bound, and never live tasks.
pub async fn delete_merge_tasks_deletes_finished_tasks_only(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(
        &metastore,
        "logs",
        &["a", "b", "c", "d", "e", "f", "g", "h"],
    )
    .await;
    let created = create_tasks(
        &metastore,
        &uid,
        &[&["a", "b"], &["c", "d"], &["e", "f"], &["g", "h"]],
        3,
    )
    .await;
    let [succeeded, failed, running, pending] = [0, 1, 2, 3].map(|i| created[i].task_id.clone());
    for _ in 0..3 {
        metastore
            .claim_merge_task("node-1", 1_000_000, T0, None, None, false)
            .await
            .expect("claim");
    }
    stage(&metastore, &uid, &["out"]).await;
    metastore
        .publish_merge(
            &uid,
            &succeeded,
            "node-1",
            &ids(&["out"]),
            &ids(&["a", "b"]),
            T0 + 100,
        )
        .await
        .expect("publish_merge");
    metastore
        .fail_merge_task(&failed, "node-1", "boom", false, T0 + 200)
        .await
        .expect("fail");

    let remaining = |metastore: Arc<dyn Metastore>| async move {
        let mut ids = task_ids(&all_tasks(&metastore).await);
        ids.sort();
        ids
    };
    assert_eq!(
        metastore
            .delete_merge_tasks(T0 + 100)
            .await
            .expect("delete"),
        0
    );
    assert_eq!(
        metastore
            .delete_merge_tasks(T0 + 101)
            .await
            .expect("delete"),
        1
    );
    assert_eq!(
        remaining(metastore.clone()).await,
        [failed.clone(), running.clone(), pending.clone()]
    );
    assert_eq!(
        metastore
            .delete_merge_tasks(i64::MAX)
            .await
            .expect("delete"),
        1
    );
    assert_eq!(remaining(metastore.clone()).await, [running, pending]);
    assert_eq!(
        metastore
            .delete_merge_tasks(i64::MAX)
            .await
            .expect("delete"),
        0
    );
}

/// `delete_index` deletes the index's merge tasks, live ones included; a new incarnation can
/// merge the same split ids again.
pub async fn delete_index_deletes_its_merge_tasks(metastore: Arc<dyn Metastore>) {
    let logs = index_with_published(&metastore, "logs", &["a", "b", "c", "d"]).await;
    let other = index_with_published(&metastore, "other", &["x", "y"]).await;
    create_tasks(&metastore, &logs, &[&["a", "b"], &["c", "d"]], 3).await;
    let kept = create_tasks(&metastore, &other, &[&["x", "y"]], 3).await;
    claimed(claim(&metastore, "node-1", T0, Some(&logs)).await);

    metastore.delete_index(&logs).await.expect("delete_index");
    assert_eq!(all_tasks(&metastore).await, kept);
    assert!(metastore
        .list_merge_tasks(Some(&logs), &[], None)
        .await
        .expect("list")
        .is_empty());
    let task = claimed(claim(&metastore, "node-1", T0, None).await);
    assert_eq!(task.task_id, kept[0].task_id);

    let recreated = index_with_published(&metastore, "logs", &["a", "b"]).await;
    let again = create_tasks(&metastore, &recreated, &[&["a", "b"]], 3).await;
    assert_eq!(inputs(&again), [ids(&["a", "b"])]);
}

// ----- delete tasks -----

fn delete_query(query: &str) -> shale_types::DeleteQuery {
    shale_types::DeleteQuery {
        query: query.to_string(),
        search_field: Some(vec!["body".to_string()]),
        start_timestamp: Some(10),
        end_timestamp: None,
        time_range_ms: None,
    }
}

pub async fn delete_tasks_are_numbered_per_index_and_listed_by_opstamp(
    metastore: Arc<dyn Metastore>,
) {
    let logs = create(&metastore, "logs").await.index_uid;
    let other = create(&metastore, "other").await.index_uid;
    assert!(metastore
        .last_delete_opstamps()
        .await
        .expect("last")
        .is_empty());
    let first = metastore
        .create_delete_task(&logs, delete_query("level:ERROR"), T0)
        .await
        .expect("create");
    assert_eq!(first.opstamp, 1);
    assert_eq!(first.create_timestamp, T0);
    assert_eq!(first.index_uid, logs);
    let second = metastore
        .create_delete_task(&logs, delete_query("secret"), T0 + 1)
        .await
        .expect("create");
    assert_eq!(second.opstamp, 2);
    let elsewhere = metastore
        .create_delete_task(&other, delete_query("x"), T0)
        .await
        .expect("create");
    assert_eq!(elsewhere.opstamp, 1, "opstamps are per index");

    let all = metastore.list_delete_tasks(&logs, 0).await.expect("list");
    assert_eq!(all, [first.clone(), second.clone()]);
    assert_eq!(all[1].delete_query, delete_query("secret"));
    assert_eq!(
        metastore.list_delete_tasks(&logs, 1).await.expect("list"),
        std::slice::from_ref(&second)
    );
    assert!(metastore
        .list_delete_tasks(&logs, 2)
        .await
        .expect("list")
        .is_empty());
    let last = metastore.last_delete_opstamps().await.expect("last");
    assert_eq!(last.get(&logs), Some(&2));
    assert_eq!(last.get(&other), Some(&1));

    // Unknown index: not found, nothing created.
    let unknown = IndexUid::new("unknown");
    assert!(matches!(
        metastore
            .create_delete_task(&unknown, delete_query("x"), T0)
            .await,
        Err(MetastoreError::NotFound { .. })
    ));
    assert!(matches!(
        metastore.list_delete_tasks(&unknown, 0).await,
        Err(MetastoreError::NotFound { .. })
    ));

    // Deleting the index forgets its tasks; a new incarnation starts again at 1.
    metastore.delete_index(&logs).await.expect("delete");
    let logs = create(&metastore, "logs").await.index_uid;
    assert!(metastore
        .list_delete_tasks(&logs, 0)
        .await
        .expect("list")
        .is_empty());
    let again = metastore
        .create_delete_task(&logs, delete_query("x"), T0)
        .await
        .expect("create");
    assert_eq!(again.opstamp, 1);
}

pub async fn concurrent_delete_tasks_get_distinct_opstamps(metastore: Arc<dyn Metastore>) {
    let logs = create(&metastore, "logs").await.index_uid;
    let creators: Vec<_> = (0..8)
        .map(|i| {
            let metastore = metastore.clone();
            let logs = logs.clone();
            tokio::spawn(async move {
                metastore
                    .create_delete_task(&logs, delete_query(&format!("q{i}")), T0)
                    .await
                    .expect("create")
                    .opstamp
            })
        })
        .collect();
    let mut opstamps = Vec::new();
    for creator in creators {
        opstamps.push(creator.await.expect("task"));
    }
    opstamps.sort();
    assert_eq!(opstamps, (1..=8).collect::<Vec<u64>>());
}

pub async fn list_splits_visible_at_a_past_second(metastore: Arc<dyn Metastore>) {
    let uid = create(&metastore, "logs").await.index_uid;
    stage(&metastore, &uid, &["a", "b", "never"]).await;
    publish(&metastore, &uid, &["a", "b"]).await;
    let t1 = shale_types::now_unix_secs();
    // The next second: `a` is replaced by `c`, the staged split is dropped.
    while shale_types::now_unix_secs() == t1 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stage(&metastore, &uid, &["c"]).await;
    metastore
        .publish_splits(&uid, &ids(&["c"]), &ids(&["a"]), None)
        .await
        .expect("publish");
    metastore
        .mark_splits_for_deletion(&uid, &ids(&["never"]))
        .await
        .expect("mark");
    let t2 = shale_types::now_unix_secs();
    let visible = |at: i64| {
        let mut query = ListSplitsQuery::for_index(uid.clone());
        query.visible_at = Some(at);
        // The states asked are ignored: visibility decides.
        query.split_states = vec![SplitState::Staged];
        listed_ids(&metastore, query)
    };
    assert_eq!(visible(t1).await, ["a", "b"]);
    assert_eq!(visible(t2).await, ["b", "c"]);
    assert!(visible(t1 - 3600).await.is_empty());
    let mut count = ListSplitsQuery::for_index(uid.clone());
    count.visible_at = Some(t1);
    assert_eq!(metastore.count_splits(count).await.expect("count"), 2);
}

// ----- manual compactions -----

pub async fn merge_tasks_record_their_trigger_and_compaction(metastore: Arc<dyn Metastore>) {
    use shale_types::MergeTrigger;
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d", "e"]).await;
    let created = metastore
        .create_merge_tasks(
            &uid,
            vec![
                new_task(&uid, &["a", "b"]),
                new_task(&uid, &["c"])
                    .with_kind(MergeKind::Delete)
                    .with_trigger(MergeTrigger::DeleteRatio),
                new_task(&uid, &["d", "e"]).with_compaction("C1"),
            ],
            3,
        )
        .await
        .expect("create");
    assert_eq!(created.len(), 3);
    let by_id = |id: &str| created.iter().find(|t| t.task_id == id).cloned().unwrap();
    for task in &created {
        let stored = stored_task(&metastore, &task.task_id).await;
        assert_eq!(&stored, task);
    }
    assert_eq!(by_id(&created[0].task_id).trigger, MergeTrigger::Policy);
    assert_eq!(created[0].compaction_id, None);
    assert_eq!(created[1].trigger, MergeTrigger::DeleteRatio);
    assert_eq!(created[1].kind, MergeKind::Delete);
    assert_eq!(created[2].trigger, MergeTrigger::Manual);
    assert_eq!(created[2].compaction_id.as_deref(), Some("C1"));
    // A node whose automatic compaction is off claims only the manual task.
    let manual = metastore
        .claim_merge_task("node-1", LEASE, T0, None, None, true)
        .await
        .expect("claim")
        .expect("a manual task");
    assert_eq!(manual.task_id, created[2].task_id);
    assert!(metastore
        .claim_merge_task("node-1", LEASE, T0, None, None, true)
        .await
        .expect("claim")
        .is_none());
    assert!(claim(&metastore, "node-2", T0, None).await.is_some());
}

pub async fn compactions_are_recorded_listed_and_updated(metastore: Arc<dyn Metastore>) {
    use crate::{CompactionRequest, CompactionState};
    let logs = create(&metastore, "logs").await.index_uid;
    let other = create(&metastore, "other").await.index_uid;
    let request = CompactionRequest {
        start_timestamp: Some(10),
        end_timestamp: Some(20),
        force: true,
    };
    let first = metastore
        .create_compaction(&logs, request.clone(), T0)
        .await
        .expect("create");
    assert_eq!(first.state, CompactionState::Pending);
    assert_eq!(first.request, request);
    assert_eq!(first.create_timestamp, T0);
    let second = metastore
        .create_compaction(&logs, CompactionRequest::default(), T0 + 1)
        .await
        .expect("create");
    let elsewhere = metastore
        .create_compaction(&other, CompactionRequest::default(), T0)
        .await
        .expect("create");
    let listed = metastore
        .list_compactions(Some(&logs), &[])
        .await
        .expect("list");
    assert_eq!(listed, [second.clone(), first.clone()], "newest first");
    assert_eq!(
        metastore
            .list_compactions(None, &[])
            .await
            .expect("list")
            .len(),
        3
    );
    let mut executing = first.clone();
    executing.state = CompactionState::Executing;
    executing.start_timestamp = Some(T0 + 2);
    executing.progress.total = 4;
    executing.progress.completed = 1;
    executing.progress.splits_before = 9;
    executing.progress.bytes_read = 1234;
    executing.update_timestamp = T0 + 2;
    metastore
        .update_compaction(&executing)
        .await
        .expect("update");
    assert_eq!(
        metastore
            .list_compactions(Some(&logs), &[CompactionState::Executing])
            .await
            .expect("list"),
        [executing.clone()]
    );
    let pending: BTreeSet<String> = metastore
        .list_compactions(None, &[CompactionState::Pending])
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.compaction_id)
        .collect();
    assert_eq!(
        pending,
        BTreeSet::from([
            second.compaction_id.clone(),
            elsewhere.compaction_id.clone()
        ])
    );
    let mut unknown = executing.clone();
    unknown.compaction_id = "nope".to_string();
    assert!(matches!(
        metastore.update_compaction(&unknown).await,
        Err(MetastoreError::NotFound { .. })
    ));
    assert!(matches!(
        metastore
            .create_compaction(&IndexUid::new("gone"), CompactionRequest::default(), T0)
            .await,
        Err(MetastoreError::NotFound { .. })
    ));
    // Deleting the index forgets its compactions.
    metastore.delete_index(&logs).await.expect("delete");
    assert_eq!(
        metastore.list_compactions(None, &[]).await.expect("list"),
        [elsewhere]
    );
}

// ----- cluster -----

const CLUSTER: &str = "test-cluster";
const MS0: i64 = 1_700_000_000_000;

fn roles() -> Vec<String> {
    vec!["indexer".to_string(), "searcher".to_string()]
}

async fn register(metastore: &Arc<dyn Metastore>, node_id: &str, now_ms: i64) -> NodeRecord {
    metastore
        .register_node(
            CLUSTER,
            node_id,
            &format!("{node_id}:7280"),
            &roles(),
            now_ms,
        )
        .await
        .expect("register_node")
}

fn assert_fenced<T: std::fmt::Debug>(result: Result<T, MetastoreError>) {
    match result {
        Err(MetastoreError::FailedPrecondition(message)) if message.starts_with("fenced") => {}
        other => panic!("expected a fenced FailedPrecondition, got {other:?}"),
    }
}

/// The metastore's clock, the cluster's one clock, reads in ms since the epoch and moves
/// forward (on this machine it agrees with the system clock).
pub async fn the_metastore_clock_is_read_in_milliseconds(metastore: Arc<dyn Metastore>) {
    let system = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let before = system();
    let first = metastore.clock_ms().await.expect("clock");
    assert!((first - before).abs() < 2_000, "{first} vs {before}");
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let second = metastore.clock_ms().await.expect("clock");
    assert!(second - first >= 20, "{first} then {second}");
}

/// A registration returns a new generation each time; heartbeats of an older generation (a
/// zombie) are refused; liveness follows the last heartbeat; old nodes can be forgotten.
pub async fn nodes_register_with_growing_generations_and_heartbeat(metastore: Arc<dyn Metastore>) {
    let first = register(&metastore, "n1", MS0).await;
    assert_eq!(first.generation, 1);
    assert_eq!(first.roles, roles());
    assert_eq!(first.advertise_address, "n1:7280");
    register(&metastore, "n2", MS0).await;
    let second = register(&metastore, "n1", MS0 + 10).await;
    assert_eq!(second.generation, 2);
    metastore
        .heartbeat_node(
            CLUSTER,
            &second.identity(),
            serde_json::json!({"running_merges": 1}),
            MS0 + 1000,
        )
        .await
        .expect("heartbeat");
    assert_fenced(
        metastore
            .heartbeat_node(
                CLUSTER,
                &first.identity(),
                serde_json::json!({}),
                MS0 + 1000,
            )
            .await,
    );
    assert_fenced(
        metastore
            .heartbeat_node(
                CLUSTER,
                &NodeIdentity {
                    node_id: "ghost".to_string(),
                    generation: 1,
                },
                serde_json::json!({}),
                MS0,
            )
            .await,
    );
    let nodes = metastore.list_nodes(CLUSTER).await.expect("list_nodes");
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0].node_id, "n1");
    assert_eq!(nodes[0].generation, 2);
    assert_eq!(nodes[0].last_heartbeat_ms, MS0 + 1000);
    assert_eq!(nodes[0].info["running_merges"], 1);
    assert!(nodes[0].is_live(MS0 + 5999, 5000));
    assert!(!nodes[0].is_live(MS0 + 6000, 5000));
    assert!(!nodes[1].is_live(MS0 + 5000, 5000));
    assert!(metastore
        .list_nodes("other-cluster")
        .await
        .expect("list")
        .is_empty());
    assert_eq!(
        metastore
            .forget_nodes(CLUSTER, MS0 + 500)
            .await
            .expect("forget"),
        1
    );
    let nodes = metastore.list_nodes(CLUSTER).await.expect("list_nodes");
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].node_id, "n1");
}

/// One holder at a time; renewing keeps the token; a takeover after expiry grows it; only a
/// node's current generation may hold the lease; a released lease is free at once.
pub async fn leader_lease_has_one_holder_and_a_growing_fencing_token(
    metastore: Arc<dyn Metastore>,
) {
    let a = register(&metastore, "a", MS0).await.identity();
    let b = register(&metastore, "b", MS0).await.identity();
    let acquire = |holder: NodeIdentity, now_ms: i64| {
        let metastore = metastore.clone();
        async move {
            metastore
                .acquire_lease(CLUSTER, LEADER_LEASE, &holder, 3000, now_ms)
                .await
                .expect("acquire_lease")
        }
    };
    let lease = acquire(a.clone(), MS0).await.expect("a leads");
    assert_eq!((lease.fencing_token, lease.expires_at_ms), (1, MS0 + 3000));
    assert_eq!(acquire(b.clone(), MS0 + 2999).await, None);
    let renewed = acquire(a.clone(), MS0 + 2000).await.expect("a renews");
    assert_eq!(
        (renewed.fencing_token, renewed.expires_at_ms),
        (1, MS0 + 5000)
    );
    let taken = acquire(b.clone(), MS0 + 5000).await.expect("b takes over");
    assert_eq!(taken.fencing_token, 2);
    assert_eq!(acquire(a.clone(), MS0 + 5001).await, None);
    let stored = metastore
        .get_lease(CLUSTER, LEADER_LEASE)
        .await
        .expect("get_lease")
        .expect("a lease");
    assert_eq!(stored.holder, b);
    // A new generation of the holder takes over at once (the old one is fenced out), and a
    // superseded generation cannot take it.
    let b2 = register(&metastore, "b", MS0 + 6000).await.identity();
    let restarted = acquire(b2.clone(), MS0 + 6001).await.expect("b2 leads");
    assert_eq!(restarted.fencing_token, 3);
    assert_fenced(
        metastore
            .acquire_lease(CLUSTER, LEADER_LEASE, &b, 3000, MS0 + 6002)
            .await,
    );
    // Released: free at once, for the next holder with a new token.
    metastore
        .release_lease(CLUSTER, LEADER_LEASE, &b2)
        .await
        .expect("release");
    let after = acquire(a, MS0 + 6003).await.expect("a leads again");
    assert_eq!(after.fencing_token, 4);
}

/// Concurrent candidates: exactly one gets the lease.
pub async fn concurrent_lease_candidates_elect_one(metastore: Arc<dyn Metastore>) {
    const CANDIDATES: usize = 6;
    let mut identities = Vec::new();
    for i in 0..CANDIDATES {
        identities.push(register(&metastore, &format!("n{i}"), MS0).await.identity());
    }
    let barrier = Arc::new(Barrier::new(CANDIDATES));
    let tasks: Vec<_> = identities
        .into_iter()
        .map(|identity| {
            let (metastore, barrier) = (metastore.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                metastore
                    .acquire_lease(CLUSTER, LEADER_LEASE, &identity, 3000, MS0 + 1)
                    .await
                    .expect("acquire_lease")
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        if task.await.expect("task").is_some() {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

/// A fenced handle writes while its fence holds, and is refused — changing nothing — once a
/// new leader took over or the node was registered again.
pub async fn fenced_writes_are_refused_once_the_fence_is_gone(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d"]).await;
    let now = shale_types::now_unix_secs() * 1000;
    let leader = register(&metastore, "leader", now).await.identity();
    let lease = metastore
        .acquire_lease(CLUSTER, LEADER_LEASE, &leader, 60_000, now)
        .await
        .expect("acquire")
        .expect("leads");
    let as_leader = metastore.with_fence(Fence::Leader {
        cluster_id: CLUSTER.to_string(),
        holder: leader.clone(),
        fencing_token: lease.fencing_token,
    });
    let created = as_leader
        .create_merge_tasks(&uid, vec![new_task(&uid, &["a", "b"])], 3)
        .await
        .expect("fenced create while leading");
    assert_eq!(created.len(), 1);
    // Reads are not fenced.
    assert_eq!(as_leader.list_nodes(CLUSTER).await.expect("list").len(), 1);

    // A new leader takes over (the old lease is released, as after a pause past its expiry).
    metastore
        .release_lease(CLUSTER, LEADER_LEASE, &leader)
        .await
        .expect("release");
    let other = register(&metastore, "other", now).await.identity();
    metastore
        .acquire_lease(CLUSTER, LEADER_LEASE, &other, 60_000, now)
        .await
        .expect("acquire")
        .expect("other leads");
    assert_fenced(
        as_leader
            .create_merge_tasks(&uid, vec![new_task(&uid, &["c", "d"])], 3)
            .await,
    );
    assert_fenced(as_leader.mark_splits_for_deletion(&uid, &ids(&["c"])).await);
    assert_eq!(all_tasks(&metastore).await.len(), 1);
    assert_eq!(
        splits_of(&metastore, &uid)
            .await
            .iter()
            .filter(|s| s.split_state == SplitState::Published)
            .count(),
        4
    );

    // A node fence: the node's writes stop once it is registered again.
    let node = register(&metastore, "indexer", now).await.identity();
    let as_node = metastore.with_fence(Fence::Node {
        cluster_id: CLUSTER.to_string(),
        identity: node.clone(),
    });
    as_node
        .stage_splits(&uid, vec![split_metadata(&uid, "e")])
        .await
        .expect("stage while current");
    register(&metastore, "indexer", now + 1).await;
    assert_fenced(as_node.publish_splits(&uid, &ids(&["e"]), &[], None).await);
    assert_eq!(
        splits_of(&metastore, &uid)
            .await
            .iter()
            .find(|s| s.split_metadata.split_id == "e")
            .map(|s| s.split_state),
        Some(SplitState::Staged)
    );
}

/// Shards are opened on a node, listed per index, closed, then deleted.
pub async fn shards_open_close_and_delete(metastore: Arc<dyn Metastore>) {
    let logs = create(&metastore, "logs").await.index_uid;
    let other = create(&metastore, "other").await.index_uid;
    let key = |uid: &IndexUid, shard_id: &str| ShardKey {
        index_uid: uid.clone(),
        source_id: "_ingest-api-source".to_string(),
        shard_id: shard_id.to_string(),
    };
    let opened = metastore
        .open_shards(vec![
            (key(&logs, "s1"), "n1".to_string()),
            (key(&logs, "s2"), "n2".to_string()),
            (key(&other, "s3"), "n1".to_string()),
        ])
        .await
        .expect("open_shards");
    assert_eq!(opened.len(), 3);
    assert!(opened.iter().all(|s| s.state == ShardState::Open));
    assert_eq!(
        key(&logs, "s1").queue_name(),
        format!("{logs}/_ingest-api-source/s1")
    );
    let of_logs = metastore.list_shards(Some(&logs)).await.expect("list");
    assert_eq!(of_logs.len(), 2);
    assert_eq!(of_logs[1].node_id, "n2");
    assert_eq!(metastore.list_shards(None).await.expect("list").len(), 3);
    metastore
        .close_shards(&[key(&logs, "s2"), key(&logs, "unknown")])
        .await
        .expect("close");
    let of_logs = metastore.list_shards(Some(&logs)).await.expect("list");
    assert_eq!(of_logs[0].state, ShardState::Open);
    assert_eq!(of_logs[1].state, ShardState::Closed);
    // Both shards published something: each has a checkpoint.
    for (shard, position) in [("s1", 4), ("s2", 9)] {
        let split = format!("split-{shard}");
        stage(&metastore, &logs, &[&split]).await;
        metastore
            .publish_splits(
                &logs,
                &ids(&[&split]),
                &[],
                Some((
                    "_ingest-api-source".to_string(),
                    CheckpointDelta::single(shard, None, position),
                )),
            )
            .await
            .expect("publish");
    }
    metastore
        .delete_shards(&[key(&logs, "s2")])
        .await
        .expect("delete");
    assert_eq!(
        metastore
            .list_shards(Some(&logs))
            .await
            .expect("list")
            .len(),
        1
    );
    // The checkpoint of a deleted shard goes with it; the others stay.
    let checkpoint = metastore
        .index_metadata("logs")
        .await
        .expect("index")
        .checkpoint("_ingest-api-source");
    assert_eq!(checkpoint.position("s1"), Some(4));
    assert_eq!(checkpoint.position("s2"), None);
    assert_not_found(
        metastore
            .open_shards(vec![(key(&IndexUid::new("nope"), "s"), "n1".to_string())])
            .await,
    );
    // Deleting an index deletes its shards.
    metastore.delete_index(&other).await.expect("delete_index");
    assert_eq!(metastore.list_shards(None).await.expect("list").len(), 1);
}

/// The Running tasks of a dead incarnation go back to Pending at once, for another worker.
pub async fn merge_tasks_of_dead_workers_are_requeued(metastore: Arc<dyn Metastore>) {
    let uid = index_with_published(&metastore, "logs", &["a", "b", "c", "d"]).await;
    create_tasks(&metastore, &uid, &[&["a", "b"], &["c", "d"]], 3).await;
    let dead = claimed(claim(&metastore, "dead#1", T0, None).await);
    let alive = claimed(claim(&metastore, "alive#1", T0, None).await);
    let requeued = metastore
        .requeue_merge_tasks(&["dead#1".to_string(), "nobody#3".to_string()], T0 + 1)
        .await
        .expect("requeue");
    assert_eq!(requeued, vec![dead.task_id.clone()]);
    let task = stored_task(&metastore, &dead.task_id).await;
    assert_eq!(task.state, MergeTaskState::Pending);
    assert_eq!(task.lease_owner, None);
    assert!(task.error.as_deref().unwrap_or("").contains("dead#1"));
    assert_eq!(
        stored_task(&metastore, &alive.task_id).await.state,
        MergeTaskState::Running
    );
    // Another worker takes it at once, long before the dead worker's lease would expire.
    let retaken = claimed(claim(&metastore, "alive#1", T0 + 2, None).await);
    assert_eq!(retaken.task_id, dead.task_id);
}
