//! Search requests and responses, in Quickwit's REST shape.

use serde::{Deserialize, Serialize};

/// Default `max_hits`.
pub const DEFAULT_MAX_HITS: usize = 20;

fn default_max_hits() -> usize {
    DEFAULT_MAX_HITS
}

/// A search request (`GET` query string or `POST` JSON body).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SearchRequest {
    /// Tantivy query language; empty or `*` matches everything.
    #[serde(default)]
    pub query: String,
    /// Inclusive lower bound on the timestamp field, seconds since epoch.
    #[serde(default)]
    pub start_timestamp: Option<i64>,
    /// Exclusive upper bound on the timestamp field, seconds since epoch.
    #[serde(default)]
    pub end_timestamp: Option<i64>,
    /// Hits returned (default 20).
    #[serde(default = "default_max_hits")]
    pub max_hits: usize,
    /// Hits skipped first.
    #[serde(default)]
    pub start_offset: usize,
    /// `timestamp`/`-timestamp`/`+timestamp`/`timestamp:asc|desc` or `_score`.
    #[serde(default)]
    pub sort_by: Option<String>,
    /// Fields searched by terms without a field (default: the index's default search fields).
    #[serde(default, deserialize_with = "shale_types::field_list")]
    pub search_field: Option<Vec<String>>,
    /// Time travel: search the index as it was at the end of this second (Unix seconds),
    /// within the index's `time_travel_retention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<i64>,
    /// Aggregations (Elasticsearch's aggregation JSON, as Quickwit's `aggs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggs: Option<serde_json::Value>,
    /// A cursor (Elasticsearch's `search_after`): only hits sorting strictly after this key
    /// are returned; the count and aggregations still cover every match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_after: Option<crate::leaf::SortKey>,
}

/// Sort direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortOrder {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

/// One sort criterion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SortField {
    /// By BM25 score, best first.
    Score,
    /// By address in the index (split, segment, document): Elasticsearch's `_doc`.
    Doc(SortOrder),
    /// By a fast field.
    Field {
        /// Field name.
        field: String,
        /// Direction.
        order: SortOrder,
    },
}

/// How hits are ordered: one or two criteria, the second breaking ties of the first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortBy {
    /// The criteria, most significant first.
    pub fields: Vec<SortField>,
}

/// Most sort criteria a search may have (as in Quickwit).
pub const MAX_SORT_FIELDS: usize = 2;

impl SortBy {
    /// By score.
    pub fn score() -> Self {
        SortBy {
            fields: vec![SortField::Score],
        }
    }

    /// By one field.
    pub fn field(field: impl Into<String>, order: SortOrder) -> Self {
        SortBy {
            fields: vec![SortField::Field {
                field: field.into(),
                order,
            }],
        }
    }

    /// Parses the `sort_by` parameter as Quickwit does: comma-separated criteria, each
    /// `field` or `+field` (descending, newest first), `-field` (ascending), `field:asc|desc`,
    /// or `_score`; at most [`MAX_SORT_FIELDS`].
    pub fn parse(s: &str) -> Result<SortBy, String> {
        let fields = s
            .split(',')
            .map(parse_sort_field)
            .collect::<Result<Vec<_>, _>>()?;
        if fields.len() > MAX_SORT_FIELDS {
            return Err(format!(
                "sort by {} fields: at most {MAX_SORT_FIELDS} are supported",
                fields.len()
            ));
        }
        Ok(SortBy { fields })
    }
}

fn parse_sort_field(s: &str) -> Result<SortField, String> {
    let s = s.trim();
    if s == "_score" || s == "+_score" || s == "-_score" {
        return Ok(SortField::Score);
    }
    match s {
        "_doc" | "+_doc" | "_doc:desc" => return Ok(SortField::Doc(SortOrder::Desc)),
        "-_doc" | "_doc:asc" => return Ok(SortField::Doc(SortOrder::Asc)),
        _ => {}
    }
    let (field, order) = if let Some((field, order)) = s.split_once(':') {
        let order = match order {
            "asc" => SortOrder::Asc,
            "desc" => SortOrder::Desc,
            other => return Err(format!("unknown sort order `{other}` (asc or desc)")),
        };
        (field, order)
    } else if let Some(field) = s.strip_prefix('-') {
        (field, SortOrder::Asc)
    } else if let Some(field) = s.strip_prefix('+') {
        (field, SortOrder::Desc)
    } else {
        (s, SortOrder::Desc)
    };
    if field.is_empty() {
        return Err("empty sort field".to_string());
    }
    Ok(SortField::Field {
        field: field.to_string(),
        order,
    })
}

/// A search response, Quickwit's shape plus split fan-out figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SearchResponse {
    /// Total number of matching documents.
    pub num_hits: u64,
    /// The requested page of hits, as JSON documents.
    pub hits: Vec<serde_json::Value>,
    /// Wall time of the search.
    pub elapsed_time_micros: u64,
    /// Per-split failures (the other splits' hits are still returned).
    pub errors: Vec<String>,
    /// Splits opened.
    pub num_splits_searched: usize,
    /// Splits skipped by time range or tag pruning.
    pub num_splits_pruned: usize,
    /// Nodes that searched splits for this response.
    #[serde(default)]
    pub num_nodes: usize,
    /// The aggregations' results, when the request had `aggs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregations: Option<serde_json::Value>,
    /// Per hit, in order: its index, address and sort values (for the Elasticsearch API's
    /// `_index`, `_id` and `sort`); not part of the REST response.
    #[serde(skip)]
    pub hit_meta: Vec<HitMeta>,
    /// Aggregations not rendered yet (a part of [`crate::SearchService::search_many`]).
    #[serde(skip)]
    pub intermediate_aggs:
        Option<tantivy::aggregation::intermediate_agg_result::IntermediateAggregationResults>,
    /// The count error bounds of `intermediate_aggs`.
    #[serde(skip)]
    pub term_count_errors: crate::aggs::TermCountErrors,
}

/// Where a hit comes from and how it sorted.
#[derive(Clone, Debug, PartialEq)]
pub struct HitMeta {
    /// Its sort values, one per criterion.
    pub key: crate::leaf::SortKey,
    /// Its address.
    pub doc: crate::leaf::DocRef,
    /// Its index.
    pub index_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_by_forms() {
        assert_eq!(SortBy::parse("_score").unwrap(), SortBy::score());
        let f = |field: &str, order| SortBy::field(field, order);
        assert_eq!(SortBy::parse("ts").unwrap(), f("ts", SortOrder::Desc));
        // Quickwit's mini-language: `-` is ascending, `+` (or nothing) descending.
        assert_eq!(SortBy::parse("-ts").unwrap(), f("ts", SortOrder::Asc));
        assert_eq!(SortBy::parse("+ts").unwrap(), f("ts", SortOrder::Desc));
        assert_eq!(SortBy::parse("ts:asc").unwrap(), f("ts", SortOrder::Asc));
        assert!(SortBy::parse("ts:up").is_err());
        assert_eq!(
            SortBy::parse("service, -ts").unwrap().fields,
            vec![
                SortField::Field {
                    field: "service".into(),
                    order: SortOrder::Desc
                },
                SortField::Field {
                    field: "ts".into(),
                    order: SortOrder::Asc
                },
            ]
        );
        assert!(SortBy::parse("a,b,c").is_err());
        assert!(SortBy::parse("a,").is_err());
    }

    #[test]
    fn search_field_accepts_comma_list() {
        let req: SearchRequest =
            serde_json::from_str(r#"{"query":"x","search_field":"a, b"}"#).unwrap();
        assert_eq!(req.search_field.unwrap(), vec!["a", "b"]);
        assert_eq!(req.max_hits, 20);
    }
}
