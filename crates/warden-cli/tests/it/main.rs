//! The `warden` binary, run as a process: `serve` startup output, operator
//! token source, a real request, shutdown on SIGTERM, and the startup
//! errors a user meets first.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod check;
mod checkpoints;
mod hardening;
mod keys;
mod pg_faults;
mod postgres;

const OP: &str = "cli-test-operator-token-0123456789abcdef";

fn warden() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_warden"));
    c.env_remove("WARDEN_OPERATOR_TOKEN")
        .env("WARDEN_LOG", "info");
    c
}

/// Start `warden serve` and read its stdout up to the listening line.
#[expect(
    clippy::zombie_processes,
    reason = "the child is returned to the caller, which waits for it"
)]
fn start(cmd: &mut Command) -> (Child, Vec<String>, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap_or(0);
        if n == 0 {
            let status = child.wait();
            panic!("serve exited before listening ({status:?}): {lines:?}");
        }
        let line = line.trim_end().to_owned();
        if let Some(addr) = line.strip_prefix("listening on http://") {
            let addr = addr.to_owned();
            lines.push(line);
            return (child, lines, addr);
        }
        lines.push(line);
    }
}

fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn wait(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "warden did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn terminate(child: &mut Child) -> ExitStatus {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    wait(child)
}

#[test]
fn serve_prints_its_address_and_token_source_then_stops_on_sigterm() {
    let (mut child, lines, addr) = start(warden().args([
        "serve",
        "--database",
        "memory://",
        "--listen",
        "127.0.0.1:0",
    ]));
    assert!(lines[0].starts_with("policy: `lab-1`"), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("operator token: generated")),
        "{lines:?}"
    );
    let token = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("wdn_"))
        .map(|t| format!("wdn_{t}"))
        .expect("the generated token is printed once");
    assert!(!addr.ends_with(":0"), "{addr}");
    let health = http(
        &addr,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let audit = http(
        &addr,
        &format!(
            "GET /v1/audit/verify HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n"
        ),
    );
    assert!(audit.contains("\"valid\":true"), "{audit}");
    let status = terminate(&mut child);
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("shutting down") && err.contains("stopped"),
        "{err}"
    );
}

#[test]
fn serve_takes_the_operator_token_from_the_environment() {
    let (mut child, lines, addr) = start(warden().env("WARDEN_OPERATOR_TOKEN", OP).args([
        "serve",
        "--database",
        "memory://",
        "--listen",
        "127.0.0.1:0",
    ]));
    assert!(
        lines.contains(&"operator token: from WARDEN_OPERATOR_TOKEN".to_owned()),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("wdn_")), "{lines:?}");
    let r = http(
        &addr,
        &format!(
            "POST /v1/agents/researcher/tokens HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ),
    );
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    assert!(terminate(&mut child).success());
}

#[test]
fn a_taken_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = warden()
        .args(["serve", "--database", "memory://", "--listen", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already in use"), "{err}");
    // Nothing was printed as if it were serving.
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
}

#[test]
fn unsupported_databases_and_bad_policies_are_clear_errors() {
    let junk_dir = tempfile::tempdir().unwrap();
    let junk = junk_dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x5a_u8; 8192]).unwrap();
    let url = format!("sqlite://{}", junk.display());
    let out = warden()
        .args(["serve", "--database", &url, "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a usable warden database"), "{err}");
    assert_eq!(std::fs::read(&junk).unwrap(), vec![0x5a_u8; 8192]);
    let out = warden()
        .args(["serve", "--database", "ftp://x", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scheme `ftp`"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("policy.yaml");
    std::fs::write(
        &bad,
        "policy_version: x\nagents: [{id: a, parent: ghost}]\n",
    )
    .unwrap();
    let out = warden()
        .args([
            "serve",
            "--database",
            "memory://",
            "--listen",
            "127.0.0.1:0",
            "--policy",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid policy bundle") && err.contains("agents[0]"),
        "{err}"
    );
}

/// `demo` passes all eight acceptance criteria against a temporary SQLite
/// database.
#[test]
fn demo_passes_every_acceptance_criterion() {
    let out = warden().arg("demo").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("[PASS]").count(), 8, "{text}");
    assert!(text.contains("8 passed, 0 failed"));
}

/// `check`: 0 admitted, 1 rejected (every failing step listed), 2 bad input.
#[test]
fn check_exit_codes() {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/report-hierarchy"
    );
    let policy = format!("{root}/policy.yaml");
    let run = |agent: &str, sop: &str, json: bool| {
        let mut c = warden();
        c.args([
            "check",
            "--policy",
            &policy,
            "--agent",
            agent,
            &format!("{root}/sops/{sop}.json"),
        ]);
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    assert_eq!(
        run("researcher", "valid-report", false).status.code(),
        Some(0)
    );
    let rejected = run("researcher", "unsafe-upload", false);
    assert_eq!(rejected.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&rejected.stdout).contains("action_not_in_effective_capabilities")
    );
    let json = run("researcher", "path-traversal", true);
    assert_eq!(json.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["admitted"], serde_json::json!(false));
    assert!(
        v["steps"][0]["decision"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("path_")
    );
    assert_eq!(run("nobody", "valid-report", false).status.code(), Some(2));
    assert_eq!(
        run("researcher", "missing-file", false).status.code(),
        Some(2)
    );
}

/// `policy lint` locates problems; `policy schema` prints JSON Schema.
#[test]
fn policy_lint_explains_provenance_rules() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mail.yaml");
    std::fs::write(
        &file,
        "policy_version: t\nenvironment_capabilities: [mail.send, mail.read]\nactions:\n  mail.read:\n    output: {trust: untrusted}\n  mail.send:\n    tags: [state_changing]\n    provenance: [{argument: \"recipients[*]\", from: [user, trusted], otherwise: escalate, match: caseless}]\nagents: [{id: a, capabilities: [mail.send, mail.read]}]\n",
    )
    .unwrap();
    let out = warden()
        .args(["policy", "lint", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("argument `recipients[*]` (every element) must occur whole in the user's trusted inputs or a trusted result")
            && text.contains("otherwise escalate"),
        "{text}"
    );
}

#[test]
fn policy_lint_and_schema() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "policy_version: x\nenvironment_capabilities: [shell.eval]\n",
    )
    .unwrap();
    let out = warden()
        .args(["policy", "lint", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("environment_capabilities[0]"));
    let good = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/report-hierarchy/policy.yaml"
    );
    assert_eq!(
        warden()
            .args(["policy", "lint", good])
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );
    let out = warden().args(["policy", "schema"]).output().unwrap();
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(schema["properties"]["agents"].is_object());
}

/// `audit verify` exits 0 on an intact log and 1 naming the first altered
/// entry after an edit; `--expect-head` catches a truncated tail; `export`
/// writes one JSON line per entry.
#[test]
fn audit_verify_and_export_over_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let url = format!("sqlite://{}", db.display());
    // Populate through a real server run on this file.
    let (mut child, _lines, addr) = start(warden().env("WARDEN_OPERATOR_TOKEN", OP).args([
        "serve",
        "--database",
        &url,
        "--listen",
        "127.0.0.1:0",
    ]));
    let resp = http(
        &addr,
        &format!(
            "GET /v1/audit HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\nconnection: close\r\n\r\n"
        ),
    );
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(terminate(&mut child).success());

    let verify = warden()
        .args(["audit", "verify", "--database", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout).to_string();
    assert_eq!(verify.status.code(), Some(0), "{text}");
    let export = warden()
        .args(["audit", "export", "--database", &url])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&export.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 3);
    let after = warden()
        .args(["audit", "export", "--database", &url, "--after", "2"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&after.stdout).lines().count(),
        lines.len() - 2
    );

    // Edit one field of entry 2 behind Warden's back.
    assert!(edit_behind_wardens_back(
        &db,
        "UPDATE audit SET reason = 'forged' WHERE seq = 2;"
    ));
    let broken = warden()
        .args(["audit", "verify", "--database", &url])
        .output()
        .unwrap();
    assert_eq!(broken.status.code(), Some(1));
    let out = String::from_utf8_lossy(&broken.stdout);
    assert!(out.contains("entry 2"), "{out}");
}

/// Edit the database as an attacker with file access would: drop Warden's
/// guard triggers, then run `sql` (through Python's sqlite3 module).
fn edit_behind_wardens_back(db: &std::path::Path, sql: &str) -> bool {
    let py = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nfor t in [r[0] for r in c.execute(\"select name from sqlite_master where type='trigger'\")]:\n    c.execute('drop trigger '+t)\nc.executescript(sys.argv[2])\nc.commit()\n";
    Command::new("python3")
        .args(["-c", py, db.to_str().unwrap(), sql])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn policy_schema_into_a_closed_pipe_exits_quietly() {
    use std::process::Stdio;
    let mut child = warden()
        .args(["policy", "schema"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the schema is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{out:?}"
    );
}
