//! PostgreSQL test harness (to be written).
