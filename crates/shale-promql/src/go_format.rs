//! Floats written as Prometheus (Go's `strconv`) writes them: sample values in API answers,
//! `count_values` labels and the numbers in error messages must read the same as
//! Prometheus's, digit for digit. Rust's shortest round-trip digits are Go's; only the
//! layout differs (Go's exponents have a sign and at least two digits).

/// `NaN`, `+Inf` or `-Inf` for the values that are not finite.
fn special(v: f64) -> Option<&'static str> {
    if v.is_nan() {
        Some("NaN")
    } else if v == f64::INFINITY {
        Some("+Inf")
    } else if v == f64::NEG_INFINITY {
        Some("-Inf")
    } else {
        None
    }
}

/// Go's `strconv.FormatFloat(v, 'e', -1, 64)`: `4.2e-17`, `1e+300`, `-2.5e+21`.
fn e_format(v: f64) -> String {
    let text = format!("{v:e}");
    let Some((mantissa, exponent)) = text.split_once('e') else {
        return text;
    };
    let (sign, digits) = match exponent.strip_prefix('-') {
        Some(digits) => ('-', digits),
        None => ('+', exponent),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

/// A sample value as Prometheus's API writes it: Go's `'f'` layout, or `'e'` when the
/// magnitude is under 1e-6 or at least 1e21; `NaN`, `+Inf`, `-Inf`.
pub fn sample_value(v: f64) -> String {
    if let Some(text) = special(v) {
        return text.to_string();
    }
    let abs = v.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        e_format(v)
    } else {
        format!("{v}")
    }
}

/// Go's `strconv.FormatFloat(v, 'f', -1, 64)` (`count_values` labels): no exponent ever.
pub fn f_format(v: f64) -> String {
    match special(v) {
        Some(text) => text.to_string(),
        None => format!("{v}"),
    }
}

/// Go's `%v` of a float (error messages): `'e'` when the exponent is under -4 or at least
/// 21, else `'f'`.
pub fn v_format(v: f64) -> String {
    if let Some(text) = special(v) {
        return text.to_string();
    }
    let abs = v.abs();
    if abs != 0.0 && !(1e-4..1e21).contains(&abs) {
        e_format(v)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_prometheus_writes_them() {
        assert_eq!(
            sample_value(-4.163336342344337e-17),
            "-4.163336342344337e-17"
        );
        assert_eq!(sample_value(1e300), "1e+300");
        assert_eq!(sample_value(2.5e21), "2.5e+21");
        assert_eq!(sample_value(1e21 - 1e6), "999999999999999000000");
        assert_eq!(sample_value(0.000001), "0.000001");
        assert_eq!(sample_value(0.0000009), "9e-07");
        assert_eq!(sample_value(0.0), "0");
        assert_eq!(sample_value(-0.0), "-0");
        assert_eq!(sample_value(1.5), "1.5");
        assert_eq!(sample_value(f64::NAN), "NaN");
        assert_eq!(sample_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(f_format(1e-7), "0.0000001");
        assert_eq!(f_format(1e22), "10000000000000000000000");
        assert_eq!(v_format(f64::NAN), "NaN");
        assert_eq!(v_format(1e300), "1e+300");
        assert_eq!(v_format(0.00001), "1e-05");
    }
}
