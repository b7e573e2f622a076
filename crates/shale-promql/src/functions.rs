//! PromQL's functions as of Prometheus 2.42: per-element math, range functions over a
//! window (`rate` and its extrapolation, `*_over_time`, regressions, `holt_winters`), label
//! manipulation, `histogram_quantile` over classic buckets, `absent*`, time and date functions.

use std::rc::Rc;

use promql_parser::parser::{Call, Expr, MatrixSelector};
use shale_metrics::{Labels, Sample, METRIC_NAME_LABEL};

use crate::aggregate::{is_label_name, quantile};
use crate::eval::{
    check_unique, go_max, go_min, string_arg, unwrap_parens, with_label, Elem, Evaluator,
    StepTable, Val,
};
use crate::plan::matchers_of;
use crate::plan::{at_ms, duration_ms, offset_ms};
use crate::PromqlError;
use shale_metrics::MatchOp;

/// Evaluates a function call at `t`.
pub(crate) fn eval_call<'a>(
    ev: &'a Evaluator,
    call: &'a Call,
    t: i64,
) -> Result<Val<'a>, PromqlError> {
    let name = call.func.name;
    let args: Vec<&Expr> = call.args.args.iter().map(|a| a.as_ref()).collect();
    let arg = |i: usize| -> Result<&'a Expr, PromqlError> {
        call.args
            .args
            .get(i)
            .map(|a| a.as_ref())
            .ok_or_else(|| PromqlError::BadData(format!("missing argument {i} of {name}")))
    };
    let out = match name {
        "time" => return Ok(Val::Scalar(t as f64 / 1000.0)),
        "pi" => return Ok(Val::Scalar(std::f64::consts::PI)),
        "scalar" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            return Ok(Val::Scalar(if v.len() == 1 {
                v[0].value
            } else {
                f64::NAN
            }));
        }
        "vector" => vec![Elem {
            labels: Labels::default(),
            value: ev.eval_scalar(arg(0)?, t)?,
        }],
        "abs" | "ceil" | "floor" | "exp" | "sqrt" | "ln" | "log2" | "log10" | "sin" | "cos"
        | "tan" | "asin" | "acos" | "atan" | "sinh" | "cosh" | "tanh" | "asinh" | "acosh"
        | "atanh" | "deg" | "rad" | "sgn" => {
            let f = simple_fn(name);
            map_values(ev.eval_vector(arg(0)?, t)?, f)
        }
        "round" => {
            let to_nearest = match args.get(1) {
                Some(a) => ev.eval_scalar(a, t)?,
                None => 1.0,
            };
            let inverse = 1.0 / to_nearest;
            map_values(ev.eval_vector(arg(0)?, t)?, |v| {
                (v * inverse + 0.5).floor() / inverse
            })
        }
        "clamp" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            let min = ev.eval_scalar(arg(1)?, t)?;
            let max = ev.eval_scalar(arg(2)?, t)?;
            if max < min {
                Vec::new()
            } else {
                map_values(v, |x| go_max(min, go_min(max, x)))
            }
        }
        "clamp_max" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            let max = ev.eval_scalar(arg(1)?, t)?;
            map_values(v, |x| go_min(x, max))
        }
        "clamp_min" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            let min = ev.eval_scalar(arg(1)?, t)?;
            map_values(v, |x| go_max(x, min))
        }
        "day_of_month" | "day_of_week" | "day_of_year" | "days_in_month" | "hour" | "minute"
        | "month" | "year" => {
            let v = match args.first() {
                Some(a) => ev.eval_vector(a, t)?,
                None => vec![Elem {
                    labels: Labels::default(),
                    value: t as f64 / 1000.0,
                }],
            };
            map_values(v, |x| date_part(name, x))
        }
        "timestamp" => {
            let a = unwrap_parens(arg(0)?);
            if let Expr::VectorSelector(vs) = a {
                ev.instant_select(vs, t)
                    .map(|(labels, ts, _)| Elem {
                        labels: labels.without_name(),
                        value: ts as f64 / 1000.0,
                    })
                    .collect()
            } else {
                map_values(ev.eval_vector(a, t)?, |_| t as f64 / 1000.0)
            }
        }
        "absent" => {
            let a = unwrap_parens(arg(0)?);
            let v = ev.eval_vector(a, t)?;
            if v.is_empty() {
                vec![Elem {
                    labels: absent_labels(a)?,
                    value: 1.0,
                }]
            } else {
                Vec::new()
            }
        }
        "sort" | "sort_desc" => {
            let mut v = ev.eval_vector(arg(0)?, t)?;
            let desc = name == "sort_desc";
            v.sort_by(|a, b| {
                let (x, y) = (a.value, b.value);
                // NaN last in both orders, as Prometheus's sorts place it.
                match (x.is_nan(), y.is_nan()) {
                    (true, true) => std::cmp::Ordering::Equal,
                    (true, false) => std::cmp::Ordering::Greater,
                    (false, true) => std::cmp::Ordering::Less,
                    _ if desc => y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal),
                    _ => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
                }
            });
            return Ok(Val::Vector(v));
        }
        "label_replace" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            let dst = string_arg(arg(1)?)?;
            let replacement = string_arg(arg(2)?)?;
            let src = string_arg(arg(3)?)?;
            let regex_src = string_arg(arg(4)?)?;
            let re = regex::Regex::new(&format!("^(?:{regex_src})$")).map_err(|_| {
                PromqlError::Execution(format!(
                    "invalid regular expression in label_replace(): {regex_src}"
                ))
            })?;
            if !is_label_name(&dst) {
                return Err(PromqlError::Execution(format!(
                    "invalid destination label name in label_replace(): {dst}"
                )));
            }
            v.into_iter()
                .map(|e| {
                    let src_val = e.labels.get(&src).unwrap_or("");
                    match re.captures(src_val) {
                        Some(caps) => {
                            let mut res = String::new();
                            caps.expand(&replacement, &mut res);
                            Elem {
                                labels: with_label(&e.labels, &dst, &res),
                                value: e.value,
                            }
                        }
                        None => e,
                    }
                })
                .collect()
        }
        "label_join" => {
            let v = ev.eval_vector(arg(0)?, t)?;
            let dst = string_arg(arg(1)?)?;
            let sep = string_arg(arg(2)?)?;
            let mut srcs = Vec::new();
            for a in args.iter().skip(3) {
                let s = string_arg(a)?;
                if !is_label_name(&s) {
                    return Err(PromqlError::Execution(format!(
                        "invalid source label name in label_join(): {s}"
                    )));
                }
                srcs.push(s);
            }
            if !is_label_name(&dst) {
                return Err(PromqlError::Execution(format!(
                    "invalid destination label name in label_join(): {dst}"
                )));
            }
            v.into_iter()
                .map(|e| {
                    let joined = srcs
                        .iter()
                        .map(|s| e.labels.get(s).unwrap_or(""))
                        .collect::<Vec<_>>()
                        .join(&sep);
                    Elem {
                        labels: with_label(&e.labels, &dst, &joined),
                        value: e.value,
                    }
                })
                .collect()
        }
        "histogram_quantile" => {
            let q = ev.eval_scalar(arg(0)?, t)?;
            let v = ev.eval_vector(arg(1)?, t)?;
            histogram_quantile(q, v)
        }
        "rate" | "increase" | "delta" | "irate" | "idelta" | "deriv" | "changes" | "resets"
        | "avg_over_time" | "min_over_time" | "max_over_time" | "sum_over_time"
        | "count_over_time" | "stddev_over_time" | "stdvar_over_time" | "last_over_time"
        | "present_over_time" | "absent_over_time" | "quantile_over_time" | "predict_linear"
        | "holt_winters" => {
            // Distinct input series give distinct outputs (checked by the function), so
            // the vector needs no uniqueness check.
            let out = range_function(ev, call as *const Call as usize, name, &args, t)?;
            ev.hold(out.len())?;
            return Ok(Val::Vector(out));
        }
        other => {
            return Err(PromqlError::BadData(format!(
                "unknown function with name {other:?}"
            )))
        }
    };
    check_unique(&out)?;
    ev.hold(out.len())?;
    Ok(Val::Vector(out))
}

fn map_values(v: Vec<Elem>, f: impl Fn(f64) -> f64) -> Vec<Elem> {
    v.into_iter()
        .map(|e| Elem {
            labels: e.labels.without_name(),
            value: f(e.value),
        })
        .collect()
}

fn simple_fn(name: &str) -> fn(f64) -> f64 {
    match name {
        "abs" => f64::abs,
        "ceil" => f64::ceil,
        "floor" => f64::floor,
        "exp" => f64::exp,
        "sqrt" => f64::sqrt,
        "ln" => crate::go_math::ln,
        "log2" => crate::go_math::log2,
        "log10" => crate::go_math::log10,
        "sin" => f64::sin,
        "cos" => f64::cos,
        "tan" => f64::tan,
        "asin" => f64::asin,
        "acos" => f64::acos,
        "atan" => f64::atan,
        "sinh" => f64::sinh,
        "cosh" => f64::cosh,
        "tanh" => f64::tanh,
        "asinh" => f64::asinh,
        "acosh" => f64::acosh,
        "atanh" => f64::atanh,
        "deg" => |v| v * 180.0 / std::f64::consts::PI,
        "rad" => |v| v * std::f64::consts::PI / 180.0,
        _ => |v: f64| {
            if v < 0.0 {
                -1.0
            } else if v > 0.0 {
                1.0
            } else {
                v
            }
        },
    }
}

/// The labels `absent` gives: the selector's equality matchers, but `__name__` and labels
/// matched more than once or otherwise.
fn absent_labels(expr: &Expr) -> Result<Labels, PromqlError> {
    let vs = match unwrap_parens(expr) {
        Expr::VectorSelector(vs) => vs,
        Expr::MatrixSelector(ms) => &ms.vs,
        _ => return Ok(Labels::default()),
    };
    // Prometheus's label builder, matcher by matcher: the first equality on a name sets it,
    // any other matcher on that name removes it — until a later first equality sets it again
    // (`{a!="x", a="y"}` keeps `a="y"`; `{a="x", a="y"}` keeps nothing).
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut set: Vec<String> = Vec::new();
    for m in matchers_of(vs)? {
        if m.name == METRIC_NAME_LABEL {
            continue;
        }
        pairs.retain(|(n, _)| *n != m.name);
        if m.op == MatchOp::Equal && !set.contains(&m.name) {
            pairs.push((m.name.clone(), m.value.clone()));
            set.push(m.name.clone());
        }
    }
    Ok(Labels::new(pairs))
}

/// Go's `int64(v)` on amd64, as Prometheus converts sample values to Unix seconds: toward
/// zero, and the smallest int64 for NaN, ±Inf and values out of its range.
fn go_int64(v: f64) -> i64 {
    // 2^63: the first value past int64.
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&v) {
        i64::MIN
    } else {
        v as i64
    }
}

/// A date of Go's `time.Unix(sec, 0).UTC()`, computed as Go 1.19/1.20 (Prometheus 2.42's)
/// does, on its unsigned "absolute" seconds — so that times Go wraps around (the smallest
/// int64, for NaN and ±Inf) give Go's answers too.
struct GoDate {
    year: i64,
    /// 1 to 12.
    month: i64,
    /// 1 to 31.
    day: i64,
    /// 0-based day of the year.
    yday: i64,
    hour: i64,
    minute: i64,
    /// 0 (Sunday) to 6.
    weekday: i64,
}

/// Go's `absoluteZeroYear`.
const GO_ABSOLUTE_ZERO_YEAR: i64 = -292_277_022_399;
/// Go's `unixToInternal + internalToAbsolute`.
const GO_UNIX_TO_ABSOLUTE: i64 = 9_223_372_028_715_321_600;

fn go_is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Days before the start of each month of a non-leap year (Go's `daysBefore`).
const GO_DAYS_BEFORE: [i64; 13] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365];

fn go_date(sec: i64) -> GoDate {
    const DAY: u64 = 86_400;
    const DAYS_PER_400_YEARS: u64 = 365 * 400 + 97;
    const DAYS_PER_100_YEARS: u64 = 365 * 100 + 24;
    const DAYS_PER_4_YEARS: u64 = 365 * 4 + 1;
    let abs = sec.wrapping_add(GO_UNIX_TO_ABSOLUTE) as u64;
    let mut d = abs / DAY;
    let mut n = d / DAYS_PER_400_YEARS;
    let mut y = 400 * n;
    d -= DAYS_PER_400_YEARS * n;
    n = d / DAYS_PER_100_YEARS;
    n -= n >> 2;
    y += 100 * n;
    d -= DAYS_PER_100_YEARS * n;
    n = d / DAYS_PER_4_YEARS;
    y += 4 * n;
    d -= DAYS_PER_4_YEARS * n;
    n = d / 365;
    n -= n >> 2;
    y += n;
    d -= 365 * n;
    let year = (y as i64).wrapping_add(GO_ABSOLUTE_ZERO_YEAR);
    let yday = d as i64;
    let mut day = yday;
    let (month, day) = 'month: {
        if go_is_leap(year) {
            if day == 31 + 29 - 1 {
                break 'month (2, 29);
            }
            if day > 31 + 29 - 1 {
                day -= 1;
            }
        }
        let mut month = day / 31;
        let end = GO_DAYS_BEFORE[(month + 1) as usize];
        let begin = if day >= end {
            month += 1;
            end
        } else {
            GO_DAYS_BEFORE[month as usize]
        };
        (month + 1, day - begin + 1)
    };
    let in_day = abs % DAY;
    // Go's absWeekday: the absolute epoch is a Monday.
    let weekday = ((abs.wrapping_add(DAY) % (7 * DAY)) / DAY) as i64;
    GoDate {
        year,
        month,
        day,
        yday,
        hour: (in_day / 3600) as i64,
        minute: (in_day % 3600 / 60) as i64,
        weekday,
    }
}

/// Days in `month` of `year` (Go's `time.Date(year, month, 32, …)` trick).
fn go_days_in_month(year: i64, month: i64) -> i64 {
    if month == 2 && go_is_leap(year) {
        29
    } else {
        GO_DAYS_BEFORE[month as usize] - GO_DAYS_BEFORE[(month - 1) as usize]
    }
}

/// A date part of a Unix time in seconds (UTC), as Prometheus's date functions give it (Go's
/// conversions included: see [`go_int64`] and [`go_date`]).
fn date_part(name: &str, value: f64) -> f64 {
    let date = go_date(go_int64(value));
    let v = match name {
        "day_of_month" => date.day,
        "day_of_week" => date.weekday,
        "day_of_year" => date.yday + 1,
        "days_in_month" => go_days_in_month(date.year, date.month),
        "hour" => date.hour,
        "minute" => date.minute,
        "month" => date.month,
        _ => date.year,
    };
    v as f64
}

/// `histogram_quantile` over classic buckets (`le` labels).
fn histogram_quantile(q: f64, v: Vec<Elem>) -> Vec<Elem> {
    let mut keys: std::collections::HashMap<Labels, usize> = std::collections::HashMap::new();
    let mut groups: Vec<(Labels, Vec<(f64, f64)>)> = Vec::new();
    for e in v {
        let Some(le) = e.labels.get("le") else {
            continue;
        };
        let Some(upper) = parse_go_float(le) else {
            continue;
        };
        let key = Labels::new(
            e.labels
                .iter()
                .filter(|(n, _)| *n != "le")
                .map(|(n, v)| (n.to_string(), v.to_string())),
        );
        let gi = match keys.get(&key) {
            Some(&gi) => gi,
            None => {
                let out_labels = key.without_name();
                keys.insert(key, groups.len());
                groups.push((out_labels, Vec::new()));
                groups.len() - 1
            }
        };
        groups[gi].1.push((upper, e.value));
    }
    groups
        .into_iter()
        .map(|(labels, mut buckets)| Elem {
            labels,
            value: bucket_quantile(q, &mut buckets),
        })
        .collect()
}

fn parse_go_float(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "inf" | "+inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok(),
    }
}

fn bucket_quantile(q: f64, buckets: &mut [(f64, f64)]) -> f64 {
    if q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    match buckets.last() {
        Some(last) if last.0 == f64::INFINITY => {}
        _ => return f64::NAN,
    }
    // Coalesce buckets with the same upper bound.
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
    for &(ub, c) in buckets.iter() {
        match merged.last_mut() {
            Some(last) if last.0 == ub => last.1 += c,
            _ => merged.push((ub, c)),
        }
    }
    // Force the counts to be monotonic.
    let mut max = f64::NEG_INFINITY;
    for b in merged.iter_mut() {
        if b.1 > max {
            max = b.1;
        } else if b.1 < max {
            b.1 = max;
        }
    }
    if merged.len() < 2 {
        return f64::NAN;
    }
    let observations = merged[merged.len() - 1].1;
    if observations == 0.0 {
        return f64::NAN;
    }
    let mut rank = q * observations;
    let n = merged.len() - 1;
    // Go's sort.Search, probe for probe: with a NaN count the predicate is not monotonic,
    // and the bucket found depends on the probes.
    let b = go_search(n, |i| merged[i].1 >= rank);
    if b == n {
        return merged[n - 1].0;
    }
    if b == 0 && merged[0].0 <= 0.0 {
        return merged[0].0;
    }
    let mut start = 0.0;
    let end = merged[b].0;
    let mut count = merged[b].1;
    if b > 0 {
        start = merged[b - 1].0;
        count -= merged[b - 1].1;
        rank -= merged[b - 1].1;
    }
    start + (end - start) * (rank / count)
}

/// Go's `sort.Search(n, f)`: the smallest index in `[0, n)` where `f` holds, by the same
/// bisection (so the same answer when `f` is not monotonic).
fn go_search(n: usize, f: impl Fn(usize) -> bool) -> usize {
    let (mut i, mut j) = (0, n);
    while i < j {
        let h = (i + j) / 2;
        if !f(h) {
            i = h + 1;
        } else {
            j = h;
        }
    }
    i
}

/// Neumaier's compensated summation step, as Prometheus uses it.
fn kahan_inc(inc: f64, sum: f64, c: f64) -> (f64, f64) {
    let t = sum + inc;
    let c = if sum.abs() >= inc.abs() {
        c + ((sum - t) + inc)
    } else {
        c + ((inc - t) + sum)
    };
    (t, c)
}

/// Least-squares slope and intercept, x in seconds relative to `intercept_ms`.
fn linear_regression(samples: &[Sample], intercept_ms: i64) -> (f64, f64) {
    let init_y = samples[0].value;
    let mut const_y = true;
    let (mut n, mut sx, mut cx, mut sy, mut cy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let (mut sxy, mut cxy, mut sx2, mut cx2) = (0.0, 0.0, 0.0, 0.0);
    for (i, s) in samples.iter().enumerate() {
        if const_y && i > 0 && s.value != init_y {
            const_y = false;
        }
        n += 1.0;
        let x = (s.timestamp_ms - intercept_ms) as f64 / 1e3;
        (sx, cx) = kahan_inc(x, sx, cx);
        (sy, cy) = kahan_inc(s.value, sy, cy);
        (sxy, cxy) = kahan_inc(x * s.value, sxy, cxy);
        (sx2, cx2) = kahan_inc(x * x, sx2, cx2);
    }
    if const_y {
        if init_y.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        return (0.0, init_y);
    }
    let (sx, sy, sxy, sx2) = (sx + cx, sy + cy, sxy + cxy, sx2 + cx2);
    let cov_xy = sxy - sx * sy / n;
    let var_x = sx2 - sx * sx / n;
    let slope = cov_xy / var_x;
    let intercept = sy / n - slope * sx / n;
    (slope, intercept)
}

/// `rate`, `increase` and `delta` with Prometheus's extrapolation.
fn extrapolated_rate(w: Span, s: &[Sample], is_counter: bool, is_rate: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let first = s[0];
    let last = s[s.len() - 1];
    let mut result = last.value - first.value;
    if is_counter {
        let mut prev = 0.0;
        for x in s {
            if x.value < prev {
                result += prev;
            }
            prev = x.value;
        }
    }
    let mut to_start = (first.timestamp_ms - w.start_ms) as f64 / 1000.0;
    let to_end = (w.end_ms - last.timestamp_ms) as f64 / 1000.0;
    let sampled = (last.timestamp_ms - first.timestamp_ms) as f64 / 1000.0;
    let avg_step = sampled / (s.len() - 1) as f64;
    if is_counter && result > 0.0 && first.value >= 0.0 {
        let to_zero = sampled * (first.value / result);
        if to_zero < to_start {
            to_start = to_zero;
        }
    }
    let threshold = avg_step * 1.1;
    let mut interval = sampled;
    interval += if to_start < threshold {
        to_start
    } else {
        avg_step / 2.0
    };
    interval += if to_end < threshold {
        to_end
    } else {
        avg_step / 2.0
    };
    // One factor, then one product: Prometheus 2.42's order of operations, to the last digit.
    let mut factor = interval / sampled;
    if is_rate {
        factor /= w.range_ms as f64 / 1000.0;
    }
    Some(result * factor)
}

fn instant_delta(s: &[Sample], is_rate: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let last = s[s.len() - 1];
    let prev = s[s.len() - 2];
    let mut result = if is_rate && last.value < prev.value {
        last.value
    } else {
        last.value - prev.value
    };
    let interval = last.timestamp_ms - prev.timestamp_ms;
    if interval == 0 {
        return None;
    }
    if is_rate {
        result /= interval as f64 / 1000.0;
    }
    Some(result)
}

/// Prometheus's checks of `holt_winters`' smoothing and trend factors.
fn check_holt_winters_factors(sf: f64, tf: f64) -> Result<(), PromqlError> {
    // NaN fails neither comparison, as in Go.
    if sf <= 0.0 || sf >= 1.0 {
        return Err(PromqlError::Execution(format!(
            "invalid smoothing factor. Expected: 0 < sf < 1, got: {sf:.6}"
        )));
    }
    if tf <= 0.0 || tf >= 1.0 {
        return Err(PromqlError::Execution(format!(
            "invalid trend factor. Expected: 0 < tf < 1, got: {tf:.6}"
        )));
    }
    Ok(())
}

fn holt_winters(s: &[Sample], sf: f64, tf: f64) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (mut s0, mut s1) = (0.0, s[0].value);
    let mut b = s[1].value - s[0].value;
    for (i, x) in s.iter().enumerate().skip(1) {
        let scaled = sf * x.value;
        if i > 1 {
            b = tf * (s1 - s0) + (1.0 - tf) * b;
        }
        let y = (1.0 - sf) * (s1 + b);
        s0 = s1;
        s1 = scaled + y;
    }
    Some(s1)
}

fn range_function(
    ev: &Evaluator,
    call_key: usize,
    name: &str,
    args: &[&Expr],
    t: i64,
) -> Result<Vec<Elem>, PromqlError> {
    // The range argument: the first matrix selector or subquery.
    let mut matrix_index = None;
    for (i, a) in args.iter().enumerate() {
        if matches!(
            unwrap_parens(a),
            Expr::MatrixSelector(_) | Expr::Subquery(_)
        ) {
            matrix_index = Some(i);
            break;
        }
    }
    let Some(mi) = matrix_index else {
        return Err(PromqlError::BadData(format!(
            "expected a range vector argument to {name}"
        )));
    };
    let scalar_at = |i: usize| -> Result<f64, PromqlError> {
        match args.get(i) {
            Some(a) => ev.eval_scalar(a, t),
            None => Err(PromqlError::BadData(format!(
                "missing argument {i} of {name}"
            ))),
        }
    };
    let param = match name {
        "quantile_over_time" => scalar_at(0)?,
        "predict_linear" => scalar_at(1)?,
        _ => 0.0,
    };
    let (sf, tf) = if name == "holt_winters" {
        (scalar_at(1)?, scalar_at(2)?)
    } else {
        (0.0, 0.0)
    };
    if precomputable(name) {
        if let Expr::MatrixSelector(ms) = unwrap_parens(args[mi]) {
            if let Some(out) =
                ev.precomputed_steps(call_key, t, || precompute(ev, call_key, name, ms))?
            {
                return Ok(out);
            }
        }
    }
    let window = ev.eval_window(args[mi], t)?;
    // Prometheus checks the factors in the function itself, called for each series with
    // samples in the window: with none, bad factors are no error.
    if name == "holt_winters" && window.series.iter().any(|s| !s.samples.is_empty()) {
        check_holt_winters_factors(sf, tf)?;
    }
    if name == "absent_over_time" {
        if window.series.iter().any(|s| !s.samples.is_empty()) {
            return Ok(Vec::new());
        }
        return Ok(vec![Elem {
            labels: absent_labels(args[mi])?,
            value: 1.0,
        }]);
    }
    // `predict_linear` regresses against the evaluation time, not shifted by the offset; an
    // `@` argument is step-invariant, evaluated (by Prometheus) once at the query's start.
    let pinned = match unwrap_parens(args[mi]) {
        Expr::MatrixSelector(ms) => ms.vs.at.is_some(),
        Expr::Subquery(sq) => sq.at.is_some(),
        _ => false,
    };
    let eval_time = if pinned { ev.window.start_ms } else { t };
    let span = Span {
        start_ms: window.start_ms,
        end_ms: window.end_ms,
        range_ms: window.range_ms,
    };
    let args = RangeArgs {
        param,
        sf,
        tf,
        eval_time,
    };
    let mut out = Vec::with_capacity(window.series.len());
    for series in &window.series {
        let s: &[Sample] = &series.samples;
        if s.is_empty() {
            continue;
        }
        if let Some(value) = range_value(name, span, s, &args) {
            let labels = if name == "last_over_time" {
                series.labels.clone().into_owned()
            } else {
                // Prometheus checks the whole output matrix of the function, over every
                // step: two input series giving one label set is an error even at
                // different steps.
                ev.range_output_labels(call_key, &series.labels)?
            };
            out.push(Elem { labels, value });
        }
    }
    Ok(out)
}

/// The table of every step of `call` and the step `t` is, when the call can be computed for
/// every step at once: a range query, a [`precomputable`] function of one matrix selector.
pub(crate) fn step_table_of(
    ev: &Evaluator,
    call: &Call,
    t: i64,
) -> Result<Option<(Rc<StepTable>, usize)>, PromqlError> {
    let name = call.func.name;
    let [arg] = call.args.args.as_slice() else {
        return Ok(None);
    };
    let Expr::MatrixSelector(ms) = unwrap_parens(arg) else {
        return Ok(None);
    };
    if !precomputable(name) {
        return Ok(None);
    }
    let call_key = call as *const Call as usize;
    ev.step_table(call_key, t, || precompute(ev, call_key, name, ms))
}

/// The window of a range function at one step.
#[derive(Clone, Copy)]
struct Span {
    /// Lower bound (inclusive).
    start_ms: i64,
    /// Upper bound (inclusive).
    end_ms: i64,
    /// The selector's range.
    range_ms: i64,
}

/// The scalar arguments of a range function at one step.
#[derive(Clone, Copy)]
struct RangeArgs {
    param: f64,
    sf: f64,
    tf: f64,
    eval_time: i64,
}

/// Range functions whose value at a step depends on the window's samples alone (no scalar
/// argument, no evaluation time): a range query computes them for every step at once.
fn precomputable(name: &str) -> bool {
    matches!(
        name,
        "rate"
            | "increase"
            | "delta"
            | "irate"
            | "idelta"
            | "deriv"
            | "changes"
            | "resets"
            | "avg_over_time"
            | "min_over_time"
            | "max_over_time"
            | "sum_over_time"
            | "count_over_time"
            | "stddev_over_time"
            | "stdvar_over_time"
            | "last_over_time"
            | "present_over_time"
    )
}

/// A [`precomputable`] function of a matrix selector at every step of the range query,
/// series by series.
fn precompute(
    ev: &Evaluator,
    call_key: usize,
    name: &str,
    ms: &MatrixSelector,
) -> Result<StepTable, PromqlError> {
    let Some(steps) = ev.steps() else {
        return Err(PromqlError::Execution(
            "internal: precomputing outside a range query".to_string(),
        ));
    };
    let vs = &ms.vs;
    let plan = StepWindows {
        steps,
        range_ms: duration_ms(&ms.range),
        at: at_ms(&vs.at, &ev.window),
        offset: offset_ms(&vs.offset),
        name,
    };
    let data = ev.selector_series(vs);
    // The series' values on several threads when there is enough work (each series is
    // independent); then the table in series order, as one thread would build it.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(data.len() / 64 + 1);
    let work = data.len().saturating_mul(steps.count);
    let chunks: Vec<SeriesSteps> = if threads > 1 && work >= PARALLEL_STEP_WORK {
        let size = data.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let mut parts = data.chunks(size);
            let first = parts.next().unwrap_or(&[]);
            let handles: Vec<_> = parts.map(|part| scope.spawn(|| plan.run(part))).collect();
            let mut chunks = vec![plan.run(first)];
            for handle in handles {
                match handle.join() {
                    Ok(chunk) => chunks.push(chunk),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            chunks
        })
    } else {
        vec![plan.run(data)]
    };
    let mut table = StepTable {
        rows: vec![Vec::new(); steps.count],
        held: vec![0; steps.count],
        labels: vec![Labels::default(); data.len()],
    };
    let mut i = 0usize;
    for chunk in chunks {
        for (k, held) in chunk.held.iter().enumerate() {
            table.held[k] += held;
        }
        for values in chunk.values {
            let series = &data[i];
            if !values.is_empty() {
                table.labels[i] = if name == "last_over_time" {
                    series.labels.clone()
                } else {
                    ev.range_output_labels(call_key, &series.labels)?
                };
                for (k, value) in values {
                    table.rows[k as usize].push((i as u32, value));
                }
            }
            i += 1;
        }
    }
    Ok(table)
}

/// Series × steps from which a step table is computed on several threads.
const PARALLEL_STEP_WORK: usize = 100_000;

/// How a range function's windows move over the steps of a range query.
struct StepWindows<'a> {
    steps: crate::eval::Steps,
    range_ms: i64,
    at: Option<i64>,
    offset: i64,
    name: &'a str,
}

/// The values of consecutive series at every step.
struct SeriesSteps {
    /// Per series: (step, value) where it has one.
    values: Vec<Vec<(u32, f64)>>,
    /// Per step: samples in the windows of these series.
    held: Vec<usize>,
}

impl StepWindows<'_> {
    /// The function of each of `series` at every step: each series' window moves forward
    /// over its samples (each sample is visited a few times, in memory order) instead of
    /// being searched at every step.
    fn run(&self, series: &[crate::plan::SeriesData]) -> SeriesSteps {
        let steps = self.steps;
        let no_args = RangeArgs {
            param: 0.0,
            sf: 0.0,
            tf: 0.0,
            eval_time: 0,
        };
        let mut out = SeriesSteps {
            values: Vec::with_capacity(series.len()),
            held: vec![0; steps.count],
        };
        for s in series {
            let samples = &s.clean;
            let (mut lo, mut hi) = (0, 0);
            let mut values = Vec::new();
            for k in 0..steps.count {
                let t = steps
                    .start_ms
                    .saturating_add(steps.step_ms.saturating_mul(k as i64));
                let end = self.at.unwrap_or(t).saturating_sub(self.offset);
                let start = end.saturating_sub(self.range_ms);
                while lo < samples.len() && samples[lo].timestamp_ms < start {
                    lo += 1;
                }
                hi = hi.max(lo);
                while hi < samples.len() && samples[hi].timestamp_ms <= end {
                    hi += 1;
                }
                if lo >= hi {
                    continue;
                }
                out.held[k] += hi - lo;
                let span = Span {
                    start_ms: start,
                    end_ms: end,
                    range_ms: self.range_ms,
                };
                if let Some(value) = range_value(self.name, span, &samples[lo..hi], &no_args) {
                    values.push((k as u32, value));
                }
            }
            out.values.push(values);
        }
        out
    }
}

/// The value of range function `name` over the window samples `s` (not empty).
fn range_value(name: &str, w: Span, s: &[Sample], args: &RangeArgs) -> Option<f64> {
    let RangeArgs {
        param,
        sf,
        tf,
        eval_time,
    } = *args;
    match name {
        "rate" => extrapolated_rate(w, s, true, true),
        "increase" => extrapolated_rate(w, s, true, false),
        "delta" => extrapolated_rate(w, s, false, false),
        "irate" => instant_delta(s, true),
        "idelta" => instant_delta(s, false),
        "deriv" => (s.len() >= 2).then(|| linear_regression(s, s[0].timestamp_ms).0),
        "predict_linear" => (s.len() >= 2).then(|| {
            let (slope, intercept) = linear_regression(s, eval_time);
            slope * param + intercept
        }),
        "holt_winters" => holt_winters(s, sf, tf),
        "changes" => Some(
            s.windows(2)
                .filter(|p| {
                    p[1].value != p[0].value && !(p[1].value.is_nan() && p[0].value.is_nan())
                })
                .count() as f64,
        ),
        "resets" => Some(s.windows(2).filter(|p| p[1].value < p[0].value).count() as f64),
        "avg_over_time" => {
            let (mut mean, mut c, mut count): (f64, f64, f64) = (0.0, 0.0, 0.0);
            for x in s {
                count += 1.0;
                if mean.is_infinite() {
                    if x.value.is_infinite() && (mean > 0.0) == (x.value > 0.0) {
                        continue;
                    }
                    if !x.value.is_infinite() && !x.value.is_nan() {
                        continue;
                    }
                }
                (mean, c) = kahan_inc(x.value / count - mean / count, mean, c);
            }
            Some(if mean.is_infinite() { mean } else { mean + c })
        }
        "min_over_time" => {
            let mut m = s[0].value;
            for x in s {
                if x.value < m || m.is_nan() {
                    m = x.value;
                }
            }
            Some(m)
        }
        "max_over_time" => {
            let mut m = s[0].value;
            for x in s {
                if x.value > m || m.is_nan() {
                    m = x.value;
                }
            }
            Some(m)
        }
        "sum_over_time" => {
            let (mut sum, mut c) = (0.0, 0.0);
            for x in s {
                (sum, c) = kahan_inc(x.value, sum, c);
            }
            Some(if sum.is_infinite() { sum } else { sum + c })
        }
        "count_over_time" => Some(s.len() as f64),
        "stddev_over_time" | "stdvar_over_time" => {
            let (mut count, mut mean, mut c_mean, mut aux, mut c_aux) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for x in s {
                count += 1.0;
                let delta = x.value - (mean + c_mean);
                (mean, c_mean) = kahan_inc(delta / count, mean, c_mean);
                (aux, c_aux) = kahan_inc(delta * (x.value - (mean + c_mean)), aux, c_aux);
            }
            let var = (aux + c_aux) / count;
            Some(if name == "stddev_over_time" {
                var.sqrt()
            } else {
                var
            })
        }
        "last_over_time" => Some(s[s.len() - 1].value),
        "present_over_time" => Some(1.0),
        "quantile_over_time" => {
            let mut values: Vec<f64> = s.iter().map(|x| x.value).collect();
            Some(quantile(param, &mut values))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(sec: i64) -> (i64, i64, i64, i64, i64, i64, i64) {
        let d = go_date(sec);
        (d.year, d.month, d.day, d.yday, d.hour, d.minute, d.weekday)
    }

    #[test]
    fn dates_are_gos() {
        // 1970-01-01 00:00 was a Thursday.
        assert_eq!(parts(0), (1970, 1, 1, 0, 0, 0, 4));
        // 2023-11-14 22:13:20, a Tuesday, day 318.
        assert_eq!(parts(1_700_000_000), (2023, 11, 14, 317, 22, 13, 2));
        // A leap day, and the day after.
        assert_eq!(parts(951_782_400), (2000, 2, 29, 59, 0, 0, 2));
        assert_eq!(parts(951_868_800), (2000, 3, 1, 60, 0, 0, 3));
        // Before 1970: 1969-12-31 23:59:59, a Wednesday.
        assert_eq!(parts(-1), (1969, 12, 31, 364, 23, 59, 3));
        assert_eq!(go_days_in_month(2000, 2), 29);
        assert_eq!(go_days_in_month(1900, 2), 28);
        assert_eq!(go_days_in_month(2023, 4), 30);
    }

    #[test]
    fn values_convert_to_seconds_as_go_does() {
        assert_eq!(go_int64(1.9), 1);
        assert_eq!(go_int64(-1.9), -1);
        for odd in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e19, -1e19] {
            assert_eq!(go_int64(odd), i64::MIN, "{odd}");
        }
        // The smallest int64 wraps around Go's absolute time: Go's
        // time.Unix(math.MinInt64, 0).UTC() is 292277026596-12-04 15:30:08, a Sunday.
        assert_eq!(parts(i64::MIN), (292_277_026_596, 12, 4, 338, 15, 30, 0));
        let _ = go_date(i64::MAX);
    }

    #[test]
    fn gos_search_follows_its_probes() {
        let counts = [1.0, f64::NAN, 5.0, 9.0];
        // Probe 2 (5 >= 4) holds, probe 1 (NaN) does not: index 2, where a
        // partition point over the NaN would have said 1.
        assert_eq!(go_search(4, |i| counts[i] >= 4.0), 2);
        assert_eq!(go_search(0, |_| true), 0);
    }
}
