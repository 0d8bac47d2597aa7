//! `kill -9` at random points: nothing acknowledged is lost, nothing is
//! half-done, the chain verifies.
//!
//! The parent test re-runs this test binary as a child (selecting only
//! [`crash_child`], with `WARDEN_SQLITE_CRASH_CHILD` set). The child writes
//! from several tasks at once (puts with their audit entry, plain audit
//! appends, run step records) and prints one `ACK` line per acknowledged
//! write, flushed. The parent reads a seeded number of acknowledgements,
//! sends SIGKILL (`Child::kill`), collects every line the child managed to
//! print, reopens the database and checks:
//!
//! - every acknowledged write is there;
//! - a record exists if and only if its audit entry does, and a step
//!   outcome exists if and only if its audit entry does (no partial state);
//! - the audit chain verifies against its recorded head.
//!
//! Rounds alternate `synchronous=FULL` (the default) and `NORMAL`.
//! It repeats for several rounds on the same file, so each round also
//! reopens a file the previous kill left behind (the first round kills the
//! child before it acknowledges anything, often while it is still creating
//! the database).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use warden_core::audit::Digest;
use warden_core::decision::Verdict;
use warden_core::ids::{ActionName, Key, Namespace, RunId, StepId};
use warden_core::time::Timestamp;
use warden_sqlite::{SqliteOptions, SqliteStore, Synchronous, verify_audit_path};
use warden_store::conformance::{audit_all, draft, put_audit};
use warden_store::{
    RecordStep, RunRecord, RunStep, StepOutcome, StepStatus, Store, StoreError, VerifyError,
};

use crate::support::{Rng, id, put};

const CHILD_ENV: &str = "WARDEN_SQLITE_CRASH_CHILD";
const WRITERS: u64 = 4;
const STEPS: u64 = 64;
const ROUNDS: u64 = 8;

/// Even rounds run with the default `synchronous=FULL`, odd ones with
/// `NORMAL`: in WAL mode both must survive a process crash (see the crate
/// docs for why NORMAL does not survive power loss).
fn sync_for(round: u64) -> Synchronous {
    if round.is_multiple_of(2) {
        Synchronous::Full
    } else {
        Synchronous::Normal
    }
}

fn run_id(round: u64, w: u64) -> RunId {
    RunId::parse(&format!("run-r{round}-w{w}")).unwrap()
}

fn step_id(i: u64) -> StepId {
    StepId::parse(&format!("s{i}")).unwrap()
}

/// The child half: does nothing unless started by [`kill_9_loses_nothing`].
#[test]
fn crash_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (round, path) = spec.split_once(':').unwrap();
    let round: u64 = round.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(child(round, Path::new(path)));
}

fn ack(out: &Mutex<std::io::Stdout>, line: &str) {
    let out = out.lock().unwrap();
    let mut out = out.lock();
    writeln!(out, "ACK {line}").unwrap();
    out.flush().unwrap();
}

async fn child(round: u64, path: &Path) {
    let store = Arc::new(
        SqliteStore::open_with(SqliteOptions {
            synchronous: sync_for(round),
            ..SqliteOptions::new(path)
        })
        .await
        .unwrap(),
    );
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let store = Arc::clone(&store);
        let out = Arc::clone(&out);
        tasks.push(tokio::spawn(async move {
            let run = RunRecord {
                run_id: run_id(round, w),
                agent: id("crasher"),
                sop_hash: Digest::of(b"crash"),
                sop: json!({"round": round, "writer": w}),
                steps: (0..STEPS)
                    .map(|i| RunStep {
                        step_id: step_id(i),
                        action: ActionName::parse("artifact.save").unwrap(),
                        operation_id: format!("r{round}-w{w}-s{i}"),
                    })
                    .collect(),
                policy_version: "crash-1".into(),
                created_at: Timestamp(1),
                envelope_id: None,
            };
            store
                .create_run(run, None, warden_store::audit_if_created(vec![]))
                .await
                .unwrap();
            let started = Instant::now();
            // Bounded: the parent kills long before this ends.
            for i in 0..5_000u64 {
                if started.elapsed() > Duration::from_secs(20) {
                    break;
                }
                let key = format!("r{round}-w{w}-{i}");
                let resource = format!("crash.{key}");
                store
                    .put_record(
                        put(
                            "crasher",
                            "crash",
                            &key,
                            json!({"round": round, "w": w, "i": i}),
                            Some(0),
                        ),
                        Timestamp(i as i64),
                        warden_store::StorageQuota::default(),
                        put_audit("crasher", &resource, i),
                    )
                    .await
                    .unwrap();
                ack(&out, &format!("PUT {key}"));
                if i.is_multiple_of(3) {
                    let resource = format!("note:{key}");
                    store
                        .append_audit(vec![draft(
                            "crasher",
                            "note",
                            &resource,
                            Verdict::Allow,
                            "ok",
                        )])
                        .await
                        .unwrap();
                    ack(&out, &format!("NOTE {resource}"));
                }
                if i.is_multiple_of(2) && i / 2 < STEPS {
                    let step = step_id(i / 2);
                    let outcome = StepOutcome {
                        status: StepStatus::Completed,
                        result: Some(json!({"i": i})),
                        error: None,
                        labels: vec![],
                        recorded_at: Timestamp(i as i64),
                    };
                    let resource = format!("{}/{step}", run_id(round, w));
                    let recorded = store
                        .record_step(
                            run_id(round, w),
                            step.clone(),
                            outcome,
                            vec![draft(
                                "crasher",
                                "step.complete",
                                &resource,
                                Verdict::Allow,
                                "step_allowed",
                            )],
                        )
                        .await
                        .unwrap();
                    assert_eq!(recorded, RecordStep::Recorded);
                    ack(&out, &format!("STEP {resource}"));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[derive(Default, Debug)]
struct Acks {
    puts: Vec<String>,
    notes: Vec<String>,
    steps: Vec<String>,
}

fn parse_ack(line: &str, acks: &mut Acks) -> bool {
    let Some(rest) = line.strip_prefix("ACK ") else {
        return false;
    };
    let (kind, what) = rest.split_once(' ').unwrap();
    match kind {
        "PUT" => acks.puts.push(what.to_string()),
        "NOTE" => acks.notes.push(what.to_string()),
        "STEP" => acks.steps.push(what.to_string()),
        other => panic!("unknown ack `{other}`"),
    }
    true
}

#[test]
fn kill_9_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng::new(0x5EED);
    let started = Instant::now();
    for round in 0..ROUNDS {
        // Round 0 dies before any acknowledgement; later rounds at a seeded
        // point between 1 and ~300 acknowledgements.
        let kill_after = if round == 0 { 0 } else { 1 + rng.below(300) };
        let mut child = Command::new(&exe)
            .args([
                "crash::crash_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{round}:{}", path.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut acks = Acks::default();
        let mut seen = 0;
        while seen < kill_after {
            match lines.next() {
                Some(line) => {
                    if parse_ack(&line.unwrap(), &mut acks) {
                        seen += 1;
                    }
                }
                None => panic!("round {round}: the child ended after {seen} acknowledgements"),
            }
        }
        // Land the kill at a varied point of whatever the child is doing.
        std::thread::sleep(Duration::from_micros(rng.below(2_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "round {round}: the child was not killed");
        // Everything printed before the kill was acknowledged too.
        for line in lines {
            parse_ack(&line.unwrap(), &mut acks);
        }
        check(&path, round, &acks);
    }
    // Not a timing assertion: a guard against the child never being killed.
    assert!(started.elapsed() < Duration::from_secs(120));
}

fn check(path: &Path, round: u64, acks: &Acks) {
    if !path.exists() {
        // Killed before it even created the file.
        assert!(acks.puts.is_empty() && acks.notes.is_empty() && acks.steps.is_empty());
        return;
    }
    let nothing_acked = acks.puts.is_empty() && acks.notes.is_empty() && acks.steps.is_empty();
    // The chain verifies against its recorded head, straight from the
    // crashed file, read-only...
    match verify_audit_path(path, None) {
        Ok(_) => {}
        // ...unless the child died before its first migration committed,
        // possibly in the middle of a transaction that only a read-write
        // open rolls back (the reopening below does).
        Err(VerifyError::Store(StoreError::ReadOnly { source }))
            if nothing_acked
                && (source.to_string().contains("not initialised")
                    || source.to_string().contains("needs recovery")) => {}
        Err(e) => panic!("round {round}: audit verification failed: {e}"),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Reopen as a restarted Warden would, then verify again.
        let store = SqliteStore::open_with(SqliteOptions::new(path)).await.unwrap();
        let report = store
            .verify_audit(None)
            .await
            .unwrap_or_else(|e| panic!("round {round}: audit verification failed: {e}"));
        let entries = audit_all(&store).await;
        assert_eq!(entries.len() as u64, report.verified.count);
        let audited: BTreeSet<&str> = entries.iter().map(|e| e.draft.resource.as_str()).collect();

        // Every acknowledged write is present, with its audit entry.
        for key in &acks.puts {
            let got = store
                .get_records(Namespace::parse("crash").unwrap(), Key::parse(key).unwrap(), vec![id("crasher")])
                .await
                .unwrap();
            assert_eq!(got.len(), 1, "round {round}: acknowledged put `{key}` is missing");
            assert!(audited.contains(format!("crash.{key}").as_str()), "round {round}: `{key}` has no audit entry");
        }
        for note in &acks.notes {
            assert!(audited.contains(note.as_str()), "round {round}: acknowledged `{note}` is missing");
        }
        for step in &acks.steps {
            assert!(audited.contains(step.as_str()), "round {round}: `{step}` has no audit entry");
            let (run, s) = step.split_once('/').unwrap();
            let state = store.get_run(RunId::parse(run).unwrap()).await.unwrap().unwrap();
            assert!(state.outcomes.contains_key(&step_id(s[1..].parse().unwrap())), "round {round}: acknowledged step `{step}` is missing");
        }

        // No partial state: a record iff its audit entry, a step outcome iff
        // its audit entry (including writes that committed but were not yet
        // acknowledged when the child died).
        let conn = rusqlite::Connection::open(path).unwrap();
        let stored: BTreeSet<String> = conn
            .prepare("SELECT key FROM memory WHERE namespace = 'crash'")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(|k| format!("crash.{}", k.unwrap()))
            .collect();
        let put_entries: BTreeSet<String> = entries
            .iter()
            .filter(|e| e.draft.operation == "memory.write")
            .map(|e| e.draft.resource.clone())
            .collect();
        assert_eq!(stored, put_entries, "round {round}: records and their audit entries differ");
        let recorded: BTreeSet<String> = conn
            .prepare("SELECT run_id || '/' || step_id FROM run_steps WHERE status IS NOT NULL")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(0))
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        let step_entries: BTreeSet<String> = entries
            .iter()
            .filter(|e| e.draft.operation == "step.complete")
            .map(|e| e.draft.resource.clone())
            .collect();
        assert_eq!(recorded, step_entries, "round {round}: step outcomes and their audit entries differ");
        eprintln!(
            "round {round}: {} acknowledged ({} puts, {} notes, {} steps); {} records, {} entries on disk",
            acks.puts.len() + acks.notes.len() + acks.steps.len(),
            acks.puts.len(),
            acks.notes.len(),
            acks.steps.len(),
            stored.len(),
            entries.len()
        );
    });
}
