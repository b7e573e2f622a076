//! Queries: the user query language (Tantivy's, AND by default as in Quickwit), time range
//! filters, and the tag terms a query requires (for split pruning).

use std::collections::BTreeSet;
use std::ops::Bound;

use shale_types::time::{window_bound, WindowBound};
use tantivy::query::{AllQuery, EmptyQuery, Query, QueryParser, QueryParserError, RangeQuery};
use tantivy::query_grammar::{Delimiter, Occur, UserInputAst, UserInputLeaf, UserInputLiteral};
use tantivy::schema::Field;
use tantivy::{DateTime, Term};

use crate::doc_mapper::{DocMapper, TagKind, DYNAMIC_FIELD_NAME};
use crate::error::IndexError;
use crate::glob::{parse_glob_regex, GlobQuery};

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

/// The date formats query values of datetime fields are read in (Quickwit's).
const QUERY_DATE_FORMAT_NAMES: [&str; 8] = [
    "rfc3339",
    "unix_timestamp",
    "%a, %d %b %Y %H:%M:%S %z",
    "%Y-%m-%dT%H:%M:%S",
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%d",
    "%Y/%m/%d",
];

static QUERY_DATE_FORMATS: std::sync::LazyLock<Vec<shale_config::DateInputFormat>> =
    std::sync::LazyLock::new(|| {
        QUERY_DATE_FORMAT_NAMES
            .iter()
            .filter_map(|name| shale_config::DateInputFormat::parse(name).ok())
            .collect()
    });

/// What a query date value may look like, for error messages.
fn accepted_date_formats() -> String {
    format!(
        "accepted formats: RFC 3339 (2024-01-31T10:00:00Z), RFC 2822 (Wed, 31 Jan 2024 10:00:00 \
         +0000), a Unix timestamp in seconds, milliseconds, microseconds or nanoseconds, {}",
        QUERY_DATE_FORMAT_NAMES[3..]
            .iter()
            .map(|f| format!("`{f}`"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// A query parser error in words, without Rust's debug output of the underlying error.
fn describe_parser_error(err: &QueryParserError) -> String {
    match err {
        QueryParserError::ExpectedInt(_) => "expected an integer".to_string(),
        QueryParserError::ExpectedFloat(_) => "expected a number".to_string(),
        QueryParserError::ExpectedBool(_) => "expected `true` or `false`".to_string(),
        QueryParserError::ExpectedBase64(_) => "expected bytes in base64 or hex".to_string(),
        QueryParserError::DateFormatError(_) => {
            format!("invalid date; {}", accepted_date_formats())
        }
        other => other.to_string(),
    }
}

/// Builds `ast` with the query parser; only negative clauses (`NOT a`) are allowed (they
/// match all documents but those).
fn build_leniently(
    parser: &QueryParser,
    ast: UserInputAst,
    query: &str,
) -> Result<Box<dyn Query>, IndexError> {
    let (query_obj, errors) = parser.build_query_from_user_input_ast_lenient(ast);
    match errors
        .into_iter()
        .find(|err| !matches!(err, QueryParserError::AllButQueryForbidden))
    {
        Some(err) => Err(IndexError::InvalidQuery(format!(
            "`{query}`: {}",
            describe_parser_error(&err)
        ))),
        None => Ok(query_obj),
    }
}

/// The start of every text term of `path` inside json `field`.
fn json_text_prefix(field: Field, path: &str, expand_dots: bool) -> Term {
    let mut prefix = Term::from_field_json_path(field, path, expand_dots);
    prefix.append_type_and_str("");
    prefix
}

/// The type Tantivy gives a range bound's text on a json path (its order of attempts: an
/// RFC 3339 date, a number, a boolean, else text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonBoundKind {
    Date,
    I64,
    U64,
    F64,
    Bool,
    Text,
}

impl JsonBoundKind {
    /// The type in words; numbers of any type are one ("a number").
    fn name(self) -> &'static str {
        match self {
            JsonBoundKind::Date => "a date",
            JsonBoundKind::I64 | JsonBoundKind::U64 | JsonBoundKind::F64 => "a number",
            JsonBoundKind::Bool => "a boolean",
            JsonBoundKind::Text => "text",
        }
    }
}

fn json_bound_kind(text: &str) -> JsonBoundKind {
    let text = text.trim();
    if crate::date::parse_datetime(
        &serde_json::Value::String(text.to_string()),
        &[shale_config::DateInputFormat::Rfc3339],
    )
    .is_ok()
    {
        JsonBoundKind::Date
    } else if text.parse::<i64>().is_ok() {
        JsonBoundKind::I64
    } else if text.parse::<u64>().is_ok() {
        JsonBoundKind::U64
    } else if text.parse::<f64>().is_ok() {
        JsonBoundKind::F64
    } else if text.parse::<bool>().is_ok() {
        JsonBoundKind::Bool
    } else {
        JsonBoundKind::Text
    }
}

/// A character as a regex literal.
fn regex_escape(c: char) -> String {
    if "\\.+*?()|[]{}^$#&-~".contains(c) {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

/// Gives every leaf without a field the `fields` to search: the field itself for one, a
/// disjunction over them for several. False when a leaf has no field and `fields` is empty.
fn assign_default_fields(ast: &mut UserInputAst, fields: &[String]) -> bool {
    match ast {
        UserInputAst::Clause(clauses) => clauses
            .iter_mut()
            .all(|(_, sub)| assign_default_fields(sub, fields)),
        UserInputAst::Boost(sub, _) => assign_default_fields(sub, fields),
        UserInputAst::Leaf(leaf) => {
            let unfielded = match leaf.as_ref() {
                UserInputLeaf::Literal(literal) => literal.field_name.is_none(),
                UserInputLeaf::Range { field, .. }
                | UserInputLeaf::Set { field, .. }
                | UserInputLeaf::Regex { field, .. } => field.is_none(),
                UserInputLeaf::Exists { .. } | UserInputLeaf::All => false,
            };
            if !unfielded {
                return true;
            }
            let with_field = |name: &String| {
                let mut copy = (**leaf).clone();
                set_leaf_field(&mut copy, name);
                UserInputAst::Leaf(Box::new(copy))
            };
            match fields {
                [] => false,
                [single] => {
                    set_leaf_field(leaf, single);
                    true
                }
                several => {
                    *ast = UserInputAst::Clause(
                        several
                            .iter()
                            .map(|name| (Some(Occur::Should), with_field(name)))
                            .collect(),
                    );
                    true
                }
            }
        }
    }
}

/// Sets the field of a leaf that takes one.
fn set_leaf_field(leaf: &mut UserInputLeaf, name: &str) {
    match leaf {
        UserInputLeaf::Literal(literal) => literal.field_name = Some(name.to_string()),
        UserInputLeaf::Range { field, .. }
        | UserInputLeaf::Set { field, .. }
        | UserInputLeaf::Regex { field, .. } => *field = Some(name.to_string()),
        UserInputLeaf::Exists { .. } | UserInputLeaf::All => {}
    }
}

/// With `index_field_presence`, `field:*` is a term on the presence field: any field (fast
/// or not, declared, json, object or dynamic) is found by the hash of its path.
fn exists_to_presence(ast: &mut UserInputAst) {
    match ast {
        UserInputAst::Clause(clauses) => {
            for (_, sub) in clauses {
                exists_to_presence(sub);
            }
        }
        UserInputAst::Boost(sub, _) => exists_to_presence(sub),
        UserInputAst::Leaf(leaf) => {
            if let UserInputLeaf::Exists { field } = leaf.as_ref() {
                let term = crate::doc_mapper::field_presence_hash(field).to_string();
                **leaf = UserInputLeaf::Literal(UserInputLiteral {
                    field_name: Some(crate::FIELD_PRESENCE_FIELD_NAME.to_string()),
                    phrase: term,
                    delimiter: Delimiter::None,
                    slop: 0,
                    prefix: false,
                });
            }
        }
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
        let field_names = search_fields.unwrap_or(self.default_search_fields());
        for name in field_names {
            // Search fields become the field names of unfielded terms: the same rule applies
            // (a NUL inside a json path made Tantivy's query parser panic; found by fuzzing).
            check_field_name(name)?;
            // A split of an older mapping may lack a search field: its terms there match
            // nothing (the request was checked against the current mapping).
            if !self.older_schema && !self.resolves_field(name) {
                return Err(IndexError::InvalidQuery(format!(
                    "unknown search field `{name}`"
                )));
            }
        }
        let mut ast = self.parse_grammar(trimmed)?;
        if !assign_default_fields(&mut ast, field_names) {
            return Err(IndexError::InvalidQuery(format!(
                "`{query}`: query requires a default search field and none was supplied: \
                 name the field (`field:term`), pass `search_field`, or set \
                 `search_settings.default_search_fields` in the index config"
            )));
        }
        self.rewrite_ast(&mut ast);
        self.check_values(&ast)
            .map_err(|err| IndexError::InvalidQuery(format!("`{query}`: {err}")))?;
        let mut parser = QueryParser::new(
            self.schema().clone(),
            Vec::new(),
            self.tokenizer_manager().clone(),
        );
        parser.set_conjunction_by_default();
        parser.allow_regexes();
        let built = if self.needs_own_build(&ast) {
            self.build_clause_by_clause(&parser, ast, query)?
        } else {
            build_leniently(&parser, ast, query)?
        };
        Ok(crate::exclusion::guard_exclusions(built))
    }

    /// The json field and path of a regex leaf on a path inside a json field
    /// (`attributes.user:/a.*/`, or an undeclared field routed to `_dynamic`), which Tantivy's
    /// query parser refuses.
    fn json_regex_target<'a>(&self, leaf: &'a UserInputLeaf) -> Option<(Field, &'a str, &'a str)> {
        let UserInputLeaf::Regex {
            field: Some(name),
            pattern,
        } = leaf
        else {
            return None;
        };
        let (field, path) = self.schema().find_field(name)?;
        if path.is_empty() {
            return None;
        }
        match self.schema().get_field_entry(field).field_type() {
            tantivy::schema::FieldType::JsonObject(_) => Some((field, path, pattern)),
            _ => None,
        }
    }

    /// A regex leaf of glob shape (every wildcard term, and regexes like `/err.*/`) on a text
    /// field or a path inside a json field, as a [`GlobQuery`]: no automaton to determinize
    /// first (see [`crate::glob`]).
    fn glob_leaf(&self, leaf: &UserInputLeaf) -> Option<GlobQuery> {
        use tantivy::schema::FieldType;
        let UserInputLeaf::Regex {
            field: Some(name),
            pattern,
        } = leaf
        else {
            return None;
        };
        let parts = parse_glob_regex(pattern)?;
        let (field, path) = self.schema().find_field(name)?;
        match self.schema().get_field_entry(field).field_type() {
            FieldType::Str(options)
                if path.is_empty() && options.get_indexing_options().is_some() =>
            {
                Some(GlobQuery::new(field, b"", &parts))
            }
            FieldType::JsonObject(options) if !path.is_empty() => {
                let prefix = json_text_prefix(field, path, options.is_expand_dots_enabled());
                Some(GlobQuery::new(
                    field,
                    prefix.serialized_value_bytes(),
                    &parts,
                ))
            }
            _ => None,
        }
    }

    fn needs_own_build(&self, ast: &UserInputAst) -> bool {
        match ast {
            UserInputAst::Clause(clauses) => {
                clauses.iter().any(|(_, sub)| self.needs_own_build(sub))
            }
            UserInputAst::Boost(sub, _) => self.needs_own_build(sub),
            UserInputAst::Leaf(leaf) => {
                self.glob_leaf(leaf).is_some()
                    || self.json_regex_target(leaf).is_some()
                    || self.fast_only_range(leaf).is_some()
            }
        }
    }

    /// A range leaf on a field that is fast but not indexed, as a range query on its fast
    /// column (the query parser refuses fields that are not indexed). `None` for other
    /// leaves, and for values that do not parse as the field's type.
    fn fast_only_range(&self, leaf: &UserInputLeaf) -> Option<RangeQuery> {
        use tantivy::query_grammar::UserInputBound;
        use tantivy::schema::FieldType;
        let UserInputLeaf::Range {
            field: Some(name),
            lower,
            upper,
        } = leaf
        else {
            return None;
        };
        let Some(mapping) = self.doc_mapping().field_mapping(name) else {
            return self
                .json_text_range(name, lower, upper)
                .or_else(|| self.json_number_range(name, lower, upper));
        };
        if !mapping.is_fast() || mapping.is_indexed() {
            return None;
        }
        let field = self.schema().get_field(name).ok()?;
        let field_type = self.schema().get_field_entry(field).field_type().clone();
        let term = |text: &str| -> Option<Term> {
            let text = text.trim();
            Some(match &field_type {
                FieldType::Str(_) => Term::from_field_text(field, text),
                FieldType::U64(_) => Term::from_field_u64(field, text.parse().ok()?),
                FieldType::I64(_) => Term::from_field_i64(field, text.parse().ok()?),
                FieldType::F64(_) => Term::from_field_f64(field, text.parse().ok()?),
                FieldType::Bool(_) => Term::from_field_bool(field, text.parse().ok()?),
                _ => return None,
            })
        };
        let bound = |bound: &UserInputBound| -> Option<Bound<Term>> {
            Some(match bound {
                UserInputBound::Inclusive(text) if text == "*" => Bound::Unbounded,
                UserInputBound::Exclusive(text) if text == "*" => Bound::Unbounded,
                UserInputBound::Inclusive(text) => Bound::Included(term(text)?),
                UserInputBound::Exclusive(text) => Bound::Excluded(term(text)?),
                UserInputBound::Unbounded => Bound::Unbounded,
            })
        };
        Some(RangeQuery::new(bound(lower)?, bound(upper)?))
    }

    /// The json field, path inside it and options of `name`, when it names a path inside a
    /// json field.
    fn json_path<'a>(
        &'a self,
        name: &'a str,
    ) -> Option<(Field, &'a str, &'a tantivy::schema::JsonObjectOptions)> {
        let (field, path) = self.schema().find_field(name)?;
        if path.is_empty() {
            return None;
        }
        match self.schema().get_field_entry(field).field_type() {
            tantivy::schema::FieldType::JsonObject(options) => Some((field, path, options)),
            _ => None,
        }
    }

    /// A range with text bounds on a path of a fast json field (undeclared fields of a dynamic
    /// index included), as a range on its column — Quickwit's semantics: values compare as
    /// whole strings, the bounds normalized as the column is (`H` is `h` under a lowercase
    /// normalizer). Numeric, boolean and date bounds are left to the query parser.
    fn json_text_range(
        &self,
        name: &str,
        lower: &tantivy::query_grammar::UserInputBound,
        upper: &tantivy::query_grammar::UserInputBound,
    ) -> Option<RangeQuery> {
        use tantivy::query_grammar::UserInputBound;
        let (field, path, options) = self.json_path(name)?;
        let normalizer = options.get_fast_field_tokenizer_name()?;
        let is_text = |text: &str| {
            let text = text.trim();
            text != "*"
                && text.parse::<f64>().is_err()
                && text.parse::<bool>().is_err()
                && crate::date::parse_datetime(
                    &serde_json::Value::String(text.to_string()),
                    &[shale_config::DateInputFormat::Rfc3339],
                )
                .is_err()
        };
        let texts: Vec<&str> = [lower, upper]
            .into_iter()
            .filter_map(|bound| match bound {
                UserInputBound::Inclusive(text) | UserInputBound::Exclusive(text) => {
                    Some(text.as_str())
                }
                UserInputBound::Unbounded => None,
            })
            .filter(|text| text.trim() != "*")
            .collect();
        if texts.is_empty() || !texts.iter().all(|text| is_text(text)) {
            return None;
        }
        let expand_dots = options.is_expand_dots_enabled();
        let term = |text: &str| {
            let text = if normalizer == "lowercase" {
                text.to_lowercase()
            } else {
                text.to_string()
            };
            let mut term = Term::from_field_json_path(field, path, expand_dots);
            term.append_type_and_str(&text);
            term
        };
        let bound = |bound: &UserInputBound| match bound {
            UserInputBound::Inclusive(text) if text.trim() == "*" => Bound::Unbounded,
            UserInputBound::Exclusive(text) if text.trim() == "*" => Bound::Unbounded,
            UserInputBound::Inclusive(text) => Bound::Included(term(text)),
            UserInputBound::Exclusive(text) => Bound::Excluded(term(text)),
            UserInputBound::Unbounded => Bound::Unbounded,
        };
        Some(RangeQuery::new(bound(lower), bound(upper)))
    }

    /// A range on a path inside a json field whose bounds are numbers of different types
    /// (`[1 TO 2.5]`: Tantivy reads `1` as an integer and `2.5` as a float, and its json range
    /// search requires one type), as a range with both bounds as floats; the search converts
    /// them to the column's type. `None` for other ranges.
    fn json_number_range(
        &self,
        name: &str,
        lower: &tantivy::query_grammar::UserInputBound,
        upper: &tantivy::query_grammar::UserInputBound,
    ) -> Option<RangeQuery> {
        use tantivy::query_grammar::UserInputBound;
        let (field, path, options) = self.json_path(name)?;
        let number = |bound: &UserInputBound| match bound {
            UserInputBound::Inclusive(text) | UserInputBound::Exclusive(text)
                if text.trim() != "*" =>
            {
                Some(json_bound_kind(text))
            }
            _ => None,
        };
        let is_number = |kind| {
            matches!(
                kind,
                JsonBoundKind::I64 | JsonBoundKind::U64 | JsonBoundKind::F64
            )
        };
        let (Some(a), Some(b)) = (number(lower), number(upper)) else {
            return None;
        };
        if a == b || !is_number(a) || !is_number(b) {
            return None;
        }
        let expand_dots = options.is_expand_dots_enabled();
        let bound = |bound: &UserInputBound| -> Option<Bound<Term>> {
            let float = |text: &str| -> Option<Term> {
                let mut term = Term::from_field_json_path(field, path, expand_dots);
                term.append_type_and_fast_value(text.trim().parse::<f64>().ok()?);
                Some(term)
            };
            Some(match bound {
                UserInputBound::Inclusive(text) => Bound::Included(float(text)?),
                UserInputBound::Exclusive(text) => Bound::Excluded(float(text)?),
                UserInputBound::Unbounded => Bound::Unbounded,
            })
        };
        Some(RangeQuery::new(bound(lower)?, bound(upper)?))
    }

    /// Builds `ast` clause by clause: regexes on json paths become regex queries over the
    /// json field's terms of that path (`path\0s` + the pattern), ranges on fast-only fields
    /// range queries on their columns; every other leaf is built by the query parser.
    fn build_clause_by_clause(
        &self,
        parser: &QueryParser,
        ast: UserInputAst,
        query: &str,
    ) -> Result<Box<dyn Query>, IndexError> {
        use tantivy::query::{BooleanQuery, BoostQuery, Occur as TantivyOccur, RegexQuery};
        match ast {
            UserInputAst::Clause(clauses) => {
                let mut subqueries = Vec::with_capacity(clauses.len());
                for (occur, sub) in clauses {
                    let occur = match occur {
                        Some(Occur::Should) => TantivyOccur::Should,
                        Some(Occur::MustNot) => TantivyOccur::MustNot,
                        Some(Occur::Must) | None => TantivyOccur::Must,
                    };
                    subqueries.push((occur, self.build_clause_by_clause(parser, sub, query)?));
                }
                Ok(Box::new(BooleanQuery::new(subqueries)))
            }
            UserInputAst::Boost(sub, boost) => Ok(Box::new(BoostQuery::new(
                self.build_clause_by_clause(parser, *sub, query)?,
                boost.into_inner() as f32,
            ))),
            UserInputAst::Leaf(leaf) if self.fast_only_range(&leaf).is_some() => {
                match self.fast_only_range(&leaf) {
                    Some(range) => Ok(Box::new(range)),
                    None => build_leniently(parser, UserInputAst::Leaf(leaf), query),
                }
            }
            UserInputAst::Leaf(leaf) if self.glob_leaf(&leaf).is_some() => {
                match self.glob_leaf(&leaf) {
                    Some(glob) => Ok(Box::new(glob)),
                    None => build_leniently(parser, UserInputAst::Leaf(leaf), query),
                }
            }
            UserInputAst::Leaf(leaf) => match self.json_regex_target(&leaf) {
                Some((field, path, pattern)) => {
                    let expand_dots = match self.schema().get_field_entry(field).field_type() {
                        tantivy::schema::FieldType::JsonObject(options) => {
                            options.is_expand_dots_enabled()
                        }
                        _ => true,
                    };
                    let prefix = json_text_prefix(field, path, expand_dots);
                    let mut full = String::new();
                    for c in String::from_utf8_lossy(prefix.serialized_value_bytes()).chars() {
                        if c.is_ascii_control() {
                            full.push_str(&format!("\\x{:02x}", c as u32));
                        } else {
                            full.push_str(&regex_escape(c));
                        }
                    }
                    full.push_str(pattern);
                    let regex = RegexQuery::from_pattern(&full, field).map_err(|err| {
                        IndexError::InvalidQuery(format!("`{query}`: invalid regex: {err}"))
                    })?;
                    Ok(Box::new(regex))
                }
                None => build_leniently(parser, UserInputAst::Leaf(leaf), query),
            },
        }
    }

    /// Values of datetime fields in the formats Quickwit's queries take (RFC 3339, RFC 2822,
    /// Unix timestamps, `%Y-%m-%dT%H:%M:%S`, `%Y-%m-%d %H:%M:%S[.%f]`, `%Y-%m-%d`,
    /// `%Y/%m/%d`; UTC unless they say otherwise) are rewritten as RFC 3339, which Tantivy
    /// parses. Values no format takes are left for Tantivy to refuse.
    fn normalize_dates(&self, ast: &mut UserInputAst) {
        use tantivy::query_grammar::UserInputBound;
        // Values are floored to the field's precision, as its indexed values are.
        let precision_of = |field: &str| match self.doc_mapping().field_mapping(field) {
            Some(shale_config::FieldMapping {
                kind: shale_config::FieldKind::Datetime(options),
                ..
            }) => Some(crate::doc_mapper::date_precision(options.fast_precision)),
            _ => None,
        };
        let normalize = |text: &mut String, precision: tantivy::schema::DateTimePrecision| {
            let value = serde_json::Value::String(text.clone());
            if let Ok(datetime) = crate::date::parse_datetime(&value, &QUERY_DATE_FORMATS) {
                *text =
                    crate::date::format_rfc3339(crate::date::floor_datetime(datetime, precision));
            }
        };
        let normalize_bound =
            |bound: &mut UserInputBound, precision: tantivy::schema::DateTimePrecision| match bound
            {
                UserInputBound::Inclusive(text) | UserInputBound::Exclusive(text) => {
                    if text != "*" {
                        normalize(text, precision)
                    }
                }
                UserInputBound::Unbounded => {}
            };
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.normalize_dates(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.normalize_dates(sub),
            UserInputAst::Leaf(leaf) => match leaf.as_mut() {
                UserInputLeaf::Literal(literal) => {
                    if let Some(precision) = literal.field_name.as_deref().and_then(precision_of) {
                        normalize(&mut literal.phrase, precision);
                    }
                }
                UserInputLeaf::Range {
                    field: Some(field),
                    lower,
                    upper,
                } => {
                    if let Some(precision) = precision_of(field) {
                        normalize_bound(lower, precision);
                        normalize_bound(upper, precision);
                    }
                }
                UserInputLeaf::Set {
                    field: Some(field),
                    elements,
                } => {
                    if let Some(precision) = precision_of(field) {
                        elements
                            .iter_mut()
                            .for_each(|element| normalize(element, precision));
                    }
                }
                _ => {}
            },
        }
    }

    /// A term on a field that is fast but not indexed is the range `[term TO term]`, which
    /// Tantivy answers from the fast column.
    fn fast_only_terms(&self, ast: &mut UserInputAst) {
        use tantivy::query_grammar::UserInputBound;
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.fast_only_terms(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.fast_only_terms(sub),
            UserInputAst::Leaf(leaf) => {
                let fast_only = |field: &str| {
                    self.doc_mapping()
                        .field_mapping(field)
                        .is_some_and(|mapping| mapping.is_fast() && !mapping.is_indexed())
                };
                let point = |field: &str, value: &str| UserInputLeaf::Range {
                    field: Some(field.to_string()),
                    lower: UserInputBound::Inclusive(value.to_string()),
                    upper: UserInputBound::Inclusive(value.to_string()),
                };
                match leaf.as_ref() {
                    UserInputLeaf::Literal(literal) if !literal.prefix => {
                        if let Some(field) = literal.field_name.as_deref().filter(|f| fast_only(f))
                        {
                            **leaf = point(field, &literal.phrase);
                        }
                    }
                    UserInputLeaf::Set {
                        field: Some(field),
                        elements,
                    } if fast_only(field) => {
                        *ast = UserInputAst::Clause(
                            elements
                                .iter()
                                .map(|value| {
                                    (
                                        Some(Occur::Should),
                                        UserInputAst::Leaf(Box::new(point(field, value))),
                                    )
                                })
                                .collect(),
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// A phrase prefix (`field:"a b"*`) whose text is one term once tokenized (`"p"*`) is a
    /// prefix query on that term (Tantivy's phrase prefix needs two terms).
    fn single_term_prefixes(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.single_term_prefixes(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.single_term_prefixes(sub),
            UserInputAst::Leaf(leaf) => {
                let UserInputLeaf::Literal(literal) = leaf.as_ref() else {
                    return;
                };
                let Some(field) = literal.field_name.as_deref().filter(|_| literal.prefix) else {
                    return;
                };
                let Some(tokens) = self.tokens(field, &literal.phrase) else {
                    return;
                };
                if let [token] = tokens.as_slice() {
                    let pattern: String = token.chars().map(regex_escape).collect();
                    **leaf = UserInputLeaf::Regex {
                        field: Some(field.to_string()),
                        pattern: format!("{pattern}.*"),
                    };
                }
            }
        }
    }

    /// An unquoted term with `*` or `?` inside (`jou*al`, `jour?al`) is a wildcard: a regex on
    /// the field's terms, each literal part normalized by the field's tokenizer (so `Jou*al`
    /// matches `journal` under a lowercasing tokenizer). Escaped (`\?`) they are literal.
    fn wildcards(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.wildcards(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.wildcards(sub),
            UserInputAst::Leaf(leaf) => {
                let UserInputLeaf::Literal(literal) = leaf.as_ref() else {
                    return;
                };
                if literal.delimiter != Delimiter::None {
                    return;
                }
                let Some(field) = literal.field_name.as_deref() else {
                    return;
                };
                // Literal parts and wildcards, escapes resolved.
                let mut parts: Vec<(String, Option<&str>)> = vec![(String::new(), None)];
                let mut has_wildcard = false;
                // `**` is `*`: runs of them only grow Tantivy's regex automaton (a query of
                // `a**…**b` took a second of CPU; found by fuzzing).
                let mut after_star = false;
                let mut chars = literal.phrase.chars();
                while let Some(c) = chars.next() {
                    if c == '*' && std::mem::replace(&mut after_star, true) {
                        continue;
                    }
                    after_star = c == '*';
                    match c {
                        '\\' => {
                            if let Some(next) = chars.next() {
                                if let Some(last) = parts.last_mut() {
                                    last.0.push(next);
                                }
                            }
                        }
                        '*' | '?' => {
                            has_wildcard = true;
                            if let Some(last) = parts.last_mut() {
                                last.1 = Some(if c == '*' { ".*" } else { "." });
                            }
                            parts.push((String::new(), None));
                        }
                        c => {
                            if let Some(last) = parts.last_mut() {
                                last.0.push(c);
                            }
                        }
                    }
                }
                if !has_wildcard {
                    return;
                }
                let mut pattern = String::new();
                for (text, wildcard) in &parts {
                    let normalized = match self.tokens(field, text).as_deref() {
                        Some([token]) => token.clone(),
                        _ => text.clone(),
                    };
                    pattern.extend(normalized.chars().map(regex_escape));
                    pattern.push_str(wildcard.unwrap_or(""));
                }
                if literal.prefix {
                    pattern.push_str(".*");
                }
                **leaf = UserInputLeaf::Regex {
                    field: Some(field.to_string()),
                    pattern,
                };
            }
        }
    }

    /// Whether `name` names something a query can search: a field of the schema (or a path
    /// inside a json field), or any field in dynamic mode.
    fn resolves_field(&self, name: &str) -> bool {
        self.schema().find_field(name).is_some() || self.dynamic_field().is_some()
    }

    /// Checks that every value compared with a typed field (integers, floats, booleans,
    /// dates, IP addresses) reads as that type, so that the error names the field, the value
    /// and what was expected. Runs on the rewritten tree: dates are RFC 3339 by then.
    fn check_values(&self, ast: &UserInputAst) -> Result<(), String> {
        use tantivy::query_grammar::UserInputBound;
        use tantivy::schema::FieldType;
        let (name, values): (&str, Vec<&str>) = match ast {
            UserInputAst::Clause(clauses) => {
                return clauses
                    .iter()
                    .try_for_each(|(_, sub)| self.check_values(sub));
            }
            UserInputAst::Boost(sub, _) => return self.check_values(sub),
            UserInputAst::Leaf(leaf) => match leaf.as_ref() {
                UserInputLeaf::Literal(UserInputLiteral {
                    field_name: Some(name),
                    phrase,
                    ..
                }) => (name, vec![phrase.as_str()]),
                UserInputLeaf::Range {
                    field: Some(name),
                    lower,
                    upper,
                } => {
                    let bounds = [lower, upper].into_iter().filter_map(|bound| match bound {
                        UserInputBound::Inclusive(text) | UserInputBound::Exclusive(text)
                            if text != "*" =>
                        {
                            Some(text.as_str())
                        }
                        _ => None,
                    });
                    (name, bounds.collect())
                }
                UserInputLeaf::Set {
                    field: Some(name),
                    elements,
                } => (name, elements.iter().map(String::as_str).collect()),
                _ => return Ok(()),
            },
        };
        let Ok(field) = self.schema().get_field(name) else {
            // A path inside a json field: Tantivy types each bound by itself, and searching
            // a range whose bounds have different types panics (`x:[1 TO %]`; found by
            // fuzzing). Numbers of different types are searched as floats (see
            // `json_number_range`).
            if let UserInputAst::Leaf(leaf) = ast {
                if let (UserInputLeaf::Range { .. }, [a, b]) = (leaf.as_ref(), values.as_slice()) {
                    let (kind_a, kind_b) = (json_bound_kind(a), json_bound_kind(b));
                    if kind_a.name() != kind_b.name() {
                        return Err(format!(
                            "the bounds of a range on `{name}` must be of one type: `{a}` is {} \
                             and `{b}` is {}",
                            kind_a.name(),
                            kind_b.name()
                        ));
                    }
                }
            }
            return Ok(());
        };
        let (expected, reads): (&str, fn(&str) -> bool) =
            match self.schema().get_field_entry(field).field_type() {
                FieldType::U64(_) => ("an unsigned integer", |v| v.parse::<u64>().is_ok()),
                FieldType::I64(_) => ("an integer", |v| v.parse::<i64>().is_ok()),
                FieldType::F64(_) => ("a number", |v| v.parse::<f64>().is_ok()),
                FieldType::Bool(_) => ("`true` or `false`", |v| v.parse::<bool>().is_ok()),
                FieldType::IpAddr(_) => ("an IP address or CIDR block", |v| {
                    v.parse::<std::net::IpAddr>().is_ok()
                }),
                FieldType::Date(_) => ("a date", |v| {
                    crate::date::parse_datetime(
                        &serde_json::Value::String(v.to_string()),
                        &[shale_config::DateInputFormat::Rfc3339],
                    )
                    .is_ok()
                }),
                _ => return Ok(()),
            };
        match values.into_iter().find(|value| !reads(value.trim())) {
            Some(value) => {
                let formats = if expected == "a date" {
                    format!("; {}", accepted_date_formats())
                } else {
                    String::new()
                };
                Err(format!(
                    "`{value}` is not a valid value for field `{name}`: expected {expected}{formats}"
                ))
            }
            None => Ok(()),
        }
    }

    /// Parses the query grammar; a syntax error is an error.
    fn parse_grammar(&self, query: &str) -> Result<UserInputAst, IndexError> {
        check_operators(query)?;
        let (ast, errors) = tantivy::query_grammar::parse_query_lenient(query);
        if let Some(error) = errors.first() {
            return Err(IndexError::InvalidQuery(format!(
                "`{query}`: syntax error at position {}: {}",
                error.pos, error.message
            )));
        }
        check_field_names(&ast)?;
        Ok(ast)
    }

    /// Rewrites a parsed query for this index: `field:*` on the presence field, undeclared
    /// fields routed to `_dynamic` in dynamic mode, CIDR blocks as ranges, fields an older
    /// split lacks matching nothing, negations anchored.
    fn rewrite_ast(&self, ast: &mut UserInputAst) {
        if self.presence_field().is_some() {
            exists_to_presence(ast);
        }
        self.normalize_dates(ast);
        self.wildcards(ast);
        self.single_term_prefixes(ast);
        self.fast_only_terms(ast);
        if self.dynamic_field().is_some() {
            self.route_to_dynamic(ast);
        }
        self.cidr_to_ranges(ast);
        self.bytes_values(ast);
        if self.older_schema {
            self.missing_fields_match_nothing(ast);
        }
        anchor_negations(ast);
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

    /// Values of terms and sets on bytes fields are read as Quickwit reads them: hex when they
    /// are (`trace_id:5b8efff7…`), else base64 (padding optional; a leading `!` forces base64).
    /// They are handed to Tantivy's parser in padded base64.
    fn bytes_values(&self, ast: &mut UserInputAst) {
        match ast {
            UserInputAst::Clause(clauses) => {
                for (_, sub) in clauses {
                    self.bytes_values(sub);
                }
            }
            UserInputAst::Boost(sub, _) => self.bytes_values(sub),
            UserInputAst::Leaf(leaf) => {
                let is_bytes = |field: Option<&str>| {
                    field
                        .and_then(|name| self.schema().get_field(name).ok())
                        .is_some_and(|f| {
                            matches!(
                                self.schema().get_field_entry(f).field_type(),
                                tantivy::schema::FieldType::Bytes(_)
                            )
                        })
                };
                match leaf.as_mut() {
                    UserInputLeaf::Literal(literal) if is_bytes(literal.field_name.as_deref()) => {
                        if let Some(value) = bytes_as_base64(&literal.phrase) {
                            literal.phrase = value;
                        }
                    }
                    UserInputLeaf::Set { field, elements } if is_bytes(field.as_deref()) => {
                        for element in elements {
                            if let Some(value) = bytes_as_base64(element) {
                                *element = value;
                            }
                        }
                    }
                    _ => {}
                }
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
                };
                if let Some(value) = value {
                    terms.push((field.clone(), value));
                }
            }
        }
    }

    /// A filter on the timestamp field: `start_secs <= timestamp < end_secs_exclusive` (on the
    /// fast datetime column, skipping the blocks of documents outside the range: see
    /// [`TimeFilterQuery`](crate::TimeFilterQuery)). `None` when the index has no timestamp field or both
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
        // Column values are floored to their precision, so `start <= value < end` in
        // nanoseconds is `start <= second of the timestamp < end`. A bound past an end of the
        // nanosecond range is no bound, or excludes everything (never a saturated value: the
        // last nanosecond would fall out of a window that holds its second).
        let lower = match start_secs.map(window_bound) {
            None | Some(WindowBound::BeforeAll) => Bound::Unbounded,
            Some(WindowBound::At(nanos)) => Bound::Included(DateTime::from_timestamp_nanos(nanos)),
            Some(WindowBound::AfterAll) => return Some(Box::new(EmptyQuery)),
        };
        let upper = match end_secs_exclusive.map(window_bound) {
            None | Some(WindowBound::AfterAll) => Bound::Unbounded,
            Some(WindowBound::At(nanos)) => Bound::Excluded(DateTime::from_timestamp_nanos(nanos)),
            Some(WindowBound::BeforeAll) => return Some(Box::new(EmptyQuery)),
        };
        let lower = match (lower, &upper) {
            // Every instant is in the window, but documents without a timestamp are not (and
            // a range needs a bound).
            (Bound::Unbounded, Bound::Unbounded) => Bound::Included(DateTime::MIN),
            (lower, _) => lower,
        };
        Some(Box::new(crate::TimeFilterQuery::new(field, lower, upper)))
    }

    /// Resolves a field name of the schema.
    pub fn field(&self, name: &str) -> Option<Field> {
        self.schema().get_field(name).ok()
    }
}

/// Rejects field names with control characters (`\0`, …): no field can be named so, and
/// Tantivy uses some of them to delimit json paths inside terms.
fn check_field_names(ast: &UserInputAst) -> Result<(), IndexError> {
    let name = match ast {
        UserInputAst::Clause(clauses) => {
            return clauses
                .iter()
                .try_for_each(|(_, sub)| check_field_names(sub));
        }
        UserInputAst::Boost(sub, _) => return check_field_names(sub),
        UserInputAst::Leaf(leaf) => match leaf.as_ref() {
            UserInputLeaf::Literal(literal) => literal.field_name.as_deref(),
            UserInputLeaf::Range { field, .. }
            | UserInputLeaf::Set { field, .. }
            | UserInputLeaf::Regex { field, .. } => field.as_deref(),
            UserInputLeaf::Exists { field } => Some(field.as_str()),
            UserInputLeaf::All => None,
        },
    };
    name.map_or(Ok(()), check_field_name)
}

/// Rejects a field name with a control character (see [`check_field_names`]).
fn check_field_name(name: &str) -> Result<(), IndexError> {
    if name.chars().any(char::is_control) {
        return Err(IndexError::InvalidQuery(format!(
            "field name {name:?} contains a control character"
        )));
    }
    Ok(())
}

/// The deepest nesting a query may have: parentheses and `NOT` / `-` / `+` prefixes, each a
/// level. Parsing, rewriting and running a query recurse once per level, so without a bound a
/// query could overflow a thread's stack.
pub const MAX_QUERY_DEPTH: usize = 64;

/// Refuses a query nested deeper than [`MAX_QUERY_DEPTH`] (`tokens`: its words and
/// parentheses, phrases whole).
fn check_depth(query: &str, tokens: &[String]) -> Result<(), IndexError> {
    let mut depth = 0usize;
    // Prefixes waiting for their operand, and what each open parenthesis added.
    let mut pending = 0usize;
    let mut opened: Vec<usize> = Vec::new();
    for token in tokens {
        let reached = match token.as_str() {
            "(" => {
                opened.push(pending + 1);
                depth += pending + 1;
                pending = 0;
                depth
            }
            ")" => {
                depth = depth.saturating_sub(opened.pop().unwrap_or(0));
                depth
            }
            "NOT" => {
                pending += 1;
                depth + pending
            }
            word => {
                let prefixes = word.chars().take_while(|c| matches!(c, '-' | '+')).count();
                pending += prefixes;
                let reached = depth + pending;
                if prefixes < word.len() {
                    // An operand: its prefixes are used up.
                    pending = 0;
                }
                reached
            }
        };
        if reached > MAX_QUERY_DEPTH {
            let shown: String = query.chars().take(80).collect();
            return Err(IndexError::InvalidQuery(format!(
                "`{shown}…`: the query is nested more than {MAX_QUERY_DEPTH} levels deep \
                 (parentheses and NOT, - and + prefixes), the maximum query depth"
            )));
        }
    }
    Ok(())
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
    check_depth(query, &tokens)?;
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
/// A bytes query value (hex, else base64 with or without padding; `!` forces base64) in padded
/// standard base64, or `None` when it is neither (Tantivy's parser then reports it).
fn bytes_as_base64(text: &str) -> Option<String> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
    use base64::engine::DecodePaddingMode;
    use base64::Engine;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let bytes = match text.strip_prefix('!') {
        Some(b64) => LENIENT.decode(b64).ok()?,
        None => match hex_decode(text) {
            Some(bytes) => bytes,
            None => LENIENT.decode(text).ok()?,
        },
    };
    Some(STANDARD.encode(bytes))
}

/// `text` as hex digits (an even number of them), if it is.
fn hex_decode(text: &str) -> Option<Vec<u8>> {
    if text.is_empty()
        || !text.len().is_multiple_of(2)
        || !text.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

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
