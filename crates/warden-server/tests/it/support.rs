//! A real server on `127.0.0.1:0` (bound in-process and handed to
//! `warden_server::serve`), a minimal HTTP/1.1 client over hyper, and
//! helpers to read the store behind the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use warden::ManualClock;
use warden_core::audit::{AuditEntry, ChainVerifier};
use warden_core::decision::Verdict;
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::MemoryRecord;
use warden_core::time::Timestamp;
use warden_server::{AppState, ServerConfig, ensure_operator_token, serve};
use warden_store::{MemoryStore, Store, StoredAgent};

pub const LAB_POLICY: &str = include_str!("../../../../examples/report-hierarchy/policy.yaml");
pub const OP: &str = "test-operator-token-0123456789abcdef";

pub fn sop_file(name: &str) -> Value {
    let path = format!(
        "{}/../../examples/report-hierarchy/sops/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The error code of an error response (`""` for a success).
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        self
    }

    #[track_caller]
    pub fn expect_error(self, status: u16, code: &str) -> Self {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "body: {}",
            self.text()
        );
        let err = &self.json()["error"];
        assert!(
            err["message"].is_string() && err["details"].is_object(),
            "{err}"
        );
        self
    }
}

/// One request, described completely (method, path, headers, raw body).
#[derive(Debug, Clone)]
pub struct Req {
    pub method: &'static str,
    pub path: String,
    pub token: Option<String>,
    pub body: Option<Vec<u8>>,
    pub headers: Vec<(String, String)>,
    /// Send the body without a `content-type` (one is added otherwise).
    pub bare: bool,
}

impl Req {
    pub fn new(method: &'static str, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            token: None,
            body: None,
            headers: Vec::new(),
            bare: false,
        }
    }
    /// Send the body without a `content-type` header.
    pub fn without_content_type(mut self) -> Self {
        self.bare = true;
        self
    }
    pub fn token(mut self, t: &str) -> Self {
        self.token = Some(t.to_owned());
        self
    }
    pub fn json(mut self, v: &Value) -> Self {
        self.body = Some(serde_json::to_vec(v).unwrap());
        self
    }
    pub fn raw(mut self, b: impl Into<Vec<u8>>) -> Self {
        self.body = Some(b.into());
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// Send `req` to `addr` on a fresh connection. The answer is checked
/// against the OpenAPI document ([`crate::conformance::check`]).
pub async fn send(addr: SocketAddr, req: Req) -> Resp {
    let (method, path) = (req.method, req.path.clone());
    let resp = exchange(addr, req).await;
    crate::conformance::check(method, &path, &resp);
    resp
}

/// Send `req` to `addr` on a fresh connection, unchecked.
pub async fn exchange(addr: SocketAddr, req: Req) -> Resp {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut b = hyper::Request::builder()
        .method(req.method)
        .uri(req.path.as_str());
    if !req
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("host"))
    {
        b = b.header("host", addr.to_string());
    }
    if let Some(t) = &req.token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let has_ct = req
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    if req.body.is_some() && !has_ct && !req.bare {
        b = b.header("content-type", "application/json");
    }
    for (k, v) in &req.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    let request = b
        .body(Full::new(Bytes::from(req.body.unwrap_or_default())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Resp {
        status,
        headers,
        body,
    }
}

/// Send raw bytes: `head` (request line and headers, ending in a blank
/// line) then `body`, written concurrently with reading the answer so a
/// server that answers early (413) is seen; the response is parsed by
/// `Content-Length`.
pub async fn send_raw(addr: SocketAddr, head: String, body: Vec<u8>) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(head.as_bytes()).await;
        let _ = wr.write_all(&body).await;
        let _ = wr.flush().await;
        wr
    });
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = vec![0u8; 65536];
        loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if buf.len() >= end + 4 + len {
                    break;
                }
            }
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("no response");
    writer.abort();
    let end = find(&buf, b"\r\n\r\n").expect("no response head");
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u16>()
        .unwrap();
    let mut headers = hyper::HeaderMap::new();
    for line in head.lines().skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            headers.append(
                hyper::header::HeaderName::from_bytes(k.trim().as_bytes()).unwrap(),
                hyper::header::HeaderValue::from_str(v.trim()).unwrap(),
            );
        }
    }
    Resp {
        status,
        headers,
        body: buf[end + 4..].to_vec(),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn id(s: &str) -> AgentId {
    AgentId::parse(s).unwrap()
}

/// A running server over an in-memory store with a manual clock.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: AppState<MemoryStore>,
    pub clock: Arc<ManualClock>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with(LAB_POLICY, ServerConfig::default()).await
    }

    pub async fn with(policy: &str, config: ServerConfig) -> Self {
        let policy = warden_core::bundle::compile(policy).unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
        let state = AppState::open(policy, MemoryStore::new(), clock.clone(), config)
            .await
            .unwrap();
        ensure_operator_token(&state, Some(OP)).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(serve(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Self {
            addr,
            state,
            clock,
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }

    pub async fn send(&self, req: Req) -> Resp {
        send(self.addr, req).await
    }

    pub async fn get(&self, path: &str, token: &str) -> Resp {
        self.send(Req::new("GET", path).token(token)).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Resp {
        self.send(Req::new("POST", path).token(token).json(&body))
            .await
    }

    pub async fn post_empty(&self, path: &str, token: &str) -> Resp {
        self.send(Req::new("POST", path).token(token)).await
    }

    pub async fn put(&self, path: &str, token: &str, body: Value) -> Resp {
        self.send(Req::new("PUT", path).token(token).json(&body))
            .await
    }

    pub async fn delete(&self, path: &str, token: &str) -> Resp {
        self.send(Req::new("DELETE", path).token(token)).await
    }

    /// A fresh token for `agent`, issued by the operator over HTTP.
    pub async fn token_for(&self, agent: &str) -> String {
        let r = self
            .post_empty(&format!("/v1/agents/{agent}/tokens"), OP)
            .await
            .expect(201);
        r.json()["token"].as_str().unwrap().to_owned()
    }

    /// Tokens for the lab's three agents.
    pub async fn lab_tokens(&self) -> (String, String, String) {
        (
            self.token_for("report_manager").await,
            self.token_for("researcher").await,
            self.token_for("formatter").await,
        )
    }

    pub fn store(&self) -> &MemoryStore {
        self.state.store()
    }

    pub async fn audit(&self) -> Vec<AuditEntry> {
        self.store().audit_page(0, usize::MAX).await.unwrap()
    }

    pub async fn last_audit(&self) -> AuditEntry {
        self.audit().await.pop().unwrap()
    }

    pub async fn record(&self, owner: &str, ns: &str, key: &str) -> Option<MemoryRecord> {
        self.store()
            .get_records(
                Namespace::parse(ns).unwrap(),
                Key::parse(key).unwrap(),
                vec![id(owner)],
            )
            .await
            .unwrap()
            .pop()
    }

    pub async fn verify_chain(&self) -> u64 {
        let mut v = ChainVerifier::new();
        for e in self.audit().await {
            v.push(&e).unwrap();
        }
        v.finish().count
    }

    /// Everything a client error must not change: agents, the records at
    /// `keys` for every agent, and the audit entries that are not denials.
    /// Denials may be appended: they are evidence, not state. So may the
    /// per-step `sop.validate` verdicts of a rejected SOP (its allowed steps
    /// are recorded as `allow` next to the denied ones): they record the
    /// evaluation, and nothing was admitted.
    pub async fn snapshot(&self, keys: &[(&str, &str)]) -> Snapshot {
        let agents = self.store().load_agents().await.unwrap();
        let owners: Vec<AgentId> = agents.iter().map(|a| a.id.clone()).collect();
        let mut records = Vec::new();
        for (ns, key) in keys {
            let mut found = self
                .store()
                .get_records(
                    Namespace::parse(ns).unwrap(),
                    Key::parse(key).unwrap(),
                    owners.clone(),
                )
                .await
                .unwrap();
            records.append(&mut found);
        }
        let non_deny = self
            .audit()
            .await
            .into_iter()
            .filter(|e| e.draft.verdict != Verdict::Deny && e.draft.operation != "sop.validate")
            .collect();
        Snapshot {
            agents,
            records,
            non_deny,
        }
    }

    /// Stop accepting, finish in-flight requests, and wait for `serve` to
    /// return.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(30), h)
                .await
                .expect("serve did not stop")
                .unwrap()
                .unwrap();
        }
    }

    /// Ask the server to shut down without waiting.
    pub fn trigger_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Wait for `serve` to return (after [`TestServer::trigger_shutdown`]).
    pub async fn join(mut self) -> std::io::Result<()> {
        match self.handle.take() {
            Some(h) => tokio::time::timeout(Duration::from_secs(30), h)
                .await
                .expect("serve did not stop")
                .unwrap(),
            None => Ok(()),
        }
    }
}

/// The state a client error must leave unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub agents: Vec<StoredAgent>,
    pub records: Vec<MemoryRecord>,
    pub non_deny: Vec<AuditEntry>,
}

/// Poll `cond` until it holds, failing after `deadline`.
pub async fn eventually(deadline: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < deadline,
            "condition not reached in {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
