//! Shared helpers.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::json;
use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::Put;
use warden_store::conformance::draft;

pub fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

pub fn put(
    owner: &str,
    ns: &str,
    key: &str,
    value: serde_json::Value,
    expected: Option<u64>,
) -> Put {
    Put {
        owner: id(owner),
        namespace: Namespace::parse(ns).unwrap(),
        key: Key::parse(key).unwrap(),
        value,
        expected_revision: expected,
        visibility: None,
        class: None,
    }
}

pub fn note(i: u64) -> AuditDraft {
    AuditDraft {
        details: json!({ "i": i }),
        ..draft("agent", "note", &format!("note:{i}"), Verdict::Allow, "ok")
    }
}

/// A file's bytes and modification time, to show it was not touched.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    bytes: Vec<u8>,
    modified: SystemTime,
}

impl Snapshot {
    pub fn of(path: &Path) -> Self {
        Self {
            bytes: std::fs::read(path).unwrap(),
            modified: std::fs::metadata(path).unwrap().modified().unwrap(),
        }
    }
}

/// The URL of a file.
pub fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

/// A fresh temporary directory and a database path inside it.
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warden.db");
    (dir, path)
}

/// Deterministic pseudo-random numbers (xorshift64*), so failures repeat.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
