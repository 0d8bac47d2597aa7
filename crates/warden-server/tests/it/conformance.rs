//! Every answer the tests receive, checked against the OpenAPI document the
//! server serves: the status is documented for the route, the content type
//! is the documented one, the body validates against the documented schema
//! for that status (JSON Schema, with OpenAPI 3.0's `nullable` read as a
//! `null` alternative), and an error's code is among the status's
//! `x-error-codes`. [`check`] runs on every response of
//! [`crate::support::send`], so every server test is also a conformance
//! test; the tests below drive it on its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use jsonschema::Validator;
use serde_json::{Map, Value, json};
use warden_server::API;

use crate::support::Resp;

/// The served document, the schemas converted for validation.
struct Doc {
    document: Value,
    /// `components.schemas`, converted.
    schemas: Value,
    validators: Mutex<HashMap<String, Arc<Validator>>>,
}

fn doc() -> &'static Doc {
    static DOC: OnceLock<Doc> = OnceLock::new();
    DOC.get_or_init(|| {
        let bytes = warden_server::openapi::document_bytes();
        let document: Value = serde_json::from_slice(&bytes).unwrap();
        let schemas = to_json_schema(&document["components"]["schemas"]);
        Doc {
            document,
            schemas,
            validators: Mutex::new(HashMap::new()),
        }
    })
}

/// An OpenAPI 3.0 schema as a JSON Schema (draft 4): a schema marked
/// `nullable` also admits `null`.
fn to_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => {
            let mut out: Map<String, Value> = o
                .iter()
                .filter(|(k, _)| k.as_str() != "nullable")
                .map(|(k, v)| (k.clone(), to_json_schema(v)))
                .collect();
            if o.get("nullable") == Some(&Value::Bool(true)) {
                let inner = Value::Object(std::mem::take(&mut out));
                out.insert("anyOf".into(), json!([inner, {"type": "null"}]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

/// The route of `API` a request to `method path` reached: a static segment
/// wins over a parameter, as in the router.
fn route_of(method: &str, path: &str) -> Option<&'static warden_server::Route> {
    let p: Vec<&str> = path.split('/').collect();
    API.iter()
        .filter(|r| r.method.eq_ignore_ascii_case(method))
        .filter_map(|r| {
            let t: Vec<&str> = r.path.split('/').collect();
            if t.len() != p.len() {
                return None;
            }
            let mut statics = 0;
            for (t, p) in t.iter().zip(&p) {
                if t.starts_with('{') {
                    if p.is_empty() {
                        return None;
                    }
                } else if t == p {
                    statics += 1;
                } else {
                    return None;
                }
            }
            Some((statics, r))
        })
        .max_by_key(|(statics, _)| *statics)
        .map(|(_, r)| r)
}

fn validator(key: &str, schema: &Value) -> Arc<Validator> {
    let d = doc();
    let mut cache = d.validators.lock().unwrap();
    cache
        .entry(key.to_owned())
        .or_insert_with(|| {
            let root = json!({
                "allOf": [to_json_schema(schema)],
                "components": {"schemas": d.schemas},
            });
            Arc::new(
                jsonschema::draft4::new(&root)
                    .unwrap_or_else(|e| panic!("{key}: schema does not compile: {e}")),
            )
        })
        .clone()
}

/// Every way the answer to `method path` departs from the document
/// (empty: it conforms, or the route is not in the document).
pub fn problems(method: &str, path: &str, resp: &Resp) -> Vec<String> {
    let path = path.split('?').next().unwrap_or("");
    let Some(route) = route_of(method, path) else {
        return Vec::new();
    };
    let at = format!("{} {} -> {}", route.method, route.path, resp.status);
    let op = &doc().document["paths"][route.path][route.method.to_ascii_lowercase()];
    let answer = &op["responses"][resp.status.to_string()];
    if !answer.is_object() {
        return vec![format!("{at}: status not documented; body {}", resp.text())];
    }
    let mut out = Vec::new();
    let content = answer["content"].as_object().cloned().unwrap_or_default();
    let media = resp
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let Some(media) = media else {
        if !content.is_empty() {
            out.push(format!("{at}: no content-type"));
        }
        return out;
    };
    let Some(documented) = content.get(&media) else {
        out.push(format!(
            "{at}: content-type {media}, documented {:?}",
            content.keys().collect::<Vec<_>>()
        ));
        return out;
    };
    if media != "application/json" {
        return out;
    }
    let body: Value = match serde_json::from_slice(&resp.body) {
        Ok(v) => v,
        Err(e) => {
            out.push(format!("{at}: body is not JSON: {e}"));
            return out;
        }
    };
    let v = validator(&at, &documented["schema"]);
    for e in v.iter_errors(&body) {
        out.push(format!(
            "{at}: {e} at {} (schema {})",
            e.instance_path(),
            e.schema_path()
        ));
    }
    if let Some(codes) = answer["x-error-codes"].as_array() {
        let code = &body["error"]["code"];
        if !codes.contains(code) {
            out.push(format!("{at}: error code {code} not among {codes:?}"));
        }
    }
    out
}

/// Fail unless the answer to `method path` conforms to the document.
#[track_caller]
pub fn check(method: &str, path: &str, resp: &Resp) {
    let found = problems(method, path, resp);
    assert!(
        found.is_empty(),
        "the answer departs from /openapi.json:\n{}",
        found.join("\n")
    );
}

/// Whether `json` validates against the document's `schema` (converted).
fn valid(schema: &Value, json: &Value) -> Result<(), String> {
    let root = json!({
        "allOf": [to_json_schema(schema)],
        "components": {"schemas": doc().schemas},
    });
    let v = jsonschema::draft4::new(&root).map_err(|e| e.to_string())?;
    let errors: Vec<String> = v.iter_errors(json).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// The schema a JSON pointer reaches inside `schema`, through references,
/// `allOf` / `anyOf` / `oneOf`, properties and array items (`None`: the
/// pointer names nothing the schema describes). A schema that says
/// nothing (any JSON) reaches everything.
fn reach(schema: &Value, pointer: &[&str]) -> Option<Value> {
    let schemas = &doc().document["components"]["schemas"];
    let mut s = schema.clone();
    loop {
        if let Some(name) = s["$ref"].as_str() {
            s = schemas[name.trim_start_matches("#/components/schemas/")].clone();
        } else if let Some(alts) = s["allOf"].as_array().or(s["anyOf"].as_array()) {
            let alts: Vec<&Value> = alts.iter().filter(|a| a["enum"] != json!([null])).collect();
            match alts.as_slice() {
                [one] => s = (*one).clone(),
                _ => return pointer.is_empty().then_some(s),
            }
        } else {
            break;
        }
    }
    let Some((first, rest)) = pointer.split_first() else {
        return Some(s);
    };
    if s.get("type").is_none() && s.get("properties").is_none() && s.get("oneOf").is_none() {
        return Some(json!({}));
    }
    if s["type"] == json!("array") {
        first.parse::<usize>().ok()?;
        return reach(&s["items"], rest);
    }
    reach(s["properties"].get(*first)?, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operations() -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        for (path, methods) in doc().document["paths"].as_object().unwrap() {
            for (method, op) in methods.as_object().unwrap() {
                out.push((method.clone(), path.clone(), op.clone()));
            }
        }
        out
    }

    fn codes(op: &Value, status: &str) -> Vec<String> {
        op["responses"][status]["x-error-codes"]
            .as_array()
            .map(|c| c.iter().map(|c| c.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn every_route_documents_the_answers_of_the_middleware_and_the_store() {
        for (method, path, op) in operations() {
            // Any handler may panic (500) and any request may time out
            // (503): the middleware answers both, for every route.
            assert!(
                codes(&op, "500").contains(&"internal".to_owned()),
                "{method} {path}"
            );
            assert!(
                codes(&op, "503").contains(&"timeout".to_owned()),
                "{method} {path}"
            );
            if op.get("security").is_some() {
                assert!(
                    codes(&op, "503").contains(&"unavailable".to_owned()),
                    "{method} {path}"
                );
                for status in ["401", "403", "429"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path} {status}"
                    );
                }
            }
            if op.get("requestBody").is_some() {
                for status in ["400", "413", "415", "422"] {
                    assert!(
                        op["responses"][status].is_object(),
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }

    #[test]
    fn path_parameters_are_identifiers_that_survive_url_normalisation() {
        let (_, _, op) = operations()
            .into_iter()
            .find(|(_, p, _)| p == "/v1/agents/{id}")
            .unwrap();
        let schema = &op["parameters"][0]["schema"];
        for ok in [
            "report_manager",
            "a",
            "a.b",
            "..a",
            "run-1:2",
            &"x".repeat(128),
        ] {
            assert!(valid(schema, &json!(ok)).is_ok(), "{ok}");
        }
        for bad in [".", "..", "...", "", "a/b", "a b", &"x".repeat(129)] {
            assert!(valid(schema, &json!(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_request_example_is_valid_for_its_schema() {
        let mut seen = 0;
        for (method, path, op) in operations() {
            let media = &op["requestBody"]["content"]["application/json"];
            if let Some(example) = media.get("example") {
                valid(&media["schema"], example).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                seen += 1;
            }
            for p in op["parameters"].as_array().unwrap() {
                if let Some(example) = p.get("example") {
                    valid(&p["schema"], example).unwrap_or_else(|e| panic!("{path}: {e}"));
                }
            }
        }
        assert!(seen >= 10, "{seen}");
    }

    /// Every link names an operation, only parameters it has, a body only
    /// where it reads one, and fields the answer it hangs on documents; and
    /// the links reach runs, sessions and escalations from what creates
    /// them.
    #[test]
    fn links_resolve_and_reach_runs_sessions_and_escalations() {
        let ops = operations();
        let by_id = |id: &str| {
            ops.iter()
                .find(|(_, _, op)| op["operationId"] == json!(id))
                .map(|(_, _, op)| op.clone())
                .unwrap_or_else(|| panic!("no operation {id}"))
        };
        let params = |op: &Value| -> Vec<String> {
            op["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect()
        };
        let mut edges = Vec::new();
        for (method, path, op) in &ops {
            let from = op["operationId"].as_str().unwrap();
            for (status, answer) in op["responses"].as_object().unwrap() {
                let Some(links) = answer.get("links").and_then(Value::as_object) else {
                    continue;
                };
                let schema = &answer["content"]["application/json"]["schema"];
                for (name, link) in links {
                    let at = format!("{method} {path} {status} -> {name}");
                    let to = link["operationId"].as_str().unwrap();
                    let target = by_id(to);
                    let target_params = params(&target);
                    let exprs = link["parameters"].as_object().cloned().unwrap_or_default();
                    let mut exprs: Vec<Value> = exprs
                        .iter()
                        .map(|(param, expr)| {
                            assert!(target_params.contains(param), "{at}: no parameter {param}");
                            expr.clone()
                        })
                        .collect();
                    // Every path parameter of the target is supplied.
                    for p in target["parameters"].as_array().unwrap() {
                        if p["in"] == json!("path") {
                            assert!(
                                link["parameters"]
                                    .get(p["name"].as_str().unwrap())
                                    .is_some(),
                                "{at}: path parameter {} not supplied",
                                p["name"]
                            );
                        }
                    }
                    if let Some(body) = link.get("requestBody") {
                        assert!(target.get("requestBody").is_some(), "{at}: no body");
                        if let Some(o) = body.as_object() {
                            exprs.extend(o.values().cloned());
                        }
                    }
                    for expr in exprs {
                        let Some(expr) = expr.as_str().filter(|e| e.starts_with('$')) else {
                            continue;
                        };
                        if let Some(pointer) = expr.strip_prefix("$response.body#/") {
                            let pointer: Vec<&str> = pointer.split('/').collect();
                            assert!(reach(schema, &pointer).is_some(), "{at}: {expr}");
                        } else if let Some(param) = expr.strip_prefix("$request.path.") {
                            assert!(params(op).contains(&param.to_owned()), "{at}: {expr}");
                        } else if let Some(pointer) = expr.strip_prefix("$request.body#/") {
                            let body = &op["requestBody"]["content"]["application/json"]["schema"];
                            let pointer: Vec<&str> = pointer.split('/').collect();
                            assert!(reach(body, &pointer).is_some(), "{at}: {expr}");
                        } else {
                            assert_eq!(expr, "$response.body", "{at}");
                        }
                    }
                    edges.push((from.to_owned(), to.to_owned()));
                }
            }
        }
        for (from, to) in [
            ("registerAgent", "getAgent"),
            ("registerAgent", "issueToken"),
            ("registerAgent", "delegate"),
            ("issueToken", "revokeToken"),
            ("writeMemory", "readMemory"),
            ("admitRun", "beginStep"),
            ("admitRun", "getRunEnvelope"),
            ("beginStep", "completeStep"),
            ("beginStep", "approveEscalation"),
            ("openSession", "sessionCall"),
            ("sessionCall", "recordCallResult"),
            ("sessionCall", "approveEscalation"),
            ("sessionCall", "rejectEscalation"),
            ("getSelf", "openSession"),
            ("listEscalations", "approveEscalation"),
            ("listEscalations", "rejectEscalation"),
            ("exportRunEnvelope", "openSession"),
        ] {
            assert!(
                edges.contains(&(from.to_owned(), to.to_owned())),
                "no link {from} -> {to}"
            );
        }
    }

    fn resp(status: u16, content_type: &str, body: Value) -> Resp {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("content-type", content_type.parse().unwrap());
        Resp {
            status,
            headers,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }

    fn decision() -> Value {
        json!({"verdict": "allow", "reason": "ok", "subject": "a", "operation": "o",
               "resource": "r", "policy_version": "1", "time": 0})
    }

    #[test]
    fn a_conforming_answer_passes_and_each_departure_is_found() {
        let health = json!({"status": "ok", "policy_version": "1"});
        assert_eq!(
            problems("GET", "/healthz", &resp(200, "application/json", health)),
            Vec::<String>::new()
        );
        // A field missing, a wrong type, an undocumented status, a wrong
        // content type, an undocumented error code.
        let p = problems(
            "GET",
            "/healthz",
            &resp(200, "application/json", json!({"status": "ok"})),
        );
        assert!(p.len() == 1 && p[0].contains("policy_version"), "{p:?}");
        let p = problems(
            "GET",
            "/v1/audit/verify",
            &resp(
                200,
                "application/json",
                json!({"valid": "yes", "count": 0,
                  "head_seq": 0, "head_hash": "h"}),
            ),
        );
        assert!(p.len() == 1 && p[0].contains("/valid"), "{p:?}");
        let p = problems("GET", "/healthz", &resp(418, "application/json", json!({})));
        assert!(p.len() == 1 && p[0].contains("not documented"), "{p:?}");
        let p = problems("GET", "/healthz", &resp(200, "text/html", json!({})));
        assert!(p.len() == 1 && p[0].contains("content-type"), "{p:?}");
        let err = json!({"error": {"code": "no_such_code", "message": "m", "details": {}}});
        let p = problems("GET", "/v1/agents/x", &resp(404, "application/json", err));
        assert!(p.len() == 1 && p[0].contains("no_such_code"), "{p:?}");
    }

    #[test]
    fn nullable_fields_admit_null_and_static_segments_win() {
        let created = json!({"agent_id": "a", "parent_id": null, "token": "t",
                             "token_id": "i", "effective_capabilities": []});
        assert_eq!(
            problems(
                "POST",
                "/v1/agents",
                &resp(201, "application/json", created)
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            route_of("GET", "/v1/agents/self").unwrap().doc.id,
            "getSelf"
        );
        assert_eq!(route_of("GET", "/v1/agents/x").unwrap().doc.id, "getAgent");
        assert!(route_of("GET", "/console/x").is_none());
        // A decision without `obligations` is what the server writes for an
        // allow; it conforms.
        let gate = json!({"gate": "proceed", "decision": decision()});
        assert_eq!(
            problems(
                "POST",
                "/v1/runs/r/steps/s/begin",
                &resp(200, "application/json", gate)
            ),
            Vec::<String>::new()
        );
    }
}
