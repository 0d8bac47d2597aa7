//! Nothing acknowledged is lost: a writer process is killed with SIGKILL at
//! random points, and every write it acknowledged is still there, each
//! write is present if and only if its audit entry is, and the chain
//! verifies.
//!
//! The writer is this test binary, re-run with [`CHILD_ENV`] naming the
//! schema and [`ROUND_ENV`] the round: it runs only [`crash_child`], which
//! makes create-only puts of `crash.r<round>-<i>` and prints `ACK <i>` after
//! each one returned.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use warden_core::decision::Verdict;
use warden_core::time::Timestamp;
use warden_postgres::PgStore;
use warden_store::{PutOutcome, Store};

use crate::support::*;

const CHILD_ENV: &str = "WARDEN_PG_CRASH_CHILD_SCHEMA";
const ROUND_ENV: &str = "WARDEN_PG_CRASH_CHILD_ROUND";
const ROUNDS: u64 = 4;
/// Most puts a child makes before giving up (it is killed long before).
const CHILD_LIMIT: u64 = 100_000;

/// The writer. Does nothing unless the crash test started this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let (Ok(schema), Ok(round)) = (std::env::var(CHILD_ENV), std::env::var(ROUND_ENV)) else {
        eprintln!(
            "not run on its own: the writer process of crash_kill_9_loses_no_acknowledged_write"
        );
        return;
    };
    let url = url_or_skip!();
    let store = PgStore::connect_in_schema(&url, &schema).await.unwrap();
    println!("READY");
    for i in 0..CHILD_LIMIT {
        let k = format!("r{round}-{i}");
        let outcome = store
            .put_record(
                put(
                    "writer",
                    "crash",
                    &k,
                    json!({"round": round, "i": i}),
                    Some(0),
                ),
                Timestamp(1),
                warden_store::StorageQuota::default(),
                put_audit("writer", &format!("crash.{k}"), i),
            )
            .await
            .unwrap();
        assert!(matches!(outcome, PutOutcome::Written { .. }));
        // Acknowledged: `put_record` returned.
        println!("ACK {i}");
    }
}

/// A small random number from the clock (no dependency needed).
fn random_below(n: u64, salt: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x % n.max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_kill_9_loses_no_acknowledged_write() {
    let scratch = scratch_or_skip!();
    // Create the schema first, so the children only connect.
    let store = scratch.store().await;
    let exe = std::env::current_exe().unwrap();
    let mut acked: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .args([
                "crash::crash_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &scratch.schema)
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Kill after a random number of acknowledgements (and so at a
        // random point of the next put: before, during or after its
        // commit).
        let kill_after = 5 + random_below(60, round);
        let mut round_acks = BTreeSet::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while (round_acks.len() as u64) < kill_after {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("round {round}: the writer stalled: {e}"));
            if let Some(i) = line.strip_prefix("ACK ") {
                round_acks.insert(i.trim().parse::<u64>().unwrap());
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acknowledgements printed before the kill landed count too.
        reader.join().unwrap();
        for line in rx.try_iter() {
            if let Some(i) = line.strip_prefix("ACK ") {
                round_acks.insert(i.trim().parse::<u64>().unwrap());
            }
        }
        eprintln!(
            "round {round}: killed the writer after {} acknowledged puts",
            round_acks.len()
        );
        acked.insert(round, round_acks);
    }

    // Reconnect as a fresh process would.
    drop(store);
    let store = scratch.store().await;
    let sql = scratch.client().await;
    let present: BTreeSet<String> = sql
        .query(
            "SELECT key FROM memory WHERE owner = 'writer' AND namespace = 'crash'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    for (round, acks) in &acked {
        for i in acks {
            let k = format!("r{round}-{i}");
            assert!(present.contains(&k), "acknowledged write {k} is missing");
            let rec = get_one(&store, "writer", "crash", &k).await.unwrap();
            assert_eq!(rec.value, json!({"round": round.to_string(), "i": i}));
        }
    }
    // A write is present if and only if its audit entry is.
    let audited: BTreeSet<String> = audit_all(&store)
        .await
        .into_iter()
        .filter(|e| e.draft.verdict == Verdict::Allow && e.draft.operation == "memory.write")
        .map(|e| e.draft.resource.trim_start_matches("crash.").to_string())
        .collect();
    assert_eq!(audited, present);
    let total_acked: usize = acked.values().map(BTreeSet::len).sum();
    assert!(present.len() >= total_acked);
    assert!(
        present.len() <= total_acked + ROUNDS as usize,
        "more unacknowledged writes than kills"
    );
    assert_chain(&store).await;
}
