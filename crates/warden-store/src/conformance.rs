//! The storage conformance suite: every backend runs it with one line.
//!
//! Filled in alongside the SQLite backend.
