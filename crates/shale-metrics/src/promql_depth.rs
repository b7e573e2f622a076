//! PromQL parsed with a bound on its nesting. The parser checks each operator's operands
//! recursively, and everything after it walks the expression recursively (evaluation,
//! planning, even dropping it), so a query of a few thousand nested levels (`1 + 1 + … + 1`,
//! `abs(abs(…))`) would overflow a thread's stack. Two bounds, both errors that name them:
//!
//! - before parsing, on the text: parentheses nested at most [`MAX_PROMQL_DEPTH`] deep, at most
//!   [`MAX_PROMQL_OPERATORS`] operators (which bounds what the parser recurses through);
//! - after parsing, on the expression: at most [`MAX_PROMQL_DEPTH`] levels, measured (and a
//!   too-deep expression taken apart) without recursion.

use promql_parser::parser::{Expr, NumberLiteral};

/// The deepest expression a PromQL query may have (every operator, call, parenthesis and
/// aggregation is a level).
pub const MAX_PROMQL_DEPTH: usize = 64;

/// The most operators (`+`, `-`, `*`, `/`, `%`, `^`, comparisons, `and`, `or`, `unless`,
/// `atan2`) a PromQL query may have.
pub const MAX_PROMQL_OPERATORS: usize = 1024;

/// Parses `query`, refusing (with a message naming the limit) one nested deeper than
/// [`MAX_PROMQL_DEPTH`] or with more than [`MAX_PROMQL_OPERATORS`] operators.
pub fn parse_bounded(query: &str) -> Result<Expr, String> {
    check_text(query)?;
    let expr = promql_parser::parser::parse(query)?;
    let depth = depth(&expr);
    if depth > MAX_PROMQL_DEPTH {
        dismantle(expr);
        return Err(format!(
            "the query is nested {depth} levels deep: at most {MAX_PROMQL_DEPTH} levels \
             (operators, calls, parentheses) are allowed, the maximum PromQL depth"
        ));
    }
    Ok(expr)
}

/// The text-level bounds: parentheses nesting and operators, outside strings and comments
/// (a number's exponent sign counts as an operator: the count is an upper bound).
fn check_text(query: &str) -> Result<(), String> {
    let bytes = query.as_bytes();
    let (mut nesting, mut deepest, mut operators) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' | b'\'' | b'`' => {
                // A string: skip to its closing quote (backslash escapes but in raw strings).
                i += 1;
                while i < bytes.len() && bytes[i] != b {
                    if bytes[i] == b'\\' && b != b'`' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' => {
                nesting += 1;
                deepest = deepest.max(nesting);
            }
            b')' => nesting = nesting.saturating_sub(1),
            b'+' | b'-' | b'*' | b'/' | b'%' | b'^' | b'<' | b'>' => operators += 1,
            // `==` and `!=` (`=~` and `!~` only appear in label matchers: not counted).
            b'=' | b'!' if bytes.get(i + 1) == Some(&b'=') => {
                operators += 1;
                i += 1;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &query[start..i];
                if ["and", "or", "unless", "atan2"]
                    .iter()
                    .any(|op| word.eq_ignore_ascii_case(op))
                {
                    operators += 1;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if deepest > MAX_PROMQL_DEPTH {
        return Err(format!(
            "the query nests parentheses {deepest} deep: at most {MAX_PROMQL_DEPTH} levels are \
             allowed, the maximum PromQL depth"
        ));
    }
    if operators > MAX_PROMQL_OPERATORS {
        return Err(format!(
            "the query has more than {MAX_PROMQL_OPERATORS} operators, the maximum for a PromQL \
             query (and it would be nested beyond the maximum PromQL depth)"
        ));
    }
    Ok(())
}

/// The sub-expressions of `expr`.
fn children(expr: &Expr) -> Vec<&Expr> {
    match expr {
        Expr::Aggregate(agg) => std::iter::once(agg.expr.as_ref())
            .chain(agg.param.as_deref())
            .collect(),
        Expr::Unary(unary) => vec![unary.expr.as_ref()],
        Expr::Binary(binary) => vec![binary.lhs.as_ref(), binary.rhs.as_ref()],
        Expr::Paren(paren) => vec![paren.expr.as_ref()],
        Expr::Subquery(subquery) => vec![subquery.expr.as_ref()],
        Expr::Call(call) => call.args.args.iter().map(AsRef::as_ref).collect(),
        Expr::NumberLiteral(_)
        | Expr::StringLiteral(_)
        | Expr::VectorSelector(_)
        | Expr::MatrixSelector(_)
        | Expr::Extension(_) => Vec::new(),
    }
}

/// The depth of `expr` (a leaf is 1), measured without recursion.
fn depth(expr: &Expr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(expr, 1usize)];
    while let Some((expr, level)) = stack.pop() {
        deepest = deepest.max(level);
        stack.extend(children(expr).into_iter().map(|child| (child, level + 1)));
    }
    deepest
}

/// Drops `expr` without recursion: each node's children are taken out before it is dropped.
fn dismantle(expr: Expr) {
    let placeholder = || Expr::NumberLiteral(NumberLiteral { val: 0.0 });
    let take = |boxed: &mut Box<Expr>| std::mem::replace(boxed.as_mut(), placeholder());
    let mut stack = vec![expr];
    while let Some(mut expr) = stack.pop() {
        match &mut expr {
            Expr::Aggregate(agg) => {
                stack.push(take(&mut agg.expr));
                if let Some(param) = agg.param.as_mut() {
                    stack.push(take(param));
                }
            }
            Expr::Unary(unary) => stack.push(take(&mut unary.expr)),
            Expr::Binary(binary) => {
                stack.push(take(&mut binary.lhs));
                stack.push(take(&mut binary.rhs));
            }
            Expr::Paren(paren) => stack.push(take(&mut paren.expr)),
            Expr::Subquery(subquery) => stack.push(take(&mut subquery.expr)),
            Expr::Call(call) => stack.extend(call.args.args.iter_mut().map(take)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_expressions_are_refused_on_a_small_stack_and_others_kept() {
        // A thread with a small stack: the refusal itself must not recurse per level.
        let result = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let chain = format!("1{}", " + 1".repeat(20_000));
                let calls = format!("{}vector(1){}", "abs(".repeat(20_000), ")".repeat(20_000));
                let parens = format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000));
                [chain, calls, parens].map(|q| parse_bounded(&q).map(|_| ()))
            })
            .unwrap()
            .join()
            .unwrap();
        for outcome in result {
            let err = outcome.unwrap_err();
            assert!(err.contains("maximum PromQL depth"), "{err}");
        }
        // Operators within the text limit, nested beyond the depth limit: refused after
        // parsing, without recursion.
        let deep = format!("{}1{}", "-(".repeat(40), ")".repeat(40));
        let err = parse_bounded(&deep).unwrap_err();
        assert!(err.contains("levels deep"), "{err}");
        // Strings and label matchers do not count.
        let strings = format!(
            "label_replace(up{{job=~\"a|b\", x!=\"{}\"}}, \"d\", \"$1\", \"s\", \"(.*)\")",
            "+(".repeat(2000)
        );
        assert!(parse_bounded(&strings).is_ok(), "{strings}");
        let fine = format!("1{}", " + 1".repeat(MAX_PROMQL_DEPTH - 2));
        assert!(parse_bounded(&fine).is_ok());
        let too_deep = format!("1{}", " + 1".repeat(MAX_PROMQL_DEPTH));
        assert!(parse_bounded(&too_deep).is_err());
        assert!(parse_bounded("sum by (job) (rate(http_requests_total[5m]))").is_ok());
    }
}
