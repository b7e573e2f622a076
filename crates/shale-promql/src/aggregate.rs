//! Aggregation operators (`sum`, `avg`, `count`, `min`, `max`, `group`, `stddev`, `stdvar`,
//! `topk`, `bottomk`, `quantile`, `count_values`) with `by`/`without` grouping, computed with
//! Prometheus's float operations (incremental mean, Welford, Go-style heaps for `topk`).

use promql_parser::parser::{AggregateExpr, Expr, LabelModifier};
use shale_metrics::{Labels, METRIC_NAME_LABEL};

use crate::eval::{string_arg, unwrap_parens, with_label, Elem, Evaluator, FastMap, Val};
use crate::PromqlError;

#[derive(Clone, Copy, PartialEq, Eq)]
enum AggOp {
    Sum,
    Avg,
    Count,
    Min,
    Max,
    Group,
    Stddev,
    Stdvar,
    Topk,
    Bottomk,
    Quantile,
    CountValues,
}

struct Group {
    labels: Labels,
    value: f64,
    mean: f64,
    count: f64,
    values: Vec<f64>,
    /// Indices into the input vector (for `topk`/`bottomk`), kept as a Go-style heap.
    heap: Vec<usize>,
}

/// Evaluates an aggregation at `t`.
pub(crate) fn eval_aggregate<'a>(
    ev: &'a Evaluator,
    agg: &'a AggregateExpr,
    t: i64,
) -> Result<Val<'a>, PromqlError> {
    let name = agg.op.to_string();
    let op = match name.as_str() {
        "sum" => AggOp::Sum,
        "avg" => AggOp::Avg,
        "count" => AggOp::Count,
        "min" => AggOp::Min,
        "max" => AggOp::Max,
        "group" => AggOp::Group,
        "stddev" => AggOp::Stddev,
        "stdvar" => AggOp::Stdvar,
        "topk" => AggOp::Topk,
        "bottomk" => AggOp::Bottomk,
        "quantile" => AggOp::Quantile,
        "count_values" => AggOp::CountValues,
        other => {
            return Err(PromqlError::BadData(format!(
                "unsupported aggregation {other:?}"
            )))
        }
    };
    let mut scalar_param = 0.0;
    let mut value_label = String::new();
    if let Some(param) = &agg.param {
        if op == AggOp::CountValues {
            value_label = string_arg(param)?;
            if !is_label_name(&value_label) {
                return Err(PromqlError::Execution(format!(
                    "invalid label name {value_label:?}"
                )));
            }
        } else {
            scalar_param = ev.eval_scalar(param, t)?;
        }
    }
    let (without, names): (bool, Vec<&str>) = match &agg.modifier {
        None => (false, Vec::new()),
        Some(LabelModifier::Include(l)) => (false, l.labels.iter().map(String::as_str).collect()),
        Some(LabelModifier::Exclude(l)) => (true, l.labels.iter().map(String::as_str).collect()),
    };
    let mut by_names = names.clone();
    if op == AggOp::CountValues && !without {
        by_names.push(value_label.as_str());
    }
    let agg_key = agg as *const AggregateExpr as usize;
    let by_names = &by_names;
    // An aggregation of a range function computed for every step: each series' group is
    // known once per query, so a step folds the table's row without hashing label sets.
    if !matches!(
        op,
        AggOp::Topk | AggOp::Bottomk | AggOp::Quantile | AggOp::CountValues
    ) {
        if let Expr::Call(call) = unwrap_parens(&agg.expr) {
            if let Some((table, k)) = crate::functions::step_table_of(ev, call, t)? {
                // What evaluating the call would hold: its windows, then its vector.
                ev.hold(table.held[k])?;
                ev.hold(table.rows[k].len())?;
                let groups =
                    ev.series_groups(agg_key, &table, |l| group_labels(l, without, by_names));
                let mut slot = vec![u32::MAX; groups.labels.len()];
                let mut acc: Vec<Group> = Vec::new();
                for &(i, v) in &table.rows[k] {
                    let g = groups.of_series[i as usize] as usize;
                    match slot[g] {
                        u32::MAX => {
                            slot[g] = acc.len() as u32;
                            acc.push(Group::first(op, groups.labels[g].clone(), v, i as usize));
                        }
                        s => acc[s as usize].fold(op, v),
                    }
                }
                let out: Vec<Elem> = acc
                    .into_iter()
                    .map(|mut g| Elem {
                        value: g.result(op, scalar_param),
                        labels: g.labels,
                    })
                    .collect();
                ev.hold(out.len())?;
                return Ok(Val::Vector(out));
            }
        }
    }
    let input = ev.eval_vector(&agg.expr, t)?;
    let k = if matches!(op, AggOp::Topk | AggOp::Bottomk) {
        // Go's convertibleToInt64 (NaN and ±Inf are not), then int64(k) < 1 is nothing.
        if !(-9_223_372_036_854_775_808.0..=9_223_372_036_854_774_784.0).contains(&scalar_param) {
            return Err(PromqlError::Execution(format!(
                "Scalar value {} overflows int64",
                crate::go_format::v_format(scalar_param)
            )));
        }
        if scalar_param < 1.0 {
            return Ok(Val::Vector(Vec::new()));
        }
        // Go's int64 conversion truncates toward zero.
        let k = scalar_param.trunc();
        if k >= input.len() as f64 {
            input.len().max(1)
        } else {
            k as usize
        }
    } else {
        0
    };
    let mut groups: Vec<Group> = Vec::new();
    let mut index: FastMap<Labels, usize> = FastMap::default();
    for (i, e) in input.iter().enumerate() {
        let metric_owned;
        let metric = if op == AggOp::CountValues {
            metric_owned = with_label(&e.labels, &value_label, &format_value(e.value));
            &metric_owned
        } else {
            &e.labels
        };
        let key = if op == AggOp::CountValues {
            group_labels(metric, without, by_names)
        } else {
            ev.group_labels(agg_key, metric, |l| group_labels(l, without, by_names))
        };
        let v = e.value;
        let gi = match index.get(&key) {
            Some(&gi) => gi,
            None => {
                index.insert(key.clone(), groups.len());
                groups.push(Group::first(op, key, v, i));
                continue;
            }
        };
        let g = &mut groups[gi];
        if !matches!(op, AggOp::Topk | AggOp::Bottomk) {
            g.fold(op, v);
            continue;
        }
        let top = op == AggOp::Topk;
        let less = |a: usize, b: usize| heap_less(top, input[a].value, input[b].value);
        if g.heap.len() < k {
            g.heap.push(i);
            let last = g.heap.len() - 1;
            heap_up(&mut g.heap, last, &less);
        } else {
            let root = input[g.heap[0]].value;
            let replace = if top {
                root < v || (root.is_nan() && !v.is_nan())
            } else {
                root > v || (root.is_nan() && !v.is_nan())
            };
            if replace {
                g.heap[0] = i;
                if k > 1 {
                    let n = g.heap.len();
                    if !heap_down(&mut g.heap, 0, n, &less) {
                        heap_up(&mut g.heap, 0, &less);
                    }
                }
            }
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for mut g in groups {
        if matches!(op, AggOp::Topk | AggOp::Bottomk) {
            let top = op == AggOp::Topk;
            let mut picked: Vec<usize> = g.heap.clone();
            // Best first, as Prometheus returns them.
            picked.sort_by(|&a, &b| {
                let (x, y) = (input[a].value, input[b].value);
                if heap_less(top, x, y) {
                    std::cmp::Ordering::Greater
                } else if heap_less(top, y, x) {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Equal
                }
            });
            for i in picked {
                out.push(input[i].clone());
            }
            continue;
        }
        out.push(Elem {
            value: g.result(op, scalar_param),
            labels: g.labels,
        });
    }
    ev.hold(out.len())?;
    Ok(Val::Vector(out))
}

impl Group {
    /// A group whose first element (input index `i`) has value `v`.
    fn first(op: AggOp, labels: Labels, v: f64, i: usize) -> Group {
        Group {
            labels,
            value: if op == AggOp::Stddev || op == AggOp::Stdvar {
                0.0
            } else {
                v
            },
            mean: v,
            count: 1.0,
            values: if op == AggOp::Quantile {
                vec![v]
            } else {
                Vec::new()
            },
            heap: if matches!(op, AggOp::Topk | AggOp::Bottomk) {
                vec![i]
            } else {
                Vec::new()
            },
        }
    }

    /// Adds a later element's value (every operator but `topk`/`bottomk`).
    fn fold(&mut self, op: AggOp, v: f64) {
        match op {
            AggOp::Sum => self.value += v,
            AggOp::Avg => {
                self.count += 1.0;
                if self.mean.is_infinite() {
                    if v.is_infinite() && (self.mean > 0.0) == (v > 0.0) {
                        return;
                    }
                    if !v.is_infinite() && !v.is_nan() {
                        return;
                    }
                }
                self.mean += v / self.count - self.mean / self.count;
            }
            AggOp::Count | AggOp::CountValues => self.count += 1.0,
            AggOp::Group | AggOp::Topk | AggOp::Bottomk => {}
            AggOp::Min => {
                if self.value > v || self.value.is_nan() {
                    self.value = v;
                }
            }
            AggOp::Max => {
                if self.value < v || self.value.is_nan() {
                    self.value = v;
                }
            }
            AggOp::Stddev | AggOp::Stdvar => {
                self.count += 1.0;
                let delta = v - self.mean;
                self.mean += delta / self.count;
                self.value += delta * (v - self.mean);
            }
            AggOp::Quantile => self.values.push(v),
        }
    }

    /// The group's value (every operator but `topk`/`bottomk`).
    fn result(&mut self, op: AggOp, scalar_param: f64) -> f64 {
        match op {
            AggOp::Sum | AggOp::Min | AggOp::Max => self.value,
            AggOp::Avg => self.mean,
            AggOp::Count | AggOp::CountValues => self.count,
            AggOp::Group | AggOp::Topk | AggOp::Bottomk => 1.0,
            AggOp::Stdvar => self.value / self.count,
            AggOp::Stddev => (self.value / self.count).sqrt(),
            AggOp::Quantile => quantile(scalar_param, &mut self.values),
        }
    }
}

/// The labels of an element's group.
fn group_labels(labels: &Labels, without: bool, names: &[&str]) -> Labels {
    Labels::new(
        labels
            .iter()
            .filter(|(n, _)| {
                if without {
                    *n != METRIC_NAME_LABEL && !names.contains(n)
                } else {
                    names.contains(n)
                }
            })
            .map(|(n, v)| (n.to_string(), v.to_string())),
    )
}

/// The heap order of Prometheus's `topk` (min-heap) and `bottomk` (max-heap); NaN first.
fn heap_less(top: bool, a: f64, b: f64) -> bool {
    if a.is_nan() {
        return true;
    }
    if top {
        a < b
    } else {
        a > b
    }
}

fn heap_up(h: &mut [usize], mut j: usize, less: &impl Fn(usize, usize) -> bool) {
    while j > 0 {
        let i = (j - 1) / 2;
        if !less(h[j], h[i]) {
            break;
        }
        h.swap(i, j);
        j = i;
    }
}

fn heap_down(h: &mut [usize], i0: usize, n: usize, less: &impl Fn(usize, usize) -> bool) -> bool {
    let mut i = i0;
    loop {
        let j1 = 2 * i + 1;
        if j1 >= n {
            break;
        }
        let mut j = j1;
        let j2 = j1 + 1;
        if j2 < n && less(h[j2], h[j1]) {
            j = j2;
        }
        if !less(h[j], h[i]) {
            break;
        }
        h.swap(i, j);
        i = j;
    }
    i > i0
}

/// Prometheus's `quantile`: linear interpolation between the closest ranks.
pub(crate) fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    values.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
    });
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0);
    let upper = (lower + 1.0).min(n - 1.0);
    let weight = rank - rank.floor();
    values[lower as usize] * (1.0 - weight) + values[upper as usize] * weight
}

/// A float as Go's `strconv.FormatFloat(v, 'f', -1, 64)` writes it.
pub(crate) fn format_value(v: f64) -> String {
    crate::go_format::f_format(v)
}

/// Whether `s` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
pub(crate) fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
