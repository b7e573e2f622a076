//! S3-compatible server test harness (to be written).
