//! The pool after an abandoned operation: a caller that gives up half-way
//! (its future dropped, as a server's request timeout does) leaves its
//! exchange pending on the connection; that connection must not be handed
//! to the next caller, who would queue behind it (on a dead link, for as
//! long as the operating system keeps the socket).

use std::time::Duration;

use warden_store::Store;

use crate::support::*;

/// With one pooled connection, an append abandoned while it waits for a
/// lock held elsewhere does not block a read made while the lock is still
/// held: the read gets a new connection. The abandoned append was queued
/// to a writer, whose group commits it once the lock is released (its
/// caller gave up; the outcome stands, as on SQLite), and the chain
/// verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_operation_does_not_hold_up_the_next() {
    let scratch = scratch_or_skip!();
    let store = scratch.store_with(1).await;
    store
        .append_audit(vec![numbered(1)])
        .await
        .expect("an append before the lock");
    let mut locker = scratch.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        store.append_audit(vec![numbered(2)]),
    )
    .await;
    assert!(abandoned.is_err(), "the append did not wait for the lock");
    // The lock is still held. Bounded so that a read stuck behind the
    // abandoned append fails the test instead of hanging it.
    let agents = tokio::time::timeout(Duration::from_secs(30), store.load_agents()).await;
    assert!(
        agents.is_ok(),
        "a read queued behind the abandoned append on the pool's only connection"
    );
    agents.unwrap().expect("the read");
    lock.rollback().await.unwrap();
    // The group commits on its own once the lock is gone: wait for it
    // (a chain read while it commits would see it half-way).
    for _ in 0..500 {
        if store.audit_head().await.unwrap().count == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let head = assert_chain(&store).await;
    assert_eq!(
        head.count, 2,
        "the queued append was committed by its group"
    );
}
