//! The process's allocator settings. glibc's malloc gives threads that contend arenas of their
//! own (up to eight per core) and keeps what is freed in each for its thread: after concurrent
//! queries the resident memory stays well above what they held, and their peaks add up. The
//! node caps the arenas at the number of cores (at least two): eight concurrent 8-level
//! aggregations under a 256 MiB budget then grew the resident memory by about 200 MiB instead
//! of 250 (`memory_budget` tests). Threads may wait on an arena's lock a little more; that
//! cost has not been measured on the benchmarks yet. An operator's `MALLOC_ARENA_MAX` or
//! `GLIBC_TUNABLES` wins.

/// Caps glibc's malloc arenas (once per process; nothing on other platforms).
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            if std::env::var_os("MALLOC_ARENA_MAX").is_some()
                || std::env::var_os("GLIBC_TUNABLES").is_some()
            {
                return;
            }
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            let arenas = cores.clamp(2, 64) as libc::c_int;
            // SAFETY: mallopt only sets a tunable of the allocator; it is thread-safe and
            // takes no pointers.
            let done = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
            if done != 1 {
                tracing::debug!("malloc arena cap not applied");
            }
        });
    }
}
