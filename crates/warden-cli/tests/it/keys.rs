//! The stored envelope signing key through real processes on SQLite: a
//! restart keeps it, `warden keys rotate` adds a new current key and keeps
//! the old one published, and `WARDEN_ENVELOPE_SIGNING_KEY` wins.

use serde_json::Value;

use super::{start, terminate, warden};

fn envelope_key(addr: &str) -> Value {
    let raw = super::http(
        addr,
        "GET /v1/envelope-key HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap()
}

fn serve_once(db: &str, env_key: Option<&str>) -> Value {
    let mut cmd = warden();
    cmd.args(["serve", "--database", db, "--listen", "127.0.0.1:0"]);
    if let Some(k) = env_key {
        cmd.env("WARDEN_ENVELOPE_SIGNING_KEY", k);
    }
    let (mut child, _, addr) = start(&mut cmd);
    let key = envelope_key(&addr);
    assert!(terminate(&mut child).success());
    key
}

fn keys(args: &[&str]) -> (i32, String) {
    let out = warden().arg("keys").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_stored_key_survives_a_restart_and_rotates_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("w.db").display());
    let (code, out) = keys(&["list", "--database", &db]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no envelope signing key stored yet"), "{out}");

    let first = serve_once(&db, None);
    assert_eq!(first["key_source"], "stored");
    assert_eq!(first["generation"], 1);
    let again = serve_once(&db, None);
    assert_eq!(
        again["public_key"], first["public_key"],
        "a restart keeps the key"
    );
    assert_eq!(again["issuer"], first["issuer"]);

    let (code, out) = keys(&["rotate", "--database", &db]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("current"), "{out}");
    let (code, listed) = keys(&["list", "--database", &db]);
    assert_eq!(code, 0, "{listed}");
    let issuer = first["issuer"].as_str().unwrap();
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("1\t") && l.contains(issuer)),
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("2\t") && l.ends_with("current")),
        "{listed}"
    );
    assert!(listed.lines().count() == 3, "{listed}");

    let rotated = serve_once(&db, None);
    assert_eq!(rotated["generation"], 2);
    assert_ne!(rotated["issuer"], first["issuer"]);
    let published: Vec<&Value> = rotated["verifying_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| &k["issuer"])
        .collect();
    assert_eq!(published, vec![&first["issuer"], &rotated["issuer"]]);

    // The variable wins over the stored key.
    let seed = "ab".repeat(32);
    let env = serve_once(&db, Some(&seed));
    assert_eq!(env["key_source"], "environment");
    assert_ne!(env["public_key"], rotated["public_key"]);
    assert!(env.get("generation").is_none(), "{env}");
}

#[test]
fn keys_commands_refuse_a_bad_database() {
    let (code, out) = keys(&["list", "--database", "nope"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no scheme"), "{out}");
}
