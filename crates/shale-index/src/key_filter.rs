//! Key-range pruning for locality indexes: from a query, the sort-key intervals every
//! matching document's key lies in, so that a split whose `[sort_key_min, sort_key_max]`
//! meets none of them is not opened.
//!
//! Conservative by construction (a superset of the keys of matching documents), from the
//! query's AST:
//! - `f0:v`, `f0:IN [a b]`, `f0:[a TO b]` on the leading sort field;
//! - a conjunction: exact values of the leading sort fields combine into key prefixes
//!   (`service:a AND host:b`), a range may follow the last exact field; required sub-clauses
//!   intersect;
//! - a disjunction of constrained clauses: their union.
//!
//! Anything else (a negation, a prefix or wildcard, a field that is not a leading sort field,
//! a value that does not parse for the field's type) constrains nothing.

use shale_types::sort_key::{self, SortFieldType, SortKey, SortValue};
use tantivy::query::Occur;
use tantivy::query_grammar::{UserInputAst, UserInputBound, UserInputLeaf};

use crate::doc_mapper::DocMapper;

/// Most intervals a filter keeps (beyond that it gives up: no pruning).
const MAX_INTERVALS: usize = 4096;

/// The key intervals `[low, high)` the documents matching a query have their keys in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFilter {
    intervals: Vec<(Vec<u8>, Vec<u8>)>,
}

impl KeyFilter {
    /// Whether a split whose keys lie in `[min, max]` may hold a matching document.
    pub fn may_match(&self, min: &SortKey, max: &SortKey) -> bool {
        self.intervals.iter().any(|(low, high)| {
            min.0.as_slice() < high.as_slice() && low.as_slice() <= max.0.as_slice()
        })
    }

    /// Whether no key can match (e.g. `service:a AND service:b`).
    pub fn is_empty(&self) -> bool {
        self.intervals.is_empty()
    }

    fn intersect(&self, other: &KeyFilter) -> Option<KeyFilter> {
        let mut intervals = Vec::new();
        for (a_low, a_high) in &self.intervals {
            for (b_low, b_high) in &other.intervals {
                let low = a_low.max(b_low);
                let high = a_high.min(b_high);
                if low < high {
                    intervals.push((low.clone(), high.clone()));
                }
                if intervals.len() > MAX_INTERVALS {
                    return None;
                }
            }
        }
        Some(KeyFilter { intervals })
    }
}

/// A condition on one sort field.
enum FieldCondition {
    /// One of these values.
    Values(Vec<SortValue>),
    /// Between these bounds.
    Range(UserInputBound, UserInputBound),
}

impl DocMapper {
    /// The key filter of `query` for a locality index; `None` when the index has no sort key
    /// or the query constrains nothing that pruning can use.
    pub fn sort_key_filter(&self, query: &str) -> Option<KeyFilter> {
        let trimmed = query.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return None;
        }
        let fields = self.sort_fields()?;
        let (ast, errors) = tantivy::query_grammar::parse_query_lenient(trimmed);
        if !errors.is_empty() {
            return None;
        }
        filter_of(&ast, &fields)
    }
}

fn filter_of(ast: &UserInputAst, fields: &[(String, SortFieldType)]) -> Option<KeyFilter> {
    match ast {
        UserInputAst::Boost(sub, _) => filter_of(sub, fields),
        UserInputAst::Leaf(_) => conjunction(std::slice::from_ref(ast), fields),
        UserInputAst::Clause(clauses) => {
            // The query is built with conjunction by default: no operator means MUST.
            let must: Vec<UserInputAst> = clauses
                .iter()
                .filter(|(occur, _)| occur.unwrap_or(Occur::Must) == Occur::Must)
                .map(|(_, sub)| sub.clone())
                .collect();
            if !must.is_empty() {
                // SHOULD clauses next to MUST ones are optional: they constrain nothing.
                return conjunction(&must, fields);
            }
            let should: Vec<&UserInputAst> = clauses
                .iter()
                .filter(|(occur, _)| *occur == Some(Occur::Should))
                .map(|(_, sub)| sub)
                .collect();
            if should.is_empty() {
                return None;
            }
            // A disjunction: every alternative must be constrained.
            let mut intervals = Vec::new();
            for sub in should {
                intervals.extend(filter_of(sub, fields)?.intervals);
                if intervals.len() > MAX_INTERVALS {
                    return None;
                }
            }
            Some(KeyFilter { intervals })
        }
    }
}

/// The filter of required clauses: leaves on sort fields combine into key prefixes; other
/// clauses are filtered on their own and intersected.
fn conjunction(clauses: &[UserInputAst], fields: &[(String, SortFieldType)]) -> Option<KeyFilter> {
    let mut conditions: Vec<Option<FieldCondition>> = fields.iter().map(|_| None).collect();
    let mut nested: Vec<KeyFilter> = Vec::new();
    for clause in clauses {
        let mut clause = clause;
        while let UserInputAst::Boost(sub, _) = clause {
            clause = sub;
        }
        match clause {
            UserInputAst::Leaf(leaf) => {
                if let Some((position, condition)) = leaf_condition(leaf, fields) {
                    // Two conditions on one field: keeping either is a superset.
                    if conditions[position].is_none() {
                        conditions[position] = Some(condition);
                    }
                }
            }
            other => nested.extend(filter_of(other, fields)),
        }
    }
    let mut filter = prefix_filter(&conditions, fields);
    for other in nested {
        filter = Some(match filter {
            None => other,
            Some(filter) => filter.intersect(&other)?,
        });
    }
    filter
}

/// The sort field position a leaf constrains, and how.
fn leaf_condition(
    leaf: &UserInputLeaf,
    fields: &[(String, SortFieldType)],
) -> Option<(usize, FieldCondition)> {
    let position = |name: &Option<String>| {
        let name = name.as_deref()?;
        fields.iter().position(|(field, _)| field == name)
    };
    match leaf {
        UserInputLeaf::Literal(literal) => {
            let at = position(&literal.field_name)?;
            if literal.prefix {
                return None;
            }
            let value = parse_value(fields[at].1, &literal.phrase)?;
            Some((at, FieldCondition::Values(vec![value])))
        }
        UserInputLeaf::Set { field, elements } => {
            let at = position(field)?;
            let values = elements
                .iter()
                .map(|element| parse_value(fields[at].1, element))
                .collect::<Option<Vec<_>>>()?;
            Some((at, FieldCondition::Values(values)))
        }
        UserInputLeaf::Range {
            field,
            lower,
            upper,
        } => {
            let at = position(field)?;
            let check = |bound: &UserInputBound| match bound {
                UserInputBound::Inclusive(v) | UserInputBound::Exclusive(v) => {
                    parse_value(fields[at].1, v).map(|_| ())
                }
                UserInputBound::Unbounded => Some(()),
            };
            check(lower)?;
            check(upper)?;
            Some((at, FieldCondition::Range(lower.clone(), upper.clone())))
        }
        _ => None,
    }
}

/// A query value as the sort key holds it; `None` if it is not an exact value of the type.
fn parse_value(kind: SortFieldType, text: &str) -> Option<SortValue> {
    match kind {
        // Wildcards are patterns, not values.
        SortFieldType::Text if text.contains(['*', '?']) => None,
        SortFieldType::Text => Some(SortValue::Text(text.to_string())),
        SortFieldType::U64 => text.trim().parse().ok().map(SortValue::U64),
        SortFieldType::I64 => text.trim().parse().ok().map(SortValue::I64),
        SortFieldType::Bool => text.trim().parse().ok().map(SortValue::Bool),
        // Dates have several input formats: not pruned on.
        SortFieldType::DateTime => None,
    }
}

fn encoded(kind: SortFieldType, value: &SortValue) -> Vec<u8> {
    let mut out = Vec::new();
    sort_key::push_value(&mut out, kind, value);
    out
}

/// Key prefixes from exact values of the leading fields, then at most one range.
fn prefix_filter(
    conditions: &[Option<FieldCondition>],
    fields: &[(String, SortFieldType)],
) -> Option<KeyFilter> {
    let mut prefixes: Vec<Vec<u8>> = vec![Vec::new()];
    for (position, condition) in conditions.iter().enumerate() {
        let kind = fields[position].1;
        match condition {
            None => break,
            Some(FieldCondition::Values(values)) => {
                if prefixes.len() * values.len() > MAX_INTERVALS {
                    break;
                }
                prefixes = prefixes
                    .iter()
                    .flat_map(|prefix| {
                        values.iter().map(move |value| {
                            let mut next = prefix.clone();
                            next.extend(encoded(kind, value));
                            next
                        })
                    })
                    .collect();
            }
            Some(FieldCondition::Range(lower, upper)) => {
                let intervals = prefixes
                    .iter()
                    .filter_map(|prefix| range_interval(prefix, kind, lower, upper))
                    .collect();
                return Some(KeyFilter { intervals });
            }
        }
    }
    if conditions.first().is_none_or(Option::is_none) {
        return None;
    }
    Some(KeyFilter {
        intervals: prefixes
            .into_iter()
            .map(|prefix| {
                let high = sort_key::prefix_upper_bound(&prefix);
                (prefix, high)
            })
            .collect(),
    })
}

/// The keys starting with `prefix` whose next component is within the bounds.
fn range_interval(
    prefix: &[u8],
    kind: SortFieldType,
    lower: &UserInputBound,
    upper: &UserInputBound,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let component = |text: &str| parse_value(kind, text).map(|value| encoded(kind, &value));
    let mut low = prefix.to_vec();
    match lower {
        UserInputBound::Inclusive(v) => low.extend(component(v)?),
        UserInputBound::Exclusive(v) => {
            low.extend(component(v)?);
            low = sort_key::prefix_upper_bound(&low);
        }
        UserInputBound::Unbounded => {}
    }
    let high = match upper {
        UserInputBound::Inclusive(v) => {
            let mut high = prefix.to_vec();
            high.extend(component(v)?);
            sort_key::prefix_upper_bound(&high)
        }
        UserInputBound::Exclusive(v) => {
            let mut high = prefix.to_vec();
            high.extend(component(v)?);
            high
        }
        UserInputBound::Unbounded => sort_key::prefix_upper_bound(prefix),
    };
    (low < high).then_some((low, high))
}
