//! tamper
