//! Human-friendly durations (`90 days`, `1h30m`) and byte sizes (`10 MiB`, `500MB`).

use crate::ConfigError;

/// Parses a duration such as `90 days`, `12 hours`, `30s`, `1h 30m` or `2 weeks` into seconds.
///
/// A duration is one or more `<integer><unit>` pairs, with or without spaces, summed. Units:
/// `s`/`sec(s)`/`second(s)`, `m`/`min(s)`/`minute(s)`, `h`/`hr(s)`/`hour(s)`, `d`/`day(s)`,
/// `w`/`week(s)` (case-insensitive). A bare integer is rejected: the unit is required.
///
/// The error's `field` is `duration`; callers that know the field re-label it.
pub fn parse_duration(input: &str) -> Result<u64, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        field: "duration".to_string(),
        message,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(invalid("empty duration".to_string()));
    }
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut total: u64 = 0;
    while pos < bytes.len() {
        while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        if pos == bytes.len() {
            break;
        }
        let num_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        if num_start == pos {
            return Err(invalid(format!(
                "`{input}` is not a duration: expected a number at `{}`",
                &text[num_start..]
            )));
        }
        let value: u64 = text[num_start..pos]
            .parse()
            .map_err(|_| invalid(format!("`{input}`: number too large")))?;
        while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
            pos += 1;
        }
        let unit = text[unit_start..pos].to_ascii_lowercase();
        let multiplier: u64 = match unit.as_str() {
            "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            "" => {
                return Err(invalid(format!(
                "`{input}` is not a duration: missing unit after `{value}` (e.g. `{value} days`)"
            )))
            }
            other => {
                return Err(invalid(format!(
                    "`{input}` is not a duration: unknown unit `{other}` (expected s, m, h, d or w)"
                )))
            }
        };
        total = value
            .checked_mul(multiplier)
            .and_then(|secs| total.checked_add(secs))
            .ok_or_else(|| invalid(format!("`{input}`: duration too large")))?;
    }
    Ok(total)
}

/// Parses a byte size such as `10 MiB`, `500MB`, `1GiB` or `4096` (bytes) into bytes.
///
/// Decimal units (`KB`, `MB`, `GB`, `TB`) are powers of 1000, binary units (`KiB`, `MiB`, `GiB`,
/// `TiB`) powers of 1024, as in Quickwit; units are case-insensitive, `B` is optional.
pub fn parse_byte_size(input: &str) -> Result<u64, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        field: "byte size".to_string(),
        message,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(invalid(format!("`{input}` is not a byte size")));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        other => {
            return Err(invalid(format!(
                "`{input}` is not a byte size: unknown unit `{other}`"
            )))
        }
    };
    if let Ok(integer) = number.parse::<u64>() {
        return integer
            .checked_mul(multiplier)
            .ok_or_else(|| invalid(format!("`{input}`: byte size too large")));
    }
    let float: f64 = number
        .parse()
        .map_err(|_| invalid(format!("`{input}` is not a byte size")))?;
    let bytes = float * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(invalid(format!("`{input}`: byte size too large")));
    }
    Ok(bytes.round() as u64)
}

/// Deserializes a byte size written as an integer or a string with a unit (`10MiB`), for
/// `serde(deserialize_with)`.
pub(crate) fn deserialize_byte_size<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<u64, D::Error> {
    use serde::Deserialize;
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a number of bytes or a size like `10MiB`")]
    enum Raw {
        Int(u64),
        Text(String),
    }
    match Raw::deserialize(deserializer)? {
        Raw::Int(bytes) => Ok(bytes),
        Raw::Text(text) => parse_byte_size(&text).map_err(|err| match err {
            ConfigError::Invalid { message, .. } => serde::de::Error::custom(message),
            other => serde::de::Error::custom(other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90 days").unwrap(), 90 * 86_400);
        assert_eq!(parse_duration("90days").unwrap(), 90 * 86_400);
        assert_eq!(parse_duration("1 day").unwrap(), 86_400);
        assert_eq!(parse_duration("12 hours").unwrap(), 12 * 3_600);
        assert_eq!(parse_duration("1h30m").unwrap(), 5_400);
        assert_eq!(parse_duration("1h 30 min").unwrap(), 5_400);
        assert_eq!(parse_duration("30s").unwrap(), 30);
        assert_eq!(parse_duration("45 seconds").unwrap(), 45);
        assert_eq!(parse_duration("2 weeks").unwrap(), 2 * 604_800);
        assert_eq!(parse_duration("1W").unwrap(), 604_800);
        assert_eq!(parse_duration("5 Minutes").unwrap(), 300);
        assert!(parse_duration("").is_err());
        assert!(parse_duration("90")
            .unwrap_err()
            .to_string()
            .contains("missing unit"));
        assert!(parse_duration("3 fortnights")
            .unwrap_err()
            .to_string()
            .contains("unknown unit `fortnights`"));
        assert!(parse_duration("days").is_err());
        assert!(parse_duration("1.5 days").is_err());
        assert!(parse_duration("99999999999999999999 days").is_err());
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("10MiB").unwrap(), 10 << 20);
        assert_eq!(parse_byte_size("10 MiB").unwrap(), 10 << 20);
        assert_eq!(parse_byte_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_byte_size("1gib").unwrap(), 1 << 30);
        assert_eq!(parse_byte_size("4096").unwrap(), 4096);
        assert_eq!(parse_byte_size("1.5 KiB").unwrap(), 1536);
        assert!(parse_byte_size("MB").is_err());
        assert!(parse_byte_size("10 parsecs").is_err());
    }
}
