//! shale-index (being written).
