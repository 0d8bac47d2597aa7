//! Record reads answered in groups: reads queued while one is at the
//! database go out as one statement, and each read gets its own records,
//! in the order of its owners.

use std::time::Duration;

use serde_json::json;
use warden_core::time::Timestamp;
use warden_store::{StorageQuota, Store};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_queued_behind_one_share_a_statement_and_each_gets_its_own_records() {
    let scratch = scratch_or_skip!();
    let s = scratch.store().await;
    let owners = ["a", "b", "c", "d"];
    for (i, o) in owners.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| owners[p]);
        s.insert_agent(agent(o, parent), register(o)).await.unwrap();
    }
    // Key `k<n>` is held by the owners whose bit is set in n, each with a
    // value naming the owner and the key; namespace `other` holds the same
    // keys with other values.
    for n in 0..16u32 {
        for (bit, o) in owners.iter().enumerate() {
            if n & (1 << bit) == 0 {
                continue;
            }
            for namespace in ["g", "other"] {
                let k = format!("k{n}");
                s.put_record(
                    put(
                        o,
                        namespace,
                        &k,
                        json!(format!("{namespace}/{o}/{k}")),
                        Some(0),
                    ),
                    Timestamp(1),
                    StorageQuota::default(),
                    put_audit(o, &format!("{namespace}.{k}"), 0),
                )
                .await
                .unwrap();
            }
        }
    }

    // Hold every read at the database: the first read's statement waits
    // on the table lock, and the reads asked for meanwhile queue behind it.
    let (holder, pid) = scratch
        .holding("BEGIN; LOCK TABLE memory IN ACCESS EXCLUSIVE MODE")
        .await;
    let watcher = scratch.client().await;
    // Each read asks for the owners in its own order (some of them
    // holding no record of the key).
    let asks: Vec<(u32, Vec<&str>)> = (0..16u32)
        .map(|n| {
            let mut order: Vec<&str> = owners.to_vec();
            order.rotate_left(n as usize % 4);
            if n % 3 == 0 {
                order.reverse();
            }
            (n, order)
        })
        .collect();
    let read = |n: u32, order: Vec<&str>| {
        let s = s.clone();
        let owners: Vec<_> = order.iter().map(|o| id(o)).collect();
        tokio::spawn(async move { s.get_records(ns("g"), key(&format!("k{n}")), owners).await })
    };
    let first = read(asks[0].0, asks[0].1.clone());
    for _ in 0..500 {
        if !blocked_by(&watcher, pid).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        blocked_by(&watcher, pid).await.len(),
        1,
        "the first read waits"
    );
    let rest: Vec<_> = asks[1..]
        .iter()
        .map(|(n, order)| read(*n, order.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Fifteen reads asked for, still one statement waiting: the others
    // wait for it to be answered, not each at the database.
    assert_eq!(
        blocked_by(&watcher, pid).await.len(),
        1,
        "reads queue, not statements"
    );
    holder.batch_execute("ROLLBACK").await.unwrap();

    let mut answers = vec![first.await.unwrap().unwrap()];
    for r in rest {
        answers.push(r.await.unwrap().unwrap());
    }
    for ((n, order), got) in asks.iter().zip(answers) {
        let want: Vec<String> = order
            .iter()
            .filter(|o| {
                let bit = owners.iter().position(|x| x == *o).unwrap();
                n & (1 << bit) != 0
            })
            .map(|o| format!("g/{o}/k{n}"))
            .collect();
        let got: Vec<String> = got
            .iter()
            .map(|r| {
                assert_eq!(r.key.as_str(), format!("k{n}"));
                assert_eq!(r.namespace.as_str(), "g");
                r.value.as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(got, want, "read of k{n} in the order {order:?}");
    }
}
