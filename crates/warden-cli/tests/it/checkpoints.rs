//! Signed audit checkpoints end to end: `warden audit keygen`, `warden
//! serve --audit-key --audit-anchor-file` (a checkpoint on shutdown), and
//! `warden audit verify --trust [--anchors]` against a SQLite file that an
//! attacker with write access edits behind Warden's back (rusqlite): plain
//! verification is fooled by a consistently re-hashed forgery, the signed
//! checkpoints are not.

use std::path::Path;
use std::process::Output;

use rusqlite::{Connection, params};
use serde_json::Value;
use warden_core::audit::checkpoint::SignedCheckpoint;
use warden_core::audit::{AuditDraft, Digest};
use warden_core::time::Timestamp;

use super::{OP, http, start, terminate, warden};

struct Fixture {
    _dir: tempfile::TempDir,
    db: std::path::PathBuf,
    url: String,
    anchors: std::path::PathBuf,
    public: String,
}

fn keygen(path: &Path) -> String {
    let out = warden()
        .args(["audit", "keygen", "--out", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("public key: ")
        .unwrap()
        .to_owned()
}

/// A server run on a new file with a signing key: a few requests, then
/// SIGTERM (which makes the last checkpoint and appends it to the anchors).
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let key = dir.path().join("audit.key");
    let anchors = dir.path().join("anchors.jsonl");
    let url = format!("sqlite://{}", db.display());
    let public = keygen(&key);
    let (mut child, lines, addr) = start(warden().env("WARDEN_OPERATOR_TOKEN", OP).args([
        "serve",
        "--database",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--audit-key",
        key.to_str().unwrap(),
        "--audit-anchor-file",
        anchors.to_str().unwrap(),
    ]));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("audit checkpoints: signed by ") && l.contains(&public)),
        "{lines:?}"
    );
    for _ in 0..3 {
        let resp = http(
            &addr,
            &format!(
                "GET /v1/audit HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\nconnection: close\r\n\r\n"
            ),
        );
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
    assert!(terminate(&mut child).success());
    Fixture {
        _dir: dir,
        db,
        url,
        anchors,
        public,
    }
}

fn verify(f: &Fixture, extra: &[&str]) -> (Option<i32>, String) {
    let out: Output = warden()
        .args(["audit", "verify", "--database", &f.url])
        .args(extra)
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).to_string();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// Open the file as an attacker would: Warden's guard triggers dropped.
fn attacker(db: &Path) -> Connection {
    let c = Connection::open(db).unwrap();
    let triggers: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for t in triggers {
        c.execute_batch(&format!("DROP TRIGGER {t}")).unwrap();
    }
    c
}

fn draft_of(c: &Connection, seq: u64) -> AuditDraft {
    c.query_row(
        "SELECT time, subject, operation, resource, verdict, reason, policy_version, details FROM audit WHERE seq = ?1",
        [seq as i64],
        |r| {
            let verdict: String = r.get(4)?;
            let details: String = r.get(7)?;
            Ok(AuditDraft {
                time: Timestamp(r.get(0)?),
                subject: r.get(1)?,
                operation: r.get(2)?,
                resource: r.get(3)?,
                verdict: serde_json::from_value(Value::String(verdict)).unwrap(),
                reason: r.get(5)?,
                policy_version: r.get(6)?,
                details: serde_json::from_str(&details).unwrap(),
            })
        },
    )
    .unwrap()
}

fn hash_of(c: &Connection, seq: u64) -> Digest {
    if seq == 0 {
        return Digest::GENESIS;
    }
    let h: Vec<u8> = c
        .query_row("SELECT hash FROM audit WHERE seq = ?1", [seq as i64], |r| {
            r.get(0)
        })
        .unwrap();
    Digest(h.try_into().unwrap())
}

fn last_seq(c: &Connection) -> u64 {
    c.query_row("SELECT max(seq) FROM audit", [], |r| r.get::<_, i64>(0))
        .unwrap() as u64
}

/// Rewrite entry `from` with `edit` and re-seal it and every later entry
/// with correct hashes, then move the recorded head: a forgery the chain
/// alone cannot tell from the real log.
fn rewrite(c: &Connection, from: u64, edit: impl Fn(&mut AuditDraft)) {
    let mut prev = hash_of(c, from - 1);
    for seq in from..=last_seq(c) {
        let mut draft = draft_of(c, seq);
        if seq == from {
            edit(&mut draft);
        }
        let sealed = draft.clone().seal(seq, prev);
        let mut details = Vec::new();
        warden_core::canonical::write_canonical(&draft.details, &mut details);
        c.execute(
            "UPDATE audit SET resource = ?2, details = ?3, prev_hash = ?4, hash = ?5 WHERE seq = ?1",
            params![
                seq as i64,
                draft.resource,
                String::from_utf8(details).unwrap(),
                sealed.prev_hash.0.to_vec(),
                sealed.hash.0.to_vec()
            ],
        )
        .unwrap();
        prev = sealed.hash;
    }
    move_head(c, last_seq(c));
}

fn move_head(c: &Connection, seq: u64) {
    c.execute(
        "UPDATE audit_head SET seq = ?1, hash = ?2 WHERE id = 1",
        params![seq as i64, hash_of(c, seq).0.to_vec()],
    )
    .unwrap();
}

/// The sequence number of the (last) checkpoint entry.
fn checkpoint_seq(c: &Connection) -> u64 {
    c.query_row(
        "SELECT max(seq) FROM audit WHERE operation = 'audit.checkpoint'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as u64
}

#[test]
fn a_log_through_its_signed_checkpoints_and_anchors_verifies() {
    let f = fixture();
    let anchors: Vec<SignedCheckpoint> = std::fs::read_to_string(&f.anchors)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(anchors.len(), 1);
    let c = attacker(&f.db);
    assert_eq!(anchors[0].checkpoint.seq + 1, checkpoint_seq(&c));
    let (code, out) = verify(
        &f,
        &[
            "--trust",
            &f.public,
            "--anchors",
            f.anchors.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("1 signed checkpoints and 1 anchors verified")
            && out.contains("0 entries after it are not signed yet"),
        "{out}"
    );
}

#[test]
fn a_rehashed_forgery_passes_plain_verify_and_fails_at_the_checkpoint() {
    let f = fixture();
    let c = attacker(&f.db);
    let cp = checkpoint_seq(&c);
    rewrite(&c, 2, |d| d.resource = "forged".into());
    // The chain alone is fooled.
    let (code, out) = verify(&f, &[]);
    assert_eq!(code, Some(0), "{out}");
    // The checkpoint's signed head is no longer in the chain.
    let (code, out) = verify(&f, &["--trust", &f.public]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "broken at entry {cp}: checkpoint entry {cp} signs entry {}",
            cp - 1
        )),
        "{out}"
    );
}

#[test]
fn a_tampered_signature_a_wrong_key_and_a_deleted_tail_are_caught() {
    let f = fixture();
    let c = attacker(&f.db);
    let cp = checkpoint_seq(&c);
    // Wrong key.
    let other = keygen(&f.db.with_extension("other.key"));
    let (code, out) = verify(&f, &["--trust", &other]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "checkpoint entry {cp}: it is signed by a key that is not trusted"
        )),
        "{out}"
    );
    // Both keys trusted: passes.
    let (code, out) = verify(&f, &["--trust", &other, "--trust", &f.public]);
    assert_eq!(code, Some(0), "{out}");

    // The newest entries (the checkpoint among them) deleted and the head
    // moved back: the chain and the checkpoints left pass; the anchor
    // file does not.
    let keep = cp - 2;
    c.execute("DELETE FROM audit WHERE seq > ?1", [keep as i64])
        .unwrap();
    move_head(&c, keep);
    assert_eq!(verify(&f, &[]).0, Some(0));
    assert_eq!(verify(&f, &["--trust", &f.public]).0, Some(0));
    let (code, out) = verify(
        &f,
        &[
            "--trust",
            &f.public,
            "--anchors",
            f.anchors.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("its newest entries were deleted"), "{out}");
}

#[test]
fn a_checkpoint_with_a_changed_signature_is_refused() {
    let f = fixture();
    let c = attacker(&f.db);
    let cp = checkpoint_seq(&c);
    // Flip the signature (and re-hash so the chain alone stays valid).
    rewrite(&c, cp, |d| {
        let sig = d.details["checkpoint"]["signature"]
            .as_str()
            .unwrap()
            .to_owned();
        let flipped = if sig.starts_with('0') { "1" } else { "0" };
        d.details["checkpoint"]["signature"] = Value::String(format!("{flipped}{}", &sig[1..]));
    });
    assert_eq!(verify(&f, &[]).0, Some(0));
    let (code, out) = verify(&f, &["--trust", &f.public]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "checkpoint entry {cp}: its signature does not verify"
        )),
        "{out}"
    );
}

#[test]
fn an_entry_forged_after_the_last_checkpoint_is_reported_as_unsigned() {
    // What checkpoints do not cover: the tail after the newest one.
    let f = fixture();
    let c = attacker(&f.db);
    let last = last_seq(&c);
    let mut forged = draft_of(&c, 1);
    forged.resource = "forged".into();
    let sealed = forged.clone().seal(last + 1, hash_of(&c, last));
    let mut details = Vec::new();
    warden_core::canonical::write_canonical(&forged.details, &mut details);
    c.execute(
        "INSERT INTO audit (seq, time, subject, operation, resource, verdict, reason, policy_version, details, prev_hash, hash) SELECT ?1, time, subject, operation, ?2, verdict, reason, policy_version, ?3, ?4, ?5 FROM audit WHERE seq = 1",
        params![
            (last + 1) as i64,
            forged.resource,
            String::from_utf8(details).unwrap(),
            sealed.prev_hash.0.to_vec(),
            sealed.hash.0.to_vec()
        ],
    )
    .unwrap();
    move_head(&c, last + 1);
    let (code, out) = verify(&f, &["--trust", &f.public]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("1 entries after it are not signed yet"),
        "{out}"
    );
}

#[test]
fn a_server_checkpoints_every_n_entries_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let key = dir.path().join("audit.key");
    let anchors = dir.path().join("anchors.jsonl");
    let url = format!("sqlite://{}", db.display());
    let public = keygen(&key);
    let (mut child, _lines, addr) = start(
        warden()
            .env("WARDEN_OPERATOR_TOKEN", OP)
            .env(
                "WARDEN_AUDIT_SIGNING_KEY",
                std::fs::read_to_string(&key).unwrap().trim(),
            )
            .args([
                "serve",
                "--database",
                &url,
                "--listen",
                "127.0.0.1:0",
                "--audit-anchor-file",
                anchors.to_str().unwrap(),
                "--audit-checkpoint-every",
                "2",
            ]),
    );
    let lines = |path: &Path| {
        std::fs::read_to_string(path)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    // Each read of an agent is recorded; the task signs within a tick.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while lines(&anchors) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic checkpoints"
        );
        let resp = http(
            &addr,
            &format!(
                "GET /v1/agents/researcher HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\nconnection: close\r\n\r\n"
            ),
        );
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    assert!(terminate(&mut child).success());
    let f = Fixture {
        _dir: dir,
        db,
        url,
        anchors,
        public,
    };
    let (code, out) = verify(
        &f,
        &[
            "--trust",
            &f.public,
            "--anchors",
            f.anchors.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let n = lines(&f.anchors);
    assert!(
        out.contains(&format!("{n} signed checkpoints and {n} anchors verified")),
        "{out}"
    );
}
