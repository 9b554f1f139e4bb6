//! Identifiers, limits and error kinds shared by every nyala crate, and the worker pool
//! their background work runs on.
//!
//! This crate owns the vocabulary the other crates agree on. It must not depend on any
//! other nyala crate, on I/O, or on Python.

pub mod error;
pub mod ids;
pub mod proto;
pub mod thread_pool;

pub use error::{Classify, ErrorKind};
pub use ids::{OpId, OpIndex, Term};
pub use thread_pool::{ThreadPool, ThreadPoolStats};
