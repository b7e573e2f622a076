//! The one rounding rule for timestamps: floor, toward negative infinity.
//!
//! A document's timestamp is kept in the timestamp fast column floored to the field's
//! precision ([`floor_to_unit`]); a split's [`TimeRange`](crate::TimeRange) holds the seconds
//! of those values, floored too ([`secs_of_nanos`]), whether the split is new or merged; a
//! search window `[start, end)` in seconds selects the column values from `start` seconds to
//! `end` seconds ([`window_bound`]). So half a second before 1970 is in second `-1` everywhere,
//! and a window covering a split's whole time range selects every document of the split (what
//! the partial-result cache relies on).

/// Nanoseconds per second.
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Nanoseconds per microsecond.
pub const NANOS_PER_MICRO: i64 = 1_000;

/// The second holding the instant `nanos` (nanoseconds since the epoch), floored.
pub fn secs_of_nanos(nanos: i64) -> i64 {
    nanos.div_euclid(NANOS_PER_SEC)
}

/// The microsecond holding the instant `nanos` (nanoseconds since the epoch), floored.
pub fn micros_of_nanos(nanos: i64) -> i64 {
    nanos.div_euclid(NANOS_PER_MICRO)
}

/// The second holding the instant `micros` (microseconds since the epoch), floored.
pub fn secs_of_micros(micros: i64) -> i64 {
    micros.div_euclid(1_000_000)
}

/// `nanos` floored to a multiple of `unit_nanos` (a precision: 1 for nanoseconds, … 10⁹ for
/// seconds); near `i64::MIN`, where that multiple is below the range, the smallest multiple in
/// it. A `unit_nanos` below 1 is taken as 1.
pub fn floor_to_unit(nanos: i64, unit_nanos: i64) -> i64 {
    let unit = unit_nanos.max(1);
    let units = nanos.div_euclid(unit);
    units
        .checked_mul(unit)
        .unwrap_or_else(|| units.saturating_add(1).saturating_mul(unit))
}

/// Where a search window's bound, `secs` seconds since the epoch, falls on the timeline of
/// `i64` nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowBound {
    /// Before every representable instant.
    BeforeAll,
    /// At this many nanoseconds.
    At(i64),
    /// After every representable instant.
    AfterAll,
}

/// The bound `secs` (seconds since the epoch) as nanoseconds, without saturating: a bound past
/// an end of the `i64` nanosecond range is before or after every instant.
pub fn window_bound(secs: i64) -> WindowBound {
    match secs.checked_mul(NANOS_PER_SEC) {
        Some(nanos) => WindowBound::At(nanos),
        None if secs < 0 => WindowBound::BeforeAll,
        None => WindowBound::AfterAll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_before_1970_are_in_the_second_before() {
        assert_eq!(secs_of_nanos(-1), -1);
        assert_eq!(secs_of_nanos(-500_000_000), -1);
        assert_eq!(secs_of_nanos(-NANOS_PER_SEC), -1);
        assert_eq!(secs_of_nanos(-NANOS_PER_SEC - 1), -2);
        assert_eq!(secs_of_nanos(0), 0);
        assert_eq!(secs_of_nanos(NANOS_PER_SEC - 1), 0);
        assert_eq!(micros_of_nanos(-1), -1);
        assert_eq!(secs_of_micros(-1), -1);
        assert_eq!(secs_of_nanos(i64::MAX), 9_223_372_036);
        assert_eq!(secs_of_nanos(i64::MIN), -9_223_372_037);
    }

    #[test]
    fn values_floor_to_their_precision() {
        assert_eq!(floor_to_unit(-500_000_000, NANOS_PER_SEC), -NANOS_PER_SEC);
        assert_eq!(floor_to_unit(500_000_000, NANOS_PER_SEC), 0);
        assert_eq!(floor_to_unit(-1, 1_000_000), -1_000_000);
        assert_eq!(floor_to_unit(-1, 1), -1);
        assert_eq!(floor_to_unit(i64::MAX, 1), i64::MAX);
        assert_eq!(
            floor_to_unit(i64::MAX, NANOS_PER_SEC),
            9_223_372_036 * NANOS_PER_SEC
        );
        // No multiple of a second at or below i64::MIN: the first one above.
        assert_eq!(
            floor_to_unit(i64::MIN, NANOS_PER_SEC),
            -9_223_372_036 * NANOS_PER_SEC
        );
        assert_eq!(floor_to_unit(i64::MIN, 1), i64::MIN);
    }

    #[test]
    fn window_bounds_past_the_range_do_not_saturate() {
        assert_eq!(window_bound(-1), WindowBound::At(-NANOS_PER_SEC));
        assert_eq!(
            window_bound(9_223_372_036),
            WindowBound::At(9_223_372_036 * NANOS_PER_SEC)
        );
        assert_eq!(window_bound(9_223_372_037), WindowBound::AfterAll);
        assert_eq!(window_bound(-9_223_372_037), WindowBound::BeforeAll);
        assert_eq!(window_bound(i64::MAX), WindowBound::AfterAll);
        assert_eq!(window_bound(i64::MIN), WindowBound::BeforeAll);
    }
}
