//! The tablet write-ahead log (see docs/wal-format.md).
