//! `warden serve` against hostile conditions: a second server on the same
//! SQLite file, sockets that send nothing or trickle their request head,
//! a read-only filesystem and a full disk.
//!
//! The filesystem cases need a private mount namespace (`unshare --mount`,
//! available to root); without one they skip with a message.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use super::{OP, http, start, terminate, warden};

fn sqlite_url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

#[test]
fn a_second_server_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("warden.db");
    let url = sqlite_url(&db);
    let (mut first, _, addr) = start(warden().env("WARDEN_OPERATOR_TOKEN", OP).args([
        "serve",
        "--database",
        &url,
        "--listen",
        "127.0.0.1:0",
    ]));
    let before = std::fs::read(&db).unwrap();
    let mut second = warden()
        .env("WARDEN_OPERATOR_TOKEN", OP)
        .args(["serve", "--database", &url, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while second.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            second.kill().unwrap();
            let _ = second.wait();
            panic!("a second server started on the same file");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = second.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in use by another Warden process") && err.contains(&db.display().to_string()),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    assert_eq!(std::fs::read(&db).unwrap(), before, "nothing was written");
    // Read-only tools still work beside the server.
    let verify = warden()
        .args(["audit", "verify", "--database", &url])
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    // The first server still serves, writes included.
    let health = http(
        &addr,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let r = http(
        &addr,
        &format!(
            "POST /v1/agents/researcher/tokens HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ),
    );
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    assert!(terminate(&mut first).success());
    // Once it has stopped, the file serves again.
    let (mut again, _, _) = start(warden().env("WARDEN_OPERATOR_TOKEN", OP).args([
        "serve",
        "--database",
        &url,
        "--listen",
        "127.0.0.1:0",
    ]));
    assert!(terminate(&mut again).success());
}

/// Read from `s` until EOF, a reset, or `patience`; `Some(bytes)` if the
/// server closed the connection.
fn read_until_closed(s: &mut TcpStream, patience: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + patience;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while Instant::now() < deadline {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(got),
        }
    }
    None
}

/// A thread that sends one byte of a never-ending request head every 100
/// ms until the server closes the connection; returns whether it did
/// within `patience`.
fn trickle(addr: &str, patience: Duration) -> std::thread::JoinHandle<bool> {
    let mut s = TcpStream::connect(addr).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + patience;
        if s.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ").is_err() {
            return true;
        }
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            if s.write_all(b"a").is_err() {
                return true;
            }
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return true,
            }
        }
        false
    })
}

fn healthz_within(addr: &str, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            if let Some(got) = read_until_closed(&mut s, Duration::from_secs(2))
                && got.starts_with(b"HTTP/1.1 200")
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn idle_and_trickling_connections_do_not_hold_the_server() {
    const LIMIT: usize = 8;
    let patience = Duration::from_secs(20);
    let (mut child, _, addr) = start(warden().args([
        "serve",
        "--database",
        "memory://",
        "--listen",
        "127.0.0.1:0",
        "--max-connections",
        &LIMIT.to_string(),
        "--header-timeout-ms",
        "1500",
        "--idle-timeout-ms",
        "1500",
    ]));
    // Fill the limit with sockets that send nothing...
    let mut idle: Vec<TcpStream> = (0..LIMIT)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // ...then connections past it are refused at once, with a 503.
    let mut past: Vec<TcpStream> = (0..LIMIT)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut refused = 0;
    for s in &mut past {
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
        if let Some(got) = read_until_closed(s, Duration::from_secs(5)) {
            let got = String::from_utf8_lossy(&got);
            if got.starts_with("HTTP/1.1 503") {
                assert!(got.contains("\"code\":\"unavailable\""), "{got}");
                refused += 1;
            }
        }
    }
    // (Under heavy load an idle socket may time out before all are tried.)
    assert!(
        refused >= LIMIT / 2,
        "connections past the limit are refused with a 503: {refused}"
    );
    // Past the limit, trickling ones too; within it they are closed after
    // the header timeout although they keep sending.
    let tricklers: Vec<_> = (0..LIMIT).map(|_| trickle(&addr, patience)).collect();
    // The idle sockets are closed after the header timeout...
    for s in &mut idle {
        assert!(
            read_until_closed(s, patience).is_some(),
            "an idle socket stays open"
        );
    }
    // ...so a fresh connection gets its answer again.
    assert!(healthz_within(&addr, patience), "/healthz never answered");
    for t in tricklers {
        assert!(t.join().unwrap(), "a trickling connection stays open");
    }
    // A trickler that started with the server free is closed all the same.
    assert!(
        trickle(&addr, patience).join().unwrap(),
        "a trickling connection stays open"
    );
    // A kept-alive connection is closed once idle past the idle timeout,
    // after its answer.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let got = read_until_closed(&mut s, patience).expect("the idle connection is closed");
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(terminate(&mut child).success());
}

/// Whether this process may make a private mount namespace.
fn can_unshare() -> bool {
    let ok = Command::new("unshare")
        .args(["--mount", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "skipped: `unshare --mount` is not available here (needs root or user namespaces)"
        );
    }
    ok
}

/// Run `script` in a private mount namespace with `$WARDEN` set to the
/// binary and `$D` to `dir`.
fn in_namespace(dir: &Path, script: &str) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--mount", "sh", "-c", script])
        .env("WARDEN", env!("CARGO_BIN_EXE_warden"))
        .env("D", dir)
        .env_remove("WARDEN_OPERATOR_TOKEN");
    c
}

#[test]
fn a_read_only_filesystem_is_named() {
    if !can_unshare() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ro = "mount --bind \"$D\" \"$D\" && mount -o remount,ro,bind \"$D\" && exec \"$WARDEN\" serve --database \"sqlite://$D/warden.db\" --listen 127.0.0.1:0";
    // A database to create, and one that exists.
    for existing in [false, true] {
        if existing {
            let (mut child, _, _) = start(warden().args([
                "serve",
                "--database",
                &sqlite_url(&dir.path().join("warden.db")),
                "--listen",
                "127.0.0.1:0",
            ]));
            assert!(terminate(&mut child).success());
        }
        let out = in_namespace(dir.path(), ro).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot write") && err.contains("read-only file system"),
            "existing: {existing}: {err}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
    }
}

#[test]
fn a_full_disk_at_start_is_named() {
    if !can_unshare() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "mount -t tmpfs -o size=256k tmpfs \"$D\" && (dd if=/dev/zero of=\"$D/fill\" bs=4k 2>/dev/null; true) && exec \"$WARDEN\" serve --database \"sqlite://$D/warden.db\" --listen 127.0.0.1:0";
    let out = in_namespace(dir.path(), script).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot write") && err.contains("disk full"),
        "{err}"
    );
}

/// A server on a small tmpfs that is filled once the server runs: reads
/// that record nothing still answer, whatever must write (a recorded
/// decision included) answers 503 `unavailable` saying `disk full`
/// (`details.reason` `disk_full`), nothing answers 500, and once there is
/// room again writes succeed.
#[test]
fn a_full_disk_while_serving_is_503_never_500() {
    if !can_unshare() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "mount -t tmpfs -o size=4m tmpfs \"$D\" || exit 3
\"$WARDEN\" serve --database \"sqlite://$D/warden.db\" --listen 127.0.0.1:0 &
W=$!
read go
dd if=/dev/zero of=\"$D/fill\" bs=4k 2>/dev/null
echo FILLED
read free
rm \"$D/fill\"
echo FREED
read stop
kill -TERM $W
wait $W";
    let mut child = in_namespace(dir.path(), script)
        .env("WARDEN_OPERATOR_TOKEN", OP)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin: ChildStdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("listening on http://").map(str::to_owned))
        .expect("the server started");
    let get = |path: &str| {
        http(
            &addr,
            &format!(
                "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\nconnection: close\r\n\r\n"
            ),
        )
    };
    let post_token = || {
        http(
            &addr,
            &format!(
                "POST /v1/agents/researcher/tokens HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {OP}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            ),
        )
    };
    assert!(post_token().starts_with("HTTP/1.1 201"));
    writeln!(stdin, "go").unwrap();
    assert!(
        lines.by_ref().map_while(Result::ok).any(|l| l == "FILLED"),
        "the disk was filled"
    );
    let mut statuses = Vec::new();
    for _ in 0..3 {
        for path in [
            "/healthz",
            "/v1/agents/researcher",
            "/v1/audit?limit=5",
            "/v1/audit/verify",
            "/v1/escalations?status=pending",
        ] {
            statuses.push((path, get(path)));
        }
        statuses.push(("POST tokens", post_token()));
    }
    for (what, r) in &statuses {
        assert!(!r.starts_with("HTTP/1.1 500"), "{what}: {r}");
        let ok = r.starts_with("HTTP/1.1 200")
            || r.starts_with("HTTP/1.1 201")
            || (r.starts_with("HTTP/1.1 503") && r.contains("\"code\":\"unavailable\""));
        assert!(ok, "{what}: {r}");
        // A 503 says why, in words and by name, and names no path.
        if r.starts_with("HTTP/1.1 503") {
            assert!(
                r.contains("\"message\":\"storage is unavailable: disk full; retry later\"")
                    && r.contains("\"details\":{\"reason\":\"disk_full\"}"),
                "{what}: {r}"
            );
            assert!(!r.contains("warden.db"), "{what}: {r}");
        }
    }
    // A write on the full disk was refused, with its reason (checked above).
    assert!(
        statuses
            .iter()
            .any(|(what, r)| *what == "POST tokens" && r.starts_with("HTTP/1.1 503")),
        "no write was refused on the full disk: {statuses:?}"
    );
    // Reads that record no decision need no writing: they answer.
    for (what, r) in &statuses {
        if ["/healthz", "/v1/audit?limit=5", "/v1/audit/verify"].contains(what) {
            assert!(r.starts_with("HTTP/1.1 200"), "{what}: {r}");
        }
    }
    // Once there is room again, writes succeed and the chain is whole.
    writeln!(stdin, "free").unwrap();
    assert!(
        lines.by_ref().map_while(Result::ok).any(|l| l == "FREED"),
        "the disk was freed"
    );
    assert!(post_token().starts_with("HTTP/1.1 201"));
    assert!(get("/v1/audit/verify").contains("\"valid\":true"));
    writeln!(stdin, "stop").unwrap();
    let status = wait_child(&mut child);
    assert!(status.success(), "{status:?}");
}

fn wait_child(child: &mut Child) -> std::process::ExitStatus {
    super::wait(child)
}

#[test]
fn a_writer_count_out_of_range_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("warden.db");
    for bad in ["0", "17", "two"] {
        let out = warden()
            .args([
                "serve",
                "--database",
                &format!("sqlite://{}", db.display()),
                "--listen",
                "127.0.0.1:0",
                "--pg-writers",
                bad,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--pg-writers"), "{bad}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("listening on"));
        // Refused while parsing: no database was created.
        assert!(!db.exists(), "{bad}");
    }
}
