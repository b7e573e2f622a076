//! Label matchers with Prometheus's semantics: `=` and `!=` compare whole values, `=~` and
//! `!~` match a regex anchored at both ends (RE2 syntax, `.` not matching a newline, as in
//! Prometheus 2.x), and a missing label matches as the empty string (`{env=""}` selects the
//! series without `env`).

use regex::Regex;

use crate::{Labels, MetricsError};

/// How a matcher compares a label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Equal,
    /// `!=`
    NotEqual,
    /// `=~`
    Regex,
    /// `!~`
    NotRegex,
}

/// One label matcher of a selector (`job="api"`, `__name__=~"http_.*"`).
#[derive(Clone, Debug)]
pub struct Matcher {
    /// The label.
    pub name: String,
    /// The comparison.
    pub op: MatchOp,
    /// The value or regex as written.
    pub value: String,
    regex: Option<Regex>,
}

impl Matcher {
    /// A matcher; a regex that does not compile is an error naming it.
    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Matcher, MetricsError> {
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => {
                Some(Regex::new(&format!("^(?:{value})$")).map_err(|err| {
                    MetricsError::InvalidRegex {
                        regex: value.to_string(),
                        reason: err.to_string(),
                    }
                })?)
            }
            MatchOp::Equal | MatchOp::NotEqual => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value: value.to_string(),
            regex,
        })
    }

    /// `name = value`.
    pub fn equal(name: &str, value: &str) -> Matcher {
        Matcher {
            name: name.to_string(),
            op: MatchOp::Equal,
            value: value.to_string(),
            regex: None,
        }
    }

    /// Whether a label value (`""` for a missing label) matches.
    pub fn matches_value(&self, value: &str) -> bool {
        match self.op {
            MatchOp::Equal => value == self.value,
            MatchOp::NotEqual => value != self.value,
            MatchOp::Regex => self.regex.as_ref().is_some_and(|re| re.is_match(value)),
            MatchOp::NotRegex => !self.regex.as_ref().is_some_and(|re| re.is_match(value)),
        }
    }

    /// Whether the series' labels match.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.matches_value(labels.get(&self.name).unwrap_or(""))
    }

    /// Whether the matcher selects series that lack the label.
    pub fn matches_missing(&self) -> bool {
        self.matches_value("")
    }

    /// The one value a matching series must have (`=` with a non-empty value): what row
    /// group statistics and bloom filters can rule out.
    pub fn required_value(&self) -> Option<&str> {
        (self.op == MatchOp::Equal && !self.value.is_empty()).then_some(self.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_semantics() {
        let re = Matcher::new("job", MatchOp::Regex, "api|web").expect("a regex");
        assert!(re.matches_value("api"));
        assert!(!re.matches_value("apix"), "anchored at both ends");
        assert!(!re.matches_value(""));
        let empty = Matcher::new("env", MatchOp::Equal, "").expect("a matcher");
        assert!(empty.matches_missing());
        let present = Matcher::new("env", MatchOp::NotEqual, "").expect("a matcher");
        assert!(!present.matches_missing());
        let dot = Matcher::new("m", MatchOp::Regex, "a.b").expect("a regex");
        assert!(
            !dot.matches_value("a\nb"),
            "`.` does not match a newline, as in Prometheus 2.x (3.0 changed it)"
        );
        assert!(dot.matches_value("a-b"));
        let not = Matcher::new("job", MatchOp::NotRegex, "a.*").expect("a regex");
        assert!(not.matches_missing());
        assert!(!not.matches_value("abc"));
        let err = Matcher::new("job", MatchOp::Regex, "(").expect_err("invalid");
        assert!(err.to_string().contains("`(`"), "{err}");
    }
}
