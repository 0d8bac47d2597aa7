//! `warden mcp`: a stdio MCP server for clients that launch their servers
//! as subprocesses, relaying every message to a running `warden serve`'s
//! `/mcp` with the agent's token (so everything is decided there, with the
//! same identity rules).
//!
//! Each line on stdin is one JSON-RPC message, posted to `/mcp` with
//! `Authorization: Bearer TOKEN`, the MCP session id the server gave at
//! `initialize`, and `Warden-Session` when one is named. Every message of
//! the answer (a JSON body, or the events of an SSE stream, each as soon as
//! it ends, not when the stream closes) is written to stdout as one line. `initialize` is relayed before the next line is
//! read (later messages need its session id); other requests are relayed
//! concurrently, so a call held for review does not block the rest. An
//! HTTP refusal (bad token: 401; the operator's token: 403) is answered
//! to a request as a JSON-RPC error naming the status and Warden's code.
//! Plain `http://` only (a loopback or a trusted network).

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc};

use crate::SESSION_HEADER;

/// Where and as whom the bridge relays.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// The server's base URL (`http://127.0.0.1:7070`); `/mcp` is added.
    pub base_url: String,
    /// The agent's bearer token.
    pub token: String,
    /// A session to bind every call to (`Warden-Session`).
    pub session: Option<String>,
}

/// Why the bridge stopped.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The base URL is not a plain `http://` URL.
    #[error("`{0}` is not an http:// URL")]
    Url(String),
    /// Reading stdin or writing stdout failed.
    #[error("stdio: {0}")]
    Io(#[from] std::io::Error),
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Relay {
    client: HttpClient,
    url: hyper::Uri,
    config: BridgeConfig,
    /// `Mcp-Session-Id` and `Mcp-Protocol-Version` once initialized.
    mcp_session: Mutex<(Option<String>, Option<String>)>,
    out: mpsc::UnboundedSender<String>,
}

/// Take the complete events (each ended by a blank line) off the front
/// of `pending`, leaving the start of an unfinished one.
fn take_events(pending: &mut Vec<u8>) -> Vec<u8> {
    let mut end = 0;
    let mut line_start = 0;
    for (i, b) in pending.iter().enumerate() {
        if *b == b'\n' {
            let line = pending.get(line_start..i).unwrap_or_default();
            if line.is_empty() || line == b"\r" {
                end = i + 1;
            }
            line_start = i + 1;
        }
    }
    let rest = pending.split_off(end);
    std::mem::replace(pending, rest)
}

/// The events' `data` of an SSE text, one message per event.
fn sse_messages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut data: Vec<&str> = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() {
                out.push(data.join("\n"));
                data.clear();
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    if !data.is_empty() {
        out.push(data.join("\n"));
    }
    out.into_iter().filter(|m| !m.trim().is_empty()).collect()
}

impl Relay {
    fn error_reply(&self, id: &Value, message: String) {
        let reply =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": message}});
        let _ = self.out.send(reply.to_string());
    }

    async fn relay(&self, line: String) {
        let message: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let _ = self.out.send(
                    json!({"jsonrpc": "2.0", "id": null,
                           "error": {"code": -32700, "message": format!("parse error: {e}")}})
                    .to_string(),
                );
                return;
            }
        };
        let id = message.get("id").cloned();
        let is_initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        let (session, version) = self.mcp_session.lock().await.clone();
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {}", self.config.token));
        if let Some(s) = &session {
            req = req.header("mcp-session-id", s);
        }
        if let Some(v) = &version {
            req = req.header("mcp-protocol-version", v);
        }
        if let Some(s) = &self.config.session {
            req = req.header(SESSION_HEADER, s);
        }
        let req = match req.body(Full::new(Bytes::from(line))) {
            Ok(r) => r,
            Err(e) => {
                if let Some(id) = &id {
                    self.error_reply(id, format!("warden: bad request: {e}"));
                }
                return;
            }
        };
        let response = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(id) = &id {
                    self.error_reply(id, format!("warden: cannot reach {}: {e}", self.url));
                }
                return;
            }
        };
        let status = response.status();
        let new_session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let is_sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if is_sse && status.is_success() && status != StatusCode::ACCEPTED {
            self.relay_events(
                response.into_body(),
                id.as_ref(),
                is_initialize,
                new_session,
            )
            .await;
            return;
        }
        let body = match response.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                if let Some(id) = &id {
                    self.error_reply(id, format!("warden: answer cut short: {e}"));
                }
                return;
            }
        };
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            if let Some(id) = &id {
                let code = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| text.chars().take(200).collect());
                self.error_reply(id, format!("warden: HTTP {} {code}", status.as_u16()));
            }
            return;
        }
        let messages = if status == StatusCode::ACCEPTED || text.trim().is_empty() {
            Vec::new()
        } else {
            vec![text.trim().to_owned()]
        };
        self.deliver(messages, is_initialize, new_session).await;
    }

    /// Relay the events of an SSE answer as each one ends (the stream
    /// itself may close later): the client sees its answer as soon as the
    /// server sent it.
    async fn relay_events(
        &self,
        mut body: hyper::body::Incoming,
        id: Option<&Value>,
        is_initialize: bool,
        new_session: Option<String>,
    ) {
        let mut pending: Vec<u8> = Vec::new();
        let mut messages = Vec::new();
        let mut answered = false;
        loop {
            match body.frame().await {
                None => break,
                Some(Ok(frame)) => {
                    let Some(data) = frame.data_ref() else {
                        continue;
                    };
                    pending.extend_from_slice(data);
                    let complete = take_events(&mut pending);
                    if complete.is_empty() {
                        continue;
                    }
                    let events = sse_messages(&String::from_utf8_lossy(&complete));
                    if is_initialize {
                        messages.extend(events);
                    } else {
                        answered |= !events.is_empty();
                        self.send_lines(events);
                    }
                }
                Some(Err(e)) => {
                    // A stream cut after its answer went out is not that
                    // request's error.
                    if let Some(id) = id.filter(|_| !answered) {
                        self.error_reply(id, format!("warden: answer cut short: {e}"));
                    }
                    return;
                }
            }
        }
        messages.extend(sse_messages(&String::from_utf8_lossy(&pending)));
        self.deliver(messages, is_initialize, new_session).await;
    }

    /// Note the MCP session an `initialize` answer opened, then write the
    /// messages out.
    async fn deliver(
        &self,
        messages: Vec<String>,
        is_initialize: bool,
        new_session: Option<String>,
    ) {
        if is_initialize {
            let version = messages
                .iter()
                .filter_map(|m| serde_json::from_str::<Value>(m).ok())
                .find_map(|m| {
                    m.pointer("/result/protocolVersion")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
            *self.mcp_session.lock().await = (new_session, version);
        }
        self.send_lines(messages);
    }

    fn send_lines(&self, messages: Vec<String>) {
        for m in messages {
            // One line per message: re-encode compactly.
            let line = serde_json::from_str::<Value>(&m).map_or(m, |v| v.to_string());
            let _ = self.out.send(line);
        }
    }

    async fn close(&self) {
        let (session, _) = self.mcp_session.lock().await.clone();
        let Some(session) = session else { return };
        if let Ok(req) = Request::builder()
            .method(Method::DELETE)
            .uri(self.url.clone())
            .header("authorization", format!("Bearer {}", self.config.token))
            .header("mcp-session-id", session)
            .body(Full::new(Bytes::new()))
        {
            let _ = self.client.request(req).await;
        }
    }
}

/// The HTTP connector: `TCP_NODELAY`, so a request written in parts is
/// not held back waiting for the server's acknowledgement.
fn connector() -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    c
}

/// Relay stdin to the server and its answers to stdout until stdin ends.
pub async fn run_stdio(config: BridgeConfig) -> Result<(), BridgeError> {
    let base = config.base_url.trim_end_matches('/');
    if !base.starts_with("http://") {
        return Err(BridgeError::Url(config.base_url.clone()));
    }
    let url: hyper::Uri = format!("{base}/mcp")
        .parse()
        .map_err(|_| BridgeError::Url(config.base_url.clone()))?;
    let (out, mut rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(mut line) = rx.recv().await {
            // One write per message (and what queued meanwhile).
            line.push('\n');
            while let Ok(more) = rx.try_recv() {
                line.push_str(&more);
                line.push('\n');
            }
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let relay = Arc::new(Relay {
        client: Client::builder(TokioExecutor::new()).build(connector()),
        url,
        config,
        mcp_session: Mutex::new((None, None)),
        out,
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let initialize = serde_json::from_str::<Value>(&line)
            .ok()
            .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned))
            .is_some_and(|m| m == "initialize");
        if initialize {
            relay.relay(line).await;
        } else {
            let r = Arc::clone(&relay);
            tasks.spawn(async move { r.relay(line).await });
        }
    }
    while tasks.join_next().await.is_some() {}
    relay.close().await;
    drop(relay);
    let _ = writer.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_become_messages() {
        let text = "id: 0\nretry: 3000\ndata:\n\ndata: {\"a\":1}\n\n: ping\n\ndata: {\"b\":\r\ndata: 2}\r\n\r\n";
        assert_eq!(sse_messages(text), vec!["{\"a\":1}", "{\"b\":\n2}"]);
        assert!(sse_messages("").is_empty());
    }

    #[test]
    fn complete_events_are_taken_as_they_end() {
        let mut pending = b"data: {\"a\":1}\n\ndata: {\"b\"".to_vec();
        let done = take_events(&mut pending);
        assert_eq!(done, b"data: {\"a\":1}\n\n");
        assert_eq!(pending, b"data: {\"b\"");
        assert!(take_events(&mut pending).is_empty());
        pending.extend_from_slice(b":2}\r\n\r\nid: 3\n");
        let done = take_events(&mut pending);
        assert_eq!(
            sse_messages(&String::from_utf8_lossy(&done)),
            vec!["{\"b\":2}"]
        );
        assert_eq!(pending, b"id: 3\n");
    }
}
