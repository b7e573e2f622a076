//! Queries: the user query language (Tantivy's, AND by default as in Quickwit), time range
//! filters, and the tag terms a query requires (for split pruning).

use std::collections::BTreeSet;
use std::ops::Bound;

use tantivy::query::{AllQuery, Query, QueryParser, QueryParserError, RangeQuery};
use tantivy::query_grammar::{Occur, UserInputAst, UserInputLeaf};
use tantivy::schema::Field;
use tantivy::{DateTime, Term};

use crate::doc_mapper::{DocMapper, TagKind, DYNAMIC_FIELD_NAME};
use crate::error::IndexError;

/// Above this many distinct values of a tag field in a split, the split records only the
/// `field!` marker ("any value") for that field.
pub const MAX_VALUES_PER_TAG_FIELD: usize = 1_000;

/// The tag recorded when a tag field has too many distinct values in a split: `field!`.
pub fn any_value_tag(field: &str) -> String {
    format!("{field}!")
}

/// Whether a split whose tags are `split_tags` may hold documents with every `(field, value)` of
/// `required` (as returned by [`DocMapper::required_tag_terms`]).
///
/// A split's tags list, for each tag field of its doc mapping, every value present
/// (`field:value`), or only `field!` when there were more than [`MAX_VALUES_PER_TAG_FIELD`]. So a
/// split may match `field:value` iff it has `field:value` or `field!`. A split with no tag at
/// all for a field holds no document with that field. Only prune with the tag fields of the
/// split's own doc mapping: a field that was not a tag field when the split was built has no
/// tags in it.
pub fn split_may_match_tags(split_tags: &BTreeSet<String>, required: &[(String, String)]) -> bool {
    required.iter().all(|(field, value)| {
        split_tags.contains(&format!("{field}:{value}"))
            || split_tags.contains(&any_value_tag(field))
    })
}

/// Gives every group made only of exclusions (`a AND NOT b` parses as `+a +(-b)`) an
/// "all documents" clause to exclude from: alone, such a group would match nothing.
fn anchor_negations(ast: &mut UserInputAst) {
    match ast {
        UserInputAst::Clause(clauses) => {
            for (_, sub) in clauses.iter_mut() {
                anchor_negations(sub);
            }
            if !clauses.is_empty()
                && clauses
                    .iter()
                    .all(|(occur, _)| *occur == Some(Occur::MustNot))
            {
                clauses.push((
                    Some(Occur::Must),
                    UserInputAst::Leaf(Box::new(UserInputLeaf::All)),
                ));
            }
        }
        UserInputAst::Boost(sub, _) => anchor_negations(sub),
        UserInputAst::Leaf(_) => {}
    }
}

impl DocMapper {
    /// Parses a query (Tantivy's query language: `field:value`, `"a phrase"`, `a AND b`,
    /// `-c`, `f:[1 TO 5]`, `f:IN [a b]`, `f:*`, …) with AND as the default operator, as Quickwit.
    ///
    /// Terms without a field search `search_fields`, or else the
    /// [default search fields](DocMapper::default_search_fields); with neither, such a term is
    /// an error, as in Quickwit. `*` or an empty query match all documents. In dynamic mode, fields that are not declared are looked up in the
    /// catch-all `_dynamic` field (`service:api` → `_dynamic.service:api`).
    pub fn parse_query(
        &self,
        query: &str,
        search_fields: Option<&[String]>,
    ) -> Result<Box<dyn Query>, IndexError> {
        let trimmed = query.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(Box::new(AllQuery));
        }
        let ast = self.parse_ast(trimmed)?;
        let field_names = search_fields.unwrap_or(self.default_search_fields());
        let mut default_fields = Vec::with_capacity(field_names.len());
        for name in field_names {
            let field = self
                .schema()
                .get_field(name)
                .map_err(|_| IndexError::InvalidQuery(format!("unknown search field `{name}`")))?;
            default_fields.push(field);
        }
        let mut parser = QueryParser::new(
            self.schema().clone(),
            default_fields,
            self.tokenizer_manager().clone(),
        );
        parser.set_conjunction_by_default();
        parser.allow_regexes();
        // Only negative clauses (`NOT a`) are allowed: they match all documents but those.
        let (query_obj, errors) = parser.build_query_from_user_input_ast_lenient(ast);
        match errors
            .into_iter()
            .find(|err| !matches!(err, QueryParserError::AllButQueryForbidden))
        {
            Some(QueryParserError::NoDefaultFieldDeclared) => {
                Err(IndexError::InvalidQuery(format!(
                    "`{query}`: query requires a default search field and none was supplied: \
                     name the field (`field:term`), pass `search_field`, or set \
                     `search_settings.default_search_fields` in the index config"
                )))
            }
            Some(err) => Err(IndexError::InvalidQuery(format!("`{query}`: {err}"))),
            None => Ok(query_obj),
        }
    }

    /// Parses the query grammar and routes undeclared fields to `_dynamic` in dynamic mode.
    fn parse_ast(&self, query: &str) -> Result<UserInputAst, IndexError> {
        check_operators(query)?;
        let (mut ast, errors) = tantivy::query_grammar::parse_query_lenient(query);
        if let Some(error) = errors.first() {
            return Err(IndexError::InvalidQuery(format!(
                "`{query}`: syntax error at position {}: {}",
                error.pos, error.message
            )));
        }
        if self.dynamic_field().is_some() {
            self.route_to_dynamic(&mut ast);
        }
        self.cidr_to_ranges(&mut ast);
        if self.older_schema {
            self.missing_fields_match_nothing(&mut ast);
        }
        anchor_negations(&mut ast);
        Ok(ast)
    }

    /// `ip:10.0.0.0/8` (or `ip:"2001:db8::/32"`) on an ip field becomes the range of the
    /// block's addresses.
    fn cidr_to_ranges(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.cidr_to_ranges(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.cidr_to_ranges(sub),
            UserInputAst::Leaf(leaf) => {
                let UserInputLeaf::Literal(literal) = leaf.as_ref() else {
                    return;
                };
                let Some(field) = literal.field_name.as_deref() else {
                    return;
                };
                let is_ip = self.schema().get_field(field).is_ok_and(|f| {
                    matches!(
                        self.schema().get_field_entry(f).field_type(),
                        tantivy::schema::FieldType::IpAddr(_)
                    )
                });
                if !is_ip {
                    return;
                }
                let Some((low, high)) = cidr_bounds(&literal.phrase) else {
                    return;
                };
                **leaf = UserInputLeaf::Range {
                    field: Some(field.to_string()),
                    lower: tantivy::query_grammar::UserInputBound::Inclusive(low),
                    upper: tantivy::query_grammar::UserInputBound::Inclusive(high),
                };
            }
        }
    }

    /// Replaces the terms on fields the schema lacks by a clause matching nothing (a split of
    /// an older doc mapping has no document with such a field).
    fn missing_fields_match_nothing(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.missing_fields_match_nothing(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.missing_fields_match_nothing(sub),
            UserInputAst::Leaf(leaf) => {
                let field = match leaf.as_ref() {
                    UserInputLeaf::Literal(literal) => literal.field_name.as_deref(),
                    UserInputLeaf::Range { field, .. }
                    | UserInputLeaf::Set { field, .. }
                    | UserInputLeaf::Regex { field, .. } => field.as_deref(),
                    UserInputLeaf::Exists { field } => Some(field.as_str()),
                    UserInputLeaf::All => None,
                };
                if field.is_some_and(|f| self.schema().find_field(f).is_none()) {
                    *ast = UserInputAst::Clause(vec![
                        (
                            Some(Occur::Must),
                            UserInputAst::Leaf(Box::new(UserInputLeaf::All)),
                        ),
                        (
                            Some(Occur::MustNot),
                            UserInputAst::Leaf(Box::new(UserInputLeaf::All)),
                        ),
                    ]);
                }
            }
        }
    }

    fn route_to_dynamic(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.route_to_dynamic(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.route_to_dynamic(sub),
            UserInputAst::Leaf(leaf) => {
                let field = match leaf.as_mut() {
                    UserInputLeaf::Literal(literal) => literal.field_name.as_mut(),
                    UserInputLeaf::Range { field, .. }
                    | UserInputLeaf::Set { field, .. }
                    | UserInputLeaf::Regex { field, .. } => field.as_mut(),
                    UserInputLeaf::Exists { field } => Some(field),
                    UserInputLeaf::All => None,
                };
                if let Some(field) = field {
                    if self.schema().find_field(field).is_none() {
                        *field = format!("{DYNAMIC_FIELD_NAME}.{field}");
                    }
                }
            }
        }
    }

    /// The `(tag field, value)` terms every document matching `query` must have, for split
    /// pruning with [`split_may_match_tags`]; `None` when nothing is known (no pruning).
    ///
    /// Conservative: only top-level required (`AND`ed or unprefixed, `+`) plain `field:value`
    /// terms on tag fields whose indexed terms equal their tag values (text fields with the
    /// `raw` tokenizer, i64, u64, bool) count; anything under `OR`, `NOT`, prefixes, ranges and
    /// sets is ignored. An unparsable query gives `None`.
    pub fn required_tag_terms(&self, query: &str) -> Option<Vec<(String, String)>> {
        let trimmed = query.trim();
        if trimmed.is_empty() || trimmed == "*" || self.tag_fields().is_empty() {
            return None;
        }
        let (ast, errors) = tantivy::query_grammar::parse_query_lenient(trimmed);
        if !errors.is_empty() {
            return None;
        }
        let mut terms = Vec::new();
        self.collect_required_tags(&ast, &mut terms);
        terms.sort();
        terms.dedup();
        (!terms.is_empty()).then_some(terms)
    }

    fn collect_required_tags(&self, ast: &UserInputAst, terms: &mut Vec<(String, String)>) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (occur, sub) in clauses {
                    // Conjunction by default: no operator means MUST.
                    if occur.unwrap_or(Occur::Must) == Occur::Must {
                        self.collect_required_tags(sub, terms);
                    }
                }
            }
            UserInputAst::Boost(sub, _) => self.collect_required_tags(sub, terms),
            UserInputAst::Leaf(leaf) => {
                let UserInputLeaf::Literal(literal) = leaf.as_ref() else {
                    return;
                };
                let Some(field) = &literal.field_name else {
                    return;
                };
                if literal.prefix {
                    return;
                }
                let Some(kind) = self.mapped_field_is_exact_tag(field) else {
                    return;
                };
                let value = match kind {
                    // Wildcards may mean something one day: not an exact value, no pruning.
                    TagKind::Text if literal.phrase.contains(['*', '?']) => None,
                    TagKind::Text => Some(literal.phrase.clone()),
                    TagKind::I64 => literal
                        .phrase
                        .trim()
                        .parse::<i64>()
                        .ok()
                        .map(|v| v.to_string()),
                    TagKind::U64 => literal
                        .phrase
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .map(|v| v.to_string()),
                    TagKind::Bool => literal
                        .phrase
                        .trim()
                        .parse::<bool>()
                        .ok()
                        .map(|v| v.to_string()),
                };
                if let Some(value) = value {
                    terms.push((field.clone(), value));
                }
            }
        }
    }

    /// A filter on the timestamp field: `start_secs <= timestamp < end_secs_exclusive` (a range
    /// query on the fast datetime column). `None` when the index has no timestamp field or both
    /// bounds are open.
    pub fn time_range_query(
        &self,
        start_secs: Option<i64>,
        end_secs_exclusive: Option<i64>,
    ) -> Option<Box<dyn Query>> {
        let field = self.timestamp_field()?;
        if start_secs.is_none() && end_secs_exclusive.is_none() {
            return None;
        }
        let term = |secs: i64| Term::from_field_date(field, datetime_from_secs(secs));
        let lower = start_secs.map_or(Bound::Unbounded, |secs| Bound::Included(term(secs)));
        let upper = end_secs_exclusive.map_or(Bound::Unbounded, |secs| Bound::Excluded(term(secs)));
        Some(Box::new(RangeQuery::new(lower, upper)))
    }

    /// Resolves a field name of the schema.
    pub fn field(&self, name: &str) -> Option<Field> {
        self.schema().get_field(name).ok()
    }
}

/// Rejects a boolean operator without an operand on each side (`a AND`, `AND AND`,
/// `(OR b)`, `NOT`), as Quickwit does; the grammar would read it as a search term.
fn check_operators(query: &str) -> Result<(), IndexError> {
    // Split into words and parentheses, skipping quoted phrases and escaped characters.
    let mut tokens: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut chars = query.chars();
    let mut in_quotes = false;
    let flush = |word: &mut String, tokens: &mut Vec<String>| {
        if !word.is_empty() {
            tokens.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                word.push(c);
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                word.push(c);
            }
            _ if in_quotes => word.push(c),
            '(' | ')' => {
                flush(&mut word, &mut tokens);
                tokens.push(c.to_string());
            }
            c if c.is_whitespace() => flush(&mut word, &mut tokens),
            _ => word.push(c),
        }
    }
    flush(&mut word, &mut tokens);
    let is_binary = |t: &str| t == "AND" || t == "OR";
    let dangling = |op: &str| {
        IndexError::InvalidQuery(format!(
            "`{query}`: syntax error: `{op}` needs an operand on {}",
            if op == "NOT" {
                "its right"
            } else {
                "each side"
            }
        ))
    };
    for (i, token) in tokens.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| tokens[j].as_str());
        let next = tokens.get(i + 1).map(String::as_str);
        let missing_right = |next: Option<&str>| next.is_none_or(|n| n == ")" || is_binary(n));
        if is_binary(token) {
            let missing_left = prev.is_none_or(|p| p == "(" || is_binary(p) || p == "NOT");
            if missing_left || missing_right(next) {
                return Err(dangling(token));
            }
        } else if token == "NOT" && missing_right(next) {
            return Err(dangling(token));
        }
    }
    Ok(())
}

/// The first and last address of a CIDR block (`10.0.0.0/8`, `2001:db8::/32`), rendered as
/// addresses; `None` if `text` is not a CIDR block.
fn cidr_bounds(text: &str) -> Option<(String, String)> {
    let (addr, bits) = text.trim().split_once('/')?;
    let bits: u32 = bits.parse().ok()?;
    match addr.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            let low = u32::from(v4) & mask;
            let high = low | !mask;
            Some((
                std::net::Ipv4Addr::from(low).to_string(),
                std::net::Ipv4Addr::from(high).to_string(),
            ))
        }
        std::net::IpAddr::V6(v6) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            let low = u128::from(v6) & mask;
            let high = low | !mask;
            Some((
                std::net::Ipv6Addr::from(low).to_string(),
                std::net::Ipv6Addr::from(high).to_string(),
            ))
        }
        _ => None,
    }
}

/// Seconds to a `DateTime`, saturating outside the representable range.
fn datetime_from_secs(secs: i64) -> DateTime {
    match secs.checked_mul(1_000_000_000) {
        Some(nanos) => DateTime::from_timestamp_nanos(nanos),
        None if secs < 0 => DateTime::MIN,
        None => DateTime::MAX,
    }
}
