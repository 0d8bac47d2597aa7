//! Faults between `warden serve` processes and PostgreSQL, with real
//! processes under concurrent load: the database restarting
//! (`pg_ctl stop -m immediate`, then `-m fast`), one server cut off from
//! the database by `tc` qdiscs in its own network namespace (delay, loss,
//! a silent cut), and a server killed with SIGKILL mid-batch.
//!
//! Every test remembers each write a client saw acknowledged (201: key and
//! value) and checks at the end that each one is in the database with its
//! value and has its decision record, and that `warden audit verify`
//! passes on the database. Every answer seen during a test is one of: the
//! write acknowledged, the read answered with the value last acknowledged
//! at its key, or a 503 `unavailable` (for the server cut off, also a 503
//! `timeout`); anything else (a 500, a wrong value, a hang past the
//! client's 60 s read timeout) fails the test.
//!
//! The restart and cut tests run their own throwaway PostgreSQL cluster
//! (`cluster`), and the cut test needs root for `ip netns` and `tc`
//! (`netns`); the kill test uses `WARDEN_TEST_DATABASE_URL`. Each skips
//! with a message saying what is missing.

mod cluster;
mod netns;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::postgres::{Schema, audit_verify, database_url, register, request};
use super::{OP, warden};
use cluster::Cluster;
use netns::Netns;

/// The agent every client writes as.
const AGENT: &str = "faulty";

/// How long a server gets to serve again once the fault is gone. Generous:
/// the point is that it recovers by itself, without a restart.
const RECOVERY_BOUND: Duration = Duration::from_secs(60);

/// A running `warden serve` (optionally inside a network namespace),
/// killed when dropped.
struct Serve {
    child: Child,
    addr: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(url: &str, ns: Option<&Netns>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("serve.log");
        let (mut cmd, listen) = match ns {
            Some(ns) => (
                ns.command(std::path::Path::new(env!("CARGO_BIN_EXE_warden"))),
                format!("{}:0", ns.listen_addr),
            ),
            None => (warden(), "127.0.0.1:0".to_owned()),
        };
        let mut child = cmd
            .env_remove("WARDEN_OPERATOR_TOKEN")
            .env("WARDEN_LOG", "info")
            .env("WARDEN_OPERATOR_TOKEN", OP)
            .args([
                "serve",
                "--database",
                url,
                "--listen",
                &listen,
                "--sync-interval-ms",
                "1000",
            ])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut out, &mut line).unwrap_or(0) == 0 {
                let status = child.wait();
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("serve exited before listening ({status:?})\n{log}");
            }
            if let Some(addr) = line.trim_end().strip_prefix("listening on http://") {
                break addr.to_owned();
            }
        };
        Self {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What a client asked.
#[derive(Clone, Debug)]
enum Op {
    /// Create `key` (create-only) with `value`.
    Write { key: String, value: u64 },
    /// Resolve `key`, whose acknowledged value is `value`.
    Read { key: String, value: u64 },
}

/// One request and its answer, with when it was sent and answered
/// (relative to the load's start).
#[derive(Clone, Debug)]
struct Outcome {
    server: &'static str,
    op: Op,
    sent: Duration,
    answered: Duration,
    answer: Result<(u16, Value), String>,
}

impl Outcome {
    fn status(&self) -> Option<u16> {
        self.answer.as_ref().ok().map(|(s, _)| *s)
    }

    fn is_success(&self) -> bool {
        matches!(
            (&self.op, self.status()),
            (Op::Write { .. }, Some(201)) | (Op::Read { .. }, Some(200))
        )
    }

    fn is_unavailable(&self) -> bool {
        matches!(&self.answer, Ok((503, body)) if body["error"]["code"] == json!("unavailable"))
    }

    /// A 503 `timeout`: the server's request timeout (30 s) ended it.
    fn timed_out(&self) -> bool {
        matches!(&self.answer, Ok((503, body)) if body["error"]["code"] == json!("timeout"))
    }

    /// Whether the answer is one a client may see at any time: success
    /// with the right value, or 503 `unavailable`.
    fn is_acceptable(&self) -> bool {
        match (&self.op, &self.answer) {
            (_, Ok((503, _))) => self.is_unavailable(),
            (Op::Write { .. }, Ok((status, _))) => *status == 201,
            (Op::Read { value, .. }, Ok((status, body))) => {
                *status == 200 && body["value"] == json!(value)
            }
            (_, Err(_)) => false,
        }
    }

    fn took(&self) -> Duration {
        self.answered.saturating_sub(self.sent)
    }
}

/// The clients of one server: its label, their stop flag, their threads.
type Group = (&'static str, Arc<AtomicBool>, Vec<JoinHandle<()>>);

/// Clients writing and resolving continuously against one or more servers.
struct Load {
    epoch: Instant,
    token: String,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    /// Acknowledged writes: key and value, in acknowledgement order.
    acked: Arc<Mutex<Vec<(String, u64)>>>,
    groups: Vec<Group>,
    next_client: AtomicUsize,
}

impl Load {
    fn new(token: String) -> Self {
        Self {
            epoch: Instant::now(),
            token,
            outcomes: Arc::default(),
            acked: Arc::default(),
            groups: Vec::new(),
            next_client: AtomicUsize::new(0),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Start `n` clients on the server at `addr`, labelled `server`. Each
    /// alternates a create of a fresh key with a resolve of a key someone
    /// saw acknowledged (on any server); after a failed request it pauses
    /// briefly, so a down database is not hammered.
    fn clients(&mut self, server: &'static str, addr: &str, n: usize) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for _ in 0..n {
            let id = self.next_client.fetch_add(1, Ordering::Relaxed);
            let (stop, outcomes, acked, addr, token, epoch) = (
                Arc::clone(&stop),
                Arc::clone(&self.outcomes),
                Arc::clone(&self.acked),
                addr.to_owned(),
                self.token.clone(),
                self.epoch,
            );
            handles.push(std::thread::spawn(move || {
                for n in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let known = {
                        let acked = acked.lock().unwrap();
                        // A spread of old and recent keys.
                        let i = usize::try_from(n.wrapping_mul(7919)).unwrap_or(0);
                        (!acked.is_empty()).then(|| acked[i % acked.len()].clone())
                    };
                    let op = match known {
                        Some((key, value)) if n % 2 == 1 => Op::Read { key, value },
                        _ => Op::Write {
                            key: format!("{server}{id}_{n}"),
                            value: n,
                        },
                    };
                    let sent = epoch.elapsed();
                    let answer = match &op {
                        Op::Write { key, value } => request(
                            &addr,
                            "PUT",
                            &format!("/v1/memory/faults/{key}"),
                            &token,
                            Some(&json!({"value": value, "expected_revision": 0})),
                        ),
                        Op::Read { key, .. } => request(
                            &addr,
                            "GET",
                            &format!("/v1/memory/faults/{key}"),
                            &token,
                            None,
                        ),
                    }
                    .map_err(|e| e.to_string());
                    let outcome = Outcome {
                        server,
                        op,
                        sent,
                        answered: epoch.elapsed(),
                        answer,
                    };
                    let success = outcome.is_success();
                    if let (Op::Write { key, value }, true) = (&outcome.op, success) {
                        acked.lock().unwrap().push((key.clone(), *value));
                    }
                    outcomes.lock().unwrap().push(outcome);
                    if !success {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }));
        }
        self.groups.push((server, stop, handles));
    }

    /// Stop the clients of `server` and wait for their last answers.
    fn stop_clients(&mut self, server: &str) {
        for (label, stop, handles) in &mut self.groups {
            if *label == server {
                stop.store(true, Ordering::SeqCst);
                for h in handles.drain(..) {
                    h.join().unwrap();
                }
            }
        }
    }

    fn stop_all(&mut self) {
        for (_, stop, _) in &self.groups {
            stop.store(true, Ordering::SeqCst);
        }
        for (_, _, handles) in &mut self.groups {
            for h in handles.drain(..) {
                h.join().unwrap();
            }
        }
    }

    fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes.lock().unwrap().clone()
    }

    fn acked(&self) -> Vec<(String, u64)> {
        self.acked.lock().unwrap().clone()
    }

    /// The answers `server` gave to requests sent at or after `from` and
    /// answered by `to`.
    fn between(&self, server: &str, from: Duration, to: Duration) -> Vec<Outcome> {
        self.outcomes()
            .into_iter()
            .filter(|o| o.server == server && o.sent >= from && o.answered <= to)
            .collect()
    }

    /// Wait until `server` has acknowledged `n` writes sent at or after
    /// `from`; the time of the first of them.
    fn wait_for_writes(&self, server: &str, from: Duration, n: usize) -> Duration {
        loop {
            let acks: Vec<Outcome> = self
                .outcomes()
                .into_iter()
                .filter(|o| {
                    o.server == server
                        && o.sent >= from
                        && o.is_success()
                        && matches!(o.op, Op::Write { .. })
                })
                .collect();
            if acks.len() >= n {
                return acks.iter().map(|o| o.answered).min().unwrap_or(from);
            }
            assert!(
                self.now() < from + RECOVERY_BOUND,
                "`{server}` did not acknowledge {n} writes within {RECOVERY_BOUND:?}: {:?}",
                self.between(server, from, self.now()).last()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Every answer was acceptable (see [`Outcome::is_acceptable`]); the
/// servers in `killed` may also have refused connections once dead, and
/// those in `may_time_out` answered 503 `timeout`.
fn assert_all_acceptable(outcomes: &[Outcome], killed: &[&str], may_time_out: &[&str]) {
    let bad: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| {
            !(o.is_acceptable()
                || killed.contains(&o.server) && o.answer.is_err()
                || may_time_out.contains(&o.server) && o.timed_out())
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} unacceptable answers of {}, the first: {:#?}",
        bad.len(),
        outcomes.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Every acknowledged write is in the database with its value (read back
/// through `addr`), each has its allowed `memory.write` decision in the log
/// (`warden audit export`), each key has at least as many allowed
/// `memory.read` decisions as `outcomes` holds acknowledged reads of it (a
/// read's decision record is all it writes: one acknowledged and then lost
/// leaves its key short, unless an unacknowledged read of the key was
/// committed), and `warden audit verify` passes.
fn assert_nothing_acknowledged_lost(
    url: &str,
    addr: &str,
    token: &str,
    acked: &[(String, u64)],
    outcomes: &[Outcome],
) {
    assert!(!acked.is_empty());
    // The log first: the reads below are recorded too.
    let export = warden()
        .args(["audit", "export", "--database", url])
        .output()
        .unwrap();
    assert!(export.status.success(), "{export:?}");
    let mut written: HashMap<String, usize> = HashMap::new();
    let mut read: HashMap<String, usize> = HashMap::new();
    let writes = format!("{AGENT}:faults.");
    for line in String::from_utf8_lossy(&export.stdout).lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        let resource = entry["resource"].as_str().unwrap_or_default();
        if entry["verdict"] != json!("allow") {
            continue;
        }
        let (counts, key) = if entry["operation"] == json!("memory.write")
            && entry["details"]["revision"] == json!(1)
        {
            (&mut written, resource.strip_prefix(&writes))
        } else if entry["operation"] == json!("memory.read") && entry["subject"] == json!(AGENT) {
            (&mut read, resource.strip_prefix("faults."))
        } else {
            continue;
        };
        if let Some(key) = key {
            *counts.entry(key.to_owned()).or_default() += 1;
        }
    }
    let mut reads_acked: HashMap<&str, usize> = HashMap::new();
    for o in outcomes {
        if let (Op::Read { key, .. }, true) = (&o.op, o.is_success()) {
            *reads_acked.entry(key.as_str()).or_default() += 1;
        }
    }
    assert!(!reads_acked.is_empty(), "no read was acknowledged");
    for (key, n) in &reads_acked {
        let recorded = read.get(*key).copied().unwrap_or(0);
        assert!(
            recorded >= *n,
            "`{key}`: {n} reads acknowledged, {recorded} allowed read decisions recorded"
        );
    }
    let mut keys = HashSet::new();
    for (key, value) in acked {
        assert!(keys.insert(key.clone()), "`{key}` acknowledged twice");
        assert_eq!(
            written.get(key),
            Some(&1),
            "acknowledged write `{key}` has no single allowed decision record"
        );
        let (status, body) = request(
            addr,
            "GET",
            &format!("/v1/memory/faults/{key}"),
            token,
            None,
        )
        .unwrap();
        assert_eq!(status, 200, "acknowledged write `{key}` is missing: {body}");
        assert_eq!(body["value"], json!(value), "`{key}`: {body}");
    }
    let (code, out) = audit_verify(url);
    assert_eq!(code, 0, "{out}");
}

fn summary(label: &str, outcomes: &[Outcome]) -> String {
    let mut took: Vec<Duration> = outcomes.iter().map(Outcome::took).collect();
    took.sort();
    let pick = |q: f64| {
        took.get(((took.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let ok = outcomes.iter().filter(|o| o.is_success()).count();
    let unavailable = outcomes.iter().filter(|o| o.is_unavailable()).count();
    let timed_out = outcomes.iter().filter(|o| o.timed_out()).count();
    format!(
        "{label}: {} answers ({ok} ok, {unavailable} unavailable, {timed_out} timeout), p50 {:?}, max {:?}",
        outcomes.len(),
        pick(0.5),
        pick(1.0)
    )
}

/// The database stops (`-m immediate`, then `-m fast`) and starts again
/// under load through two servers: while it is down every answer is a 503
/// `unavailable`; once it is back both servers answer again by
/// themselves; nothing acknowledged is lost and the chain verifies.
#[test]
fn the_database_restarting_under_load() {
    let db = match Cluster::start("127.0.0.1") {
        Ok(db) => db,
        Err(skip) => {
            eprintln!("{skip}");
            return;
        }
    };
    let url = db.url("127.0.0.1", "");
    let a = Serve::start(&url, None);
    let b = Serve::start(&url, None);
    let token = register(&a.addr, AGENT);
    let mut load = Load::new(token.clone());
    load.clients("a", &a.addr, 2);
    load.clients("b", &b.addr, 2);
    load.wait_for_writes("a", Duration::ZERO, 50);
    load.wait_for_writes("b", Duration::ZERO, 50);
    for mode in ["immediate", "fast"] {
        db.stop(mode);
        let down = load.now();
        // Requests keep coming while it is down.
        std::thread::sleep(Duration::from_secs(2));
        let up_at = load.now();
        db.start_again();
        for server in ["a", "b"] {
            let during = load.between(server, down, up_at);
            eprintln!(
                "{}",
                summary(&format!("{server} while down ({mode})"), &during)
            );
            assert!(
                !during.is_empty(),
                "no request reached `{server}` while down"
            );
            assert!(
                during.iter().all(Outcome::is_unavailable),
                "`{server}` answered other than 503 unavailable while the database was down: {:#?}",
                during.iter().find(|o| !o.is_unavailable())
            );
        }
        for server in ["a", "b"] {
            let back = load.wait_for_writes(server, up_at, 20);
            eprintln!(
                "{server} acknowledged writes again {:?} after the database started ({mode})",
                back.saturating_sub(up_at)
            );
        }
    }
    load.stop_all();
    let outcomes = load.outcomes();
    eprintln!("{}", summary("all", &outcomes));
    assert_all_acceptable(&outcomes, &[], &[]);
    let acked = load.acked();
    assert_nothing_acknowledged_lost(&url, &b.addr, &token, &acked, &outcomes);
    eprintln!("{} acknowledged writes survived two restarts", acked.len());
    drop((a, b));
}

/// Two servers, each in its own network namespace, reach PostgreSQL over
/// their own link. Delay, then loss on A's link (see
/// `Netns::degradations`): A's answers are slower but all correct. A
/// silent cut: every request A answers is a 503 `unavailable` (bounded by
/// the connection timeouts; rarely `timeout`, see below), B carries on
/// without an error, and A serves again by itself
/// once the link is back. Nothing acknowledged is lost; the chain
/// verifies.
#[test]
fn a_server_cut_off_from_the_database() {
    let (ns_a, ns_b) = match Netns::create(0).and_then(|a| Ok((a, Netns::create(1)?))) {
        Ok(pair) => pair,
        Err(skip) => {
            eprintln!("{skip}");
            return;
        }
    };
    let db = match Cluster::start("*") {
        Ok(db) => db,
        Err(skip) => {
            eprintln!("{skip}");
            return;
        }
    };
    // The default timeouts (`warden_postgres::PgTimeouts`): none in the URL.
    let a = Serve::start(&db.url(&ns_a.db_host_addr, ""), Some(&ns_a));
    let b = Serve::start(&db.url(&ns_b.db_host_addr, ""), Some(&ns_b));
    let token = register(&a.addr, AGENT);
    let mut load = Load::new(token.clone());
    load.clients("a", &a.addr, 2);
    load.clients("b", &b.addr, 2);
    load.wait_for_writes("a", Duration::ZERO, 30);
    load.wait_for_writes("b", Duration::ZERO, 30);
    eprintln!(
        "{}",
        summary(
            "a, no fault",
            &load.between("a", Duration::ZERO, load.now())
        )
    );

    for spec in ns_a.degradations() {
        let name = spec.join(" ");
        ns_a.degrade(&spec);
        let from = load.now();
        load.wait_for_writes("a", from, 10);
        let during = load.between("a", from, load.now());
        ns_a.clear();
        eprintln!("{}", summary(&format!("a with {name}"), &during));
        assert!(
            during.iter().all(Outcome::is_success),
            "`a` failed a request with {name} on its link: {:#?}",
            during.iter().find(|o| !o.is_success())
        );
    }

    ns_a.cut();
    let cut = load.now();
    // Long enough for A's requests to fail both ways: on the connections
    // it had, and on new ones that cannot be opened.
    loop {
        let failed = load.between("a", cut, load.now());
        if failed.len() >= 6 {
            break;
        }
        assert!(
            load.now() < cut + RECOVERY_BOUND,
            "`a` answered only {} requests in {RECOVERY_BOUND:?} while cut off: it hangs\n{}",
            failed.len(),
            a.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let restored = load.now();
    ns_a.clear();
    let a_cut = load.between("a", cut, restored);
    let b_cut = load.between("b", cut, restored);
    eprintln!("{}", summary("a cut off", &a_cut));
    eprintln!("{}", summary("b while a is cut off", &b_cut));
    // A request already waiting when the link went silent can add up the
    // bounds (a lock held by a session the database has yet to end, then
    // its own connection declared dead) and meet the server's request
    // timeout first: still a clean, bounded 503, but `timeout`.
    assert!(
        a_cut.iter().all(|o| o.is_unavailable() || o.timed_out()),
        "`a` answered other than 503 while cut off: {:#?}",
        a_cut.iter().find(|o| !o.is_unavailable())
    );
    assert!(
        !b_cut.is_empty(),
        "`b` answered nothing while `a` was cut off"
    );
    assert!(
        b_cut.iter().all(Outcome::is_success),
        "`b` failed while `a` was cut off: {:#?}",
        b_cut.iter().find(|o| !o.is_success())
    );
    let back = load.wait_for_writes("a", restored, 20);
    eprintln!(
        "a acknowledged writes again {:?} after its link was restored",
        back.saturating_sub(restored)
    );

    load.stop_all();
    let outcomes = load.outcomes();
    eprintln!("{}", summary("all", &outcomes));
    assert_all_acceptable(&outcomes, &[], &["a"]);
    let acked = load.acked();
    assert_nothing_acknowledged_lost(&db.url("127.0.0.1", ""), &b.addr, &token, &acked, &outcomes);
    eprintln!("{} acknowledged writes survived the cut", acked.len());
    drop((a, b));
}

/// Under concurrent writes through two servers, A is killed with SIGKILL:
/// every write it acknowledged is there, B carries on without an error, a
/// restarted A serves again, and the chain verifies.
#[test]
fn a_server_killed_mid_batch() {
    let Some(base) = database_url() else {
        eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
        return;
    };
    let schema = Schema::new(base);
    let mut a = Serve::start(&schema.url, None);
    let b = Serve::start(&schema.url, None);
    let token = register(&a.addr, AGENT);
    let mut load = Load::new(token.clone());
    load.clients("a", &a.addr, 4);
    load.clients("b", &b.addr, 4);
    load.wait_for_writes("a", Duration::ZERO, 200);
    // Writes are in flight on every one of A's clients.
    a.kill9();
    let killed = load.now();
    load.wait_for_writes("b", killed, 100);
    load.stop_clients("a");
    let again = Serve::start(&schema.url, None);
    load.clients("a2", &again.addr, 2);
    load.wait_for_writes("a2", load.now(), 20);
    load.stop_all();

    let outcomes = load.outcomes();
    eprintln!("{}", summary("all", &outcomes));
    assert_all_acceptable(&outcomes, &["a"], &[]);
    let b_all: Vec<&Outcome> = outcomes.iter().filter(|o| o.server == "b").collect();
    assert!(
        b_all.iter().all(|o| o.is_success()),
        "`b` failed a request: {:#?}",
        b_all.iter().find(|o| !o.is_success())
    );
    let acked = load.acked();
    let by_a = outcomes
        .iter()
        .filter(|o| o.server == "a" && o.is_success() && matches!(o.op, Op::Write { .. }))
        .count();
    assert_nothing_acknowledged_lost(&schema.url, &again.addr, &token, &acked, &outcomes);
    eprintln!(
        "{} acknowledged writes ({by_a} by the killed server) survived its SIGKILL",
        acked.len()
    );
}
