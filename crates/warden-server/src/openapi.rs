//! The OpenAPI 3.0 document, built from the wire types' JSON Schemas
//! (schemars) and a table of operations that covers every route of
//! [`ROUTES`](crate::ROUTES) (a test holds the two together).

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::wire::*;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Anyone,
    Operator,
    Agent,
    Either,
}

struct Op {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    who: Who,
    request: Option<Value>,
    /// Query parameters: name, description, and the allowed values of a
    /// string parameter (`None`: a non-negative integer).
    query: &'static [(&'static str, &'static str, Option<&'static [&'static str]>)],
    success: (u16, Value),
    /// Another success status with the same body (200 vs 201).
    also: Option<u16>,
    errors: &'static [u16],
}

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    Value::from(g.subschema_for::<T>())
}

fn operations(g: &mut SchemaGenerator) -> Vec<Op> {
    let text = json!({"type": "string"});
    vec![
        Op {
            method: "post",
            path: "/v1/agents",
            id: "registerAgent",
            summary: "Register an agent; returns its token once",
            who: Who::Operator,
            request: Some(schema::<RegisterAgentRequest>(g)),
            query: &[],
            success: (201, schema::<AgentCreatedResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 409, 413, 422, 429],
        },
        Op {
            method: "get",
            path: "/v1/agents/self",
            id: "getSelf",
            summary: "The calling agent, its lineage and effective capabilities",
            who: Who::Agent,
            request: None,
            query: &[],
            success: (200, schema::<AgentResponse>(g)),
            also: None,
            errors: &[401, 403, 429],
        },
        Op {
            method: "post",
            path: "/v1/agents/self/children",
            id: "delegate",
            summary: "Register a child of the calling agent (delegation lockdown applies)",
            who: Who::Agent,
            request: Some(schema::<DelegateRequest>(g)),
            query: &[],
            success: (201, schema::<AgentCreatedResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 409, 413, 422, 429],
        },
        Op {
            method: "get",
            path: "/v1/agents/{id}",
            id: "getAgent",
            summary: "An agent (operator, the agent itself, its ancestors)",
            who: Who::Either,
            request: None,
            query: &[],
            success: (200, schema::<AgentResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "delete",
            path: "/v1/agents/{id}",
            id: "revokeAgent",
            summary: "Revoke an agent and its descendants (operator, an ancestor)",
            who: Who::Either,
            request: None,
            query: &[],
            success: (200, schema::<RevokedResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "post",
            path: "/v1/agents/{id}/tokens",
            id: "issueToken",
            summary: "Issue a revocable token for an agent",
            who: Who::Operator,
            request: None,
            query: &[],
            success: (201, schema::<TokenIssuedResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409],
        },
        Op {
            method: "delete",
            path: "/v1/tokens/{token_id}",
            id: "revokeToken",
            summary: "Revoke one token; the agent stays active",
            who: Who::Operator,
            request: None,
            query: &[],
            success: (200, schema::<TokenRevokedResponse>(g)),
            also: None,
            errors: &[401, 403, 404],
        },
        Op {
            method: "get",
            path: "/v1/memory/{namespace}/{key}",
            id: "readMemory",
            summary: "Resolve a key toward the root, with provenance",
            who: Who::Agent,
            request: None,
            query: &[],
            success: (200, schema::<MemoryValueResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "put",
            path: "/v1/memory/{namespace}/{key}",
            id: "writeMemory",
            summary: "Write a record in the caller's own scope (201 when created)",
            who: Who::Agent,
            request: Some(schema::<PutMemoryRequest>(g)),
            query: &[],
            success: (200, schema::<MemoryWrittenResponse>(g)),
            also: Some(201),
            errors: &[400, 401, 403, 409, 413, 415, 422, 429],
        },
        Op {
            method: "delete",
            path: "/v1/memory/{namespace}/{key}",
            id: "deleteMemory",
            summary: "Delete one of the caller's own records",
            who: Who::Agent,
            request: None,
            query: &[("expected_revision", "delete only at this revision", None)],
            success: (200, schema::<MemoryDeletedResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 429],
        },
        Op {
            method: "post",
            path: "/v1/sops/validate",
            id: "validateSop",
            summary: "Preflight an SOP: every step's decision, nothing runs",
            who: Who::Agent,
            request: Some(schema::<ValidateSopRequest>(g)),
            query: &[],
            success: (200, schema::<ValidateResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 413, 415, 422, 429],
        },
        Op {
            method: "post",
            path: "/v1/runs",
            id: "admitRun",
            summary: "Admit an SOP as a run (403 sop_rejected with every step's decision)",
            who: Who::Agent,
            request: Some(schema::<AdmitRunRequest>(g)),
            query: &[],
            success: (201, schema::<RunAdmittedResponse>(g)),
            also: Some(200),
            errors: &[400, 401, 403, 409, 413, 415, 422, 429],
        },
        Op {
            method: "post",
            path: "/v1/runs/{run}/steps/{step}/begin",
            id: "beginStep",
            summary: "The per-step gate (proceed / replay / executed; 403 step_denied)",
            who: Who::Agent,
            request: None,
            query: &[],
            success: (200, schema::<GateResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 429],
        },
        Op {
            method: "post",
            path: "/v1/runs/{run}/steps/{step}/complete",
            id: "completeStep",
            summary: "Record a step's outcome exactly once",
            who: Who::Agent,
            request: Some(schema::<CompleteStepRequest>(g)),
            query: &[],
            success: (200, schema::<OutcomeBody>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 413, 415, 422, 429],
        },
        Op {
            method: "get",
            path: "/v1/runs/{run}/envelope",
            id: "getRunEnvelope",
            summary: "A run's context envelope: labels, derived labels, sensitivity, restrictions, version, delegation depth, parent (never data)",
            who: Who::Either,
            request: None,
            query: &[],
            success: (200, schema::<EnvelopeResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "get",
            path: "/v1/runs/{run}/envelope/signed",
            id: "exportRunEnvelope",
            summary: "The run's envelope signed with the server's Ed25519 key (verify with GET /v1/envelope-key)",
            who: Who::Either,
            request: None,
            query: &[],
            success: (
                200,
                schema::<warden_core::envelope::sign::SignedEnvelope>(g),
            ),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "get",
            path: "/v1/runs/{run}/receipt",
            id: "runEnvelopeReceipt",
            summary: "An opaque receipt for the run's envelope (reference, sensitivity tier, resolvable_until)",
            who: Who::Either,
            request: None,
            query: &[],
            success: (200, schema::<ReceiptResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 429],
        },
        Op {
            method: "post",
            path: "/v1/runs/{run}/declassify",
            id: "declassifyRun",
            summary: "Lower a run's envelope (the bundle's declassifiers only; 403 declassification_not_authorized, recorded)",
            who: Who::Agent,
            request: Some(schema::<DeclassifyRequest>(g)),
            query: &[],
            success: (200, schema::<DeclassifyResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 413, 415, 422, 429],
        },
        Op {
            method: "get",
            path: "/v1/envelope-key",
            id: "envelopeKey",
            summary: "The issuer id and Ed25519 public key that verify exported envelopes",
            who: Who::Anyone,
            request: None,
            query: &[],
            success: (200, schema::<EnvelopeKeyResponse>(g)),
            also: None,
            errors: &[],
        },
        Op {
            method: "get",
            path: "/v1/escalations",
            id: "listEscalations",
            summary: "The escalation queue, oldest first",
            who: Who::Operator,
            request: None,
            query: &[(
                "status",
                "only escalations with this status",
                Some(&["pending", "approved", "rejected", "consumed"]),
            )],
            success: (200, schema::<EscalationListResponse>(g)),
            also: None,
            errors: &[400, 401, 403],
        },
        Op {
            method: "get",
            path: "/v1/escalations/{id}",
            id: "getEscalation",
            summary: "One escalation",
            who: Who::Operator,
            request: None,
            query: &[],
            success: (200, schema::<EscalationBody>(g)),
            also: None,
            errors: &[400, 401, 403, 404],
        },
        Op {
            method: "post",
            path: "/v1/escalations/{id}/approve",
            id: "approveEscalation",
            summary: "Approve an escalation (operator, or an ancestor of the requester): the held request proceeds once",
            who: Who::Either,
            request: None,
            query: &[],
            success: (200, schema::<ReviewResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 429],
        },
        Op {
            method: "post",
            path: "/v1/escalations/{id}/reject",
            id: "rejectEscalation",
            summary: "Reject an escalation (operator, or an ancestor of the requester): the held request is denied",
            who: Who::Either,
            request: Some(schema::<RejectEscalationRequest>(g)),
            query: &[],
            success: (200, schema::<ReviewResponse>(g)),
            also: None,
            errors: &[400, 401, 403, 404, 409, 413, 415, 422, 429],
        },
        Op {
            method: "get",
            path: "/v1/audit",
            id: "auditPage",
            summary: "Page through the decision log",
            who: Who::Operator,
            request: None,
            query: &[
                ("after", "entries after this sequence number", None),
                ("limit", "page size", None),
            ],
            success: (200, schema::<AuditPageResponse>(g)),
            also: None,
            errors: &[400, 401, 403],
        },
        Op {
            method: "get",
            path: "/v1/audit/verify",
            id: "auditVerify",
            summary: "Recompute the decision log's hash chain",
            who: Who::Operator,
            request: None,
            query: &[],
            success: (200, schema::<VerifyResponse>(g)),
            also: None,
            errors: &[401, 403],
        },
        Op {
            method: "get",
            path: "/healthz",
            id: "health",
            summary: "Liveness",
            who: Who::Anyone,
            request: None,
            query: &[],
            success: (200, schema::<HealthResponse>(g)),
            also: None,
            errors: &[],
        },
        Op {
            method: "get",
            path: "/metrics",
            id: "metrics",
            summary: "Prometheus metrics (text exposition format)",
            who: Who::Anyone,
            request: None,
            query: &[],
            success: (200, text.clone()),
            also: None,
            errors: &[],
        },
        Op {
            method: "get",
            path: "/openapi.json",
            id: "openapi",
            summary: "This document",
            who: Who::Anyone,
            request: None,
            query: &[],
            success: (200, json!({"type": "object"})),
            also: None,
            errors: &[],
        },
    ]
}

fn path_params(path: &str) -> Vec<Value> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| {
            json!({
                "name": name, "in": "path", "required": true,
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}
            })
        })
        .collect()
}

fn describe_status(code: u16) -> &'static str {
    match code {
        400 => {
            "unreadable request (malformed_json, duplicate_key, json_too_deep, invalid_identifier, invalid_query)"
        }
        401 => "missing_token, invalid_token, token_revoked",
        403 => "denied; the decision is in the audit log",
        404 => "not_found (missing and not visible answer alike)",
        409 => {
            "conflict (revision_conflict, duplicate_agent, run_id_conflict, escalation_not_pending, ...)"
        }
        413 => "body_too_large, value_too_large",
        415 => "unsupported_media_type",
        422 => "invalid for the route (unknown_field, wrong_type, invalid_sop, ...)",
        429 => "quota exhausted (quota_*)",
        _ => "error",
    }
}

/// The OpenAPI document.
pub fn document() -> Value {
    let mut g = SchemaSettings::openapi3().into_generator();
    let error = schema::<ErrorResponse>(&mut g);
    let mut paths: Map<String, Value> = Map::new();
    for op in operations(&mut g) {
        let mut responses = Map::new();
        let media = if op.path == "/metrics" {
            "text/plain"
        } else {
            "application/json"
        };
        if let Some(also) = op.also {
            responses.insert(
                also.to_string(),
                json!({"description": "success", "content": {media: {"schema": op.success.1.clone()}}}),
            );
        }
        responses.insert(
            op.success.0.to_string(),
            json!({"description": "success", "content": {media: {"schema": op.success.1}}}),
        );
        for code in op.errors {
            responses.insert(
                code.to_string(),
                json!({"description": describe_status(*code),
                       "content": {"application/json": {"schema": error.clone()}}}),
            );
        }
        if op.who != Who::Anyone {
            responses.insert(
                "500".into(),
                json!({"description": "internal error (logged, not detailed)",
                       "content": {"application/json": {"schema": error.clone()}}}),
            );
        }
        let mut parameters = path_params(op.path);
        for (name, desc, values) in op.query {
            let schema = match values {
                None => json!({"type": "integer", "format": "int64", "minimum": 0}),
                Some(values) => json!({"type": "string", "enum": values}),
            };
            parameters.push(json!({
                "name": name, "in": "query", "required": false, "description": desc,
                "schema": schema
            }));
        }
        let who = match op.who {
            Who::Anyone => "anyone",
            Who::Operator => "the operator token",
            Who::Agent => "an agent token (the acting agent is the token's)",
            Who::Either => "the operator or an agent token",
        };
        let mut operation = json!({
            "operationId": op.id,
            "summary": op.summary,
            "description": format!("Caller: {who}."),
            "parameters": parameters,
            "responses": responses,
        });
        if op.who != Who::Anyone
            && let Some(o) = operation.as_object_mut()
        {
            o.insert("security".into(), json!([{"bearer": []}]));
        }
        if let (Some(req), Some(o)) = (op.request, operation.as_object_mut()) {
            o.insert(
                "requestBody".into(),
                json!({"required": true, "content": {"application/json": {"schema": req}}}),
            );
        }
        let entry = paths.entry(op.path.to_owned()).or_insert_with(|| json!({}));
        if let Some(e) = entry.as_object_mut() {
            e.insert(op.method.to_owned(), operation);
        }
    }
    let schemas = g.take_definitions(true);
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Warden governance API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Deterministic governance decisions for hierarchical AI agents. Identity is the bearer token's; errors are {\"error\": {\"code\", \"message\", \"details\"}}."
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        }
    })
}

/// The document as JSON bytes, built once.
pub fn document_bytes() -> Vec<u8> {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    DOC.get_or_init(|| crate::body::json_bytes(&document()))
        .clone()
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
