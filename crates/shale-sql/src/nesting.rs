//! A bound on how nested a SQL query may be, checked on its text before anything parses it.
//! DataFusion plans and optimizes expressions recursively (and its parser's own recursion
//! limit does not cover a long chain like `1 + 1 + … + 1`), so without a bound one query of a
//! few thousand levels would overflow a thread's stack.

/// The deepest parentheses may nest in a SQL query.
pub const MAX_SQL_DEPTH: usize = 64;

/// The most operators (`+`, `=`, `||`, `AND`, `OR`, `NOT`, …) a SQL query may have: they bound
/// how deep its expressions can nest.
pub const MAX_SQL_OPERATORS: usize = 512;

/// Refuses a query whose parentheses nest deeper than [`MAX_SQL_DEPTH`] or that has more than
/// [`MAX_SQL_OPERATORS`] operators (outside strings, quoted names and comments).
pub fn check(sql: &str) -> Result<(), String> {
    let bytes = sql.as_bytes();
    let (mut nesting, mut deepest, mut operators) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"' | b'`') => {
                // A string or quoted name; a doubled quote inside is the quote itself.
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == quote {
                        if bytes.get(i + 1) == Some(&quote) {
                            i += 1;
                        } else {
                            break;
                        }
                    }
                    i += 1;
                }
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 1;
            }
            b'(' => {
                nesting += 1;
                deepest = deepest.max(nesting);
            }
            b')' => nesting = nesting.saturating_sub(1),
            b'+' | b'-' | b'*' | b'/' | b'%' | b'=' | b'<' | b'>' | b'!' | b'|' | b'&' | b'^' => {
                // A run of operator characters (`<=`, `||`) is one operator.
                operators += 1;
                while bytes.get(i + 1).is_some_and(|b| b"=<>!|&".contains(b)) {
                    i += 1;
                }
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &sql[start..i];
                if ["and", "or", "not"]
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
    if deepest > MAX_SQL_DEPTH {
        return Err(format!(
            "the query nests parentheses {deepest} deep: at most {MAX_SQL_DEPTH} levels are \
             allowed, the maximum SQL depth"
        ));
    }
    if operators > MAX_SQL_OPERATORS {
        return Err(format!(
            "the query has more than {MAX_SQL_OPERATORS} operators, the maximum for a SQL query \
             (so that its expressions stay within the maximum SQL depth)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_or_long_queries_are_refused_and_strings_do_not_count() {
        let deep = format!("SELECT {}1{}", "(".repeat(65), ")".repeat(65));
        assert!(check(&deep).unwrap_err().contains("maximum SQL depth"));
        let long = format!("SELECT 1{}", " + 1".repeat(513));
        assert!(check(&long).unwrap_err().contains("operators"));
        let fine = format!(
            "SELECT 1{} FROM t WHERE a <= 2 AND b || 'x' = 'y'",
            " + 1".repeat(500)
        );
        assert!(check(&fine).is_ok());
        let strings = format!(
            "SELECT '{}' AS \"a(((\" -- ((((\nFROM t /* (((( */",
            "((((+ '' ".repeat(1000)
        );
        assert!(check(&strings).is_ok(), "{strings}");
    }
}
