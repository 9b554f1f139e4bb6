//! Identifiers, limits and error kinds shared by every nyala crate.
//!
//! This crate owns the vocabulary the other crates agree on. It must not depend on any
//! other nyala crate, on I/O, or on Python.

pub mod error;
pub mod ids;

pub use error::{Classify, ErrorKind};
pub use ids::{OpId, OpIndex, Term};
