//! The cluster's one clock: the metastore's.
//!
//! Every time Shale writes to the metastore or compares with a time read from it —
//! heartbeats and death, the leader lease and merge task leases, staged-split timeouts, split
//! publish and update times that `as_of` and the janitor read — comes from [`now_ms`]: this
//! machine's clock corrected by its offset to the metastore's clock. Membership measures that
//! offset at start and at every heartbeat ([`record_metastore_clock`]), so nodes whose clocks
//! disagree still agree on what time it is, within the round trip to the metastore. No
//! comparison is ever made between two nodes' own clocks.
//!
//! `SHALE_TEST_CLOCK_SKEW_MS` (tests only) shifts this machine's clock, to test a node whose
//! clock is off.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::LazyLock;

/// The metastore's clock minus this machine's (corrected) clock, in ms.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);
/// Whether an offset was measured yet.
static MEASURED: AtomicBool = AtomicBool::new(false);
/// The round trip of the measurement the offset comes from.
static OFFSET_RTT_MS: AtomicI64 = AtomicI64::new(i64::MAX);

/// The test-only skew of this machine's clock.
static SKEW_MS: LazyLock<i64> = LazyLock::new(|| {
    std::env::var("SHALE_TEST_CLOCK_SKEW_MS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
});

/// This machine's clock (ms since the epoch), with the test skew if any: what a node would
/// use if it trusted its own clock. Only for measuring the offset.
pub fn local_ms() -> i64 {
    let system = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    system.saturating_add(*SKEW_MS)
}

/// The cluster's time: ms since the epoch on the metastore's clock.
pub fn now_ms() -> i64 {
    local_ms().saturating_add(OFFSET_MS.load(Ordering::Relaxed))
}

/// The cluster's time in seconds since the epoch.
pub fn now_unix_secs() -> i64 {
    now_ms().div_euclid(1000)
}

/// Records a reading `metastore_ms` of the metastore's clock, taken between `sent_ms` and
/// `received_ms` of [`local_ms`]: the offset becomes the reading minus the local midpoint.
/// Jitter below the round trip is ignored, so the clock does not wobble from one heartbeat to
/// the next; a reading with a much longer round trip than the current one only replaces it
/// when the offset moved by more than that round trip.
pub fn record_metastore_clock(sent_ms: i64, metastore_ms: i64, received_ms: i64) {
    let rtt = received_ms.saturating_sub(sent_ms).max(0);
    let offset = metastore_ms.saturating_sub(sent_ms.saturating_add(rtt / 2));
    let current = OFFSET_MS.load(Ordering::Relaxed);
    let first = !MEASURED.swap(true, Ordering::Relaxed);
    if first || (offset - current).abs() > rtt / 2 + 1 {
        OFFSET_MS.store(offset, Ordering::Relaxed);
        OFFSET_RTT_MS.store(rtt, Ordering::Relaxed);
    } else if rtt < OFFSET_RTT_MS.load(Ordering::Relaxed) {
        // A more precise reading within the jitter: keep it.
        OFFSET_MS.store(offset, Ordering::Relaxed);
        OFFSET_RTT_MS.store(rtt, Ordering::Relaxed);
    }
}

/// The measured offset of the metastore's clock to this machine's, in ms (0 until measured).
pub fn metastore_offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_the_metastore_and_ignores_jitter() {
        let local = local_ms();
        // The metastore is 30 s ahead; 4 ms round trip.
        record_metastore_clock(local, local + 30_002, local + 4);
        assert_eq!(metastore_offset_ms(), 30_000);
        assert!((now_ms() - (local_ms() + 30_000)).abs() < 5);
        // Jitter within the round trip: unchanged.
        record_metastore_clock(local, local + 30_003, local + 4);
        assert_eq!(metastore_offset_ms(), 30_000);
        // A real move: followed.
        record_metastore_clock(local, local - 5_000, local + 2);
        assert_eq!(metastore_offset_ms(), -5_001);
        assert_eq!(now_unix_secs(), now_ms().div_euclid(1000));
    }
}
