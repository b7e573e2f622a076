//! Errors of the index crate.

use std::path::PathBuf;

use shale_config::ConfigError;

/// An error building a schema, a query, or building, opening or merging a split.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The doc mapping or search settings are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A query could not be parsed or does not fit the schema.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A split bundle is truncated, corrupt or not a bundle.
    #[error("invalid split bundle `{path}`: {message}")]
    InvalidBundle {
        /// The bundle file (empty for in-memory bundles).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// File system error.
    #[error("I/O error on `{path}`: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Error from Tantivy.
    #[error("tantivy: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    /// A caller broke a documented precondition (e.g. merging zero splits).
    #[error("{0}")]
    InvalidArgument(String),
}

impl IndexError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> IndexError {
        IndexError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why a document was rejected by [`DocMapper::parse_doc`](crate::DocMapper::parse_doc).
/// Every message names the offending field when there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DocParsingError {
    /// The document is larger than [`MAX_DOC_BYTES`](crate::MAX_DOC_BYTES).
    #[error("document is {num_bytes} bytes, over the {max_bytes} bytes limit")]
    TooLarge {
        /// Size of the document.
        num_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The bytes are not valid JSON.
    #[error("malformed JSON: {0}")]
    InvalidJson(String),
    /// Valid JSON, but not an object.
    #[error("document is not a JSON object")]
    NotAnObject,
    /// A declared field holds a value of the wrong type (or an unparsable one).
    #[error("field `{field}`: {message}")]
    InvalidValue {
        /// The field.
        field: String,
        /// What is wrong, with the value.
        message: String,
    },
    /// An undeclared field, in `strict` mode.
    #[error("field `{field}` is not declared in the doc mapping (mode: strict)")]
    UnknownField {
        /// The field.
        field: String,
    },
    /// The index has a timestamp field and the document does not.
    #[error("timestamp field `{field}` is missing")]
    MissingTimestamp {
        /// The timestamp field.
        field: String,
    },
    /// The timestamp field's value cannot be parsed with the field's `input_formats`.
    #[error("timestamp field `{field}`: {message}")]
    InvalidTimestamp {
        /// The timestamp field.
        field: String,
        /// What is wrong, with the value.
        message: String,
    },
}

impl DocParsingError {
    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            DocParsingError::InvalidValue { field, .. }
            | DocParsingError::UnknownField { field }
            | DocParsingError::MissingTimestamp { field }
            | DocParsingError::InvalidTimestamp { field, .. } => Some(field),
            _ => None,
        }
    }
}
