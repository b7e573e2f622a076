//! shale-search (being written).
