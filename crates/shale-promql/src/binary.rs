//! Binary operators: arithmetic, comparisons (filtering or `bool`), `atan2`, the set
//! operators, and vector matching (`on`/`ignoring`, `group_left`/`group_right`) with
//! Prometheus's label rules and errors.

use std::collections::HashSet;

use promql_parser::parser::{BinaryExpr, LabelModifier, VectorMatchCardinality};
use shale_metrics::{Labels, METRIC_NAME_LABEL};

use crate::eval::{check_unique, format_labels, Elem, Evaluator, FastMap, FastSet, Val};
use crate::PromqlError;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Atan2,
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
    And,
    Or,
    Unless,
}

impl Op {
    fn parse(s: &str) -> Result<Op, PromqlError> {
        Ok(match s {
            "+" => Op::Add,
            "-" => Op::Sub,
            "*" => Op::Mul,
            "/" => Op::Div,
            "%" => Op::Mod,
            "^" => Op::Pow,
            "atan2" => Op::Atan2,
            "==" => Op::Eq,
            "!=" => Op::Ne,
            ">" => Op::Gt,
            "<" => Op::Lt,
            ">=" => Op::Ge,
            "<=" => Op::Le,
            "and" => Op::And,
            "or" => Op::Or,
            "unless" => Op::Unless,
            other => {
                return Err(PromqlError::BadData(format!(
                    "unsupported binary operator {other:?}"
                )))
            }
        })
    }

    fn is_comparison(self) -> bool {
        matches!(self, Op::Eq | Op::Ne | Op::Gt | Op::Lt | Op::Ge | Op::Le)
    }

    /// Whether the result loses the metric name (arithmetic but `atan2`, as in Prometheus).
    fn drops_name(self) -> bool {
        matches!(
            self,
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Mod | Op::Pow
        )
    }
}

/// The value and whether a comparison keeps the element.
fn apply(op: Op, l: f64, r: f64) -> (f64, bool) {
    match op {
        Op::Add => (l + r, true),
        Op::Sub => (l - r, true),
        Op::Mul => (l * r, true),
        Op::Div => (l / r, true),
        Op::Mod => (l % r, true),
        Op::Pow => (crate::go_math::pow(l, r), true),
        Op::Atan2 => (l.atan2(r), true),
        Op::Eq => (l, l == r),
        Op::Ne => (l, l != r),
        Op::Gt => (l, l > r),
        Op::Lt => (l, l < r),
        Op::Ge => (l, l >= r),
        Op::Le => (l, l <= r),
        Op::And | Op::Or | Op::Unless => (l, false),
    }
}

/// How series of both sides are matched.
struct Matching<'m> {
    on: bool,
    names: HashSet<&'m str>,
    /// The evaluator and the binary node, to compute each series' signature once per query.
    ev: &'m Evaluator,
    key: usize,
}

impl Matching<'_> {
    /// The key series of both sides are matched by: the labels they are matched on.
    fn signature(&self, labels: &Labels) -> Labels {
        self.ev
            .group_labels(self.key, labels, |l| self.matched_labels(l))
    }

    /// The labels the signature is made of.
    fn matched_labels(&self, labels: &Labels) -> Labels {
        Labels::new(
            labels
                .iter()
                .filter(|(n, _)| {
                    if self.on {
                        self.names.contains(n)
                    } else {
                        *n != METRIC_NAME_LABEL && !self.names.contains(n)
                    }
                })
                .map(|(n, v)| (n.to_string(), v.to_string())),
        )
    }
}

/// Evaluates a binary expression at `t`.
pub(crate) fn eval_binary<'a>(
    ev: &'a Evaluator,
    bin: &'a BinaryExpr,
    t: i64,
) -> Result<Val<'a>, PromqlError> {
    let op = Op::parse(&bin.op.to_string())?;
    let return_bool = bin.modifier.as_ref().is_some_and(|m| m.return_bool);
    let lhs = ev.eval(&bin.lhs, t)?;
    let rhs = ev.eval(&bin.rhs, t)?;
    match (lhs, rhs) {
        (Val::Scalar(l), Val::Scalar(r)) => {
            let (v, keep) = apply(op, l, r);
            if op.is_comparison() {
                Ok(Val::Scalar(if keep { 1.0 } else { 0.0 }))
            } else {
                Ok(Val::Scalar(v))
            }
        }
        (Val::Vector(v), Val::Scalar(s)) => {
            let out = vector_scalar(op, v, s, false, return_bool);
            check_unique(&out)?;
            ev.hold(out.len())?;
            Ok(Val::Vector(out))
        }
        (Val::Scalar(s), Val::Vector(v)) => {
            let out = vector_scalar(op, v, s, true, return_bool);
            check_unique(&out)?;
            ev.hold(out.len())?;
            Ok(Val::Vector(out))
        }
        (Val::Vector(l), Val::Vector(r)) => {
            let (matching, card) = matching_of(ev, bin);
            let out = match op {
                Op::And => set_and(l, r, &matching),
                Op::Or => set_or(l, r, &matching),
                Op::Unless => set_unless(l, r, &matching),
                _ => vector_vector(op, l, r, &matching, card, return_bool)?,
            };
            check_unique(&out)?;
            ev.hold(out.len())?;
            Ok(Val::Vector(out))
        }
        (l, r) => Err(PromqlError::BadData(format!(
            "binary expression must contain only scalar and instant vector types, got {} and {}",
            kind(&l),
            kind(&r)
        ))),
    }
}

fn kind(v: &Val<'_>) -> &'static str {
    match v {
        Val::Scalar(_) => "scalar",
        Val::Str(_) => "string",
        Val::Vector(_) => "instant vector",
        Val::Matrix(_) => "range vector",
    }
}

fn matching_of<'m>(
    ev: &'m Evaluator,
    bin: &'m BinaryExpr,
) -> (Matching<'m>, Option<&'m VectorMatchCardinality>) {
    let key = bin as *const BinaryExpr as usize;
    let matching = |on: bool, names: HashSet<&'m str>| Matching { on, names, ev, key };
    let Some(modifier) = &bin.modifier else {
        return (matching(false, HashSet::new()), None);
    };
    let matching = match &modifier.matching {
        Some(LabelModifier::Include(l)) => {
            matching(true, l.labels.iter().map(String::as_str).collect())
        }
        Some(LabelModifier::Exclude(l)) => {
            matching(false, l.labels.iter().map(String::as_str).collect())
        }
        None => matching(false, HashSet::new()),
    };
    (matching, Some(&modifier.card))
}

fn vector_scalar(op: Op, v: Vec<Elem>, s: f64, scalar_left: bool, return_bool: bool) -> Vec<Elem> {
    let mut out = Vec::with_capacity(v.len());
    for e in v {
        let (l, r) = if scalar_left {
            (s, e.value)
        } else {
            (e.value, s)
        };
        let (mut value, mut keep) = apply(op, l, r);
        // A comparison keeps the vector's value, even when the vector is on the right.
        if op.is_comparison() && scalar_left {
            value = r;
        }
        if return_bool {
            value = if keep { 1.0 } else { 0.0 };
            keep = true;
        }
        if keep {
            let labels = if op.drops_name() || return_bool {
                e.labels.without_name()
            } else {
                e.labels
            };
            out.push(Elem { labels, value });
        }
    }
    out
}

fn set_and(l: Vec<Elem>, r: Vec<Elem>, m: &Matching<'_>) -> Vec<Elem> {
    if l.is_empty() || r.is_empty() {
        return Vec::new();
    }
    let right: FastSet<Labels> = r.iter().map(|e| m.signature(&e.labels)).collect();
    l.into_iter()
        .filter(|e| right.contains(&m.signature(&e.labels)))
        .collect()
}

fn set_or(l: Vec<Elem>, r: Vec<Elem>, m: &Matching<'_>) -> Vec<Elem> {
    let left: FastSet<Labels> = l.iter().map(|e| m.signature(&e.labels)).collect();
    let mut out = l;
    out.extend(
        r.into_iter()
            .filter(|e| !left.contains(&m.signature(&e.labels))),
    );
    out
}

fn set_unless(l: Vec<Elem>, r: Vec<Elem>, m: &Matching<'_>) -> Vec<Elem> {
    if l.is_empty() || r.is_empty() {
        return l;
    }
    let right: FastSet<Labels> = r.iter().map(|e| m.signature(&e.labels)).collect();
    l.into_iter()
        .filter(|e| !right.contains(&m.signature(&e.labels)))
        .collect()
}

fn vector_vector(
    op: Op,
    lhs: Vec<Elem>,
    rhs: Vec<Elem>,
    m: &Matching<'_>,
    card: Option<&VectorMatchCardinality>,
    return_bool: bool,
) -> Result<Vec<Elem>, PromqlError> {
    let (one_to_one, swapped, include): (bool, bool, &[String]) = match card {
        Some(VectorMatchCardinality::ManyToOne(l)) => (false, false, &l.labels),
        Some(VectorMatchCardinality::OneToMany(l)) => (false, true, &l.labels),
        _ => (true, false, &[]),
    };
    // Nothing can match when a side is empty: no duplicate is looked for (as Prometheus).
    if lhs.is_empty() || rhs.is_empty() {
        return Ok(Vec::new());
    }
    // The "many" side is iterated; the other side must be unique per signature.
    let (many, one) = if swapped { (rhs, lhs) } else { (lhs, rhs) };
    let mut one_sigs: FastMap<Labels, &Elem> = FastMap::default();
    for e in &one {
        let sig = m.signature(&e.labels);
        if let Some(dup) = one_sigs.get(&sig) {
            let side = if swapped { "left" } else { "right" };
            return Err(PromqlError::Execution(format!(
                "found duplicate series for the match group {} on the {side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                format_labels(&m.matched_labels(&e.labels)),
                format_labels(&e.labels),
                format_labels(&dup.labels),
            )));
        }
        one_sigs.insert(sig, e);
    }
    let mut matched: FastMap<Labels, FastSet<Labels>> = FastMap::default();
    let mut out = Vec::new();
    for e in &many {
        let sig = m.signature(&e.labels);
        let Some(other) = one_sigs.get(&sig) else {
            continue;
        };
        let (l, r) = if swapped {
            (other.value, e.value)
        } else {
            (e.value, other.value)
        };
        let (mut value, keep) = apply(op, l, r);
        if return_bool {
            value = if keep { 1.0 } else { 0.0 };
        } else if !keep {
            continue;
        }
        let mut labels = result_labels(&e.labels, &other.labels, op, m, one_to_one, include);
        if return_bool {
            labels = labels.without_name();
        }
        if one_to_one {
            if matched.contains_key(&sig) {
                return Err(PromqlError::Execution(
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                        .to_string(),
                ));
            }
            matched.insert(sig, FastSet::default());
        } else {
            let set = matched.entry(sig).or_default();
            if !set.insert(labels.clone()) {
                return Err(PromqlError::Execution(
                    "multiple matches for labels: grouping labels must ensure unique matches"
                        .to_string(),
                ));
            }
        }
        out.push(Elem { labels, value });
    }
    Ok(out)
}

fn result_labels(
    many: &Labels,
    one: &Labels,
    op: Op,
    m: &Matching<'_>,
    one_to_one: bool,
    include: &[String],
) -> Labels {
    let drop_name = op.drops_name();
    let mut pairs: Vec<(String, String)> = many
        .iter()
        .filter(|(n, _)| {
            if drop_name && *n == METRIC_NAME_LABEL {
                return false;
            }
            if one_to_one {
                if m.on {
                    return m.names.contains(n);
                }
                return !m.names.contains(n);
            }
            true
        })
        .filter(|(n, _)| !include.iter().any(|i| i == n))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    for name in include {
        if let Some(v) = one.get(name) {
            pairs.push((name.clone(), v.to_string()));
        }
    }
    Labels::new(pairs)
}
