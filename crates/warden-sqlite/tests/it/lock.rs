//! One writing process per database file: a second process is refused
//! before it writes anything; stores inside one process share the lock;
//! read-only opens take none.
//!
//! The other process is this test binary run again as a child (selecting
//! only [`lock_child`], with `WARDEN_SQLITE_LOCK_CHILD` naming the file):
//! it opens the store for writing, prints `OPEN` and holds the store until
//! its stdin closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use warden_sqlite::{SqliteOptions, SqliteStore, lock_path};
use warden_store::{Store, StoreError};

use crate::support::{Snapshot, note, temp_db, url};

const CHILD_ENV: &str = "WARDEN_SQLITE_LOCK_CHILD";

/// The child half: does nothing unless started by a test below.
#[test]
fn lock_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&url(Path::new(&path))).await.unwrap();
        store.append_audit(vec![note(1)]).await.unwrap();
        println!("OPEN");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        drop(store);
    });
}

/// A child process holding a store open, with its output.
struct Holder {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

/// Start a child holding `path` open for writing; returns once it said so.
fn holder(path: &Path) -> Holder {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "lock::lock_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // The harness prints the test's name on the same line.
    let opened = out
        .by_ref()
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("OPEN"));
    assert!(opened, "the child did not open the store");
    Holder { child, out }
}

fn release(mut holder: Holder) {
    drop(holder.child.stdin.take());
    let mut rest = String::new();
    let _ = holder.out.read_to_string(&mut rest);
    assert!(holder.child.wait().unwrap().success(), "{rest}");
}

#[tokio::test]
async fn a_second_process_is_refused_and_nothing_changes() {
    let (_dir, path) = temp_db();
    let child = holder(&path);
    let wal = path.with_file_name("warden.db-wal");
    let before = (Snapshot::of(&path), Snapshot::of(&wal));
    let err = SqliteStore::open(&url(&path)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("in use by another Warden process")
            && message.contains(&path.display().to_string()),
        "{message}"
    );
    assert_eq!((Snapshot::of(&path), Snapshot::of(&wal)), before);
    // Reading beside the holder needs no lock.
    let ro = SqliteStore::open_with(SqliteOptions::new(&path).read_only())
        .await
        .unwrap();
    assert_eq!(ro.audit_head().await.unwrap().count, 1);
    assert_eq!(ro.verify_audit(None).await.unwrap().verified.count, 1);
    drop(ro);
    release(child);
    // Once the holder is gone, the file opens for writing again.
    let store = SqliteStore::open(&url(&path)).await.unwrap();
    store.append_audit(vec![note(2)]).await.unwrap();
    assert_eq!(store.audit_head().await.unwrap().count, 2);
}

#[tokio::test]
async fn stores_of_one_process_share_the_lock_and_release_it_together() {
    let (_dir, path) = temp_db();
    let a = SqliteStore::open(&url(&path)).await.unwrap();
    let b = SqliteStore::open(&url(&path)).await.unwrap();
    drop(a);
    // `b` still holds the lock for this process...
    let probe = std::fs::File::open(lock_path(&path)).unwrap();
    assert!(
        probe.try_lock().is_err(),
        "the lock is held while `b` lives"
    );
    drop(b);
    // ...and dropping the last store releases it.
    assert!(
        probe.try_lock().is_ok(),
        "the lock is released with the last store"
    );
    probe.unlock().unwrap();
    let child = holder(&path);
    release(child);
}

#[tokio::test]
async fn a_lock_held_elsewhere_refuses_even_a_fresh_file() {
    let (_dir, path) = temp_db();
    // Whoever holds the lock file (here: a descriptor outside any store).
    let foreign = std::fs::File::create(lock_path(&path)).unwrap();
    foreign.try_lock().unwrap();
    let err = SqliteStore::open(&url(&path)).await.unwrap_err();
    assert!(
        err.to_string().contains("in use by another Warden process"),
        "{err}"
    );
    // Nothing was initialised: the file is not a Warden database yet.
    let ro = SqliteStore::open_with(SqliteOptions::new(&path).read_only()).await;
    assert!(ro.is_err(), "{ro:?}");
    drop(foreign);
    SqliteStore::open(&url(&path)).await.unwrap();
}
