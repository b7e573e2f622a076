//! Before evaluating: every vector and matrix selector of the query, the time window it needs
//! over the whole evaluation (offsets, `@`, ranges, nested subqueries, the lookback), and one
//! `select` per selector. The series read are kept per selector node, sorted by labels as
//! Prometheus's storage returns them.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use promql_parser::label::MatchOp as ParserMatchOp;
use promql_parser::parser::{AtModifier, Expr, Offset, VectorSelector};
use shale_metrics::{Labels, MatchOp, Matcher, Sample, METRIC_NAME_LABEL};

use crate::{PromqlError, QueryStats, SeriesSource};

/// The bounds of the whole evaluation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueryWindow {
    pub start_ms: i64,
    pub end_ms: i64,
    pub lookback_ms: i64,
}

/// One series read for a selector: its samples as stored (staleness markers included, for
/// instant selectors) and without staleness markers (for range selectors).
pub(crate) struct SeriesData {
    pub labels: Labels,
    pub raw: Vec<Sample>,
    pub clean: Vec<Sample>,
}

/// The series of every selector, keyed by the selector node's address.
pub(crate) type SelectorData = HashMap<usize, Vec<SeriesData>>;

/// The key of a selector node in [`SelectorData`].
pub(crate) fn selector_key(vs: &VectorSelector) -> usize {
    vs as *const VectorSelector as usize
}

/// Milliseconds of a duration (saturating).
pub(crate) fn duration_ms(d: &Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The signed offset in milliseconds.
pub(crate) fn offset_ms(offset: &Option<Offset>) -> i64 {
    match offset {
        None => 0,
        Some(Offset::Pos(d)) => duration_ms(d),
        Some(Offset::Neg(d)) => -duration_ms(d),
    }
}

/// The time an `@` modifier pins evaluation to, if any.
pub(crate) fn at_ms(at: &Option<AtModifier>, window: &QueryWindow) -> Option<i64> {
    match at {
        None => None,
        Some(AtModifier::Start) => Some(window.start_ms),
        Some(AtModifier::End) => Some(window.end_ms),
        Some(AtModifier::At(time)) => Some(system_time_ms(time)),
    }
}

fn system_time_ms(time: &SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => duration_ms(&d),
        Err(err) => -duration_ms(&err.duration()),
    }
}

/// The label matchers of a selector, the metric name included as a `__name__` matcher.
pub(crate) fn matchers_of(vs: &VectorSelector) -> Result<Vec<Matcher>, PromqlError> {
    if !vs.matchers.or_matchers.is_empty() {
        return Err(PromqlError::BadData(
            "`or` inside a label matcher list is not supported".to_string(),
        ));
    }
    let mut out = Vec::with_capacity(vs.matchers.matchers.len() + 1);
    if let Some(name) = &vs.name {
        out.push(Matcher::equal(METRIC_NAME_LABEL, name));
    }
    for m in &vs.matchers.matchers {
        let op = match m.op {
            ParserMatchOp::Equal => MatchOp::Equal,
            ParserMatchOp::NotEqual => MatchOp::NotEqual,
            ParserMatchOp::Re(_) => MatchOp::Regex,
            ParserMatchOp::NotRe(_) => MatchOp::NotRegex,
        };
        out.push(
            Matcher::new(&m.name, op, &m.value)
                .map_err(|err| PromqlError::BadData(err.to_string()))?,
        );
    }
    Ok(out)
}

struct Need<'e> {
    selector: &'e VectorSelector,
    min_ms: i64,
    max_ms: i64,
}

/// Walks `expr` evaluated at times `[lo, hi]`, recording each selector's window.
fn collect<'e>(expr: &'e Expr, lo: i64, hi: i64, window: &QueryWindow, out: &mut Vec<Need<'e>>) {
    match expr {
        Expr::VectorSelector(vs) => {
            let (lo, hi) = at_ms(&vs.at, window).map_or((lo, hi), |at| (at, at));
            let off = offset_ms(&vs.offset);
            out.push(Need {
                selector: vs,
                min_ms: lo.saturating_sub(off).saturating_sub(window.lookback_ms),
                max_ms: hi.saturating_sub(off),
            });
        }
        Expr::MatrixSelector(ms) => {
            let (lo, hi) = at_ms(&ms.vs.at, window).map_or((lo, hi), |at| (at, at));
            let off = offset_ms(&ms.vs.offset);
            out.push(Need {
                selector: &ms.vs,
                min_ms: lo
                    .saturating_sub(off)
                    .saturating_sub(duration_ms(&ms.range)),
                max_ms: hi.saturating_sub(off),
            });
        }
        Expr::Subquery(sq) => {
            let (lo, hi) = at_ms(&sq.at, window).map_or((lo, hi), |at| (at, at));
            let off = offset_ms(&sq.offset);
            collect(
                &sq.expr,
                lo.saturating_sub(off)
                    .saturating_sub(duration_ms(&sq.range)),
                hi.saturating_sub(off),
                window,
                out,
            );
        }
        Expr::Aggregate(a) => {
            if let Some(p) = &a.param {
                collect(p, lo, hi, window, out);
            }
            collect(&a.expr, lo, hi, window, out);
        }
        Expr::Unary(u) => collect(&u.expr, lo, hi, window, out),
        Expr::Binary(b) => {
            collect(&b.lhs, lo, hi, window, out);
            collect(&b.rhs, lo, hi, window, out);
        }
        Expr::Paren(p) => collect(&p.expr, lo, hi, window, out),
        Expr::Call(c) => {
            for arg in &c.args.args {
                collect(arg, lo, hi, window, out);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// Reads every selector's series once, for the window the whole evaluation needs.
pub(crate) async fn fetch(
    source: &dyn SeriesSource,
    expr: &Expr,
    window: &QueryWindow,
) -> Result<(SelectorData, QueryStats), PromqlError> {
    let mut needs = Vec::new();
    collect(expr, window.start_ms, window.end_ms, window, &mut needs);
    // Every selector's read at once: their splits are read and decoded concurrently.
    let reads = futures::future::try_join_all(needs.iter().map(|need| async move {
        let matchers = matchers_of(need.selector)?;
        source.select(&matchers, need.min_ms, need.max_ms).await
    }))
    .await?;
    let mut data = SelectorData::new();
    let mut stats = QueryStats::default();
    for (need, mut series) in needs.iter().zip(reads) {
        series.sort_by(|a, b| a.labels.cmp(&b.labels));
        let mut out = Vec::with_capacity(series.len());
        for s in series {
            stats.series_read += 1;
            stats.samples_read += s.samples.len() as u64;
            let clean: Vec<Sample> = s
                .samples
                .iter()
                .filter(|x| !x.is_stale())
                .copied()
                .collect();
            out.push(SeriesData {
                labels: s.labels,
                raw: s.samples,
                clean,
            });
        }
        data.insert(selector_key(need.selector), out);
    }
    Ok((data, stats))
}
