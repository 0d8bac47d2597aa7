//! One writing process per database file.
//!
//! Every store that opens a file for writing holds an exclusive advisory
//! lock (`flock(2)` on Unix, `LockFileEx` on Windows, through
//! [`std::fs::File::try_lock`]) on a sibling file, `PATH.lock`, for as long
//! as it lives. A second *process* that tries to open the same file for
//! writing is refused before it writes anything: two servers on one file
//! would each cache the hierarchy, and a revocation made through one would
//! never reach the other.
//!
//! Stores inside one process share the lock (a registry keyed by the lock
//! file's canonical path counts them), so a process may open a file it
//! already has open. Read-only opens (`mode=ro`, `warden audit verify`,
//! `warden audit export`) take no lock: WAL readers never disturb a writer.
//!
//! The lock lives on a sibling file rather than on the database file
//! itself, because SQLite's own POSIX locks on the database are dropped by
//! the kernel whenever *any* descriptor of that file is closed in the
//! process. The lock file holds no data and is left in place on exit (the
//! kernel releases the lock when the process ends, even on `kill -9`);
//! removing it while a server runs defeats the check.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use warden_store::StoreError;

/// The held lock; released when the last store of this process that shares
/// it is dropped.
#[derive(Debug)]
pub(crate) struct WriterLock {
    key: PathBuf,
    file: Option<File>,
    /// The file's request-rate buckets: one writing process per file, so
    /// this process's stores of the file are the whole deployment and
    /// share one table.
    pub(crate) rates: warden_store::RateBuckets,
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Close the file (releasing the lock) and forget the entry in one
        // step under the registry's mutex, so an open racing with this drop
        // either shares a live lock or finds the file free.
        let held = HELD.lock();
        drop(self.file.take());
        if let Ok(mut held) = held
            && held.get(&self.key).is_some_and(|w| w.strong_count() == 0)
        {
            held.remove(&self.key);
        }
    }
}

/// Locks this process holds, by canonical lock-file path.
static HELD: Mutex<BTreeMap<PathBuf, Weak<WriterLock>>> = Mutex::new(BTreeMap::new());

/// The lock file of the database at `db`: `db` with `.lock` appended.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Take (or share, within this process) the writer lock of `db`.
pub(crate) fn acquire(db: &Path) -> Result<Arc<WriterLock>, StoreError> {
    let path = lock_path(db);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| crate::error::io_failure(&path, "create the lock file", &e))?;
    let key = path.canonicalize().unwrap_or_else(|_| path.clone());
    // A store of this process whose last handle is being dropped still
    // holds the lock for a moment: wait for it rather than blame another
    // process.
    for _ in 0..1000 {
        let mut held = HELD
            .lock()
            .map_err(|_| StoreError::backend("the sqlite lock registry is poisoned"))?;
        let entry = held.get(&key);
        if let Some(shared) = entry.and_then(Weak::upgrade) {
            return Ok(shared);
        }
        let dying = entry.is_some();
        match file.try_lock() {
            Ok(()) => {
                let lock = Arc::new(WriterLock {
                    key: key.clone(),
                    file: Some(file),
                    rates: warden_store::RateBuckets::default(),
                });
                held.insert(key, Arc::downgrade(&lock));
                return Ok(lock);
            }
            Err(TryLockError::WouldBlock) if dying => {
                drop(held);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::unavailable_because(
                    warden_store::Unavailability::Busy,
                    format!(
                        "`{}` is in use by another Warden process (it holds the lock on `{}`): stop that process or use another database",
                        db.display(),
                        path.display()
                    ),
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(crate::error::io_failure(&path, "lock", &e));
            }
        }
    }
    Err(StoreError::unavailable_because(
        warden_store::Unavailability::Busy,
        format!(
            "`{}`: a store of this process did not release its lock on `{}`",
            db.display(),
            path.display()
        ),
    ))
}
