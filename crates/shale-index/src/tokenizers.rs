//! The tokenizers of an index: Tantivy's built-ins (`default`, `raw`, `en_stem`,
//! `whitespace`), Quickwit's other built-ins (`raw_lowercase`/`lowercase`,
//! `chinese_compatible`, `source_code_default`) and the custom tokenizers of the doc mapping
//! (`simple`, `ngram`, `regex`, `multilang`, `source_code` bases with `remove_long`,
//! `lower_caser` and `ascii_folding` filters). The same manager tokenizes documents when
//! splits are written and query terms when queries are parsed.
//!
//! `multilang` detects each value's language (the `whichlang` detector Quickwit uses):
//! Chinese, Japanese and Korean text is split into characters (Quickwit segments them with
//! dictionaries instead), any other language into words as `simple` does.

use shale_config::{TokenFilter, TokenizerConfig, TokenizerKind};
use tantivy::tokenizer::{
    AsciiFoldingFilter, LowerCaser, NgramTokenizer, RawTokenizer, RegexTokenizer, RemoveLongFilter,
    SimpleTokenizer, TextAnalyzer, Token, TokenStream, Tokenizer, TokenizerManager,
};

use crate::IndexError;

/// Longest token kept by `remove_long` (bytes), as in Quickwit.
const MAX_TOKEN_BYTES: usize = 255;

/// The tokenizer manager of a doc mapping with `custom` tokenizers.
pub(crate) fn tokenizer_manager(
    custom: &[TokenizerConfig],
) -> Result<TokenizerManager, IndexError> {
    let manager = TokenizerManager::default();
    fn lowercased<T: Tokenizer>(tokenizer: T) -> TextAnalyzer {
        TextAnalyzer::builder(tokenizer)
            .filter(RemoveLongFilter::limit(MAX_TOKEN_BYTES))
            .filter(LowerCaser)
            .build()
    }
    manager.register("raw_lowercase", lowercased(RawTokenizer::default()));
    manager.register("lowercase", lowercased(RawTokenizer::default()));
    manager.register(
        "chinese_compatible",
        lowercased(WordsTokenizer { mode: Mode::Cjk }),
    );
    manager.register(
        "source_code_default",
        TextAnalyzer::builder(WordsTokenizer {
            mode: Mode::SourceCode,
        })
        .filter(RemoveLongFilter::limit(MAX_TOKEN_BYTES))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .build(),
    );
    for tokenizer in custom {
        let invalid = |message: String| {
            IndexError::from(shale_config::ConfigError::Invalid {
                field: format!("doc_mapping.tokenizers.{}", tokenizer.name),
                message,
            })
        };
        let mut builder = match &tokenizer.kind {
            TokenizerKind::Simple => TextAnalyzer::builder(SimpleTokenizer::default()).dynamic(),
            TokenizerKind::Ngram {
                min_gram,
                max_gram,
                prefix_only,
            } => TextAnalyzer::builder(
                NgramTokenizer::new(*min_gram, *max_gram, *prefix_only)
                    .map_err(|err| invalid(err.to_string()))?,
            )
            .dynamic(),
            TokenizerKind::Regex { pattern } => TextAnalyzer::builder(
                RegexTokenizer::new(pattern).map_err(|err| invalid(err.to_string()))?,
            )
            .dynamic(),
            TokenizerKind::Multilang => TextAnalyzer::builder(WordsTokenizer {
                mode: Mode::Multilang,
            })
            .dynamic(),
            TokenizerKind::SourceCode => TextAnalyzer::builder(WordsTokenizer {
                mode: Mode::SourceCode,
            })
            .dynamic(),
        };
        for filter in &tokenizer.filters {
            builder = match filter {
                TokenFilter::RemoveLong => {
                    builder.filter_dynamic(RemoveLongFilter::limit(MAX_TOKEN_BYTES))
                }
                TokenFilter::LowerCaser => builder.filter_dynamic(LowerCaser),
                TokenFilter::AsciiFolding => builder.filter_dynamic(AsciiFoldingFilter),
            };
        }
        manager.register(&tokenizer.name, builder.build());
    }
    Ok(manager)
}

/// The normalizers of fast text columns (`fast: {normalizer: raw|lowercase}`), as Tantivy's
/// fast-field tokenizers.
pub fn fast_field_tokenizers() -> TokenizerManager {
    let manager = TokenizerManager::new();
    manager.register("raw", RawTokenizer::default());
    manager.register(
        "lowercase",
        TextAnalyzer::builder(RawTokenizer::default())
            .filter(LowerCaser)
            .build(),
    );
    manager
}

/// Whether `c` is a Chinese, Japanese or Korean character.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0x1100..=0x11FF    // Hangul jamo
        | 0x3130..=0x318F    // Hangul compatibility jamo
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0x20000..=0x2FA1F  // CJK extensions B-F, compatibility supplement
    )
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Words; every CJK character a token.
    Cjk,
    /// Words split further at case changes and letter/digit boundaries.
    SourceCode,
    /// `Cjk` for Chinese, Japanese and Korean text, plain words otherwise.
    Multilang,
}

/// A tokenizer splitting text into alphanumeric words, with per-mode refinements.
#[derive(Clone, Debug)]
struct WordsTokenizer {
    mode: Mode,
}

/// Tokens computed up front.
struct VecTokenStream {
    tokens: Vec<Token>,
    next: usize,
}

impl TokenStream for VecTokenStream {
    fn advance(&mut self) -> bool {
        if self.next < self.tokens.len() {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        &self.tokens[self.next - 1]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.next - 1]
    }
}

impl Tokenizer for WordsTokenizer {
    type TokenStream<'a> = VecTokenStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> VecTokenStream {
        let cjk = match self.mode {
            Mode::Cjk => true,
            Mode::SourceCode => false,
            Mode::Multilang => matches!(
                whichlang::detect_language(text),
                whichlang::Lang::Cmn | whichlang::Lang::Jpn | whichlang::Lang::Kor
            ),
        };
        let source_code = matches!(self.mode, Mode::SourceCode);
        let mut spans: Vec<(usize, usize)> = Vec::new();
        let mut start: Option<usize> = None;
        let mut prev: Option<char> = None;
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        for (i, &(offset, c)) in chars.iter().enumerate() {
            if cjk && is_cjk(c) {
                if let Some(s) = start.take() {
                    spans.push((s, offset));
                }
                spans.push((offset, offset + c.len_utf8()));
                prev = None;
                continue;
            }
            if !c.is_alphanumeric() {
                if let Some(s) = start.take() {
                    spans.push((s, offset));
                }
                prev = None;
                continue;
            }
            if let (true, Some(s), Some(p)) = (source_code, start, prev) {
                let next = chars.get(i + 1).map(|&(_, n)| n);
                let boundary = (p.is_lowercase() && c.is_uppercase())
                    || (p.is_alphabetic() != c.is_alphabetic())
                    || (p.is_uppercase()
                        && c.is_uppercase()
                        && next.is_some_and(char::is_lowercase));
                if boundary {
                    spans.push((s, offset));
                    start = Some(offset);
                }
            }
            if start.is_none() {
                start = Some(offset);
            }
            prev = Some(c);
        }
        if let Some(s) = start {
            spans.push((s, text.len()));
        }
        let tokens = spans
            .into_iter()
            .enumerate()
            .map(|(position, (from, to))| Token {
                offset_from: from,
                offset_to: to,
                position,
                text: text[from..to].to_string(),
                position_length: 1,
            })
            .collect();
        VecTokenStream { tokens, next: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(manager: &TokenizerManager, name: &str, text: &str) -> Vec<String> {
        let mut analyzer = manager.get(name).unwrap();
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            out.push(stream.token().text.clone());
        }
        out
    }

    #[test]
    fn built_in_and_custom_tokenizers() {
        let custom: Vec<TokenizerConfig> = serde_yaml::from_str(
            r#"
- {name: grams, type: ngram, min_gram: 2, max_gram: 3, prefix_only: true, filters: [lower_caser]}
- {name: digits, type: regex, pattern: "[0-9]+"}
- {name: ml, type: multilang, filters: [remove_long, lower_caser]}
- {name: folded, type: simple, filters: [lower_caser, ascii_folding]}
"#,
        )
        .unwrap();
        let m = tokenizer_manager(&custom).unwrap();
        assert_eq!(tokens(&m, "raw_lowercase", "Hello World"), ["hello world"]);
        assert_eq!(tokens(&m, "grams", "Quick"), ["qu", "qui"]);
        assert_eq!(tokens(&m, "digits", "a12b345"), ["12", "345"]);
        assert_eq!(tokens(&m, "folded", "Café Déjà"), ["cafe", "deja"]);
        assert_eq!(
            tokens(&m, "chinese_compatible", "Hello 世界 ok"),
            ["hello", "世", "界", "ok"]
        );
        assert_eq!(
            tokens(&m, "source_code_default", "parseHTTPResponse2 snake_case"),
            ["parse", "http", "response", "2", "snake", "case"]
        );
        assert_eq!(
            tokens(&m, "ml", "The quick brown fox"),
            ["the", "quick", "brown", "fox"]
        );
        assert_eq!(
            tokens(&m, "ml", "我爱北京天安门"),
            ["我", "爱", "北", "京", "天", "安", "门"]
        );
        let bad: Vec<TokenizerConfig> =
            serde_yaml::from_str("- {name: bad, type: regex, pattern: \"(\"}").unwrap();
        assert!(tokenizer_manager(&bad).is_err());
    }
}
