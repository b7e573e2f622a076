//! Index templates (Quickwit's `/api/v1/templates`): an index config without an index id,
//! applied to an index created on its first write (ingest or `_bulk`) when its id matches one
//! of the template's `index_id_patterns`. Among matching templates the highest `priority` wins
//! (ties: the smallest template id).

use serde::{Deserialize, Serialize};

use crate::{
    CompactionSettings, ConfigError, DocMapping, IndexConfig, IndexingSettings, IngestSettings,
    RetentionPolicy, SearchSettings,
};

/// An index template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexTemplate {
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<serde_json::Value>,
    /// `^[a-zA-Z][a-zA-Z0-9._-]{2,254}$`.
    pub template_id: String,
    /// Index id patterns: `*` matches any run of characters; a pattern starting with `-`
    /// excludes the ids it matches.
    pub index_id_patterns: Vec<String>,
    /// Where created indexes keep their splits: `{index_root_uri}/{index_id}`; defaults to
    /// the node's default index root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_root_uri: Option<String>,
    /// The highest priority wins among templates matching an index id.
    #[serde(default)]
    pub priority: usize,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The doc mapping of created indexes.
    pub doc_mapping: DocMapping,
    /// Their indexing settings.
    #[serde(default)]
    pub indexing_settings: IndexingSettings,
    /// Their ingest settings (Quickwit's; see [`IndexConfig::inert_keys`]).
    #[serde(default, skip_serializing_if = "IngestSettings::is_default")]
    pub ingest_settings: IngestSettings,
    /// Their search settings.
    #[serde(default)]
    pub search_settings: SearchSettings,
    /// Their retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionPolicy>,
    /// Their automatic compaction settings.
    #[serde(default, skip_serializing_if = "CompactionSettings::is_default")]
    pub compaction: CompactionSettings,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

impl IndexTemplate {
    /// Parses a template (JSON if its first non-space byte is `{`, else YAML) and
    /// [validates](IndexTemplate::validate) it. Errors name the offending field.
    pub fn parse(bytes: &[u8]) -> Result<IndexTemplate, ConfigError> {
        let template: IndexTemplate = crate::validation::deserialize_with_path(bytes)?;
        template.validate()?;
        Ok(template)
    }

    /// Parses a template as [`parse`](IndexTemplate::parse) does, its id set to
    /// `template_id` whatever the body says (`PUT /api/v1/templates/{id}`).
    pub fn parse_with_id(bytes: &[u8], template_id: &str) -> Result<IndexTemplate, ConfigError> {
        let mut value: serde_json::Value = crate::validation::deserialize_with_path(bytes)?;
        match &mut value {
            serde_json::Value::Object(object) => {
                object.insert(
                    "template_id".to_string(),
                    serde_json::Value::String(template_id.to_string()),
                );
            }
            _ => {
                return Err(ConfigError::Parse(
                    "a template must be an object".to_string(),
                ))
            }
        }
        let body = serde_json::to_vec(&value).map_err(|err| ConfigError::Parse(err.to_string()))?;
        IndexTemplate::parse(&body)
    }

    /// Checks the id, the patterns, and the config an index created from it would have.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::validation::validate_index_id(&self.template_id).map_err(|_| {
            invalid(
                "template_id",
                format!(
                    "`{}` is invalid: must match `^[a-zA-Z][a-zA-Z0-9._-]{{2,254}}$` (3 to 255 \
                 characters, starting with a letter)",
                    self.template_id
                ),
            )
        })?;
        if self.index_id_patterns.is_empty() {
            return Err(invalid(
                "index_id_patterns",
                "a template needs at least one index id pattern",
            ));
        }
        for (i, pattern) in self.index_id_patterns.iter().enumerate() {
            validate_pattern(pattern)
                .map_err(|message| invalid(format!("index_id_patterns[{i}]"), message))?;
        }
        if !self.index_id_patterns.iter().any(|p| !p.starts_with('-')) {
            return Err(invalid(
                "index_id_patterns",
                "a template needs at least one positive pattern (not starting with `-`)",
            ));
        }
        // The config of an index created from the template must be valid.
        self.index_config("template-check").validate()
    }

    /// Whether an index with this id is created from this template: a positive pattern
    /// matches it and no negative one does.
    pub fn matches(&self, index_id: &str) -> bool {
        let mut matched = false;
        for pattern in &self.index_id_patterns {
            match pattern.strip_prefix('-') {
                Some(negative) if glob_match(negative, index_id) => return false,
                Some(_) => {}
                None => matched |= glob_match(pattern, index_id),
            }
        }
        matched
    }

    /// The config of index `index_id` created from this template (without an
    /// `index_root_uri`, the index goes under the node's default index root).
    pub fn index_config(&self, index_id: &str) -> IndexConfig {
        let root = self.index_root_uri.as_deref();
        let mut doc_mapping = self.doc_mapping.clone();
        doc_mapping.doc_mapping_uid = String::new();
        IndexConfig {
            version: self.version.clone(),
            index_id: index_id.to_string(),
            index_uri: root.map(|root| format!("{}/{index_id}", root.trim_end_matches('/'))),
            doc_mapping,
            metrics: None,
            indexing_settings: self.indexing_settings.clone(),
            ingest_settings: self.ingest_settings.clone(),
            search_settings: self.search_settings.clone(),
            retention: self.retention.clone(),
            compaction: self.compaction.clone(),
            time_travel_retention: None,
        }
    }
}

/// The template `index_id` is created from: the highest priority among the matching ones,
/// then the smallest id.
pub fn select_template<'a>(
    templates: &'a [IndexTemplate],
    index_id: &str,
) -> Option<&'a IndexTemplate> {
    templates
        .iter()
        .filter(|template| template.matches(index_id))
        .max_by(|a, b| {
            a.priority
                .cmp(&b.priority)
                .then_with(|| b.template_id.cmp(&a.template_id))
        })
}

/// A pattern is an index id in which `*` may stand for any run of characters, optionally
/// preceded by `-` (an exclusion).
fn validate_pattern(pattern: &str) -> Result<(), String> {
    let body = pattern.strip_prefix('-').unwrap_or(pattern);
    if body.is_empty() {
        return Err(format!("index id pattern `{pattern}` is empty"));
    }
    let mut chars = body.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '*');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*'));
    if !first_ok || !rest_ok || body.len() > 255 {
        return Err(format!(
            "index id pattern `{pattern}` is invalid: letters, digits, `.`, `_`, `-` and `*` \
             only, starting with a letter or `*`"
        ));
    }
    Ok(())
}

/// Whether `text` matches `pattern`, in which `*` matches any run of characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star_pi, star_ti)) = star {
            pi = star_pi + 1;
            ti = star_ti + 1;
            star = Some((star_pi, star_ti + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(id: &str, patterns: &[&str], priority: usize) -> IndexTemplate {
        let yaml = format!(
            "template_id: {id}\nindex_id_patterns: [{}]\npriority: {priority}\ndoc_mapping:\n  mode: dynamic\n",
            patterns
                .iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        serde_yaml::from_str(&yaml).unwrap()
    }

    #[test]
    fn globs() {
        assert!(glob_match("logs-*", "logs-2024"));
        assert!(glob_match("*", "anything"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("logs", "logs"));
        assert!(!glob_match("logs", "logs2"));
        assert!(glob_match("*-prod", "api-prod"));
    }

    #[test]
    fn the_highest_priority_matching_template_wins() {
        let templates = vec![
            template("generic", &["*"], 0),
            template("logs", &["logs-*", "-logs-test*"], 5),
            template("logs-eu", &["logs-eu-*"], 10),
        ];
        let pick = |id: &str| select_template(&templates, id).map(|t| t.template_id.as_str());
        assert_eq!(pick("logs-us-1"), Some("logs"));
        assert_eq!(pick("logs-eu-1"), Some("logs-eu"));
        assert_eq!(
            pick("logs-test-1"),
            Some("generic"),
            "excluded by `-logs-test*`"
        );
        assert_eq!(pick("metrics"), Some("generic"));
        let templates = vec![template("bbb", &["x*"], 1), template("aaa", &["x*"], 1)];
        assert_eq!(
            select_template(&templates, "xyz").map(|t| t.template_id.as_str()),
            Some("aaa"),
            "ties go to the smallest id"
        );
    }

    #[test]
    fn templates_are_validated() {
        template("good", &["logs-*"], 0).validate().unwrap();
        let err = template("x", &["logs-*"], 0).validate().unwrap_err();
        assert!(err.to_string().contains("template_id"), "{err}");
        let err = template("good", &["logs/*"], 0).validate().unwrap_err();
        assert!(err.to_string().contains("index_id_patterns[0]"), "{err}");
        let err = template("good", &["-logs-*"], 0).validate().unwrap_err();
        assert!(err.to_string().contains("positive pattern"), "{err}");
        let mut bad = template("good", &["logs-*"], 0);
        bad.doc_mapping.timestamp_field = Some("missing".to_string());
        let err = bad.validate().unwrap_err();
        assert!(err.to_string().contains("timestamp_field"), "{err}");
    }

    #[test]
    fn an_index_config_from_a_template() {
        let mut t = template("logs", &["logs-*"], 0);
        t.index_root_uri = Some("s3://bucket/indexes/".to_string());
        let config = t.index_config("logs-1");
        assert_eq!(config.index_id, "logs-1");
        assert_eq!(
            config.index_uri.as_deref(),
            Some("s3://bucket/indexes/logs-1")
        );
        config.validate().unwrap();
        t.index_root_uri = None;
        assert_eq!(t.index_config("logs-2").index_uri, None);
    }
}
