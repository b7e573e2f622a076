//! Series selectors (`up{job="api"}`, `{__name__=~"http_.*", env!="dev"}`) as matcher sets,
//! and the deletes of metrics indexes: a delete task's selectors and window, applied to
//! samples by queries and merges alike.

use shale_types::DeleteTask;

use crate::{Labels, MatchOp, Matcher, MetricsError, METRIC_NAME_LABEL};

/// The matcher sets of one series selector (a series matches if one set matches: a
/// selector with `or` inside its braces has several).
pub fn parse_selector(text: &str) -> Result<Vec<Vec<Matcher>>, MetricsError> {
    let invalid = |reason: String| MetricsError::InvalidSelector {
        selector: text.to_string(),
        reason,
    };
    let expr = crate::promql_depth::parse_bounded(text).map_err(invalid)?;
    let promql_parser::parser::Expr::VectorSelector(selector) = expr else {
        return Err(invalid("not a series selector".to_string()));
    };
    let groups = if selector.matchers.or_matchers.is_empty() {
        vec![selector.matchers.matchers.clone()]
    } else {
        selector.matchers.or_matchers.clone()
    };
    let mut sets = Vec::with_capacity(groups.len());
    for group in groups {
        let mut set = Vec::new();
        if let Some(name) = &selector.name {
            set.push(Matcher::equal(METRIC_NAME_LABEL, name));
        }
        for m in group {
            use promql_parser::label::MatchOp as P;
            let op = match &m.op {
                P::Equal => MatchOp::Equal,
                P::NotEqual => MatchOp::NotEqual,
                P::Re(_) => MatchOp::Regex,
                P::NotRe(_) => MatchOp::NotRegex,
            };
            set.push(Matcher::new(&m.name, op, &m.value)?);
        }
        sets.push(set);
    }
    Ok(sets)
}

/// A delete task of a metrics index: the samples of the series its selectors match, within
/// its window (inclusive milliseconds).
#[derive(Clone, Debug)]
pub struct SeriesDelete {
    /// The task's opstamp: it applies to splits not clean of it.
    pub opstamp: u64,
    /// Matcher sets, one per selector (or per `or` group).
    pub sets: Vec<Vec<Matcher>>,
    /// First millisecond deleted.
    pub start_ms: i64,
    /// Last millisecond deleted.
    pub end_ms: i64,
}

impl SeriesDelete {
    /// The delete of a metrics index's task (selectors one per line in its query).
    pub fn from_task(task: &DeleteTask) -> Result<SeriesDelete, MetricsError> {
        let mut sets = Vec::new();
        for line in task
            .delete_query
            .query
            .lines()
            .filter(|l| !l.trim().is_empty())
        {
            sets.extend(parse_selector(line)?);
        }
        let (start_ms, end_ms) = task.delete_query.time_range_ms.unwrap_or((
            task.delete_query
                .start_timestamp
                .map_or(i64::MIN, |s| s.saturating_mul(1000)),
            task.delete_query
                .end_timestamp
                .map_or(i64::MAX, |e| e.saturating_mul(1000).saturating_sub(1)),
        ));
        Ok(SeriesDelete {
            opstamp: task.opstamp,
            sets,
            start_ms,
            end_ms,
        })
    }

    /// Whether the task deletes samples of the series `labels`.
    pub fn matches_series(&self, labels: &Labels) -> bool {
        self.sets
            .iter()
            .any(|set| set.iter().all(|m| m.matches(labels)))
    }

    /// Whether the task deletes the sample at `timestamp_ms` of a series it matches.
    pub fn covers(&self, timestamp_ms: i64) -> bool {
        self.start_ms <= timestamp_ms && timestamp_ms <= self.end_ms
    }
}

/// `samples` of the series `labels` without those `deletes` remove; returns how many went.
pub fn apply_deletes(
    deletes: &[&SeriesDelete],
    labels: &Labels,
    samples: &mut Vec<crate::Sample>,
) -> u64 {
    let applying: Vec<&&SeriesDelete> = deletes
        .iter()
        .filter(|d| d.matches_series(labels))
        .collect();
    if applying.is_empty() {
        return 0;
    }
    let before = samples.len();
    samples.retain(|s| !applying.iter().any(|d| d.covers(s.timestamp_ms)));
    (before - samples.len()) as u64
}
