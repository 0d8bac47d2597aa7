//! Test support: a scratch schema per test, dropped when the test ends, and
//! helpers shared by the modules.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use warden_core::audit::{AuditDraft, AuditEntry, ChainHead, ChainVerifier};
use warden_core::decision::Verdict;
use warden_core::envelope::EnvelopeId;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{ActionName, AgentId, Key, Namespace};
use warden_core::memory::{MemoryRecord, Put};
use warden_core::time::Timestamp;
use warden_postgres::{PgOptions, PgStore};
use warden_store::{Store, StoredAgent};

/// The variable CI sets to a PostgreSQL URL.
pub const ENV: &str = "WARDEN_TEST_DATABASE_URL";

/// Prefix of every scratch schema.
const PREFIX: &str = "wtest_";

/// Scratch schemas older than this are leftovers of killed runs.
const STALE_AFTER: Duration = Duration::from_secs(6 * 3600);

/// The database URL, if tests against PostgreSQL should run.
pub fn database_url() -> Option<String> {
    std::env::var(ENV).ok().filter(|s| !s.trim().is_empty())
}

/// The URL, or print that the test is skipped and return from it.
macro_rules! url_or_skip {
    () => {
        match $crate::support::database_url() {
            Some(url) => url,
            None => {
                eprintln!("skipped: WARDEN_TEST_DATABASE_URL is not set");
                return;
            }
        }
    };
}

/// A fresh scratch schema, or print that the test is skipped and return.
macro_rules! scratch_or_skip {
    () => {
        $crate::support::Scratch::new(url_or_skip!()).await
    };
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A unique schema name: `wtest_<unix secs>_<pid>_<counter>_<nanos>`.
fn fresh_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{PREFIX}{}_{}_{n}_{:x}",
        now_secs(),
        std::process::id(),
        nanos
    )
}

/// A raw client on `url`, driven on a background task.
pub async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Drop scratch schemas left behind by killed runs (once per process).
async fn sweep_stale(url: &str) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let client = raw_client(url).await;
    let rows = client
        .query(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)",
            &[&PREFIX],
        )
        .await
        .unwrap();
    let cutoff = now_secs().saturating_sub(STALE_AFTER.as_secs());
    for row in rows {
        let name: String = row.get(0);
        let secs = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if secs.is_some_and(|s| s < cutoff) {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                .await;
        }
    }
}

/// A scratch schema in the test database, dropped (with everything in it)
/// when this value drops, even if the test panics.
#[derive(Debug)]
pub struct Scratch {
    pub url: String,
    pub schema: String,
}

impl Scratch {
    pub async fn new(url: String) -> Self {
        sweep_stale(&url).await;
        Self {
            url,
            schema: fresh_name(),
        }
    }

    /// A store on this schema (default options).
    pub async fn store(&self) -> PgStore {
        PgStore::connect_in_schema(&self.url, &self.schema)
            .await
            .unwrap()
    }

    /// A store on this schema with `pool_size` connections.
    pub async fn store_with(&self, pool_size: usize) -> PgStore {
        PgStore::connect_with(&self.url, self.options(pool_size))
            .await
            .unwrap()
    }

    pub fn options(&self, pool_size: usize) -> PgOptions {
        PgOptions {
            schema: Some(self.schema.clone()),
            pool_size,
            ..PgOptions::default()
        }
    }

    /// A raw client whose `search_path` is this schema.
    pub async fn client(&self) -> tokio_postgres::Client {
        let client = raw_client(&self.url).await;
        client
            .batch_execute(&format!("SET search_path TO \"{}\"", self.schema))
            .await
            .unwrap();
        client
    }

    /// A raw client that has run `sql` (a `BEGIN` and a locking
    /// statement) and keeps its transaction open, and its backend pid:
    /// whatever waits on the lock can be found with [`blocked_by`]. Roll
    /// back to release it.
    pub async fn holding(&self, sql: &str) -> (tokio_postgres::Client, i32) {
        let client = self.client().await;
        client.batch_execute(sql).await.unwrap();
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        (client, pid)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        // Drop runs inside the test's runtime, which cannot block on a
        // future: drop the schema from a thread with its own runtime, and
        // let the test runtime's other workers meanwhile finish closing the
        // test's connections (whose locks the drop may wait for).
        let drop_schema = move || {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .ok()?;
                    let driver = tokio::spawn(connection);
                    let dropped = client
                        .batch_execute(&format!(
                            "SET lock_timeout = '20s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                        ))
                        .await;
                    drop(client);
                    let _ = driver.await;
                    dropped.ok()
                })
            })
            .join()
        };
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let done = if multi_thread {
            tokio::task::block_in_place(drop_schema)
        } else {
            drop_schema()
        };
        if !matches!(done, Ok(Some(()))) {
            eprintln!("note: scratch schema `{}` was not dropped", self.schema);
        }
    }
}

/// A [`PgStore`] that owns its scratch schema: the shape the conformance
/// suite's factory returns (each check takes a fresh store by value and the
/// schema goes with it).
#[derive(Debug)]
pub struct ScratchStore {
    pub store: PgStore,
    _scratch: Arc<Scratch>,
}

impl ScratchStore {
    /// A fresh store in its own schema, `None` without a database URL.
    pub async fn fresh() -> Option<Self> {
        let scratch = Scratch::new(database_url()?).await;
        let store = scratch.store().await;
        Some(Self {
            store,
            _scratch: Arc::new(scratch),
        })
    }
}

warden_store::forward_store!(impl Store for ScratchStore => field store);

// ----- domain helpers -----

pub fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

pub fn ns(s: &str) -> Namespace {
    Namespace::parse(s).unwrap()
}

pub fn key(s: &str) -> Key {
    Key::parse(s).unwrap()
}

pub fn action(s: &str) -> ActionName {
    ActionName::parse(s).unwrap()
}

/// A draft at time 1000 under policy `pg-1`.
pub fn draft(
    subject: &str,
    operation: &str,
    resource: &str,
    verdict: Verdict,
    reason: &str,
) -> AuditDraft {
    AuditDraft {
        time: Timestamp(1_000),
        subject: subject.to_string(),
        operation: operation.to_string(),
        resource: resource.to_string(),
        verdict,
        reason: reason.to_string(),
        policy_version: "pg-1".to_string(),
        details: Value::Null,
    }
}

/// A numbered draft, distinguishable by its details.
pub fn numbered(i: u64) -> AuditDraft {
    AuditDraft {
        time: Timestamp(i as i64),
        details: json!({"i": i}),
        ..draft(
            "researcher",
            "memory.read",
            &format!("project.k{i}"),
            Verdict::Allow,
            "visible_from:report_manager",
        )
    }
}

pub fn agent(name: &str, parent: Option<&str>) -> StoredAgent {
    StoredAgent {
        id: id(name),
        parent: parent.map(id),
        capabilities: ["memory.read", "memory.write"]
            .into_iter()
            .map(action)
            .collect(),
        tools: vec!["search".to_string()],
        config: Some(json!({"model": "small", "temperature": 0.5})),
        status: AgentStatus::Active,
        created_at: Timestamp(10),
        // Children carry the envelope they inherited.
        envelope_id: parent.map(|p| EnvelopeId::parse(&format!("env-of-{p}")).unwrap()),
    }
}

pub fn register(name: &str) -> Vec<AuditDraft> {
    vec![draft(
        "@operator",
        "agent.register",
        name,
        Verdict::Allow,
        "registered",
    )]
}

pub fn put(owner: &str, namespace: &str, k: &str, value: Value, expected: Option<u64>) -> Put {
    Put {
        owner: id(owner),
        namespace: ns(namespace),
        key: key(k),
        value,
        expected_revision: expected,
        visibility: None,
        class: None,
    }
}

pub use warden_store::conformance::put_audit;

/// Every audit entry, paged through `audit_page` in small pages.
pub async fn audit_all<S: Store>(store: &S) -> Vec<AuditEntry> {
    let mut out: Vec<AuditEntry> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let page = store.audit_page(after, 7).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

/// The chain verifies with `ChainVerifier` over `audit_page` and with the
/// snapshot verifier, and both agree with `audit_head`. Returns the head.
pub async fn assert_chain(store: &PgStore) -> ChainHead {
    let entries = audit_all(store).await;
    let mut verifier = ChainVerifier::new();
    for e in &entries {
        verifier.push(e).unwrap();
    }
    let verified = verifier.finish();
    let head = store.audit_head().await.unwrap();
    assert_eq!(verified, head, "verified chain differs from audit_head");
    assert_eq!(head.count, entries.len() as u64);
    let report = store.verify_audit(None).await.unwrap();
    assert_eq!(report.verified, head);
    head
}

pub async fn head_count(store: &PgStore) -> u64 {
    store.audit_head().await.unwrap().count
}

pub async fn get_one(
    store: &PgStore,
    owner: &str,
    namespace: &str,
    k: &str,
) -> Option<MemoryRecord> {
    let mut got = store
        .get_records(ns(namespace), key(k), vec![id(owner)])
        .await
        .unwrap();
    assert!(got.len() <= 1);
    got.pop()
}

/// The backends waiting for the lock `blocker` holds. (`client` may be
/// in a transaction, whose first look at `pg_stat_activity` would
/// otherwise be the one it sees until it ends.)
pub async fn blocked_by(client: &tokio_postgres::Client, blocker: i32) -> Vec<i32> {
    client
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            &[&blocker],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}
