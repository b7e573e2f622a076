//! The node's memory budget for query work: one counter of bytes shared by every search
//! aggregation, PromQL evaluation and SQL query in flight. Work reserves what it is about to
//! take before taking it ([`MemoryBudget::try_reserve`], [`Reservation::try_grow`]); a
//! reservation that would pass the budget is refused, so concurrent requests share the budget
//! instead of each having a limit of its own. A reservation gives its bytes back when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A reservation would pass the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the query memory budget is exhausted: {wanted} more bytes wanted, {in_use} of \
     {budget} in use by the queries running (query_memory_budget_bytes)"
)]
pub struct BudgetExceeded {
    /// Bytes asked for.
    pub wanted: u64,
    /// Bytes reserved by everything running when it was asked.
    pub in_use: u64,
    /// The whole budget.
    pub budget: u64,
}

/// A byte budget shared by the queries of a node (cheap to clone: clones share it).
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total: u64,
    used: AtomicU64,
}

impl MemoryBudget {
    /// A budget of `total` bytes.
    pub fn new(total: u64) -> Self {
        MemoryBudget {
            inner: Arc::new(Inner {
                total,
                used: AtomicU64::new(0),
            }),
        }
    }

    /// The whole budget.
    pub fn total(&self) -> u64 {
        self.inner.total
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` from the budget, or refuses if that would pass it.
    fn take(&self, bytes: u64) -> Result<(), BudgetExceeded> {
        let total = self.inner.total;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|after| *after <= total)
            })
            .map(|_| ())
            .map_err(|in_use| BudgetExceeded {
                wanted: bytes,
                in_use,
                budget: total,
            })
    }

    fn give_back(&self, bytes: u64) {
        // Never below zero, whatever happens.
        let _ = self
            .inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// A reservation of `bytes` (0 is fine: it grows later).
    pub fn try_reserve(&self, bytes: u64) -> Result<Reservation, BudgetExceeded> {
        self.take(bytes)?;
        Ok(Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes held from a [`MemoryBudget`], given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    bytes: u64,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The budget it is held from.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// Holds `more` bytes more, or refuses (holding what it held).
    pub fn try_grow(&mut self, more: u64) -> Result<(), BudgetExceeded> {
        self.budget.take(more)?;
        self.bytes += more;
        Ok(())
    }

    /// Holds exactly `bytes` (growing or shrinking), or refuses a growth.
    pub fn try_resize(&mut self, bytes: u64) -> Result<(), BudgetExceeded> {
        if bytes > self.bytes {
            self.try_grow(bytes - self.bytes)
        } else {
            self.shrink(self.bytes - bytes);
            Ok(())
        }
    }

    /// Holds `more` bytes more even past the budget (for memory already taken, that the
    /// budget must still count).
    pub fn force_grow(&mut self, more: u64) {
        self.budget.inner.used.fetch_add(more, Ordering::AcqRel);
        self.bytes += more;
    }

    /// Gives `less` bytes back (at most what it holds).
    pub fn shrink(&mut self, less: u64) {
        let less = less.min(self.bytes);
        self.budget.give_back(less);
        self.bytes -= less;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_share_the_budget_and_give_it_back() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.try_reserve(60).unwrap();
        let err = budget.try_reserve(41).unwrap_err();
        assert_eq!(
            err,
            BudgetExceeded {
                wanted: 41,
                in_use: 60,
                budget: 100
            }
        );
        assert!(err.to_string().contains("query_memory_budget_bytes"));
        let mut b = budget.try_reserve(40).unwrap();
        assert!(b.try_grow(1).is_err());
        assert_eq!(b.bytes(), 40);
        a.shrink(10);
        b.try_grow(10).unwrap();
        assert_eq!(budget.in_use(), 100);
        b.try_resize(5).unwrap();
        assert_eq!(budget.in_use(), 55);
        drop(a);
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn concurrent_reservations_never_pass_the_budget() {
        let budget = MemoryBudget::new(1_000);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for _ in 0..1_000 {
                        if let Ok(r) = budget.try_reserve(7) {
                            assert!(budget.in_use() <= 1_000);
                            held.push(r);
                        }
                        if held.len() > 20 {
                            held.clear();
                        }
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(budget.in_use(), 0);
    }
}
