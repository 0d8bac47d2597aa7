//! Change notifications: how one Warden server learns that another changed
//! an agent or a token, so it can refresh its caches.
//!
//! Every transaction that inserts an agent, changes an agent's status or
//! capabilities, inserts a token or revokes one also inserts a row into the
//! `changes` table and sends `NOTIFY` on the store's channel
//! ([`PgStore::channel`]) with a small JSON payload: `{"seq": 7, "kind":
//! "agent_status", "ids": ["researcher", "formatter"]}`.
//!
//! - **Sequence numbers are gapless and in commit order.** A change's `seq`
//!   is assigned as `max + 1` while the transaction holds the audit head
//!   lock (see the crate docs), which it holds until it commits; so change
//!   `n + 1` cannot commit before change `n`, and a reader that has seen `n`
//!   has seen everything before it.
//! - **A notification is sent if and only if its transaction commits**, and
//!   PostgreSQL delivers notifications in commit order. It is a hint, not
//!   the record: a payload naming more than 32 ids carries `"ids": null`,
//!   and a notification can be missed while a listener's connection is
//!   down. The `changes` table is the record; [`PgStore::changes_since`]
//!   reads it.
//! - **[`ChangeStream`] delivers every change exactly once, in `seq`
//!   order, with no gaps**: it fills any gap (and any `null` ids) from the
//!   table, checks the table every [`PgOptions::listen_heartbeat`] anyway,
//!   and after a lost connection reconnects (with backoff) and catches up
//!   before reporting [`ChangeEvent::Resumed`]. Between
//!   [`ChangeEvent::Disconnected`] and [`ChangeEvent::Resumed`] a node may
//!   be stale: it can fail closed, or reload, as its policy says.
//!
//! How a node keeps a cache fresh: subscribe first, then load what it
//! caches, then apply every change (re-reading the named agents with
//! [`PgStore::agents_by_id`], dropping cached tokens by id). A change that
//! arrives for something the load already saw is harmless to re-apply.
//!
//! [`PgOptions::listen_heartbeat`]: crate::PgOptions::listen_heartbeat

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};
use warden_store::StoreError;

use crate::codec::{text_out, u64_in, u64_out};
use crate::error::DbResult;
use crate::schema::quote_ident;
use crate::sql;
use crate::store::PgStore;

/// What kind of thing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// An agent was registered; `ids` holds its id.
    AgentInserted,
    /// Agents' status changed (revocation of a subtree); `ids` holds them.
    AgentStatus,
    /// An agent's declared capabilities were replaced; `ids` holds its id.
    AgentCapabilities,
    /// A token was issued; `ids` holds its token id.
    TokenInserted,
    /// A token was revoked; `ids` holds its token id.
    TokenRevoked,
}

impl ChangeKind {
    /// The snake_case name stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::AgentInserted => "agent_inserted",
            ChangeKind::AgentStatus => "agent_status",
            ChangeKind::AgentCapabilities => "agent_capabilities",
            ChangeKind::TokenInserted => "token_inserted",
            ChangeKind::TokenRevoked => "token_revoked",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "agent_inserted" => ChangeKind::AgentInserted,
            "agent_status" => ChangeKind::AgentStatus,
            "agent_capabilities" => ChangeKind::AgentCapabilities,
            "token_inserted" => ChangeKind::TokenInserted,
            "token_revoked" => ChangeKind::TokenRevoked,
            _ => return None,
        })
    }
}

/// One committed change to agents or tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Position in the change log: from 1, without gaps, in commit order.
    pub seq: u64,
    /// What changed.
    pub kind: ChangeKind,
    /// The agent ids or token ids it concerns.
    pub ids: Vec<String>,
}

/// What a [`ChangeStream`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeEvent {
    /// The next change (its `seq` is one more than the previous one's).
    Change(Change),
    /// The listening connection was lost; changes made from now on arrive
    /// only after [`ChangeEvent::Resumed`].
    Disconnected,
    /// Caught up: every change up to `seq` has been delivered. Sent after
    /// a reconnect, and by [`PgStore::subscribe_from`] once the changes
    /// already stored are delivered.
    Resumed {
        /// The last change delivered.
        seq: u64,
    },
}

/// Changes as they commit, from a dedicated `LISTEN` connection; see the
/// [module docs](self). Dropping it closes the connection.
#[derive(Debug)]
pub struct ChangeStream {
    rx: mpsc::Receiver<ChangeEvent>,
    task: JoinHandle<()>,
    start: u64,
}

impl ChangeStream {
    /// The next event; `None` only once the store is gone.
    pub async fn recv(&mut self) -> Option<ChangeEvent> {
        self.rx.recv().await
    }

    /// The change sequence number the stream started after: it yields the
    /// changes with a greater `seq`.
    pub fn start_seq(&self) -> u64 {
        self.start
    }
}

impl Drop for ChangeStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Changes read per query while catching up.
const CATCH_UP_PAGE: usize = 512;

/// Events buffered for a slow consumer before the listener waits for it.
const STREAM_BUFFER: usize = 1024;

/// Shortest heartbeat period accepted.
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl PgStore {
    /// Subscribe to changes committed from now on (after the current
    /// [`PgStore::change_head`]), by any server sharing the database.
    ///
    /// Returns once the listening connection is established: every change
    /// that commits after this returns is delivered.
    pub async fn subscribe(&self) -> Result<ChangeStream, StoreError> {
        self.subscribe_after(None).await
    }

    /// Subscribe to every change after `seq` (first those already in the
    /// table, then new ones): how a node resumes from what it has applied.
    pub async fn subscribe_from(&self, seq: u64) -> Result<ChangeStream, StoreError> {
        self.subscribe_after(Some(seq)).await
    }

    async fn subscribe_after(&self, after: Option<u64>) -> Result<ChangeStream, StoreError> {
        let (client, notes) = self.listen().await?;
        let start = match after {
            Some(seq) => seq,
            None => head_on(&client).await?,
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let listener = Listener {
            store: self.clone(),
            out: tx,
            last: start,
        };
        let task = tokio::spawn(listener.run(client, notes, after.is_some()));
        Ok(ChangeStream { rx, task, start })
    }

    /// Up to `limit` changes with `seq > after`, ascending: the record a
    /// node that missed notifications catches up from.
    pub async fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        let after = u64_in(after, "change sequence number")?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        conn.query(sql::CHANGES_SINCE, &[&after, &limit])
            .await?
            .iter()
            .map(change_out)
            .collect()
    }

    /// The last change's sequence number (0 if there is none).
    pub async fn change_head(&self) -> Result<u64, StoreError> {
        let mut conn = self.inner.pool.get().await?;
        let rows = conn.query(sql::CHANGE_HEAD, &[]).await?;
        let seq: i64 = match rows.first() {
            Some(row) => row.try_get(0).map_err(crate::error::column)?,
            None => 0,
        };
        u64_out(seq, "change sequence number")
    }

    /// Open a listening connection: its own client, `LISTEN`ing on the
    /// channel, with notification payloads forwarded to the receiver (which
    /// closes when the connection does).
    async fn listen(&self) -> Result<(Client, mpsc::UnboundedReceiver<String>), StoreError> {
        let mut config = self.inner.config.clone();
        // Detect a dead connection within about half a minute even when
        // nothing is sent (the heartbeat query also does).
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        let name = format!("warden-listen:{}", self.inner.schema);
        config.application_name(name.as_str());
        let (client, mut connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(crate::error::db)?;
        let (ntx, nrx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if ntx.send(n.payload().to_string()).is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "postgres change listener connection failed");
                        break;
                    }
                    None => break,
                }
            }
        });
        client
            .batch_execute(&format!(
                "{}; LISTEN {}",
                self.inner.setup,
                quote_ident(&self.inner.channel)
            ))
            .await
            .db()?;
        Ok((client, nrx))
    }
}

fn change_out(row: &tokio_postgres::Row) -> Result<Change, StoreError> {
    let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
    let kind: &str = row.try_get(1).map_err(crate::error::column)?;
    let ids: Vec<String> = row.try_get(2).map_err(crate::error::column)?;
    Ok(Change {
        seq: u64_out(seq, "change sequence number")?,
        kind: ChangeKind::parse(kind)
            .ok_or_else(|| StoreError::corrupt(format!("unknown change kind `{kind}`")))?,
        ids: ids.into_iter().map(text_out).collect::<Result<_, _>>()?,
    })
}

async fn head_on(client: &Client) -> Result<u64, StoreError> {
    let row = client.query_one(sql::CHANGE_HEAD, &[]).await.db()?;
    let seq: i64 = row.try_get(0).map_err(crate::error::column)?;
    u64_out(seq, "change sequence number")
}

/// The payload of a notification.
#[derive(Deserialize)]
struct Payload {
    seq: u64,
    kind: String,
    ids: Option<Vec<String>>,
}

/// Why the listener left its connected loop.
enum Exit {
    /// The consumer dropped the stream.
    Closed,
    /// The connection failed.
    Lost,
}

struct Listener {
    store: PgStore,
    out: mpsc::Sender<ChangeEvent>,
    /// The last change delivered.
    last: u64,
}

impl Listener {
    async fn run(
        mut self,
        mut client: Client,
        mut notes: mpsc::UnboundedReceiver<String>,
        catch_up_first: bool,
    ) {
        let mut catch_up = catch_up_first;
        loop {
            let exit = match self.connected(&client, &mut notes, catch_up).await {
                Ok(exit) => exit,
                Err(e) => {
                    tracing::warn!(error = %e, "postgres change listener lost its connection");
                    Exit::Lost
                }
            };
            if let Exit::Closed = exit {
                return;
            }
            if self.out.send(ChangeEvent::Disconnected).await.is_err() {
                return;
            }
            let mut backoff = Duration::from_millis(50);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = self.out.closed() => return,
                }
                match self.store.listen().await {
                    Ok((c, n)) => {
                        client = c;
                        notes = n;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "postgres change listener cannot reconnect");
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
            catch_up = true;
        }
    }

    /// Deliver changes while the connection lives.
    async fn connected(
        &mut self,
        client: &Client,
        notes: &mut mpsc::UnboundedReceiver<String>,
        catch_up_first: bool,
    ) -> Result<Exit, StoreError> {
        if catch_up_first {
            if !self.catch_up(client).await? {
                return Ok(Exit::Closed);
            }
            if self
                .out
                .send(ChangeEvent::Resumed { seq: self.last })
                .await
                .is_err()
            {
                return Ok(Exit::Closed);
            }
        }
        let period = self.store.inner.options.listen_heartbeat.max(MIN_HEARTBEAT);
        let mut heartbeat = tokio::time::interval(period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.reset();
        loop {
            let delivered = tokio::select! {
                note = notes.recv() => match note {
                    None => return Ok(Exit::Lost),
                    Some(payload) => self.on_notification(client, &payload).await?,
                },
                _ = heartbeat.tick() => self.catch_up(client).await?,
                () = self.out.closed() => return Ok(Exit::Closed),
            };
            if !delivered {
                return Ok(Exit::Closed);
            }
        }
    }

    /// Deliver what a notification announces; `false` if the consumer is
    /// gone.
    async fn on_notification(
        &mut self,
        client: &Client,
        payload: &str,
    ) -> Result<bool, StoreError> {
        let parsed = serde_json::from_str::<Payload>(payload).ok();
        match parsed {
            Some(p) if p.seq <= self.last => Ok(true),
            Some(Payload {
                seq,
                kind,
                ids: Some(ids),
            }) if seq == self.last + 1 => {
                let (Some(kind), Ok(ids)) = (
                    ChangeKind::parse(&kind),
                    ids.into_iter().map(text_out).collect::<Result<Vec<_>, _>>(),
                ) else {
                    return self.catch_up(client).await;
                };
                self.deliver(Change { seq, kind, ids }).await
            }
            // A gap, a payload without ids, or one that does not parse:
            // the table has the truth.
            _ => self.catch_up(client).await,
        }
    }

    /// Deliver every change after `last` from the table; `false` if the
    /// consumer is gone.
    async fn catch_up(&mut self, client: &Client) -> Result<bool, StoreError> {
        let limit = i64::try_from(CATCH_UP_PAGE).unwrap_or(i64::MAX);
        loop {
            let after = u64_in(self.last, "change sequence number")?;
            let rows = client
                .query(sql::CHANGES_SINCE, &[&after, &limit])
                .await
                .db()?;
            if rows.is_empty() {
                return Ok(true);
            }
            for row in &rows {
                if !self.deliver(change_out(row)?).await? {
                    return Ok(false);
                }
            }
            if rows.len() < CATCH_UP_PAGE {
                return Ok(true);
            }
        }
    }

    async fn deliver(&mut self, change: Change) -> Result<bool, StoreError> {
        if change.seq <= self.last {
            return Ok(true);
        }
        if change.seq != self.last + 1 {
            // Warden assigns sequence numbers without gaps; a gap means
            // rows were removed from the table (pruned, or tampered with).
            tracing::warn!(
                after = self.last,
                next = change.seq,
                "the change log skips sequence numbers"
            );
        }
        self.last = change.seq;
        Ok(self.out.send(ChangeEvent::Change(change)).await.is_ok())
    }
}
