//! The `warden` binary, run as a process: `serve` startup output, operator
//! token source, a real request, shutdown on SIGTERM, and the startup
//! errors a user meets first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
