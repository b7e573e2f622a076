//! shale-server (being written).
