//! Tasks on a thread of their own: the group-commit writers and the
//! record-reads task, which every audited decision waits for.
//!
//! On the caller's runtime, each answer from the database waited for a
//! worker busy with other tasks (a server's HTTP connections) before the
//! task went on; a writer does so with the audit head lock held. On a
//! single-threaded runtime of their own, with their connections (opened
//! from the task, so driven there too), they go on as soon as the
//! operating system wakes the thread.

use std::future::Future;

use warden_store::StoreError;

/// Run `task` on a new thread named `name` (Linux shows 15 bytes of it),
/// in a single-threaded runtime that ends with it (and with the
/// connections it drives).
pub(crate) fn spawn<F>(name: &str, task: F) -> Result<(), StoreError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::backend(format!("starting the runtime of `{name}`: {e}")))?;
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || runtime.block_on(task))
        .map_err(|e| StoreError::backend(format!("starting the thread `{name}`: {e}")))?;
    Ok(())
}
