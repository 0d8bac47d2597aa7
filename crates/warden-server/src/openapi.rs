//! The OpenAPI 3.0 document and the README's route table, both generated
//! from the route list [`API`] and the wire types' JSON Schemas
//! (schemars).
//!
//! Request bodies and query strings are described as the server reads them
//! (schemars' deserialize contract: a field with a default is optional);
//! responses as the server writes them (the serialize contract: a field is
//! required unless the server may omit it, and an `Option` that is always
//! written is required and nullable).
//!
//! Every status a route can answer is documented, from its own errors and
//! the shared ones its kind implies ([`Route::errors`]). Links join the
//! operations that create agents, tokens, records, runs, sessions and
//! escalations to those that use them, and request examples (for the
//! example bundle) give a client a valid start; the tests in
//! `tests/it/conformance.rs` hold every answer of the server to the
//! document.

use std::fmt::Write as _;
use std::sync::OnceLock;

use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::routes::{API, Access, ErrorDoc, Payload, Route};
use crate::wire::ErrorResponse;

const SCHEMA_PREFIX: &str = "#/components/schemas/";

/// The schemas of one route, as references into the definitions.
struct RouteSchemas {
    route: &'static Route,
    request: Option<Value>,
    query: Option<Value>,
    response: Value,
}

/// Every route with its schemas, and every schema definition.
struct Model {
    routes: Vec<RouteSchemas>,
    definitions: Map<String, Value>,
    error: Value,
}

fn generators() -> (SchemaGenerator, SchemaGenerator) {
    (
        SchemaSettings::openapi3()
            .for_deserialize()
            .into_generator(),
        SchemaSettings::openapi3().for_serialize().into_generator(),
    )
}

fn model() -> Model {
    let (mut requests, mut responses) = generators();
    let error = Value::from(responses.subschema_for::<ErrorResponse>());
    let routes = API
        .iter()
        .map(|route| {
            let d = &route.doc;
            RouteSchemas {
                route,
                request: d.request.map(|w| Value::from((w.schema)(&mut requests))),
                query: d.query.map(|w| Value::from((w.schema)(&mut requests))),
                response: match d.response {
                    Payload::Json(w) => Value::from((w.schema)(&mut responses)),
                    Payload::Prometheus => json!({"type": "string"}),
                    Payload::OpenApi => json!({"type": "object"}),
                },
            }
        })
        .collect();
    let mut definitions = requests.take_definitions(true);
    for (name, schema) in responses.take_definitions(true) {
        definitions.entry(name).or_insert(schema);
    }
    Model {
        routes,
        definitions,
        error,
    }
}

/// `schema`, or the definition it refers to.
fn resolve<'a>(schema: &'a Value, definitions: &'a Map<String, Value>) -> &'a Value {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix(SCHEMA_PREFIX))
        .and_then(|name| definitions.get(name))
        .unwrap_or(schema)
}

/// The properties of an object schema with whether each is required.
fn properties<'a>(
    schema: &'a Value,
    definitions: &'a Map<String, Value>,
) -> Vec<(&'a str, &'a Value, bool)> {
    let schema = resolve(schema, definitions);
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|props| {
            props
                .iter()
                .map(|(name, s)| (name.as_str(), s, required.contains(&name.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

fn who(access: Access) -> &'static str {
    match access {
        Access::Public => "anyone",
        Access::Operator => "the operator token",
        Access::Agent => "an agent token (the acting agent is the token's)",
        Access::OperatorOrAgent => "the operator or an agent token",
    }
}

/// The errors of one status, in words: `code (note), code`.
fn describe(errors: &[&ErrorDoc], code: impl Fn(&str) -> String) -> String {
    errors
        .iter()
        .map(|e| {
            if e.note.is_empty() {
                code(e.code)
            } else {
                format!("{} ({})", code(e.code), e.note)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `errors` grouped by status, in order of first appearance.
fn by_status(errors: &[ErrorDoc]) -> Vec<(u16, Vec<&ErrorDoc>)> {
    let mut groups: Vec<(u16, Vec<&ErrorDoc>)> = Vec::new();
    for e in errors {
        match groups.iter_mut().find(|(s, _)| *s == e.status) {
            Some((_, g)) => g.push(e),
            None => groups.push((e.status, vec![e])),
        }
    }
    groups
}

/// An OpenAPI link: an answer of operation `from` supplies parameters (and
/// a body) of operation `to`, so a stateful client reaches what `from`
/// created (agents, tokens, records, runs, sessions, escalations).
struct Link {
    /// The `operationId` answering.
    from: &'static str,
    /// The statuses of `from` that carry the link.
    statuses: &'static [u16],
    /// The `operationId` linked to (also the link's name).
    to: &'static str,
    /// `to`'s parameters: name and runtime expression.
    parameters: &'static [(&'static str, &'static str)],
    /// `to`'s request body, JSON that may hold runtime expressions.
    body: Option<&'static str>,
    /// The link's name, when `from` has two links to `to` (else `to`).
    name: Option<&'static str>,
}

const fn link(
    from: &'static str,
    statuses: &'static [u16],
    to: &'static str,
    parameters: &'static [(&'static str, &'static str)],
) -> Link {
    Link {
        from,
        statuses,
        to,
        parameters,
        body: None,
        name: None,
    }
}

/// A call (`sessionCallUnvouched`) in the session `from` answered with,
/// whose argument value is in no source of the session: where a provenance
/// rule asks for its origin, it escalates, and the answer's escalation
/// leads on to review.
const fn unvouched_call(from: &'static str, statuses: &'static [u16]) -> Link {
    Link {
        body: Some(
            r#"{"action": "document.summarize", "arguments": {"document_id": "named-by-nobody"}}"#,
        ),
        name: Some("sessionCallUnvouched"),
        ..link(from, statuses, "sessionCall", SESSION)
    }
}

const AGENT_ID: &[(&str, &str)] = &[("id", "$response.body#/agent_id")];
const TOKEN_ID: &[(&str, &str)] = &[("token_id", "$response.body#/token_id")];
const RECORD: &[(&str, &str)] = &[
    ("namespace", "$response.body#/namespace"),
    ("key", "$response.body#/key"),
];
const RECORD_AT_REVISION: &[(&str, &str)] = &[
    ("namespace", "$response.body#/namespace"),
    ("key", "$response.body#/key"),
    ("expected_revision", "$response.body#/revision"),
];
const RUN: &[(&str, &str)] = &[("run", "$response.body#/run_id")];
const FIRST_STEP: &[(&str, &str)] = &[
    ("run", "$response.body#/run_id"),
    ("step", "$response.body#/steps/0/step_id"),
];
const SAME_STEP: &[(&str, &str)] = &[("run", "$request.path.run"), ("step", "$request.path.step")];
const SAME_RUN: &[(&str, &str)] = &[("run", "$request.path.run")];
const SESSION: &[(&str, &str)] = &[("id", "$response.body#/session_id")];
const SAME_SESSION: &[(&str, &str)] = &[("id", "$request.path.id")];
const CALL: &[(&str, &str)] = &[
    ("id", "$request.path.id"),
    ("call", "$response.body#/call_id"),
];
const FIRST_ESCALATION: &[(&str, &str)] = &[("id", "$response.body#/escalations/0/escalation_id")];
const ESCALATION: &[(&str, &str)] = &[("id", "$response.body#/escalation_id")];
const REVIEWED: &[(&str, &str)] = &[("id", "$response.body#/escalation/escalation_id")];
const HELD: &[(&str, &str)] = &[("id", "$response.body#/error/details/escalation_id")];

/// Every link of the document. None leads from a lookup to a revocation:
/// a stateful client following links revokes only what it created.
const LINKS: &[Link] = &[
    link("registerAgent", &[201], "getAgent", AGENT_ID),
    link("registerAgent", &[201], "issueToken", AGENT_ID),
    link("registerAgent", &[201], "revokeAgent", AGENT_ID),
    link("registerAgent", &[201], "revokeToken", TOKEN_ID),
    link("delegate", &[201], "getAgent", AGENT_ID),
    link("delegate", &[201], "issueToken", AGENT_ID),
    link("delegate", &[201], "revokeAgent", AGENT_ID),
    link("delegate", &[201], "revokeToken", TOKEN_ID),
    Link {
        body: Some(r#"{"agent_id": "sibling-child", "parent_id": "$response.body#/parent_id"}"#),
        ..link("registerAgent", &[201], "delegate", &[])
    },
    link("getSelf", &[200], "getAgent", AGENT_ID),
    // The caller's own session, with the user's request as a trusted input.
    Link {
        body: Some(r#"{"trusted_inputs": ["Summarise document fixture-1"]}"#),
        ..link("getSelf", &[200], "openSession", &[])
    },
    link("getAgent", &[200], "issueToken", AGENT_ID),
    link("issueToken", &[201], "revokeToken", TOKEN_ID),
    link("issueToken", &[201], "getAgent", AGENT_ID),
    link("writeMemory", &[201, 200], "readMemory", RECORD),
    link(
        "writeMemory",
        &[201, 200],
        "deleteMemory",
        RECORD_AT_REVISION,
    ),
    link("readMemory", &[200], "writeMemory", RECORD),
    Link {
        body: Some(r#"{"sop": "$request.body#/sop"}"#),
        ..link("validateSop", &[200], "admitRun", &[])
    },
    link("admitRun", &[201, 200], "beginStep", FIRST_STEP),
    link("admitRun", &[201, 200], "completeStep", FIRST_STEP),
    link("admitRun", &[201, 200], "getRunEnvelope", RUN),
    link("admitRun", &[201, 200], "declassifyRun", RUN),
    link("admitRun", &[201, 200], "exportRunEnvelope", RUN),
    link("admitRun", &[201, 200], "runEnvelopeReceipt", RUN),
    Link {
        body: Some(r#"{"agent_id": "run-child", "from_run": "$response.body#/run_id"}"#),
        ..link("admitRun", &[201, 200], "delegate", &[])
    },
    link("beginStep", &[200], "completeStep", SAME_STEP),
    link("beginStep", &[200], "getRunEnvelope", SAME_RUN),
    link("beginStep", &[403], "getEscalation", HELD),
    link("beginStep", &[403], "approveEscalation", HELD),
    link("beginStep", &[403], "rejectEscalation", HELD),
    link("completeStep", &[200], "beginStep", SAME_STEP),
    link("getRunEnvelope", &[200], "declassifyRun", SAME_RUN),
    Link {
        body: Some(r#"{"from_envelope": "$response.body"}"#),
        ..link("exportRunEnvelope", &[200], "openSession", &[])
    },
    link("openSession", &[201, 200], "getSession", SESSION),
    link("openSession", &[201, 200], "sessionCall", SESSION),
    unvouched_call("openSession", &[201, 200]),
    // A call whose argument value the user's request holds (the example
    // session's): allowed, and its answer leads on to its result.
    Link {
        body: Some(
            r#"{"action": "document.summarize", "arguments": {"document_id": "fixture-1"}}"#,
        ),
        name: Some("sessionCallVouched"),
        ..link("openSession", &[201, 200], "sessionCall", SESSION)
    },
    link("openSession", &[201, 200], "cancelSession", SESSION),
    link("getSession", &[200], "sessionCall", SESSION),
    link("getSession", &[200], "cancelSession", SESSION),
    unvouched_call("getSession", &[200]),
    link("sessionCall", &[200], "recordCallResult", CALL),
    link("sessionCall", &[200], "getSession", SAME_SESSION),
    link("sessionCall", &[200], "getEscalation", ESCALATION),
    link("sessionCall", &[200], "approveEscalation", ESCALATION),
    link("sessionCall", &[200], "rejectEscalation", ESCALATION),
    link("listEscalations", &[200], "getEscalation", FIRST_ESCALATION),
    link(
        "listEscalations",
        &[200],
        "approveEscalation",
        FIRST_ESCALATION,
    ),
    link(
        "listEscalations",
        &[200],
        "rejectEscalation",
        FIRST_ESCALATION,
    ),
    link("getEscalation", &[200], "approveEscalation", ESCALATION),
    link("getEscalation", &[200], "rejectEscalation", ESCALATION),
    link("approveEscalation", &[200], "getEscalation", REVIEWED),
    link("rejectEscalation", &[200], "getEscalation", REVIEWED),
    link("delegate", &[403], "getEscalation", HELD),
    link("delegate", &[403], "approveEscalation", HELD),
];

/// A request body example per `operationId`, for the example bundle
/// (`examples/report-hierarchy`): a client (or a schema-driven tester)
/// starting from them reaches agents, records, runs and sessions.
const BODY_EXAMPLES: &[(&str, &str)] = &[
    (
        "registerAgent",
        r#"{"agent_id": "analyst", "parent_id": "report_manager", "capabilities": ["memory.read", "document.summarize"]}"#,
    ),
    (
        "delegate",
        r#"{"agent_id": "summariser", "capabilities": ["document.summarize"]}"#,
    ),
    (
        "writeMemory",
        r#"{"value": "EU", "visibility": "descendants"}"#,
    ),
    ("validateSop", REPORT_SOP),
    ("admitRun", REPORT_SOP),
    (
        "completeStep",
        r#"{"result": {"summary": "three findings"}, "result_labels": ["internal_document"]}"#,
    ),
    (
        "declassifyRun",
        r#"{"to": "internal", "justification": "reviewed by the report manager"}"#,
    ),
    (
        "openSession",
        r#"{"trusted_inputs": ["Summarise document fixture-1"]}"#,
    ),
    (
        "sessionCall",
        r#"{"call_id": "call-1", "action": "document.summarize", "arguments": {"document_id": "fixture-1"}}"#,
    ),
    (
        "recordCallResult",
        r#"{"result": {"summary": "three findings"}}"#,
    ),
    ("cancelSession", r#"{"reason": "the task is done"}"#),
    (
        "rejectEscalation",
        r#"{"reason": "not needed for the report"}"#,
    ),
];

const REPORT_SOP: &str = r#"{"sop": {"sop_id": "prepare-report", "version": 1, "steps": [
    {"step_id": "summarize", "action": "document.summarize", "arguments": {"document_id": "fixture-1"}},
    {"step_id": "save", "action": "artifact.save", "arguments": {"path": "internal/report.txt"}}]}}"#;

/// A path parameter example per parameter name, for the example bundle.
const PARAM_EXAMPLES: &[(&str, &str)] = &[
    ("namespace", "project"),
    ("key", "client_region"),
    ("run", "run-1"),
    ("step", "summarize"),
    ("call", "call-1"),
];

/// The links of `id`'s answer with `status`, by name.
fn links(id: &str, status: u16) -> Map<String, Value> {
    LINKS
        .iter()
        .filter(|l| l.from == id && l.statuses.contains(&status))
        .map(|l| {
            let mut link = Map::new();
            link.insert("operationId".into(), json!(l.to));
            if !l.parameters.is_empty() {
                let params: Map<String, Value> = l
                    .parameters
                    .iter()
                    .map(|(name, expr)| ((*name).to_owned(), json!(expr)))
                    .collect();
                link.insert("parameters".into(), Value::Object(params));
            }
            if let Some(body) = l.body {
                link.insert(
                    "requestBody".into(),
                    serde_json::from_str(body).unwrap_or(Value::Null),
                );
            }
            (l.name.unwrap_or(l.to).to_owned(), Value::Object(link))
        })
        .collect()
}

/// Add the links of `id` to its `responses`.
fn add_links(id: &str, responses: &mut Map<String, Value>) {
    for (status, answer) in responses.iter_mut() {
        let Ok(status) = status.parse::<u16>() else {
            continue;
        };
        let found = links(id, status);
        if let (false, Some(answer)) = (found.is_empty(), answer.as_object_mut()) {
            answer.insert("links".into(), Value::Object(found));
        }
    }
}

fn operation(r: &RouteSchemas, m: &Model) -> Value {
    let route = r.route;
    let d = &route.doc;
    let media = match d.response {
        Payload::Prometheus => "text/plain",
        Payload::Json(_) | Payload::OpenApi => "application/json",
    };
    let mut responses = Map::new();
    for status in d.success {
        responses.insert(
            status.to_string(),
            json!({"description": "success", "content": {media: {"schema": r.response}}}),
        );
    }
    for (status, errors) in by_status(&route.errors()) {
        responses.insert(
            status.to_string(),
            json!({
                "description": describe(&errors, str::to_owned),
                "x-error-codes": errors.iter().map(|e| e.code).collect::<Vec<_>>(),
                "content": {"application/json": {"schema": m.error}},
            }),
        );
    }
    add_links(d.id, &mut responses);
    let mut parameters: Vec<Value> = route
        .params()
        .map(|name| {
            let mut p = Map::new();
            p.insert("name".into(), json!(name));
            p.insert("in".into(), json!("path"));
            p.insert("required".into(), json!(true));
            p.insert("description".into(), json!(PATH_SEGMENT));
            p.insert(
                "schema".into(),
                json!({
                    "type": "string", "minLength": 1, "maxLength": 128,
                    "pattern": "^[A-Za-z0-9._:-]*[A-Za-z0-9_:-][A-Za-z0-9._:-]*$"
                }),
            );
            if let Some((_, example)) = PARAM_EXAMPLES.iter().find(|(n, _)| *n == name) {
                p.insert("example".into(), json!(example));
            }
            Value::Object(p)
        })
        .collect();
    if let Some(query) = &r.query {
        for (name, schema, required) in properties(query, &m.definitions) {
            let (description, schema) = query_schema(schema);
            parameters.push(json!({
                "name": name, "in": "query", "required": required,
                "description": description, "schema": schema
            }));
        }
    }
    let description = if d.callers.is_empty() {
        format!("Caller: {}.", who(d.access))
    } else {
        format!("Caller: {} ({}).", who(d.access), d.callers)
    };
    let mut op = Map::new();
    op.insert("operationId".into(), json!(d.id));
    op.insert("summary".into(), json!(d.summary));
    op.insert("description".into(), json!(description));
    op.insert("parameters".into(), json!(parameters));
    op.insert("responses".into(), Value::Object(responses));
    if d.access != Access::Public {
        op.insert("security".into(), json!([{"bearer": []}]));
    }
    if let Some(req) = &r.request {
        let mut media = Map::new();
        media.insert("schema".into(), req.clone());
        if let Some((_, example)) = BODY_EXAMPLES.iter().find(|(id, _)| *id == d.id) {
            media.insert(
                "example".into(),
                serde_json::from_str(example).unwrap_or(Value::Null),
            );
        }
        op.insert(
            "requestBody".into(),
            json!({"required": true, "content": {"application/json": media}}),
        );
    }
    Value::Object(op)
}

/// What a path parameter is.
const PATH_SEGMENT: &str = "An identifier (`[A-Za-z0-9._:-]`, 1 to 128 bytes). One made of dots only (`.`, `..`) cannot be named in a path: URL normalisation (RFC 3986) resolves it away.";

/// A query field's description and its schema as a parameter's: a query
/// parameter is absent rather than null, so the `null` alternative, the
/// `nullable` flag and a `null` default go.
fn query_schema(field: &Value) -> (Value, Value) {
    let mut schema = field.clone();
    let Some(o) = schema.as_object_mut() else {
        return (Value::Null, schema);
    };
    let description = o.remove("description").unwrap_or(Value::Null);
    o.remove("nullable");
    if o.get("default").is_some_and(Value::is_null) {
        o.remove("default");
    }
    let not_null: Vec<Value> = o
        .get("anyOf")
        .and_then(Value::as_array)
        .map(|alts| {
            alts.iter()
                .filter(|a| a.get("nullable").is_none() && a.get("enum") != Some(&json!([null])))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    if let [only] = not_null.as_slice() {
        o.remove("anyOf");
        if let Some(alt) = only.as_object() {
            for (k, v) in alt {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    (description, schema)
}

/// The OpenAPI document.
pub fn document() -> Value {
    let mut m = model();
    let mut paths: Map<String, Value> = Map::new();
    for r in &m.routes {
        let entry = paths
            .entry(r.route.path.to_owned())
            .or_insert_with(|| json!({}));
        if let Some(e) = entry.as_object_mut() {
            e.insert(r.route.method.to_ascii_lowercase(), operation(r, &m));
        }
    }
    // Query strings are documented as parameters, not as schemas.
    for r in API {
        if let Some(q) = r.doc.query {
            m.definitions.remove(q.name);
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Warden governance API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Deterministic governance decisions for hierarchical AI agents. Identity is the bearer token's; errors are {\"error\": {\"code\", \"message\", \"details\"}}."
        },
        "paths": paths,
        "components": {
            "schemas": m.definitions,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

/// The document as JSON bytes, built once.
pub fn document_bytes() -> Vec<u8> {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    DOC.get_or_init(|| crate::error::json_bytes(&document()))
        .clone()
}

/// `{a, b?}`: the fields of an object schema, `?` on those that may be
/// absent.
fn fields(schema: &Value, definitions: &Map<String, Value>) -> String {
    let names: Vec<String> = properties(schema, definitions)
        .into_iter()
        .map(|(name, _, required)| {
            if required {
                name.to_owned()
            } else {
                format!("{name}?")
            }
        })
        .collect();
    format!("{{{}}}", names.join(", "))
}

/// Every string an enum schema allows, looking through references and
/// `oneOf` / `anyOf` alternatives.
fn enum_values(schema: &Value, definitions: &Map<String, Value>, out: &mut Vec<String>) {
    let schema = resolve(schema, definitions);
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        out.extend(values.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        for alt in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            enum_values(alt, definitions, out);
        }
    }
}

/// `?a=N&b=x|y`: a query string's parameters with their values.
fn query_string(schema: &Value, definitions: &Map<String, Value>) -> String {
    let params: Vec<String> = properties(schema, definitions)
        .into_iter()
        .map(|(name, s, _)| {
            let mut values = Vec::new();
            enum_values(s, definitions, &mut values);
            let value = if !values.is_empty() {
                values.join("|")
            } else if s.get("type").and_then(Value::as_str) == Some("integer") {
                "N".to_owned()
            } else {
                "VALUE".to_owned()
            };
            format!("{name}={value}")
        })
        .collect();
    format!("?{}", params.join("&"))
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The route table of the crate's README: one row per route of
/// [`API`], with its caller, success answer and the errors
/// particular to it (the shared ones are described above the table).
pub fn route_table() -> String {
    let m = model();
    let mut out = String::from(
        "| route | caller | success | route-specific errors |\n| --- | --- | --- | --- |\n",
    );
    for r in &m.routes {
        let d = &r.route.doc;
        let mut route = format!("{} {}", r.route.method, r.route.path);
        if let Some(q) = &r.query {
            route.push_str(&query_string(q, &m.definitions));
        }
        let mut route = format!("`{route}`");
        if let Some(body) = &r.request {
            let _ = write!(route, " `{}`", fields(body, &m.definitions));
        }
        let caller = if !d.callers.is_empty() {
            d.callers
        } else {
            match d.access {
                Access::Public => "anyone",
                Access::Operator => "operator",
                Access::Agent => "agent",
                Access::OperatorOrAgent => "operator, agent",
            }
        };
        let statuses: Vec<String> = d.success.iter().map(u16::to_string).collect();
        let mut success = statuses.join(" / ");
        match d.response {
            Payload::Json(_) => {
                let _ = write!(success, " `{}`", fields(&r.response, &m.definitions));
            }
            Payload::Prometheus => success.push_str(" Prometheus text"),
            Payload::OpenApi => success.push_str(" OpenAPI 3.0 document"),
        }
        if !d.outcome.is_empty() {
            let _ = write!(success, ": {}", d.outcome);
        }
        let errors: Vec<String> = by_status(d.errors)
            .into_iter()
            .map(|(status, errors)| format!("{status} {}", describe(&errors, |c| format!("`{c}`"))))
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&route),
            cell(caller),
            cell(&success),
            cell(&errors.join("; "))
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_every_route_and_resolves_every_ref() {
        let doc = document();
        for (method, path) in crate::routes::ROUTES {
            assert!(
                doc["paths"][path][method.to_ascii_lowercase()].is_object(),
                "{method} {path} missing"
            );
        }
        let count: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p.as_object().unwrap().len())
            .sum();
        assert_eq!(count, crate::routes::ROUTES.len());
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = part.split('"').next().unwrap();
            assert!(schemas.contains_key(name), "dangling ref {name}");
        }
    }
}

#[cfg(test)]
mod list_tests {
    use std::collections::BTreeSet;

    use serde::Serialize;
    use warden_core::ids::{AgentId, Key, Namespace};

    use super::*;
    use crate::routes::{ROUTES, WireType};
    use crate::wire::{DecisionBody, GateBody, GateResponse, MemoryValueResponse, VerdictBody};

    fn wire_types(r: &Route) -> Vec<(WireType, bool)> {
        let mut out = Vec::new();
        if let Some(w) = r.doc.request {
            out.push((w, true));
        }
        if let Some(w) = r.doc.query {
            out.push((w, true));
        }
        if let Payload::Json(w) = r.doc.response {
            out.push((w, false));
        }
        out
    }

    #[test]
    fn route_list_is_well_formed() {
        let mut ids = BTreeSet::new();
        let mut routes = BTreeSet::new();
        for r in API {
            let d = &r.doc;
            assert!(!d.id.is_empty() && !d.summary.is_empty(), "{}", r.path);
            assert!(ids.insert(d.id), "operationId {} twice", d.id);
            assert!(
                routes.insert((r.method, r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
            assert!(!d.success.is_empty(), "{}", d.id);
            // The one field whose default is a real payload is set where
            // meant.
            assert_eq!(
                matches!(d.response, Payload::OpenApi),
                r.path == "/openapi.json",
                "{}",
                d.id
            );
            assert!(d.success.iter().all(|s| (200..300).contains(s)), "{}", d.id);
            assert!(
                d.errors.iter().all(|e| (400..600).contains(&e.status)),
                "{}",
                d.id
            );
            let mut own = BTreeSet::new();
            for e in d.errors {
                assert!(own.insert((e.status, e.code)), "{}: {} twice", d.id, e.code);
            }
            // Every own error is in the route's full list, with its note.
            let all = r.errors();
            for e in d.errors {
                assert!(all.contains(e), "{}: {} lost", d.id, e.code);
            }
            // Shared errors follow from the route's kind.
            let has = |code: &str| all.iter().any(|e| e.code == code);
            assert_eq!(has("missing_token"), d.access != Access::Public, "{}", d.id);
            assert_eq!(
                has("unsupported_media_type"),
                d.request.is_some(),
                "{}",
                d.id
            );
            assert_eq!(has("invalid_query"), d.query.is_some(), "{}", d.id);
            assert!(
                all.windows(2).all(|w| w[0].status <= w[1].status),
                "{}",
                d.id
            );
        }
        assert_eq!(ROUTES.len(), API.len());
        for (pair, r) in ROUTES.iter().zip(API) {
            assert_eq!(*pair, (r.method, r.path));
        }
    }

    #[test]
    fn wire_type_names_are_their_schema_names() {
        let (mut requests, mut responses) = generators();
        for r in API {
            for (w, read) in wire_types(r) {
                let g = if read { &mut requests } else { &mut responses };
                let schema = Value::from((w.schema)(g));
                assert_eq!(
                    schema["$ref"],
                    json!(format!("{SCHEMA_PREFIX}{}", w.name)),
                    "{} {}",
                    r.method,
                    r.path
                );
            }
        }
    }

    #[test]
    fn request_and_response_schemas_agree_where_they_share_a_name() {
        let (mut requests, mut responses) = generators();
        for r in API {
            for (w, read) in wire_types(r) {
                let g = if read { &mut requests } else { &mut responses };
                (w.schema)(g);
            }
        }
        let read = requests.take_definitions(true);
        let written = responses.take_definitions(true);
        let shared: Vec<&String> = read.keys().filter(|k| written.contains_key(*k)).collect();
        assert!(shared.iter().any(|k| k.as_str() == "SensitivityBody"));
        for name in shared {
            assert_eq!(read[name], written[name], "{name}");
        }
    }

    /// Every field a response schema calls required is in a minimal value
    /// the server writes, and every field it writes is documented.
    fn check_written<T: Serialize>(name: &str, value: &T) {
        let doc = document();
        let schema = &doc["components"]["schemas"][name];
        let written = serde_json::to_value(value).unwrap();
        let written = written.as_object().unwrap();
        for field in schema["required"].as_array().unwrap() {
            let field = field.as_str().unwrap();
            assert!(
                written.contains_key(field),
                "{name}.{field} required but omitted"
            );
        }
        for field in written.keys() {
            assert!(
                schema["properties"].get(field).is_some(),
                "{name}.{field} undocumented"
            );
        }
    }

    fn decision() -> DecisionBody {
        DecisionBody {
            verdict: VerdictBody::Allow,
            reason: "ok".into(),
            subject: "a".into(),
            operation: "memory.read".into(),
            resource: "r".into(),
            policy_version: "1".into(),
            obligations: vec![],
            time: 0,
        }
    }

    #[test]
    fn response_schemas_require_only_what_the_server_always_writes() {
        check_written("DecisionBody", &decision());
        check_written(
            "GateResponse",
            &GateResponse {
                gate: GateBody::Proceed,
                decision: decision(),
                operation_id: None,
                action: None,
                arguments: None,
                outcome: None,
                lease_id: None,
                lease_expires_at: None,
            },
        );
        check_written(
            "MemoryValueResponse",
            &MemoryValueResponse {
                namespace: Namespace::parse("n").unwrap(),
                key: Key::parse("k").unwrap(),
                value: json!(1),
                owner_agent_id: AgentId::parse("a").unwrap(),
                visibility: warden_core::memory::Visibility::Private,
                class: "preference".into(),
                revision: 1,
                reason: "visible_from:a".into(),
                combinator: None,
                contributors: vec![],
            },
        );
        // An `Option` the server always writes is required (and nullable).
        let doc = document();
        let created = &doc["components"]["schemas"]["AgentCreatedResponse"];
        assert!(
            created["required"]
                .as_array()
                .unwrap()
                .contains(&json!("parent_id"))
        );
    }

    #[test]
    fn query_parameters_are_plain_optional_values() {
        let doc = document();
        let params = &doc["paths"]["/v1/audit"]["get"]["parameters"];
        let names: Vec<&str> = params
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["after", "limit"]);
        for p in params.as_array().unwrap() {
            assert_eq!(p["in"], json!("query"));
            assert_eq!(p["required"], json!(false));
            assert_eq!(p["schema"]["type"], json!("integer"));
            assert!(p["schema"].get("nullable").is_none(), "{p}");
        }
        let status = &doc["paths"]["/v1/escalations"]["get"]["parameters"][0];
        assert_eq!(
            status["schema"]["$ref"],
            json!("#/components/schemas/EscalationStatusBody")
        );
        assert!(doc["components"]["schemas"].get("AuditQuery").is_none());
    }

    #[test]
    fn every_error_answer_names_its_codes_and_the_error_shape() {
        let doc = document();
        for r in API {
            let op = &doc["paths"][r.path][r.method.to_ascii_lowercase()];
            for (status, errors) in by_status(&r.errors()) {
                let answer = &op["responses"][status.to_string()];
                let codes: Vec<&str> = errors.iter().map(|e| e.code).collect();
                assert_eq!(answer["x-error-codes"], json!(codes), "{} {status}", r.path);
                assert_eq!(
                    answer["content"]["application/json"]["schema"]["$ref"],
                    json!("#/components/schemas/ErrorResponse")
                );
            }
        }
        let write = &doc["paths"]["/v1/memory/{namespace}/{key}"]["put"]["responses"];
        for status in [
            "200", "201", "400", "401", "403", "409", "413", "415", "422", "429", "500", "503",
        ] {
            assert!(write[status].is_object(), "{status}");
        }
    }
}
