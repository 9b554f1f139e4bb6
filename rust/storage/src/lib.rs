//! The tablet storage engine: Arrow row operations, MemRowSet, Parquet DiskRowSets.
