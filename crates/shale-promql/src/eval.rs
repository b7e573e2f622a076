//! The step-by-step evaluator: every node is evaluated at one time `t` at a time (a range
//! query loops over its steps), selectors read the series fetched by `plan`, subqueries
//! evaluate their inner expression at aligned steps. Owns the intermediate value type, the
//! sample limit and the timeout.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use promql_parser::parser::{Expr, SubqueryExpr, VectorSelector};
use shale_metrics::{Labels, Sample};

use crate::plan::{
    at_ms, duration_ms, offset_ms, selector_key, QueryWindow, SelectorData, SeriesData,
};
use crate::{EngineOptions, PromqlError, RangeSeries, Value, VectorSample};

/// Prometheus's default evaluation interval: the step of a subquery without one.
const DEFAULT_SUBQUERY_STEP_MS: i64 = 60_000;

/// A hasher for keys that are already hashes (label sets carry theirs) or addresses: one
/// multiply per word instead of SipHash over it.
#[derive(Clone, Copy, Default)]
pub(crate) struct MixHasher(u64);

impl std::hash::Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(29) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by label sets or node addresses.
pub(crate) type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<MixHasher>>;

/// A set of label sets.
pub(crate) type FastSet<K> = HashSet<K, std::hash::BuildHasherDefault<MixHasher>>;

/// Inner results of subqueries by (subquery node address, evaluation time).
type SubqueryCache = HashMap<(usize, i64), Rc<Vec<Elem>>>;

/// One element of an instant vector.
#[derive(Clone, Debug)]
pub(crate) struct Elem {
    pub labels: Labels,
    pub value: f64,
}

/// One series of a range vector: borrowed from the fetched data or owned (subqueries).
pub(crate) struct MSeries<'a> {
    pub labels: Cow<'a, Labels>,
    pub samples: Cow<'a, [Sample]>,
}

/// A range vector argument with the window it covers (for `rate`'s extrapolation).
pub(crate) struct Window<'a> {
    pub series: Vec<MSeries<'a>>,
    /// Lower bound of the window (inclusive).
    pub start_ms: i64,
    /// Upper bound of the window (inclusive).
    pub end_ms: i64,
    /// The range of the selector or subquery.
    pub range_ms: i64,
}

/// The value of a node at one time.
pub(crate) enum Val<'a> {
    Scalar(f64),
    Str(String),
    Vector(Vec<Elem>),
    Matrix(Window<'a>),
}

impl Val<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Val::Scalar(_) => "scalar",
            Val::Str(_) => "string",
            Val::Vector(_) => "instant vector",
            Val::Matrix(_) => "range vector",
        }
    }
}

/// A budget refusal as a PromQL error.
fn over_budget(err: shale_types::memory::BudgetExceeded) -> PromqlError {
    PromqlError::OverBudget(format!(
        "query processing would take more memory than it may: {err}"
    ))
}

/// Evaluates expressions over the fetched series.
pub(crate) struct Evaluator {
    data: SelectorData,
    pub window: QueryWindow,
    max_samples: usize,
    timeout: Duration,
    started: Instant,
    current: Cell<usize>,
    peak: Cell<usize>,
    /// Inner results of subqueries by (node, time): overlapping windows of successive steps
    /// evaluate each inner step once.
    subquery_cache: RefCell<SubqueryCache>,
    /// Per range-function call: each output label set and the input series it came from.
    range_outputs: RefCell<FastMap<usize, FastMap<Labels, Labels>>>,
    /// Per (range-function call, input series): its output labels.
    range_labels: RefCell<FastMap<(usize, Labels), Labels>>,
    /// Per (aggregation, input label set): its group's labels.
    group_keys: RefCell<FastMap<(usize, Labels), Labels>>,
    /// Per matrix selector: each series' window `[lo, hi)` at the previous step, from which
    /// the next step's window is found by moving forward (steps mostly go forward).
    cursors: RefCell<HashMap<usize, WindowCursor>>,
    /// The steps, during a range query.
    steps: Cell<Option<Steps>>,
    /// Range functions computed for every step, by call node.
    step_tables: RefCell<HashMap<usize, Rc<StepTable>>>,
    /// Per aggregation of a step table: the group of each of its input series.
    series_groups: RefCell<HashMap<usize, Rc<SeriesGroups>>>,
    /// What the evaluation holds of the node's query memory budget: the series read, then
    /// its peak of samples held plus the subquery steps kept (it only grows).
    reservation: RefCell<Option<shale_types::memory::Reservation>>,
    /// Bytes of subquery steps kept in `subquery_cache`.
    cached_bytes: Cell<u64>,
    /// The most bytes held on top of the series read so far (what the reservation covers).
    held_on_top: Cell<u64>,
}

/// The steps of a range query.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Steps {
    pub start_ms: i64,
    pub step_ms: i64,
    pub count: usize,
}

/// A range function of a matrix selector computed at every step of a range query.
pub(crate) struct StepTable {
    /// Per step: (index of the input series, value), in input order.
    pub rows: Vec<Vec<(u32, f64)>>,
    /// Per step: samples in the windows (what the step holds).
    pub held: Vec<usize>,
    /// Per input series: its output labels (unused for series without a value).
    pub labels: Vec<Labels>,
}

/// The groups of an aggregation over a [`StepTable`]'s series.
pub(crate) struct SeriesGroups {
    /// Per input series: its group.
    pub of_series: Vec<u32>,
    /// Per group: its labels.
    pub labels: Vec<Labels>,
}

/// The windows of a matrix selector's series at its last evaluation.
#[derive(Default)]
struct WindowCursor {
    start_ms: i64,
    end_ms: i64,
    bounds: Vec<(usize, usize)>,
}

impl Evaluator {
    pub(crate) fn new(
        data: SelectorData,
        window: QueryWindow,
        options: &EngineOptions,
        started: Instant,
    ) -> Result<Evaluator, PromqlError> {
        let read: u64 = data
            .values()
            .flatten()
            .map(|s| {
                crate::BYTES_PER_SERIES
                    + (s.raw.len() + s.clean.len()) as u64 * crate::BYTES_PER_SAMPLE / 4
            })
            .sum();
        let reservation = match &options.budget {
            Some(budget) => Some(budget.try_reserve(read).map_err(over_budget)?),
            None => None,
        };
        Ok(Evaluator {
            data,
            window,
            max_samples: options.max_samples,
            timeout: options.timeout,
            started,
            current: Cell::new(0),
            peak: Cell::new(0),
            subquery_cache: RefCell::new(HashMap::new()),
            range_outputs: RefCell::new(FastMap::default()),
            range_labels: RefCell::new(FastMap::default()),
            group_keys: RefCell::new(FastMap::default()),
            cursors: RefCell::new(HashMap::new()),
            steps: Cell::new(None),
            step_tables: RefCell::new(HashMap::new()),
            series_groups: RefCell::new(HashMap::new()),
            reservation: RefCell::new(reservation),
            cached_bytes: Cell::new(0),
            held_on_top: Cell::new(0),
        })
    }

    /// Grows the reservation to cover what the evaluation holds now (the series read, the
    /// samples held, the subquery steps kept), or fails before it takes more.
    fn reserve_held(&self) -> Result<(), PromqlError> {
        let mut reservation = self.reservation.borrow_mut();
        let Some(reservation) = reservation.as_mut() else {
            return Ok(());
        };
        let wanted = (self.current.get() as u64)
            .saturating_mul(crate::BYTES_PER_SAMPLE)
            .saturating_add(self.cached_bytes.get());
        // The series read stay held: grow past them by the most held on top so far.
        let held_on_top = self.held_on_top.get();
        if wanted > held_on_top {
            reservation
                .try_grow(wanted - held_on_top)
                .map_err(over_budget)?;
            self.held_on_top.set(wanted);
        }
        Ok(())
    }

    /// Most samples held at once.
    pub(crate) fn peak_samples(&self) -> u64 {
        self.peak.get() as u64
    }

    /// Accounts for `n` more samples held; over the limit is an error.
    pub(crate) fn hold(&self, n: usize) -> Result<(), PromqlError> {
        let now = self.current.get().saturating_add(n);
        self.current.set(now);
        if now > self.peak.get() {
            self.peak.set(now);
        }
        if now > self.max_samples {
            return Err(PromqlError::TooManySamples("query execution".to_string()));
        }
        self.reserve_held()
    }

    fn set_held(&self, n: usize) {
        self.current.set(n);
    }

    /// The output labels of a range function (`call_key`) for the input series `input`: its
    /// labels without the metric name, computed once per query. Errors when they came from
    /// another input series before (at this or another step), as Prometheus checks the
    /// function's whole output matrix.
    pub(crate) fn range_output_labels(
        &self,
        call_key: usize,
        input: &Labels,
    ) -> Result<Labels, PromqlError> {
        let key = (call_key, input.clone());
        if let Some(labels) = self.range_labels.borrow().get(&key) {
            return Ok(labels.clone());
        }
        let labels = input.without_name();
        {
            let mut all = self.range_outputs.borrow_mut();
            let outputs = all.entry(call_key).or_default();
            match outputs.get(&labels) {
                Some(previous) if previous != input => {
                    return Err(PromqlError::Execution(
                        "vector cannot contain metrics with the same labelset".to_string(),
                    ))
                }
                Some(_) => {}
                None => {
                    outputs.insert(labels.clone(), input.clone());
                }
            }
        }
        self.range_labels.borrow_mut().insert(key, labels.clone());
        Ok(labels)
    }

    /// The steps of the range query being evaluated.
    pub(crate) fn steps(&self) -> Option<Steps> {
        self.steps.get()
    }

    /// The series read for a selector.
    pub(crate) fn selector_series(&self, vs: &VectorSelector) -> &[SeriesData] {
        self.data
            .get(&selector_key(vs))
            .map(|s| s.as_slice())
            .unwrap_or(&[])
    }

    /// The value of range-function call `call_key` at `t` from its table of every step
    /// (built by `build` on first use), when `t` is a step of the range query.
    pub(crate) fn precomputed_steps(
        &self,
        call_key: usize,
        t: i64,
        build: impl FnOnce() -> Result<StepTable, PromqlError>,
    ) -> Result<Option<Vec<Elem>>, PromqlError> {
        let Some((table, k)) = self.step_table(call_key, t, build)? else {
            return Ok(None);
        };
        self.hold(table.held[k])?;
        Ok(Some(
            table.rows[k]
                .iter()
                .map(|&(i, value)| Elem {
                    labels: table.labels[i as usize].clone(),
                    value,
                })
                .collect(),
        ))
    }

    /// The table of every step of range-function call `call_key` (built by `build` on first
    /// use) and the step `t` is, when `t` is a step of the range query.
    pub(crate) fn step_table(
        &self,
        call_key: usize,
        t: i64,
        build: impl FnOnce() -> Result<StepTable, PromqlError>,
    ) -> Result<Option<(Rc<StepTable>, usize)>, PromqlError> {
        let Some(steps) = self.steps.get() else {
            return Ok(None);
        };
        let offset = t.saturating_sub(steps.start_ms);
        if offset < 0 || offset % steps.step_ms != 0 {
            return Ok(None);
        }
        let Ok(k) = usize::try_from(offset / steps.step_ms) else {
            return Ok(None);
        };
        if k >= steps.count {
            return Ok(None);
        }
        let existing = self.step_tables.borrow().get(&call_key).cloned();
        let table = match existing {
            Some(table) => table,
            None => {
                let table = Rc::new(build()?);
                self.step_tables
                    .borrow_mut()
                    .insert(call_key, Rc::clone(&table));
                table
            }
        };
        Ok(Some((table, k)))
    }

    /// The group of each input series of the step table `table` under aggregation `agg_key`
    /// (`group` gives a label set's group labels), computed once per query.
    pub(crate) fn series_groups(
        &self,
        agg_key: usize,
        table: &StepTable,
        group: impl Fn(&Labels) -> Labels,
    ) -> Rc<SeriesGroups> {
        if let Some(groups) = self.series_groups.borrow().get(&agg_key) {
            return Rc::clone(groups);
        }
        let mut index: FastMap<Labels, u32> = FastMap::default();
        let mut groups = SeriesGroups {
            of_series: Vec::with_capacity(table.labels.len()),
            labels: Vec::new(),
        };
        for labels in &table.labels {
            let key = group(labels);
            let g = *index.entry(key.clone()).or_insert_with(|| {
                groups.labels.push(key);
                (groups.labels.len() - 1) as u32
            });
            groups.of_series.push(g);
        }
        let groups = Rc::new(groups);
        self.series_groups
            .borrow_mut()
            .insert(agg_key, Rc::clone(&groups));
        groups
    }

    /// The grouping labels of `input` for the aggregation `agg_key`, computed by `group` once
    /// per query and input label set.
    pub(crate) fn group_labels(
        &self,
        agg_key: usize,
        input: &Labels,
        group: impl FnOnce(&Labels) -> Labels,
    ) -> Labels {
        let key = (agg_key, input.clone());
        if let Some(labels) = self.group_keys.borrow().get(&key) {
            return labels.clone();
        }
        let labels = group(input);
        self.group_keys.borrow_mut().insert(key, labels.clone());
        labels
    }

    pub(crate) fn check_timeout(&self) -> Result<(), PromqlError> {
        if self.started.elapsed() > self.timeout {
            return Err(PromqlError::Timeout("query execution".to_string()));
        }
        Ok(())
    }

    /// An instant query's result.
    pub(crate) fn run_instant(&self, expr: &Expr, t: i64) -> Result<Value, PromqlError> {
        Ok(match self.eval(expr, t)? {
            Val::Scalar(value) => Value::Scalar {
                timestamp_ms: t,
                value,
            },
            Val::Str(value) => Value::String {
                timestamp_ms: t,
                value,
            },
            Val::Vector(v) => Value::Vector(
                v.into_iter()
                    .map(|e| VectorSample {
                        labels: e.labels,
                        timestamp_ms: t,
                        value: e.value,
                    })
                    .collect(),
            ),
            Val::Matrix(w) => Value::Matrix(
                w.series
                    .into_iter()
                    .filter(|s| !s.samples.is_empty())
                    .map(|s| RangeSeries {
                        labels: s.labels.into_owned(),
                        samples: s.samples.into_owned(),
                    })
                    .collect(),
            ),
        })
    }

    /// A range query's result: a matrix sorted by labels.
    pub(crate) fn run_range(
        &self,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Value, PromqlError> {
        let mut index: FastMap<Labels, usize> = FastMap::default();
        let mut series: Vec<RangeSeries> = Vec::new();
        let mut held = 0usize;
        if step > 0 && end >= start {
            if let Some(count) = usize::try_from((end - start) / step)
                .ok()
                .and_then(|n| n.checked_add(1))
            {
                self.steps.set(Some(Steps {
                    start_ms: start,
                    step_ms: step,
                    count,
                }));
            }
        }
        let mut t = start;
        while t <= end {
            self.check_timeout()?;
            self.set_held(held);
            let elems = match self.eval(expr, t)? {
                Val::Scalar(v) => vec![Elem {
                    labels: Labels::default(),
                    value: v,
                }],
                Val::Vector(v) => v,
                other => {
                    return Err(PromqlError::BadData(format!(
                        "invalid expression type {:?} for range query, must be Scalar or instant Vector",
                        other.type_name()
                    )))
                }
            };
            held += elems.len();
            for e in elems {
                let sample = Sample {
                    timestamp_ms: t,
                    value: e.value,
                };
                match index.get(&e.labels) {
                    Some(&i) => series[i].samples.push(sample),
                    None => {
                        index.insert(e.labels.clone(), series.len());
                        series.push(RangeSeries {
                            labels: e.labels,
                            samples: vec![sample],
                        });
                    }
                }
            }
            t = match t.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
        series.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(Value::Matrix(series))
    }

    /// The value of `expr` at time `t`.
    pub(crate) fn eval<'a>(&'a self, expr: &'a Expr, t: i64) -> Result<Val<'a>, PromqlError> {
        match expr {
            Expr::NumberLiteral(n) => Ok(Val::Scalar(n.val)),
            Expr::StringLiteral(s) => Ok(Val::Str(s.val.clone())),
            Expr::Paren(p) => self.eval(&p.expr, t),
            Expr::Unary(u) => match self.eval(&u.expr, t)? {
                Val::Scalar(v) => Ok(Val::Scalar(-v)),
                Val::Vector(v) => {
                    // Prometheus checks the whole result (every step of a range query) for
                    // two series that are one once their names are dropped.
                    let key = u as *const _ as usize;
                    let out = v
                        .into_iter()
                        .map(|e| {
                            Ok(Elem {
                                labels: self.range_output_labels(key, &e.labels)?,
                                value: -e.value,
                            })
                        })
                        .collect::<Result<Vec<Elem>, PromqlError>>()?;
                    Ok(Val::Vector(out))
                }
                other => Err(PromqlError::BadData(format!(
                    "unary expression only allowed on expressions of type scalar or instant vector, got {:?}",
                    other.type_name()
                ))),
            },
            Expr::VectorSelector(vs) => {
                let out: Vec<Elem> = self
                    .instant_select(vs, t)
                    .map(|(labels, _, value)| Elem {
                        labels: labels.clone(),
                        value,
                    })
                    .collect();
                self.hold(out.len())?;
                Ok(Val::Vector(out))
            }
            Expr::MatrixSelector(_) | Expr::Subquery(_) => Ok(Val::Matrix(self.eval_window(expr, t)?)),
            Expr::Call(call) => crate::functions::eval_call(self, call, t),
            Expr::Aggregate(agg) => crate::aggregate::eval_aggregate(self, agg, t),
            Expr::Binary(bin) => crate::binary::eval_binary(self, bin, t),
            Expr::Extension(_) => Err(PromqlError::BadData(
                "extension expressions are not supported".to_string(),
            )),
        }
    }

    /// The instant selector at `t`: per series, the latest sample in the lookback window
    /// (none when it is a staleness marker), as (labels, sample time, value).
    pub(crate) fn instant_select<'a>(
        &'a self,
        vs: &VectorSelector,
        t: i64,
    ) -> impl Iterator<Item = (&'a Labels, i64, f64)> + 'a {
        let ref_time = at_ms(&vs.at, &self.window)
            .unwrap_or(t)
            .saturating_sub(offset_ms(&vs.offset));
        let min_time = ref_time.saturating_sub(self.window.lookback_ms);
        let series = self
            .data
            .get(&selector_key(vs))
            .map(|s| s.as_slice())
            .unwrap_or(&[]);
        series.iter().filter_map(move |s| {
            let end = s.raw.partition_point(|x| x.timestamp_ms <= ref_time);
            let last = s.raw[..end].last()?;
            if last.timestamp_ms < min_time || last.is_stale() {
                return None;
            }
            Some((&s.labels, last.timestamp_ms, last.value))
        })
    }

    /// A range vector argument (matrix selector or subquery, parentheses allowed) at `t`.
    pub(crate) fn eval_window<'a>(
        &'a self,
        expr: &'a Expr,
        t: i64,
    ) -> Result<Window<'a>, PromqlError> {
        match expr {
            Expr::Paren(p) => self.eval_window(&p.expr, t),
            Expr::MatrixSelector(ms) => {
                let vs = &ms.vs;
                let range_ms = duration_ms(&ms.range);
                let end = at_ms(&vs.at, &self.window)
                    .unwrap_or(t)
                    .saturating_sub(offset_ms(&vs.offset));
                let start = end.saturating_sub(range_ms);
                let data = self
                    .data
                    .get(&selector_key(vs))
                    .map(|s| s.as_slice())
                    .unwrap_or(&[]);
                let mut series = Vec::with_capacity(data.len());
                let mut n = 0;
                let mut cursors = self.cursors.borrow_mut();
                let cursor = cursors.entry(selector_key(vs)).or_default();
                // Forward from the previous step's windows when the window moved forward
                // (a few samples each), else a binary search per series.
                let forward = cursor.bounds.len() == data.len()
                    && start >= cursor.start_ms
                    && end >= cursor.end_ms;
                if !forward {
                    cursor.bounds = vec![(0, 0); data.len()];
                }
                cursor.start_ms = start;
                cursor.end_ms = end;
                for (s, bounds) in data.iter().zip(cursor.bounds.iter_mut()) {
                    let (mut lo, mut hi) = if forward {
                        *bounds
                    } else {
                        (
                            s.clean.partition_point(|x| x.timestamp_ms < start),
                            s.clean.partition_point(|x| x.timestamp_ms <= end),
                        )
                    };
                    if forward {
                        while lo < s.clean.len() && s.clean[lo].timestamp_ms < start {
                            lo += 1;
                        }
                        hi = hi.max(lo);
                        while hi < s.clean.len() && s.clean[hi].timestamp_ms <= end {
                            hi += 1;
                        }
                    }
                    *bounds = (lo, hi);
                    if lo < hi {
                        n += hi - lo;
                        series.push(MSeries {
                            labels: Cow::Borrowed(&s.labels),
                            samples: Cow::Borrowed(&s.clean[lo..hi]),
                        });
                    }
                }
                self.hold(n)?;
                Ok(Window {
                    series,
                    start_ms: start,
                    end_ms: end,
                    range_ms,
                })
            }
            Expr::Subquery(sq) => self.eval_subquery(sq, t),
            _ => Err(PromqlError::BadData(
                "expected a range vector (a matrix selector or a subquery)".to_string(),
            )),
        }
    }

    fn eval_subquery<'a>(
        &'a self,
        sq: &'a SubqueryExpr,
        t: i64,
    ) -> Result<Window<'a>, PromqlError> {
        let range_ms = duration_ms(&sq.range);
        let step = sq
            .step
            .as_ref()
            .map(duration_ms)
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_SUBQUERY_STEP_MS);
        let end = at_ms(&sq.at, &self.window)
            .unwrap_or(t)
            .saturating_sub(offset_ms(&sq.offset));
        let start = end.saturating_sub(range_ms);
        // The first multiple of the step at or after the window's start.
        let mut ts = start.div_euclid(step) * step;
        if ts < start {
            ts = ts.saturating_add(step);
        }
        let key = sq as *const SubqueryExpr as usize;
        let mut index: HashMap<Labels, usize> = HashMap::new();
        let mut series: Vec<(Labels, Vec<Sample>)> = Vec::new();
        let mut n = 0;
        while ts <= end {
            self.check_timeout()?;
            let cached = self.subquery_cache.borrow().get(&(key, ts)).cloned();
            let elems = match cached {
                Some(elems) => elems,
                None => {
                    let elems = match self.eval(&sq.expr, ts)? {
                        Val::Vector(v) => v,
                        Val::Scalar(v) => vec![Elem {
                            labels: Labels::default(),
                            value: v,
                        }],
                        other => {
                            return Err(PromqlError::BadData(format!(
                                "subquery is only allowed on instant vector, got {:?}",
                                other.type_name()
                            )))
                        }
                    };
                    let elems = Rc::new(elems);
                    self.subquery_cache
                        .borrow_mut()
                        .insert((key, ts), Rc::clone(&elems));
                    // Each step kept (and each sample of the window being built) counts
                    // before the next is evaluated.
                    self.cached_bytes
                        .set(self.cached_bytes.get().saturating_add(
                            (elems.len() as u64 + 1).saturating_mul(2 * crate::BYTES_PER_SAMPLE),
                        ));
                    self.reserve_held()?;
                    elems
                }
            };
            n += elems.len();
            for e in elems.iter() {
                let sample = Sample {
                    timestamp_ms: ts,
                    value: e.value,
                };
                match index.get(&e.labels) {
                    Some(&i) => series[i].1.push(sample),
                    None => {
                        index.insert(e.labels.clone(), series.len());
                        series.push((e.labels.clone(), vec![sample]));
                    }
                }
            }
            ts = match ts.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
        self.hold(n)?;
        Ok(Window {
            series: series
                .into_iter()
                .map(|(labels, samples)| MSeries {
                    labels: Cow::Owned(labels),
                    samples: Cow::Owned(samples),
                })
                .collect(),
            start_ms: start,
            end_ms: end,
            range_ms,
        })
    }

    /// The value of a scalar argument at `t`.
    pub(crate) fn eval_scalar(&self, expr: &Expr, t: i64) -> Result<f64, PromqlError> {
        match self.eval(expr, t)? {
            Val::Scalar(v) => Ok(v),
            other => Err(PromqlError::BadData(format!(
                "expected a scalar, got {:?}",
                other.type_name()
            ))),
        }
    }

    /// The value of an instant vector argument at `t`.
    pub(crate) fn eval_vector(&self, expr: &Expr, t: i64) -> Result<Vec<Elem>, PromqlError> {
        match self.eval(expr, t)? {
            Val::Vector(v) => Ok(v),
            other => Err(PromqlError::BadData(format!(
                "expected an instant vector, got {:?}",
                other.type_name()
            ))),
        }
    }
}

/// The expression inside any parentheses.
pub(crate) fn unwrap_parens(mut expr: &Expr) -> &Expr {
    while let Expr::Paren(p) = expr {
        expr = &p.expr;
    }
    expr
}

/// The value of a string literal argument.
pub(crate) fn string_arg(expr: &Expr) -> Result<String, PromqlError> {
    match unwrap_parens(expr) {
        Expr::StringLiteral(s) => Ok(s.val.clone()),
        _ => Err(PromqlError::BadData(
            "expected a string literal".to_string(),
        )),
    }
}

/// Prometheus's error when a result holds two series with the same labels.
pub(crate) fn check_unique(v: &[Elem]) -> Result<(), PromqlError> {
    if v.len() < 2 {
        return Ok(());
    }
    let mut seen = HashSet::with_capacity(v.len());
    for e in v {
        if !seen.insert(&e.labels) {
            return Err(PromqlError::Execution(
                "vector cannot contain metrics with the same labelset".to_string(),
            ));
        }
    }
    Ok(())
}

/// Labels as Prometheus prints them: `{a="b", c="d"}`.
pub(crate) fn format_labels(labels: &Labels) -> String {
    let parts: Vec<String> = labels.iter().map(|(n, v)| format!("{n}={v:?}")).collect();
    format!("{{{}}}", parts.join(", "))
}

/// `labels` with `name` set to `value` (removed when `value` is empty).
pub(crate) fn with_label(labels: &Labels, name: &str, value: &str) -> Labels {
    Labels::new(
        labels
            .iter()
            .filter(|(n, _)| *n != name)
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .chain(std::iter::once((name.to_string(), value.to_string()))),
    )
}

/// Go's `math.Max` (NaN wins, +Inf wins).
pub(crate) fn go_max(a: f64, b: f64) -> f64 {
    if a.is_infinite() && a > 0.0 || b.is_infinite() && b > 0.0 {
        return f64::INFINITY;
    }
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    if a == 0.0 && b == 0.0 {
        return if a.is_sign_negative() { b } else { a };
    }
    if a > b {
        a
    } else {
        b
    }
}

/// Go's `math.Min` (NaN wins, -Inf wins).
pub(crate) fn go_min(a: f64, b: f64) -> f64 {
    if a.is_infinite() && a < 0.0 || b.is_infinite() && b < 0.0 {
        return f64::NEG_INFINITY;
    }
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    if a == 0.0 && b == 0.0 {
        return if a.is_sign_negative() { a } else { b };
    }
    if a < b {
        a
    } else {
        b
    }
}
