//! The series a PromQL query reads, from a metrics index's published Parquet splits.
//!
//! A selector lists the splits whose time range meets its window, skips those whose
//! metric-name tags cannot hold a matching name or whose sort-key range cannot hold the
//! selector's leading `=` values (metric name, then the index's sort labels in order), reads
//! the others (each object once per
//! query, kept for the query's other selectors) and merges a series' samples across splits:
//! of two samples with one timestamp, the later split's wins (the last written value, as
//! within a split). What was listed, pruned and opened is counted for the response.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use shale_metastore::{ListSplitsQuery, Metastore};
use shale_metrics::{Labels, Matcher, Sample, SeriesSamples, METRIC_NAME_LABEL};
use shale_promql::{PromqlError, SeriesSource};
use shale_storage::StorageRef;
use shale_types::{IndexUid, SplitMetadata, SplitState};

/// What a query's selectors did with splits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Splits listed by time range (for every selector).
    pub splits_listed: u64,
    /// Of those, skipped by their metric names.
    pub splits_pruned: u64,
    /// Distinct split objects read.
    pub splits_opened: u64,
    /// Row groups of the splits read / skipped by statistics and bloom filters.
    pub row_groups_read: u64,
    /// Row groups skipped.
    pub row_groups_pruned: u64,
}

/// The published splits of one metrics index, read for one query.
pub struct SplitSource {
    metastore: Arc<dyn Metastore>,
    storage: StorageRef,
    index_uid: IndexUid,
    /// Objects read by this query, by split id.
    objects: tokio::sync::Mutex<HashMap<String, Bytes>>,
    stats: Mutex<SourceStats>,
}

impl SplitSource {
    /// A source over the splits of `index_uid` in `storage`.
    pub fn new(metastore: Arc<dyn Metastore>, storage: StorageRef, index_uid: IndexUid) -> Self {
        SplitSource {
            metastore,
            storage,
            index_uid,
            objects: tokio::sync::Mutex::new(HashMap::new()),
            stats: Mutex::new(SourceStats::default()),
        }
    }

    /// What the selectors did so far.
    pub fn stats(&self) -> SourceStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object of `split`, read once per query.
    async fn object(&self, split: &SplitMetadata) -> Result<Bytes, PromqlError> {
        let mut objects = self.objects.lock().await;
        if let Some(bytes) = objects.get(&split.split_id) {
            return Ok(bytes.clone());
        }
        let bytes = self
            .storage
            .get_bytes(&split.object_key())
            .await
            .map_err(|err| {
                PromqlError::Source(format!("reading split {}: {err}", split.split_id))
            })?;
        objects.insert(split.split_id.clone(), bytes.clone());
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .splits_opened += 1;
        Ok(bytes)
    }
}

/// Whether a split with these tags may hold a series whose name the matchers accept.
fn may_hold(split: &SplitMetadata, matchers: &[Matcher]) -> bool {
    let recorded = split
        .tag_fields
        .as_ref()
        .is_some_and(|fields| fields.iter().any(|f| f == METRIC_NAME_LABEL));
    let overflow = format!("{METRIC_NAME_LABEL}!");
    if !recorded || split.tags.contains(&overflow) {
        return true;
    }
    let prefix = format!("{METRIC_NAME_LABEL}:");
    let names: Vec<&str> = split
        .tags
        .iter()
        .filter_map(|tag| tag.strip_prefix(&prefix))
        .collect();
    matchers
        .iter()
        .filter(|m| m.name == METRIC_NAME_LABEL)
        .all(|m| names.iter().any(|name| m.matches_value(name)))
}

/// Whether a split's sort-key range may hold a series the matchers accept: the key prefix the
/// `=` matchers fix (the metric name, then the sort labels in order, up to the first label
/// without one) must fall within the split's `[sort_key_min, sort_key_max]`.
fn key_range_may_hold(split: &SplitMetadata, matchers: &[Matcher]) -> bool {
    use shale_types::sort_key::{prefix_upper_bound, push_value, SortFieldType, SortValue};
    let (Some(fields), Some(min), Some(max)) =
        (&split.sort_fields, &split.sort_key_min, &split.sort_key_max)
    else {
        return true;
    };
    let mut prefix = Vec::new();
    // The last field is the series id: never fixed by a matcher.
    for field in fields.iter().take(fields.len().saturating_sub(1)) {
        let Some(value) = matchers
            .iter()
            .find(|m| m.op == shale_metrics::MatchOp::Equal && &m.name == field)
            .map(|m| m.value.as_str())
        else {
            break;
        };
        let value = if value.is_empty() {
            SortValue::Missing
        } else {
            SortValue::Text(value.to_string())
        };
        push_value(&mut prefix, SortFieldType::Text, &value);
    }
    if prefix.is_empty() {
        return true;
    }
    let upper = prefix_upper_bound(&prefix);
    min.0 < upper && max.0 >= prefix
}

#[async_trait::async_trait]
impl SeriesSource for SplitSource {
    async fn select(
        &self,
        matchers: &[Matcher],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<SeriesSamples>, PromqlError> {
        let mut query = ListSplitsQuery::for_index(self.index_uid.clone())
            .with_states(&[SplitState::Published]);
        query.time_range_start = Some(start_ms.div_euclid(1000));
        query.time_range_end = Some(end_ms.div_euclid(1000).saturating_add(1));
        let mut splits: Vec<SplitMetadata> = self
            .metastore
            .list_splits(query)
            .await
            .map_err(|err| PromqlError::Source(format!("listing splits: {err}")))?
            .into_iter()
            .map(|split| split.split_metadata)
            .filter(|split| split.format == shale_types::SplitFormat::Parquet)
            .collect();
        // Oldest first: a later split's sample replaces an earlier one's at one timestamp.
        splits.sort_by(|a, b| a.split_id.cmp(&b.split_id));
        let listed = splits.len() as u64;
        splits.retain(|split| may_hold(split, matchers) && key_range_may_hold(split, matchers));
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.splits_listed += listed;
            stats.splits_pruned += listed - splits.len() as u64;
        }
        let mut merged: HashMap<Labels, Vec<Sample>> = HashMap::new();
        let mut order: Vec<Labels> = Vec::new();
        for split in &splits {
            let bytes = self.object(split).await?;
            let matchers = matchers.to_vec();
            let read = tokio::task::spawn_blocking(move || {
                shale_metrics::read_split(bytes, &matchers, start_ms, end_ms)
            })
            .await
            .map_err(|err| PromqlError::Source(format!("reading a split failed: {err}")))?
            .map_err(|err| PromqlError::Source(format!("split {}: {err}", split.split_id)))?;
            {
                let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                stats.row_groups_read += read.stats.row_groups_read as u64;
                stats.row_groups_pruned +=
                    (read.stats.row_groups - read.stats.row_groups_read) as u64;
            }
            for series in read.series {
                match merged.get_mut(&series.labels) {
                    Some(samples) => samples.extend(series.samples),
                    None => {
                        order.push(series.labels.clone());
                        merged.insert(series.labels, series.samples);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(order.len());
        for labels in order {
            let Some(mut samples) = merged.remove(&labels) else {
                continue;
            };
            // Stable: among samples of one timestamp the later split's stays last.
            samples.sort_by_key(|s| s.timestamp_ms);
            let mut deduped: Vec<Sample> = Vec::with_capacity(samples.len());
            for sample in samples {
                match deduped.last_mut() {
                    Some(last) if last.timestamp_ms == sample.timestamp_ms => *last = sample,
                    _ => deduped.push(sample),
                }
            }
            out.push(SeriesSamples {
                labels,
                samples: deduped,
            });
        }
        Ok(out)
    }
}

/// The label names of `series`, sorted.
pub fn label_names(series: &[SeriesSamples]) -> BTreeSet<String> {
    series
        .iter()
        .flat_map(|s| s.labels.iter().map(|(name, _)| name.to_string()))
        .collect()
}
