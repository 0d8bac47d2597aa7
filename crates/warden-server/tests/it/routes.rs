//! The route list drives the server: every listed route answers as
//! documented without a token, nothing outside the list is routed, and the
//! README's route table is the list's.

use warden_server::openapi::route_table;
use warden_server::{API, Access, Route};

use crate::support::*;

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

/// A path of the template with every parameter filled in (with values that
/// are no static segment of any route).
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{id}" => "researcher",
            "{token_id}" => "tok_0000000000000000",
            "{namespace}" => "project",
            "{key}" => "client_region",
            "{run}" => "run-1",
            "{step}" => "step-1",
            "{call}" => "call-1",
            other => {
                assert!(
                    !other.starts_with('{'),
                    "no value for {other} in {template}"
                );
                other
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether `path` is an instance of the route's template.
fn matches(route: &Route, path: &str) -> bool {
    let t: Vec<&str> = route.path.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    t.len() == p.len()
        && t.iter().zip(&p).all(|(t, p)| {
            if t.starts_with('{') {
                !p.is_empty()
            } else {
                t == p
            }
        })
}

/// Paths near the listed ones: one segment more, a trailing slash, every
/// prefix, another version, another case.
fn near_misses() -> Vec<String> {
    let mut out = vec![
        "/".to_owned(),
        "/v1".to_owned(),
        "/v1/".to_owned(),
        "/v1/unknown".to_owned(),
        "/v1/tokens".to_owned(),
        "/v1/memory".to_owned(),
        "/v1/sops".to_owned(),
        "/healthz/x".to_owned(),
        "/openapi".to_owned(),
    ];
    for r in API {
        let c = concrete(r.path);
        out.push(format!("{c}/extra"));
        out.push(format!("{c}/"));
        out.push(c.replacen("/v1/", "/v2/", 1));
        out.push(c.to_uppercase());
        let segments: Vec<&str> = c.split('/').collect();
        for n in 2..segments.len() {
            out.push(segments[..n].join("/"));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every path of up to two segments, and under `/v1` up to three, made of
/// the list's own words.
fn word_paths() -> Vec<String> {
    let mut out = Vec::new();
    let mut words: Vec<&str> = API
        .iter()
        .flat_map(|r| r.path.split('/'))
        .filter(|w| !w.is_empty() && !w.starts_with('{'))
        .collect();
    words.push("researcher");
    words.sort_unstable();
    words.dedup();
    for a in &words {
        out.push(format!("/{a}"));
        for b in &words {
            out.push(format!("/{a}/{b}"));
            out.push(format!("/v1/{a}/{b}"));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[tokio::test]
async fn every_listed_route_answers_its_documented_status_without_a_token() {
    let s = TestServer::start().await;
    let before = s.audit().await.len();
    for r in API {
        let path = concrete(r.path);
        // With a well-formed body too, so a body cannot get ahead of the
        // token check.
        let requests = if r.doc.request.is_some() {
            vec![
                Req::new(r.method, path.clone()),
                Req::new(r.method, path.clone()).json(&serde_json::json!({})),
            ]
        } else {
            vec![Req::new(r.method, path.clone())]
        };
        for req in requests {
            let resp = s.send(req).await;
            if r.doc.access == Access::Public {
                assert_eq!(resp.status, r.doc.success[0], "{} {}", r.method, r.path);
            } else {
                assert!(
                    r.errors()
                        .iter()
                        .any(|e| e.status == 401 && e.code == "missing_token"),
                    "{} {}: 401 missing_token undocumented",
                    r.method,
                    r.path
                );
                assert_eq!(
                    (resp.status, resp.code().as_str()),
                    (401, "missing_token"),
                    "{} {}",
                    r.method,
                    r.path
                );
                assert_eq!(resp.headers.get("www-authenticate").unwrap(), "Bearer");
            }
        }
    }
    // Unauthenticated requests leave nothing behind.
    assert_eq!(s.audit().await.len(), before);
    s.stop().await;
}

#[tokio::test]
async fn nothing_outside_the_list_is_routed() {
    let s = TestServer::start().await;
    let before = s.audit().await.len();
    let mut paths: Vec<(String, &[&str])> = near_misses()
        .into_iter()
        .chain(API.iter().map(|r| concrete(r.path)))
        .map(|p| (p, &METHODS[..]))
        .collect();
    // Routing goes by path first: two methods are enough for the rest.
    paths.extend(word_paths().into_iter().map(|p| (p, &["GET", "PUT"][..])));
    let mut checked = 0;
    for (path, methods) in &paths {
        let listed: Vec<&Route> = API.iter().filter(|r| matches(r, path)).collect();
        for &method in *methods {
            if listed.iter().any(|r| r.method == method) {
                continue; // a listed route: the tests above
            }
            let resp = s.send(Req::new(method, path.clone())).await;
            if listed.is_empty() {
                assert_eq!(
                    (resp.status, resp.code().as_str()),
                    (404, "not_found"),
                    "{method} {path} is not in the list"
                );
            } else {
                assert_eq!(
                    (resp.status, resp.code().as_str()),
                    (405, "method_not_allowed"),
                    "{method} {path}: the path is listed, the method is not"
                );
            }
            checked += 1;
        }
    }
    // The sweep is not vacuous: every listed path was tried with other
    // methods, and the near misses with every method.
    assert!(checked > 5 * near_misses().len() / 2, "{checked}");
    assert_eq!(s.audit().await.len(), before);
    s.stop().await;
}

#[tokio::test]
async fn the_token_each_route_needs_is_the_one_listed() {
    let s = TestServer::start().await;
    let agent = s.token_for("formatter").await;
    let wrong_kind = |access: Access| match access {
        Access::Operator => Some(("agent", "operator_only")),
        Access::Agent => Some(("operator", "agent_token_required")),
        Access::OperatorOrAgent | Access::Public => None,
    };
    for r in API {
        // Ids nothing has, so no call changes anything a later one sees.
        let path = concrete(r.path).replace("researcher", "nobody");
        for (who, token) in [("operator", OP), ("agent", agent.as_str())] {
            let resp = s.send(Req::new(r.method, path.clone()).token(token)).await;
            // `/metrics` answers text.
            let code = serde_json::from_slice::<serde_json::Value>(&resp.body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                .unwrap_or_default();
            let refused = matches!(code.as_str(), "operator_only" | "agent_token_required");
            match wrong_kind(r.doc.access) {
                Some((refused_who, expected)) if refused_who == who => {
                    assert_eq!(
                        (resp.status, code.as_str()),
                        (403, expected),
                        "{} {} with the {who} token",
                        r.method,
                        r.path
                    );
                }
                _ => assert!(
                    !refused && resp.status != 401,
                    "{} {} refuses the {who} token: {}",
                    r.method,
                    r.path,
                    resp.text()
                ),
            }
        }
    }
    s.stop().await;
}

#[test]
fn readme_route_table_is_the_route_list() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let expected = route_table();
    let begin = "<!-- route table: begin -->";
    let end = "<!-- route table: end -->";
    let found = readme
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once(end))
        .map(|(table, _)| table.trim());
    assert!(
        found == Some(expected.trim()),
        "the route table in crates/warden-server/README.md (between `{begin}` and `{end}`) \
         differs from the route list `warden_server::API`; the table should read:\n\n{expected}"
    );
}
