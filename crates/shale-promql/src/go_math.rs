//! Float functions whose last digits must be Go's, because Prometheus computes them with
//! Go's `math` package and users compare answers (and `count_values` turns the digits into
//! labels): `ln` is Go's algorithm, `log2` and `log10` Go's formulas over
//! it; `^` follows Go's `Pow`, which raises by
//! repeated squaring of the mantissa rather than in one correctly rounded step. Go's own
//! trigonometric and hyperbolic implementations are not reproduced (their last digit can
//! differ from Rust's).

/// `x` as a fraction in `[0.5, 1)` and a power of two (Go's `Frexp`); zero, infinities and
/// NaN come back as they are, with 0.
pub fn frexp(x: f64) -> (f64, i64) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let (mut x, mut exp) = (x, 0i64);
    if x.abs() < f64::MIN_POSITIVE {
        // A subnormal: normalize it first.
        x *= (1u64 << 52) as f64;
        exp = -52;
    }
    let bits = x.to_bits();
    exp += ((bits >> 52) & 0x7ff) as i64 - 1022;
    let fraction = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (fraction, exp)
}

/// `fraction × 2^exp` (Go's `Ldexp`), by exact steps of powers of two.
pub fn ldexp(fraction: f64, exp: i64) -> f64 {
    let mut x = fraction;
    let mut exp = exp.clamp(-4000, 4000);
    while exp > 1000 {
        x *= 2f64.powi(1000);
        exp -= 1000;
    }
    while exp < -1000 {
        // Scale by 2^-1000 in two steps while the value is large, so that only the last
        // multiplication can round (into a subnormal).
        x *= 2f64.powi(-1000);
        exp += 1000;
    }
    x * 2f64.powi(exp as i32)
}

/// Go's `Log` (FreeBSD's `e_log.c` reduction and polynomial, which Go's amd64 assembly
/// computes too): not always correctly rounded — `Log(1000)` is an ulp under — and
/// Prometheus's `ln`, `log2`, `log10` and `^` inherit those digits.
pub fn ln(x: f64) -> f64 {
    // The constants by their bits: ln 2 in two parts, then the polynomial's coefficients.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const L1: f64 = f64::from_bits(0x3fe5_5555_5555_5593);
    const L2: f64 = f64::from_bits(0x3fd9_9999_9997_fa04);
    const L3: f64 = f64::from_bits(0x3fd2_4924_9422_9359);
    const L4: f64 = f64::from_bits(0x3fcc_71c5_1d8e_78af);
    const L5: f64 = f64::from_bits(0x3fc7_4664_96cb_03de);
    const L6: f64 = f64::from_bits(0x3fc3_9a09_d078_c69f);
    const L7: f64 = f64::from_bits(0x3fc2_f112_df3e_5244);
    if x.is_nan() || x == f64::INFINITY {
        return x;
    }
    if x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    let (mut f1, mut ki) = frexp(x);
    if f1 < std::f64::consts::SQRT_2 / 2.0 {
        f1 *= 2.0;
        ki -= 1;
    }
    let f = f1 - 1.0;
    let k = ki as f64;
    let s = f / (2.0 + f);
    let s2 = s * s;
    let s4 = s2 * s2;
    let t1 = s2 * (L1 + s4 * (L3 + s4 * (L5 + s4 * L7)));
    let t2 = s4 * (L2 + s4 * (L4 + s4 * L6));
    let r = t1 + t2;
    let hfsq = 0.5 * f * f;
    k * LN2_HI - ((hfsq - (s * (hfsq + r) + k * LN2_LO)) - f)
}

/// Go's `Log10`: [`ln`] times 1/ln 10.
pub fn log10(x: f64) -> f64 {
    ln(x) * std::f64::consts::LOG10_E
}

/// Go's `Log2`: exact for powers of two, else the mantissa's logarithm plus the exponent.
pub fn log2(x: f64) -> f64 {
    let (fraction, exp) = frexp(x);
    if fraction == 0.5 {
        return (exp - 1) as f64;
    }
    ln(fraction) * std::f64::consts::LOG2_E + exp as f64
}

/// Go's `Pow`: the special cases are C99's (as Rust's `powf`); otherwise `x^frac(y)` by
/// `exp(frac·ln x)` and `x^int(y)` by repeated squaring of `x`'s mantissa, scaled once.
pub fn pow(x: f64, y: f64) -> f64 {
    let special = y == 0.0
        || x == 1.0
        || !x.is_finite()
        || !y.is_finite()
        || x == 0.0
        || y == 1.0
        || y == 0.5
        || y == -0.5;
    if special {
        return match y {
            0.5 if x.is_finite() && x != 0.0 => x.sqrt(),
            -0.5 if x.is_finite() && x != 0.0 => 1.0 / x.sqrt(),
            1.0 => x,
            _ => x.powf(y),
        };
    }
    let (mut yi, mut yf) = (y.abs().trunc(), y.abs().fract());
    if yf != 0.0 && x < 0.0 {
        return f64::NAN;
    }
    if yi >= 9_223_372_036_854_775_808.0 {
        // A huge even power: overflow or underflow, except for -1.
        return if x == -1.0 {
            1.0
        } else if (x.abs() < 1.0) == (y > 0.0) {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let mut a1 = 1.0;
    let mut ae: i64 = 0;
    if yf != 0.0 {
        if yf > 0.5 {
            yf -= 1.0;
            yi += 1.0;
        }
        a1 = (yf * ln(x)).exp();
    }
    let (mut x1, mut xe) = frexp(x);
    let mut i = yi as i64;
    while i != 0 {
        if !(-(1 << 12)..=(1 << 12)).contains(&xe) {
            // Certain overflow or underflow: the exponent says which.
            ae += xe;
            break;
        }
        if i & 1 == 1 {
            a1 *= x1;
            ae += xe;
        }
        x1 *= x1;
        xe <<= 1;
        if x1 < 0.5 {
            x1 += x1;
            xe -= 1;
        }
        i >>= 1;
    }
    if y < 0.0 {
        a1 = 1.0 / a1;
        ae = -ae;
    }
    ldexp(a1, ae)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frexp_and_ldexp_round_trip() {
        for x in [
            1.0,
            0.75,
            -3.5,
            1e300,
            5e-324,
            2.2250738585072014e-308,
            123.456,
        ] {
            let (f, e) = frexp(x);
            assert!((0.5..1.0).contains(&f.abs()), "{x}: {f}");
            assert_eq!(ldexp(f, e), x, "{x}");
        }
        assert_eq!(frexp(0.0), (0.0, 0));
        assert!(frexp(f64::NAN).0.is_nan());
    }

    #[test]
    fn logs_and_powers() {
        assert_eq!(log2(8.0), 3.0);
        assert_eq!(log2(0.5), -1.0);
        assert_eq!(log2(0.0), f64::NEG_INFINITY);
        assert!(log2(-1.0).is_nan());
        assert_eq!(pow(2.0, 10.0), 1024.0);
        assert_eq!(pow(2.0, -2.0), 0.25);
        assert_eq!(pow(-2.0, 3.0), -8.0);
        assert!(pow(-2.0, 0.5).is_nan());
        assert_eq!(pow(0.0, -1.0), f64::INFINITY);
        assert_eq!(pow(9.0, 0.5), 3.0);
        assert_eq!(pow(10.0, 400.0), f64::INFINITY);
        assert_eq!(pow(10.0, -400.0), 0.0);
        assert_eq!(pow(-1.0, 1e300), 1.0);
        // Within an ulp or two of the correctly rounded power.
        let (a, b) = (pow(1.7, 3.3), 1.7f64.powf(3.3));
        assert!((a - b).abs() <= 4.0 * f64::EPSILON * b, "{a} {b}");
    }
}
