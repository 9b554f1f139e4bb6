//! Raft identifiers: terms, op indexes and the (term, index) pair that names a log entry.

use std::fmt;

/// A Raft term. Terms only grow; 0 is the term before any election.
pub type Term = u64;

/// The position of an entry in a tablet's log. Index 0 means "before the first entry".
pub type OpIndex = u64;

/// The identity of one log entry: the term it was proposed in and its index.
///
/// Ordered by term first, then index, which is Raft's "more up-to-date log" order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId {
    pub term: Term,
    pub index: OpIndex,
}

impl OpId {
    /// The OpId of an empty log.
    pub const MIN: OpId = OpId { term: 0, index: 0 };

    pub const fn new(term: Term, index: OpIndex) -> Self {
        OpId { term, index }
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.term, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opid_orders_by_term_then_index() {
        assert!(OpId::new(2, 1) > OpId::new(1, 100));
        assert!(OpId::new(2, 5) > OpId::new(2, 4));
        assert_eq!(OpId::MIN, OpId::default());
        assert_eq!(OpId::new(3, 7).to_string(), "3.7");
    }
}
