//! Record reads, coalesced: the reads every resolve makes (a key's records
//! of the owners along the reader's lineage) are answered in groups, one
//! statement per group.
//!
//! A task takes every read queued (up to [`MAX_OWNERS`] owners in all),
//! asks for all of them in one statement ([`sql::GET_RECORDS_MANY`]: the
//! requests' `(namespace, key, owner)` rows joined with the records, each
//! row tagged with its request), answers each read with its own records
//! and takes the next group, so that while one group is at the database
//! the next one forms: as many reads as arrive during a round trip share
//! the next, and the database parses, plans and answers one statement for
//! them instead of one each. Alone, a read costs what it did (one
//! statement, [`sql::GET_RECORDS`]); under load it waits for the group in
//! flight, at most one round trip more.
//!
//! What a read sees is unchanged: the group's statement starts after every
//! read in it was asked for, so it sees every write acknowledged before
//! any of them (one read-committed snapshot for the group, as a statement
//! of its own would have had). A group whose statement fails for a reason
//! other than the database being unavailable is asked again one read at a
//! time, so a read that the database refuses fails alone; an unavailable
//! database fails the whole group, as it would have failed each read.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::MemoryRecord;
use warden_store::StoreError;

use crate::codec::record_out;
use crate::pool::Readers;
use crate::sql;

/// Most owners (rows asked for) in one group.
pub(crate) const MAX_OWNERS: usize = 1024;

type Reply = oneshot::Sender<Result<Vec<MemoryRecord>, StoreError>>;

struct Read {
    namespace: Namespace,
    key: Key,
    owners: Vec<AgentId>,
    reply: Reply,
}

/// The sender to the task that answers record reads; dropping it stops
/// the task once it has answered what was queued.
pub(crate) struct RecordReads {
    sender: mpsc::UnboundedSender<Read>,
}

impl RecordReads {
    /// Start the task, reading through `readers`, on a thread of its own
    /// (see [`crate::dedicated`]; the connections it opens are driven
    /// there), which ends once the task has: once this is dropped and it
    /// has answered what was queued.
    pub(crate) fn spawn(readers: Arc<Readers>) -> Result<Self, StoreError> {
        let (sender, receiver) = mpsc::unbounded_channel();
        crate::dedicated::spawn("warden-reads", run(readers, receiver))?;
        Ok(Self { sender })
    }

    /// The records of `key` in `namespace` held by `owners`, in the order
    /// of `owners`.
    pub(crate) async fn get(
        &self,
        namespace: Namespace,
        key: Key,
        owners: Vec<AgentId>,
    ) -> Result<Vec<MemoryRecord>, StoreError> {
        if owners.is_empty() {
            return Ok(Vec::new());
        }
        let stopped = || StoreError::backend("the postgres record reader has stopped");
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Read {
                namespace,
                key,
                owners,
                reply,
            })
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(readers: Arc<Readers>, mut receiver: mpsc::UnboundedReceiver<Read>) {
    while let Some(first) = receiver.recv().await {
        let mut owners = first.owners.len();
        let mut group = vec![first];
        while owners < MAX_OWNERS {
            match receiver.try_recv() {
                Ok(read) => {
                    owners += read.owners.len();
                    group.push(read);
                }
                Err(_) => break,
            }
        }
        answer(&readers, group).await;
    }
}

/// Ask for `group` and answer each read.
async fn answer(readers: &Readers, mut group: Vec<Read>) {
    if group.len() == 1
        && let Some(read) = group.pop()
    {
        let found = alone(readers, &read).await;
        let _ = read.reply.send(found);
        return;
    }
    match together(readers, &group).await {
        Ok(found) => {
            for (read, records) in group.into_iter().zip(found) {
                let _ = read.reply.send(Ok(in_owner_order(&read.owners, records)));
            }
        }
        Err(e) if !e.is_transient() => {
            for read in group {
                let found = alone(readers, &read).await;
                let _ = read.reply.send(found);
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for read in group {
                let _ = read.reply.send(Err(StoreError::fan_out(&e)));
            }
        }
    }
}

/// One read, in a statement of its own.
async fn alone(readers: &Readers, read: &Read) -> Result<Vec<MemoryRecord>, StoreError> {
    let names: Vec<&str> = read.owners.iter().map(AgentId::as_str).collect();
    let found = readers
        .query(
            sql::GET_RECORDS,
            &[&read.namespace.as_str(), &read.key.as_str(), &names],
        )
        .await?
        .iter()
        .map(record_out)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(in_owner_order(&read.owners, found))
}

/// Every read of `group` in one statement: each one's records, in the
/// order of the group.
async fn together(readers: &Readers, group: &[Read]) -> Result<Vec<Vec<MemoryRecord>>, StoreError> {
    let rows: usize = group.iter().map(|r| r.owners.len()).sum();
    let mut places: Vec<i32> = Vec::with_capacity(rows);
    let mut namespaces: Vec<&str> = Vec::with_capacity(rows);
    let mut keys: Vec<&str> = Vec::with_capacity(rows);
    let mut owners: Vec<&str> = Vec::with_capacity(rows);
    for (i, read) in group.iter().enumerate() {
        let place = i32::try_from(i)
            .map_err(|_| StoreError::backend("too many record reads in one group"))?;
        for owner in &read.owners {
            places.push(place);
            namespaces.push(read.namespace.as_str());
            keys.push(read.key.as_str());
            owners.push(owner.as_str());
        }
    }
    let mut found: Vec<Vec<MemoryRecord>> = group.iter().map(|_| Vec::new()).collect();
    for row in readers
        .query(
            sql::GET_RECORDS_MANY,
            &[&places, &namespaces, &keys, &owners],
        )
        .await?
    {
        let place: i32 = row.try_get(12).map_err(crate::error::column)?;
        let records = usize::try_from(place)
            .ok()
            .and_then(|p| found.get_mut(p))
            .ok_or_else(|| StoreError::corrupt("a grouped record read answered no read"))?;
        records.push(record_out(&row)?);
    }
    Ok(found)
}

/// `found` in the order of `owners`, as the resolver walks the lineage (a
/// repeated owner repeats its record, as `Store::get_records` says).
fn in_owner_order(owners: &[AgentId], found: Vec<MemoryRecord>) -> Vec<MemoryRecord> {
    let by_owner: HashMap<AgentId, MemoryRecord> =
        found.into_iter().map(|r| (r.owner.clone(), r)).collect();
    owners
        .iter()
        .filter_map(|owner| by_owner.get(owner).cloned())
        .collect()
}
