//! Wildcard terms (`err*`, `h?st`, `*disk*full*`) and regexes of the same shape (`/err.*/`),
//! matched against a term dictionary without building a DFA first.
//!
//! Tantivy's regex query determinizes its pattern before reading a single term; a pattern with
//! many wildcards costs up to a second of CPU per field and split before its state limit stops
//! it (found by fuzzing the Elasticsearch DSL). A glob needs no determinization: this automaton
//! runs the pattern's NFA on the bytes of each term, one bitset of active positions per FST
//! node, so its cost is linear in the pattern and the terms visited.
//!
//! A glob matches exactly what the equivalent regex matches (`.` and `.*` do not match `\n`,
//! as in the regex), so recognizing regexes of glob shape changes no result.

use std::fmt;
use std::sync::Arc;

use tantivy::query::{AutomatonWeight, EnableScoring, Query, Weight};
use tantivy::schema::Field;
use tantivy_fst::Automaton;

/// One step of a glob, on the UTF-8 bytes of a term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// This byte.
    Byte(u8),
    /// The first byte of any character but `\n` (`?`, or `.` in a regex).
    AnyLead,
    /// The continuation bytes of that character (zero or more).
    Continuation,
    /// Any bytes but `\n` (`*`, or `.*` in a regex).
    Star,
}

impl Step {
    /// Whether the step may consume nothing.
    fn is_optional(self) -> bool {
        matches!(self, Step::Continuation | Step::Star)
    }
}

/// A glob pattern: literal characters, any single character, any run of characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GlobPart {
    /// A literal character.
    Char(char),
    /// Any single character (`?`).
    Any,
    /// Any run of characters, possibly empty (`*`).
    Star,
}

/// The characters a regex escapes to take literally.
const META: &str = "\\.+*?()|[]{}^$#&-~";

/// Parses a regex into glob parts when it has a glob's shape: literal characters (escaped
/// punctuation and `\xHH` included), `.` and `.*`; `None` for anything else (classes,
/// alternations, repetitions, anchors, …), which stays a regex.
pub(crate) fn parse_glob_regex(pattern: &str) -> Option<Vec<GlobPart>> {
    let mut parts = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let escaped = chars.next()?;
                if escaped == 'x' {
                    let high = chars.next()?.to_digit(16)?;
                    let low = chars.next()?.to_digit(16)?;
                    parts.push(GlobPart::Char(char::from_u32(high * 16 + low)?));
                } else if META.contains(escaped) {
                    parts.push(GlobPart::Char(escaped));
                } else {
                    // `\d`, `\w`, `\n`, `\p{…}`, …: classes and escapes a glob has not.
                    return None;
                }
            }
            '.' => {
                if chars.peek() == Some(&'*') {
                    chars.next();
                    if matches!(chars.peek(), Some('?' | '+' | '*' | '{')) {
                        return None;
                    }
                    if parts.last() != Some(&GlobPart::Star) {
                        parts.push(GlobPart::Star);
                    }
                } else {
                    parts.push(GlobPart::Any);
                }
            }
            c if META.contains(c) => return None,
            c => parts.push(GlobPart::Char(c)),
        }
    }
    Some(parts)
}

/// Bitsets of the positions of a glob (inline up to 128 positions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Positions(Words);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Words {
    Inline([u64; 2]),
    Heap(Box<[u64]>),
}

impl Positions {
    fn empty(len: usize) -> Self {
        let words = len.div_ceil(64);
        Positions(if words <= 2 {
            Words::Inline([0; 2])
        } else {
            Words::Heap(vec![0; words].into_boxed_slice())
        })
    }

    fn words(&self) -> &[u64] {
        match &self.0 {
            Words::Inline(words) => words,
            Words::Heap(words) => words,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match &mut self.0 {
            Words::Inline(words) => words,
            Words::Heap(words) => words,
        }
    }

    fn set(&mut self, position: usize) {
        self.words_mut()[position / 64] |= 1 << (position % 64);
    }

    fn contains(&self, position: usize) -> bool {
        self.words()[position / 64] & (1 << (position % 64)) != 0
    }

    fn is_empty(&self) -> bool {
        self.words().iter().all(|word| *word == 0)
    }

    fn intersects(&self, other: &Positions) -> bool {
        self.words()
            .iter()
            .zip(other.words())
            .any(|(a, b)| a & b != 0)
    }
}

/// A glob as an automaton over the bytes of terms: its state is the set of pattern positions
/// reached, `None` once none is.
#[derive(Clone)]
pub struct GlobAutomaton {
    steps: Vec<Step>,
    /// Per byte value: the positions whose step consumes that byte and moves on.
    advance: Vec<Positions>,
    /// Per byte value: the positions whose step consumes that byte and stays.
    stay: Vec<Positions>,
    /// The start state: position 0, and those reached from it by skipping optional steps.
    start: Positions,
}

impl fmt::Debug for GlobAutomaton {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GlobAutomaton")
            .field("steps", &self.steps)
            .finish()
    }
}

impl GlobAutomaton {
    /// The automaton of a glob: `prefix` bytes (a json path) and then `parts`.
    pub(crate) fn new(prefix: &[u8], parts: &[GlobPart]) -> Self {
        let mut steps: Vec<Step> = prefix.iter().map(|byte| Step::Byte(*byte)).collect();
        for part in parts {
            match part {
                GlobPart::Char(c) => {
                    let mut buf = [0; 4];
                    steps.extend(c.encode_utf8(&mut buf).bytes().map(Step::Byte));
                }
                GlobPart::Any => steps.extend([Step::AnyLead, Step::Continuation]),
                GlobPart::Star => {
                    if steps.last() != Some(&Step::Star) {
                        steps.push(Step::Star)
                    }
                }
            }
        }
        let positions = steps.len() + 1;
        let mut advance = vec![Positions::empty(positions); 256];
        let mut stay = vec![Positions::empty(positions); 256];
        for byte in 0..=255u8 {
            let continuation = byte & 0xC0 == 0x80;
            for (position, step) in steps.iter().enumerate() {
                let (moves, stays) = match *step {
                    Step::Byte(expected) => (byte == expected, false),
                    Step::AnyLead => (!continuation && byte != b'\n', false),
                    Step::Continuation => (false, continuation),
                    Step::Star => (false, byte != b'\n'),
                };
                if moves {
                    advance[usize::from(byte)].set(position);
                }
                if stays {
                    stay[usize::from(byte)].set(position);
                }
            }
        }
        let mut start = Positions::empty(positions);
        start.set(0);
        let mut automaton = GlobAutomaton {
            steps,
            advance,
            stay,
            start: Positions::empty(positions),
        };
        automaton.close(&mut start);
        automaton.start = start;
        automaton
    }

    /// Adds the positions reached by skipping optional steps.
    fn close(&self, positions: &mut Positions) {
        for (position, step) in self.steps.iter().enumerate() {
            if step.is_optional() && positions.contains(position) {
                positions.set(position + 1);
            }
        }
    }
}

impl Automaton for GlobAutomaton {
    type State = Option<Positions>;

    fn start(&self) -> Self::State {
        Some(self.start.clone())
    }

    fn is_match(&self, state: &Self::State) -> bool {
        state
            .as_ref()
            .is_some_and(|positions| positions.contains(self.steps.len()))
    }

    fn can_match(&self, state: &Self::State) -> bool {
        state.is_some()
    }

    fn will_always_match(&self, _state: &Self::State) -> bool {
        // `*` does not match `\n`: no state matches whatever comes.
        false
    }

    fn accept(&self, state: &Self::State, byte: u8) -> Self::State {
        let current = state.as_ref()?;
        let advance = &self.advance[usize::from(byte)];
        let stay = &self.stay[usize::from(byte)];
        if !current.intersects(advance) && !current.intersects(stay) {
            return None;
        }
        let mut next = Positions::empty(self.steps.len() + 1);
        {
            let (from, to) = (current.words(), next.words_mut());
            let mut carry = 0;
            for (i, word) in from.iter().enumerate() {
                let moved = word & advance.words()[i];
                to[i] |= (moved << 1) | carry | (word & stay.words()[i]);
                carry = moved >> 63;
            }
        }
        self.close(&mut next);
        (!next.is_empty()).then_some(next)
    }
}

/// Documents with a term of `field` that the glob matches.
#[derive(Clone, Debug)]
pub struct GlobQuery {
    field: Field,
    automaton: Arc<GlobAutomaton>,
}

impl GlobQuery {
    /// The query for `parts` on `field`'s terms, which start with `prefix` (empty but for
    /// paths inside json fields).
    pub(crate) fn new(field: Field, prefix: &[u8], parts: &[GlobPart]) -> Self {
        GlobQuery {
            field,
            automaton: Arc::new(GlobAutomaton::new(prefix, parts)),
        }
    }
}

impl Query for GlobQuery {
    fn weight(&self, _scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        Ok(Box::new(AutomatonWeight::<GlobAutomaton>::new(
            self.field,
            self.automaton.clone(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(automaton: &GlobAutomaton, term: &str) -> bool {
        let mut state = automaton.start();
        for byte in term.bytes() {
            state = automaton.accept(&state, byte);
            if !automaton.can_match(&state) {
                return false;
            }
        }
        automaton.is_match(&state)
    }

    /// The glob answers as Tantivy's regex does, on terms chosen to hit every step.
    #[test]
    fn agrees_with_the_regex() {
        let patterns = [
            "err.*",
            ".*disk.*full.*",
            "h.st",
            ".*",
            ".",
            "",
            "a.*b.*c",
            "..é.*",
            "\\.\\*x\\x00s.*",
            "日本.*語",
            ".*.",
            "x.*.y",
            "a b.*",
        ];
        let terms = [
            "",
            "e",
            "err",
            "error",
            "errors\n",
            "disk is full",
            "diskfull",
            "no disk",
            "host",
            "hst",
            "hoost",
            "hést",
            "h\nst",
            "abc",
            "aXbYc",
            "acb",
            "ab",
            "..é",
            "xyé!",
            "xé",
            ".*x\0s",
            ".*x\0sfoo",
            "日本語",
            "日本の語",
            "日本",
            "a",
            "é",
            "xy",
            "x\ny",
            "xzy",
            "a b",
            "a bc",
        ];
        for pattern in patterns {
            let parts = parse_glob_regex(pattern).expect("a glob-shaped regex");
            let glob = GlobAutomaton::new(b"", &parts);
            let regex = tantivy_fst::Regex::new(pattern).expect("a valid regex");
            for term in terms {
                let expected = {
                    let mut state = regex.start();
                    for byte in term.bytes() {
                        state = regex.accept(&state, byte);
                    }
                    regex.is_match(&state)
                };
                assert_eq!(
                    matches(&glob, term),
                    expected,
                    "pattern {pattern:?} on term {term:?}"
                );
            }
        }
    }

    #[test]
    fn long_patterns_use_heap_positions() {
        let pattern = format!("{}.*{}", "a".repeat(150), "b".repeat(40));
        let glob = GlobAutomaton::new(b"", &parse_glob_regex(&pattern).expect("a glob"));
        assert!(matches(
            &glob,
            &format!("{}xyz{}", "a".repeat(150), "b".repeat(40))
        ));
        assert!(matches(
            &glob,
            &format!("{}{}", "a".repeat(150), "b".repeat(40))
        ));
        assert!(!matches(
            &glob,
            &format!("{}{}", "a".repeat(149), "b".repeat(40))
        ));
    }

    #[test]
    fn regexes_of_other_shapes_stay_regexes() {
        for pattern in [
            "a+", "a|b", "[ab]", "\\d", "a.*?", "^a", "a{2}", "(a)", "a-b", "\\/",
        ] {
            assert_eq!(parse_glob_regex(pattern), None, "{pattern}");
        }
        assert_eq!(
            parse_glob_regex("a.*.*b"),
            Some(vec![
                GlobPart::Char('a'),
                GlobPart::Star,
                GlobPart::Char('b')
            ])
        );
    }

    #[test]
    fn a_json_prefix_is_matched_first() {
        let glob = GlobAutomaton::new(b"user\0s", &parse_glob_regex("jo.*").expect("a glob"));
        assert!(matches(&glob, "user\0sjohn"));
        assert!(!matches(&glob, "usex\0sjohn"));
        assert!(!matches(&glob, "john"));
    }
}
