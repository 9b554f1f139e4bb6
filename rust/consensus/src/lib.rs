//! The Raft AppendEntries hot path and the leader log cache.
