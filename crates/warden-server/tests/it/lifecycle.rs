//! The service around the API: every route served, the OpenAPI document,
//! metrics, timeouts and graceful shutdown.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warden_server::{ROUTES, ServerConfig};

use crate::support::*;

fn concrete(path: &str) -> String {
    path.replace("{id}", "researcher")
        .replace("{token_id}", "tok_0000000000000000")
        .replace("{namespace}", "project")
        .replace("{key}", "client_region")
        .replace("{run}", "run-1")
        .replace("{step}", "step-1")
}

#[tokio::test]
async fn every_route_is_served_and_documented() {
    let s = TestServer::start().await;
    let public = ["/healthz", "/metrics", "/openapi.json", "/v1/envelope-key"];
    for (method, path) in ROUTES {
        let r = s.send(Req::new(method, concrete(path))).await;
        if public.contains(path) {
            assert_eq!(r.status, 200, "{method} {path}");
        } else {
            assert_eq!(
                (r.status, r.code().as_str()),
                (401, "missing_token"),
                "{method} {path}"
            );
            assert_eq!(r.headers.get("www-authenticate").unwrap(), "Bearer");
        }
    }
    let doc = s
        .send(Req::new("GET", "/openapi.json"))
        .await
        .expect(200)
        .json();
    assert_eq!(doc["openapi"], json!("3.0.3"));
    for (method, path) in ROUTES {
        let op = &doc["paths"][path][method.to_ascii_lowercase()];
        assert!(
            op["operationId"].is_string(),
            "{method} {path} undocumented"
        );
    }
    // Every error response refers to the one error shape.
    let err = &doc["paths"]["/v1/memory/{namespace}/{key}"]["get"]["responses"]["404"];
    assert_eq!(
        err["content"]["application/json"]["schema"]["$ref"],
        json!("#/components/schemas/ErrorResponse")
    );
    // Unknown routes and methods answer in the same shape.
    s.send(Req::new("GET", "/v2/agents"))
        .await
        .expect_error(404, "not_found");
    s.send(Req::new("PATCH", "/v1/memory/a/b"))
        .await
        .expect_error(405, "method_not_allowed");
    s.stop().await;
}

#[tokio::test]
async fn metrics_count_decisions_by_verdict_and_reason_and_time_requests() {
    let s = TestServer::start().await;
    let researcher = s.token_for("researcher").await;
    s.get("/v1/memory/project/client_region", &researcher)
        .await
        .expect(200);
    s.get("/v1/memory/credentials/storage_token", &researcher)
        .await
        .expect(404);
    let text = s.send(Req::new("GET", "/metrics")).await.expect(200);
    assert!(
        text.headers
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = text.text();
    assert!(text.contains(
        "warden_decisions_total{operation=\"memory.read\",verdict=\"allow\",reason=\"visible_from\"} 1"
    ), "{text}");
    assert!(text.contains(
        "warden_decisions_total{operation=\"memory.read\",verdict=\"deny\",reason=\"not_visible_from\"} 1"
    ));
    assert!(text.contains(
        "warden_http_requests_total{method=\"GET\",route=\"/v1/memory/{namespace}/{key}\",status=\"404\"} 1"
    ));
    assert!(text.contains(
        "warden_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/memory/{namespace}/{key}\"} 2"
    ));
    assert!(text.contains("warden_http_request_duration_seconds_bucket{method=\"GET\",route=\"/v1/memory/{namespace}/{key}\",le=\"+Inf\"} 2"));
    // No agent name or secret becomes a label.
    assert!(!text.contains("report_manager"));
    let health = s.send(Req::new("GET", "/healthz")).await.expect(200).json();
    assert_eq!(health, json!({"status": "ok", "policy_version": "lab-1"}));
    s.stop().await;
}

async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&buf).contains(needle) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("no response");
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn shutdown_finishes_the_request_in_flight_then_serve_returns() {
    let mut s = TestServer::start().await;
    let token = s.token_for("researcher").await;
    let state = s.state.clone();
    let body = br#"{"value": "written during shutdown"}"#;
    let mut stream = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "PUT /v1/memory/notes/late HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..10]).await.unwrap();
    // The handler is waiting for the rest of the body.
    eventually(Duration::from_secs(10), || state.metrics().in_flight() >= 1).await;
    s.trigger_shutdown();
    stream.write_all(&body[10..]).await.unwrap();
    let response = read_until(&mut stream, "\"created\"").await;
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    let stored = s.record("researcher", "notes", "late").await.unwrap();
    assert_eq!(stored.value, json!("written during shutdown"));
    s.join().await.unwrap();
}

#[tokio::test]
async fn a_request_that_stalls_is_answered_503_and_the_server_stays_up() {
    let config = ServerConfig {
        request_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let s = TestServer::with(LAB_POLICY, config).await;
    let token = s.token_for("researcher").await;
    let before = s.snapshot(&[("notes", "stalled")]).await;
    let mut stream = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "PUT /v1/memory/notes/stalled HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"val"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_until(&mut stream, "\"timeout\"").await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert_eq!(s.snapshot(&[("notes", "stalled")]).await, before);
    s.get("/v1/memory/project/client_region", &token)
        .await
        .expect(200);
    s.stop().await;
}
