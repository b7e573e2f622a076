//! shale-storage (being written).
