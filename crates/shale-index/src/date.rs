//! Datetime parsing for `datetime` fields, per their `input_formats`, and rendering.

use serde_json::Value;
use shale_config::DateInputFormat;
use tantivy::schema::DateTimePrecision;
use tantivy::time::format_description::well_known::{Iso8601, Rfc3339};
use tantivy::time::{Date, OffsetDateTime, PrimitiveDateTime, Time};
use tantivy::DateTime;

/// Below this absolute value a unix timestamp is in seconds (1e11 s ≈ year 5138).
const SECONDS_LIMIT: f64 = 1e11;
/// Below this, milliseconds (1e14 ms ≈ year 5138).
const MILLIS_LIMIT: f64 = 1e14;
/// Below this, microseconds; above, nanoseconds.
const MICROS_LIMIT: f64 = 1e17;

/// Nanoseconds per unit for a unix timestamp of magnitude `abs`, guessed as Quickwit does:
/// seconds below 1e11, milliseconds below 1e14, microseconds below 1e17, else nanoseconds.
fn nanos_per_unit(abs: f64) -> i64 {
    if abs < SECONDS_LIMIT {
        1_000_000_000
    } else if abs < MILLIS_LIMIT {
        1_000_000
    } else if abs < MICROS_LIMIT {
        1_000
    } else {
        1
    }
}

/// Nanoseconds in one unit of `precision`.
pub(crate) fn precision_nanos(precision: DateTimePrecision) -> i64 {
    match precision {
        DateTimePrecision::Seconds => 1_000_000_000,
        DateTimePrecision::Milliseconds => 1_000_000,
        DateTimePrecision::Microseconds => 1_000,
        DateTimePrecision::Nanoseconds => 1,
    }
}

/// `datetime` floored to `precision`: the value a fast column of that precision holds for it
/// (Tantivy truncates toward zero, which differs before 1970; see [`shale_types::time`]).
pub fn floor_datetime(datetime: DateTime, precision: DateTimePrecision) -> DateTime {
    DateTime::from_timestamp_nanos(shale_types::time::floor_to_unit(
        datetime.into_timestamp_nanos(),
        precision_nanos(precision),
    ))
}

/// The microsecond holding `datetime`, floored.
pub fn floor_micros(datetime: DateTime) -> i64 {
    shale_types::time::micros_of_nanos(datetime.into_timestamp_nanos())
}

/// The second holding `datetime`, floored: what a split's time range records for it.
pub fn floor_secs(datetime: DateTime) -> i64 {
    shale_types::time::secs_of_nanos(datetime.into_timestamp_nanos())
}

fn out_of_range(value: impl std::fmt::Display) -> String {
    format!("timestamp `{value}` is out of the supported range (years 1677 to 2262)")
}

/// Converts a unix timestamp of guessed precision to a `DateTime`.
pub(crate) fn from_unix_i64(value: i64) -> Result<DateTime, String> {
    let unit = nanos_per_unit(value.unsigned_abs() as f64);
    value
        .checked_mul(unit)
        .map(DateTime::from_timestamp_nanos)
        .ok_or_else(|| out_of_range(value))
}

/// Converts a fractional unix timestamp of guessed precision to a `DateTime`.
pub(crate) fn from_unix_f64(value: f64) -> Result<DateTime, String> {
    if !value.is_finite() {
        return Err(format!("`{value}` is not a timestamp"));
    }
    let unit = nanos_per_unit(value.abs());
    // Whole units and fraction apart, so that `1704164645.25` s is exact to the microsecond.
    let whole = value.trunc();
    // i64::MAX as f64 rounds up to 2^63, so `<` keeps the cast in range.
    if whole >= i64::MAX as f64 || whole < i64::MIN as f64 {
        return Err(out_of_range(value));
    }
    let fraction_nanos = ((value - whole) * unit as f64).round() as i64;
    (whole as i64)
        .checked_mul(unit)
        .and_then(|nanos| nanos.checked_add(fraction_nanos))
        .map(DateTime::from_timestamp_nanos)
        .ok_or_else(|| out_of_range(value))
}

fn from_offset(datetime: OffsetDateTime, text: &str) -> Result<DateTime, String> {
    DateTime::try_from_utc(datetime).ok_or_else(|| out_of_range(text))
}

/// ISO 8601 with an offset, as Quickwit requires (a local time is ambiguous).
fn parse_iso8601(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &Iso8601::DEFAULT).ok()
}

/// Reads up to `max_digits` digits (after a sign when `signed`) at `pos`.
fn read_number(bytes: &[u8], pos: &mut usize, max_digits: usize, signed: bool) -> Option<i64> {
    let start = *pos;
    let mut negative = false;
    if signed && *pos < bytes.len() && (bytes[*pos] == b'-' || bytes[*pos] == b'+') {
        negative = bytes[*pos] == b'-';
        *pos += 1;
    }
    let digits_start = *pos;
    while *pos < bytes.len() && *pos - digits_start < max_digits && bytes[*pos].is_ascii_digit() {
        *pos += 1;
    }
    if *pos == digits_start {
        *pos = start;
        return None;
    }
    let value: i64 = std::str::from_utf8(&bytes[digits_start..*pos])
        .ok()?
        .parse()
        .ok()?;
    Some(if negative { -value } else { value })
}

/// Reads one of `names` (full, or its first three letters; any case) at `pos`.
fn read_name(text: &str, pos: &mut usize, names: &[&str]) -> Option<usize> {
    let rest = text.get(*pos..)?.to_ascii_lowercase();
    for (i, full) in names.iter().enumerate() {
        if rest.starts_with(full) {
            *pos += full.len();
            return Some(i);
        }
    }
    for (i, full) in names.iter().enumerate() {
        if rest.starts_with(&full[..3]) {
            *pos += 3;
            return Some(i);
        }
    }
    None
}

/// Elasticsearch's (Java) date pattern as a strptime format: `yyyy`, `MM`, `dd`, `HH`, `mm`,
/// `ss`, `S…` (fraction), `Z`/`XXX` (offset), `'quoted'` literals; `None` for letters it does
/// not know.
pub fn java_date_format_to_strptime(pattern: &str) -> Option<String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            // A quoted literal ('' is a quote).
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '\'' {
                out.push(if chars[j] == '%' { '%' } else { chars[j] });
                if chars[j] == '%' {
                    out.push('%');
                }
                j += 1;
            }
            if j == i + 1 && j < chars.len() {
                out.push('\'');
            }
            i = j + 1;
            continue;
        }
        let mut run = 1;
        while i + run < chars.len() && chars[i + run] == c {
            run += 1;
        }
        let directive = match (c, run) {
            ('y' | 'u', 2) => "%y",
            ('y' | 'u', _) => "%Y",
            ('M', 1 | 2) => "%m",
            ('M', 3) => "%b",
            ('M', _) => "%B",
            ('d', _) => "%d",
            ('H', _) => "%H",
            ('m', _) => "%M",
            ('s', _) => "%S",
            ('S', _) => "%f",
            ('Z' | 'X' | 'x', _) => "%z",
            ('E', 1..=3) => "%a",
            ('E', _) => "%A",
            ('a', _) => "%p",
            ('h', _) => "%I",
            (c, _) if c.is_ascii_alphabetic() => return None,
            ('%', _) => "%%",
            _ => {
                for _ in 0..run {
                    out.push(c);
                }
                i += run;
                continue;
            }
        };
        out.push_str(directive);
        i += run;
    }
    Some(out)
}

/// Parses `text` with an Elasticsearch (Java) date pattern, as Unix nanoseconds; `None` when
/// the pattern is unknown or the text does not match it.
pub fn parse_with_java_format(text: &str, pattern: &str) -> Option<i128> {
    let format = java_date_format_to_strptime(pattern)?;
    parse_strptime(text, &format).map(OffsetDateTime::unix_timestamp_nanos)
}

/// Parses `text` with a strptime `format` (its directives checked by the config); UTC unless
/// the format has `%z`. The whole text must match.
pub(crate) fn parse_strptime(text: &str, format: &str) -> Option<OffsetDateTime> {
    use tantivy::time::{Month, UtcOffset};
    const MONTHS: [&str; 12] = [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ];
    const DAYS: [&str; 7] = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    let (mut year, mut month, mut day, mut ordinal) = (None, None, None, None);
    let (mut hour, mut minute, mut second, mut nanos) = (0u8, 0u8, 0u8, 0u32);
    let (mut offset_secs, mut unix) = (0i32, None);
    let bytes = text.as_bytes();
    let mut pos = 0usize;
    // `%T`, `%F`, `%D`, `%R` stand for their definitions.
    let expanded = format
        .replace("%T", "%H:%M:%S")
        .replace("%F", "%Y-%m-%d")
        .replace("%D", "%m/%d/%y")
        .replace("%R", "%H:%M");
    let mut chars = expanded.chars();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
                pos += 1;
            }
            continue;
        }
        if c != '%' {
            let mut buf = [0u8; 4];
            let literal = c.encode_utf8(&mut buf).as_bytes();
            if bytes.get(pos..pos + literal.len()) != Some(literal) {
                return None;
            }
            pos += literal.len();
            continue;
        }
        match chars.next()? {
            'Y' => year = Some(i32::try_from(read_number(bytes, &mut pos, 6, true)?).ok()?),
            'y' => {
                let y = read_number(bytes, &mut pos, 2, false)? as i32;
                year = Some(if y < 69 { 2000 + y } else { 1900 + y });
            }
            'm' => month = Some(u8::try_from(read_number(bytes, &mut pos, 2, false)?).ok()?),
            'd' | 'e' => {
                while pos < bytes.len() && bytes[pos] == b' ' {
                    pos += 1;
                }
                day = Some(u8::try_from(read_number(bytes, &mut pos, 2, false)?).ok()?);
            }
            'j' => ordinal = Some(u16::try_from(read_number(bytes, &mut pos, 3, false)?).ok()?),
            'H' => hour = u8::try_from(read_number(bytes, &mut pos, 2, false)?).ok()?,
            'M' => minute = u8::try_from(read_number(bytes, &mut pos, 2, false)?).ok()?,
            'S' => second = u8::try_from(read_number(bytes, &mut pos, 2, false)?).ok()?,
            'f' => {
                let start = pos;
                let value = read_number(bytes, &mut pos, 9, false)?;
                let digits = (pos - start) as u32;
                nanos = u32::try_from(value).ok()? * 10u32.pow(9 - digits);
            }
            's' => unix = Some(read_number(bytes, &mut pos, 19, true)?),
            'b' | 'h' | 'B' => month = Some(read_name(text, &mut pos, &MONTHS)? as u8 + 1),
            'a' | 'A' => {
                read_name(text, &mut pos, &DAYS)?;
            }
            'z' => {
                if bytes.get(pos) == Some(&b'Z') {
                    pos += 1;
                } else {
                    let sign = match bytes.get(pos)? {
                        b'+' => 1,
                        b'-' => -1,
                        _ => return None,
                    };
                    pos += 1;
                    let hours = read_number(bytes, &mut pos, 2, false)? as i32;
                    if bytes.get(pos) == Some(&b':') {
                        pos += 1;
                    }
                    let minutes = read_number(bytes, &mut pos, 2, false).unwrap_or(0) as i32;
                    offset_secs = sign * (hours * 3600 + minutes * 60);
                }
            }
            'Z' => {
                let rest = text.get(pos..)?;
                let zone = ["UTC", "GMT", "Z"]
                    .into_iter()
                    .find(|z| rest.starts_with(z))?;
                pos += zone.len();
            }
            '%' => {
                if bytes.get(pos) != Some(&b'%') {
                    return None;
                }
                pos += 1;
            }
            _ => return None,
        }
    }
    if pos != bytes.len() {
        return None;
    }
    if let Some(unix) = unix {
        return OffsetDateTime::from_unix_timestamp(unix).ok();
    }
    let year = year?;
    let date = match (month, ordinal) {
        (Some(month), _) => {
            Date::from_calendar_date(year, Month::try_from(month).ok()?, day.unwrap_or(1)).ok()?
        }
        (None, Some(ordinal)) => Date::from_ordinal_date(year, ordinal).ok()?,
        (None, None) => return None,
    };
    let time = Time::from_hms_nano(hour, minute, second, nanos).ok()?;
    let offset = UtcOffset::from_whole_seconds(offset_secs).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_offset(offset))
}

fn format_names(formats: &[DateInputFormat]) -> String {
    formats
        .iter()
        .map(DateInputFormat::name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a JSON value as a datetime with the first of `formats` that fits.
pub(crate) fn parse_datetime(
    value: &Value,
    formats: &[DateInputFormat],
) -> Result<DateTime, String> {
    let accepts_unix = formats.contains(&DateInputFormat::UnixTimestamp);
    match value {
        Value::String(text) => {
            let text = text.trim();
            for format in formats {
                match format {
                    DateInputFormat::Rfc3339 => {
                        if let Ok(datetime) = OffsetDateTime::parse(text, &Rfc3339) {
                            return from_offset(datetime, text);
                        }
                    }
                    DateInputFormat::Iso8601 => {
                        if let Some(datetime) = parse_iso8601(text) {
                            return from_offset(datetime, text);
                        }
                    }
                    DateInputFormat::Strptime(format) => {
                        if let Some(datetime) = parse_strptime(text, format) {
                            return from_offset(datetime, text);
                        }
                    }
                    DateInputFormat::UnixTimestamp => {
                        if let Ok(integer) = text.parse::<i64>() {
                            return from_unix_i64(integer);
                        }
                        if let Ok(float) = text.parse::<f64>() {
                            if float.is_finite() {
                                return from_unix_f64(float);
                            }
                        }
                    }
                }
            }
            Err(format!(
                "cannot parse `{}` as a datetime with input formats [{}]",
                crate::doc_mapper::truncate_for_message(text),
                format_names(formats)
            ))
        }
        Value::Number(number) if accepts_unix => {
            if let Some(integer) = number.as_i64() {
                from_unix_i64(integer)
            } else if let Some(unsigned) = number.as_u64() {
                Err(out_of_range(unsigned))
            } else {
                from_unix_f64(number.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::Number(number) => Err(format!(
            "got the number `{number}` but `unix_timestamp` is not among input formats [{}]",
            format_names(formats)
        )),
        other => Err(format!(
            "expected a datetime string or number, got {}",
            crate::doc_mapper::describe_value(other)
        )),
    }
}

/// Renders a datetime as RFC 3339 in UTC (`2024-01-02T03:04:05Z`, fractional seconds when any).
pub(crate) fn format_rfc3339(datetime: DateTime) -> String {
    datetime
        .into_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| datetime.into_timestamp_nanos().to_string())
}

/// Renders a datetime in a field's `output_format`: `rfc3339`, `iso8601`,
/// `unix_timestamp_{secs,millis,micros,nanos}` (numbers) or a strptime format.
pub(crate) fn format_output(datetime: DateTime, format: &str) -> Value {
    let nanos = datetime.into_timestamp_nanos();
    match format {
        "rfc3339" => Value::String(format_rfc3339(datetime)),
        "iso8601" => Value::String(
            datetime
                .into_utc()
                .format(&Iso8601::DEFAULT)
                .unwrap_or_else(|_| nanos.to_string()),
        ),
        "unix_timestamp_secs" => Value::from(nanos.div_euclid(1_000_000_000)),
        "unix_timestamp_millis" => Value::from(nanos.div_euclid(1_000_000)),
        "unix_timestamp_micros" => Value::from(nanos.div_euclid(1_000)),
        "unix_timestamp_nanos" => Value::from(nanos),
        strptime => Value::String(format_strptime(datetime, strptime)),
    }
}

/// Renders a datetime (UTC) with strptime directives.
fn format_strptime(datetime: DateTime, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let dt = datetime.into_utc();
    let month = MONTHS[usize::from(u8::from(dt.month())) - 1];
    let day = DAYS[usize::from(dt.weekday().number_days_from_monday())];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&format!("{:04}", dt.year())),
            Some('y') => out.push_str(&format!("{:02}", dt.year().rem_euclid(100))),
            Some('m') => out.push_str(&format!("{:02}", u8::from(dt.month()))),
            Some('d') => out.push_str(&format!("{:02}", dt.day())),
            Some('e') => out.push_str(&format!("{:>2}", dt.day())),
            Some('H') => out.push_str(&format!("{:02}", dt.hour())),
            Some('M') => out.push_str(&format!("{:02}", dt.minute())),
            Some('S') => out.push_str(&format!("{:02}", dt.second())),
            Some('f') => out.push_str(&format!("{:09}", dt.nanosecond())),
            Some('z') => out.push_str("+0000"),
            Some('Z') => out.push_str("UTC"),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&day[..3]),
            Some('A') => out.push_str(day),
            Some('j') => out.push_str(&format!("{:03}", dt.ordinal())),
            Some('T') => out.push_str(&format!(
                "{:02}:{:02}:{:02}",
                dt.hour(),
                dt.minute(),
                dt.second()
            )),
            Some('R') => out.push_str(&format!("{:02}:{:02}", dt.hour(), dt.minute())),
            Some('F') => out.push_str(&format!(
                "{:04}-{:02}-{:02}",
                dt.year(),
                u8::from(dt.month()),
                dt.day()
            )),
            Some('D') => out.push_str(&format!(
                "{:02}/{:02}/{:02}",
                u8::from(dt.month()),
                dt.day(),
                dt.year().rem_euclid(100)
            )),
            Some('s') => out.push_str(&dt.unix_timestamp().to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{format_output, format_rfc3339, parse_datetime};
    use serde_json::{json, Value};
    use shale_config::DateInputFormat::{self, Iso8601, Rfc3339, UnixTimestamp};
    use tantivy::DateTime;

    #[test]
    fn output_formats() {
        let dt = DateTime::from_timestamp_millis(1_700_000_000_123);
        assert_eq!(
            format_output(dt, "rfc3339"),
            json!("2023-11-14T22:13:20.123Z")
        );
        assert_eq!(
            format_output(dt, "unix_timestamp_secs"),
            json!(1_700_000_000)
        );
        assert_eq!(
            format_output(dt, "unix_timestamp_millis"),
            json!(1_700_000_000_123i64)
        );
        assert_eq!(
            format_output(dt, "%Y-%m-%d %H:%M:%S"),
            json!("2023-11-14 22:13:20")
        );
        assert_eq!(format_output(dt, "%a %d %b %Y"), json!("Tue 14 Nov 2023"));
    }

    fn secs(value: Value, formats: &[DateInputFormat]) -> Result<i64, String> {
        parse_datetime(&value, formats).map(|dt| dt.into_timestamp_secs())
    }

    #[test]
    fn rfc3339() {
        assert_eq!(
            secs(json!("2024-01-02T03:04:05Z"), &[Rfc3339]),
            Ok(1_704_164_645)
        );
        assert_eq!(
            secs(json!("2024-01-02T04:04:05+01:00"), &[Rfc3339]),
            Ok(1_704_164_645)
        );
        let nanos = parse_datetime(&json!("2024-01-02T03:04:05.123456789Z"), &[Rfc3339])
            .unwrap()
            .into_timestamp_nanos();
        assert_eq!(nanos, 1_704_164_645_123_456_789);
        assert!(secs(json!("2024-01-02 03:04:05"), &[Rfc3339])
            .unwrap_err()
            .contains("input formats [rfc3339]"));
    }

    #[test]
    fn iso8601() {
        assert_eq!(
            secs(json!("2024-01-02T03:04:05Z"), &[Iso8601]),
            Ok(1_704_164_645)
        );
        assert_eq!(
            secs(json!("20240102T030405Z"), &[Iso8601]),
            Ok(1_704_164_645)
        );
        // As in Quickwit: without an offset the time is ambiguous, so it is refused.
        assert!(secs(json!("2024-01-02T03:04:05"), &[Iso8601]).is_err());
        assert!(secs(json!("2024-01-02"), &[Iso8601]).is_err());
    }

    #[test]
    fn strptime_formats() {
        let f = |format: &str| [DateInputFormat::parse(format).unwrap()];
        assert_eq!(
            secs(json!("2024-01-02 03:04:05"), &f("%Y-%m-%d %H:%M:%S")),
            Ok(1_704_164_645)
        );
        assert_eq!(
            secs(
                json!("2024-01-02 04:04:05 +0100"),
                &f("%Y-%m-%d %H:%M:%S %z")
            ),
            Ok(1_704_164_645)
        );
        assert_eq!(
            secs(
                json!("02/Jan/2024:03:04:05 +00:00"),
                &f("%d/%b/%Y:%H:%M:%S %z")
            ),
            Ok(1_704_164_645)
        );
        assert_eq!(secs(json!("2024-01-02"), &f("%F")), Ok(1_704_153_600));
        assert_eq!(secs(json!("24 002"), &f("%y %j")), Ok(1_704_153_600));
        assert_eq!(
            secs(json!("Tue, 2024-01-02T03:04:05"), &f("%a, %FT%T")),
            Ok(1_704_164_645)
        );
        let nanos = parse_datetime(&json!("2024-01-02 03:04:05.25"), &f("%F %T.%f"))
            .unwrap()
            .into_timestamp_nanos();
        assert_eq!(nanos, 1_704_164_645_250_000_000);
        assert_eq!(secs(json!("1704164645"), &f("%s")), Ok(1_704_164_645));
        // Not matching, trailing text, impossible dates: errors naming the format.
        for bad in [
            "2024-01-02",
            "2024-01-02 03:04:05 extra",
            "2024-13-02 03:04:05",
        ] {
            let err = secs(json!(bad), &f("%Y-%m-%d %H:%M:%S")).unwrap_err();
            assert!(err.contains("%Y-%m-%d %H:%M:%S"), "{bad}: {err}");
        }
        assert!(DateInputFormat::parse("%Y-%q").is_err());
        assert!(DateInputFormat::parse("%Y-%").is_err());
    }

    #[test]
    fn unix_timestamp_precision_is_guessed() {
        let f = &[UnixTimestamp];
        assert_eq!(secs(json!(1_704_164_645), f), Ok(1_704_164_645));
        assert_eq!(secs(json!(1_704_164_645_123i64), f), Ok(1_704_164_645));
        assert_eq!(secs(json!(1_704_164_645_123_456i64), f), Ok(1_704_164_645));
        assert_eq!(
            secs(json!(1_704_164_645_123_456_789i64), f),
            Ok(1_704_164_645)
        );
        assert_eq!(secs(json!(0), f), Ok(0));
        assert_eq!(secs(json!(-86_400), f), Ok(-86_400));
        let micros = parse_datetime(&json!(1_704_164_645.25), f)
            .unwrap()
            .into_timestamp_micros();
        assert_eq!(micros, 1_704_164_645_250_000);
        assert_eq!(secs(json!("1704164645"), f), Ok(1_704_164_645));
        // Seconds beyond year 2262 do not fit in i64 nanoseconds.
        assert!(secs(json!(50_000_000_000i64), f)
            .unwrap_err()
            .contains("out of the supported range"));
        assert!(secs(json!(u64::MAX), f).is_err());
    }

    #[test]
    fn formats_are_tried_in_order_and_types_checked() {
        let both = &[Rfc3339, UnixTimestamp];
        assert_eq!(secs(json!("2024-01-02T03:04:05Z"), both), Ok(1_704_164_645));
        assert_eq!(secs(json!(1_704_164_645), both), Ok(1_704_164_645));
        assert!(secs(json!(1_704_164_645), &[Rfc3339])
            .unwrap_err()
            .contains("`unix_timestamp` is not among input formats"));
        assert!(secs(json!(true), both)
            .unwrap_err()
            .contains("got a boolean"));
        assert!(secs(json!("yesterday"), both)
            .unwrap_err()
            .contains("cannot parse `yesterday`"));
    }

    #[test]
    fn renders_rfc3339() {
        assert_eq!(
            format_rfc3339(DateTime::from_timestamp_secs(1_704_164_645)),
            "2024-01-02T03:04:05Z"
        );
        assert_eq!(
            format_rfc3339(DateTime::from_timestamp_micros(1_704_164_645_250_000)),
            "2024-01-02T03:04:05.25Z"
        );
    }
}
