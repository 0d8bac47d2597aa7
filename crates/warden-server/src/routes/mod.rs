//! The route list and the pieces every handler shares.
//!
//! [`API`] is the one list of routes. The router is built from it, the
//! OpenAPI document is generated from it ([`crate::openapi`]), and the route
//! table of the crate's README is checked against it by a test. Each entry
//! names its method, path, handler, who may call it, the wire types it reads
//! and writes, its success statuses and the error codes particular to it;
//! the errors every route of a kind shares (authentication, bodies, path
//! segments) are derived from the entry ([`Route::errors`]).

pub(crate) mod agents;
pub(crate) mod audit;
pub(crate) mod context;
pub(crate) mod memory;
pub(crate) mod meta;
pub(crate) mod runs;
pub(crate) mod sessions;

use axum::Router;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::middleware::from_fn_with_state;
use axum::routing::{MethodFilter, on};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::json;
use warden_core::envelope::sign::SignedEnvelope;
use warden_core::ids::IdentifierError;
use warden_store::Store;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::wire::*;

/// Which token a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token.
    Public,
    /// The operator token.
    Operator,
    /// An agent token; the acting agent is the token's.
    Agent,
    /// The operator token or an agent token.
    OperatorOrAgent,
}

/// A wire type a route reads or writes, with its JSON Schema.
#[derive(Debug, Clone, Copy)]
pub struct WireType {
    /// The type's name (the name of its schema in the OpenAPI document).
    pub name: &'static str,
    /// Its schema, as a reference into the generator's definitions.
    pub schema: fn(&mut SchemaGenerator) -> Schema,
}

fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The [`WireType`] of a type in scope.
macro_rules! wire {
    ($t:ident) => {
        WireType {
            name: stringify!($t),
            schema: schema_of::<$t>,
        }
    };
}

/// What a successful answer carries.
#[derive(Debug, Clone, Copy)]
pub enum Payload {
    /// JSON of this wire type.
    Json(WireType),
    /// Prometheus text exposition format.
    Prometheus,
    /// The OpenAPI document.
    OpenApi,
}

/// One documented error answer: a status and its stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorDoc {
    /// The HTTP status.
    pub status: u16,
    /// The `error.code` of the body.
    pub code: &'static str,
    /// When or why, if the code does not say it (may be empty).
    pub note: &'static str,
}

impl ErrorDoc {
    /// The same error, with a note.
    pub const fn note(self, note: &'static str) -> Self {
        Self { note, ..self }
    }
}

/// An error answer without a note.
pub(crate) const fn fail(status: u16, code: &'static str) -> ErrorDoc {
    ErrorDoc {
        status,
        code,
        note: "",
    }
}

/// Everything documented about a route besides its method and path.
#[derive(Debug, Clone, Copy)]
pub struct RouteDoc {
    /// The OpenAPI `operationId`.
    pub id: &'static str,
    /// Which token it needs.
    pub access: Access,
    /// Who may call it, in words, where that is narrower than
    /// [`access`](Self::access) says (empty: as `access` says).
    pub callers: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// The JSON body it reads.
    pub request: Option<WireType>,
    /// The query string it reads.
    pub query: Option<WireType>,
    /// Success statuses, the usual one first.
    pub success: &'static [u16],
    /// What a success carries.
    pub response: Payload,
    /// What the success means, beyond its fields (may be empty).
    pub outcome: &'static str,
    /// The errors particular to this route, in the order documented.
    pub errors: &'static [ErrorDoc],
    /// A malformed path segment answers 404 `not_found` (as a missing
    /// record does) instead of 400.
    pub path_not_found: bool,
}

impl RouteDoc {
    /// The fields an entry of [`API`] may leave out.
    const EMPTY: Self = Self {
        id: "",
        access: Access::Public,
        callers: "",
        summary: "",
        request: None,
        query: None,
        success: &[200],
        response: Payload::OpenApi,
        outcome: "",
        errors: &[],
        path_not_found: false,
    };
}

/// One route of the API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The HTTP method, upper case.
    pub method: &'static str,
    /// The path template (`{name}` for a segment parameter).
    pub path: &'static str,
    /// The rest.
    pub doc: RouteDoc,
}

/// Errors every authenticated route may answer.
pub(crate) const AUTH_ERRORS: &[ErrorDoc] = &[
    fail(401, "missing_token"),
    fail(401, "invalid_token"),
    fail(401, "token_revoked"),
    fail(403, "agent_revoked").note("recorded"),
];
/// Errors every authenticated route may answer after the checks above.
pub(crate) const QUOTA_ERRORS: &[ErrorDoc] =
    &[fail(429, "quota_requests_per_second").note("recorded")];
/// Errors every route that reads a JSON body may answer.
pub(crate) const BODY_ERRORS: &[ErrorDoc] = &[
    fail(400, "malformed_json"),
    fail(400, "duplicate_key"),
    fail(400, "json_too_deep"),
    fail(400, "body_unreadable"),
    fail(413, "body_too_large"),
    fail(415, "unsupported_media_type"),
    fail(422, "unknown_field"),
    fail(422, "missing_field"),
    fail(422, "wrong_type"),
    fail(422, "invalid_value"),
];
/// Errors every route with path parameters may answer for a malformed one.
pub(crate) const PATH_ERRORS: &[ErrorDoc] =
    &[fail(400, "invalid_identifier"), fail(400, "invalid_path")];
/// Errors every route that reads a query string may answer.
pub(crate) const QUERY_ERRORS: &[ErrorDoc] = &[fail(400, "invalid_query")];
/// Errors every route may answer: the middleware turns a handler's panic
/// into a 500 and a request over the server's timeout into a 503.
pub(crate) const SERVER_ERRORS: &[ErrorDoc] = &[
    fail(500, "internal").note("logged, not detailed"),
    fail(503, "timeout"),
];
/// Errors every route that reaches the store may answer.
pub(crate) const STORE_ERRORS: &[ErrorDoc] =
    &[fail(503, "unavailable").note(
        "storage unreachable or not taking writes; retry. `details.reason` says why: disk_full, read_only, busy, connection_lost, out_of_resources, shutting_down, io_error or other",
    )];

impl Route {
    /// The names of the path parameters, in order.
    pub fn params(&self) -> impl Iterator<Item = &'static str> {
        self.path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }

    /// Every error this route may answer: its own and the shared ones its
    /// kind implies (token, path parameters, query, body, server), sorted
    /// by status, each code once (its own entry, with its note, first).
    pub fn errors(&self) -> Vec<ErrorDoc> {
        let d = &self.doc;
        let mut shared: Vec<ErrorDoc> = Vec::new();
        if d.access != Access::Public {
            shared.extend_from_slice(AUTH_ERRORS);
            match d.access {
                Access::Operator => shared.push(fail(403, "operator_only").note("recorded")),
                Access::Agent => shared.push(fail(403, "agent_token_required").note("recorded")),
                Access::OperatorOrAgent | Access::Public => {}
            }
            shared.extend_from_slice(QUOTA_ERRORS);
        }
        if self.params().next().is_some() && !d.path_not_found {
            shared.extend_from_slice(PATH_ERRORS);
        }
        if d.query.is_some() {
            shared.extend_from_slice(QUERY_ERRORS);
        }
        if d.request.is_some() {
            shared.extend_from_slice(BODY_ERRORS);
        }
        shared.extend_from_slice(SERVER_ERRORS);
        if d.access != Access::Public {
            shared.extend_from_slice(STORE_ERRORS);
        }
        let mut all: Vec<ErrorDoc> = d.errors.to_vec();
        for e in shared {
            if !all.iter().any(|a| a.status == e.status && a.code == e.code) {
                all.push(e);
            }
        }
        all.sort_by_key(|e| e.status);
        all
    }
}

/// Declares [`API`], [`ROUTES`] and the router's routes from one list:
/// `METHOD "path" => handler, { RouteDoc fields }`. A handler generic over
/// the store names the router's store type `S`.
macro_rules! routes {
    ($( $method:ident $path:literal => $handler:expr, { $($field:ident: $value:expr),* $(,)? } )*) => {
        /// Every route of the API, in the order of the README's table: the
        /// router is built from this list and the OpenAPI document is
        /// generated from it.
        pub const API: &[Route] = &[$(
            Route {
                method: stringify!($method),
                path: $path,
                doc: RouteDoc { $($field: $value,)* ..RouteDoc::EMPTY },
            }
        ),*];

        /// Every route of [`API`] as `(method, path template)`.
        pub const ROUTES: &[(&str, &str)] = &[$( (stringify!($method), $path) ),*];

        /// `router` with every route of [`API`] and its handler.
        fn with_routes<S: Store>(router: Router<AppState<S>>) -> Router<AppState<S>> {
            router $( .route($path, on(MethodFilter::$method, $handler)) )*
        }
    };
}

const ENVELOPE_404: ErrorDoc =
    fail(404, "not_found").note("missing or another agent's run: same answer; the latter recorded");

routes! {
    POST "/v1/agents" => agents::register::<S>, {
        id: "registerAgent",
        access: Access::Operator,
        summary: "Register an agent; returns its token once",
        request: Some(wire!(RegisterAgentRequest)),
        success: &[201],
        response: Payload::Json(wire!(AgentCreatedResponse)),
        errors: &[
            fail(403, "child_write_surface_tool").note("delegation lockdown"),
            fail(403, "child_self_edit_requested").note("delegation lockdown"),
            fail(409, "duplicate_agent"),
            fail(409, "hierarchy_full"),
            fail(422, "unknown_parent"),
            fail(422, "parent_revoked"),
            fail(422, "depth_exceeded"),
            fail(422, "reserved_agent_id"),
            fail(422, "unknown_capability"),
            fail(422, "limit_exceeded"),
            fail(422, "child_self_edit_flag_invalid"),
            fail(422, "child_config_invalid"),
        ],
    }
    GET "/v1/agents/self" => agents::get_self::<S>, {
        id: "getSelf",
        access: Access::Agent,
        summary: "The calling agent, its lineage and effective capabilities",
        response: Payload::Json(wire!(AgentResponse)),
    }
    POST "/v1/agents/self/children" => agents::delegate::<S>, {
        id: "delegate",
        access: Access::Agent,
        summary: "Register a child of the calling agent (delegation lockdown applies)",
        request: Some(wire!(DelegateRequest)),
        success: &[201],
        response: Payload::Json(wire!(AgentCreatedResponse)),
        outcome: "the child's token; the child inherits the envelope of `from_run` or `from_session` (else the caller's own inherited one), with `restrictions` added, authority narrowed to what it allows",
        errors: &[
            fail(403, "not_own_child").note("a `parent_id` other than the caller; recorded"),
            fail(403, "delegation_denied").note("`details.reason`, e.g. `restricted_by:no_external_delegation`; `details.decision`; recorded, nothing created"),
            fail(403, "delegation_escalated").note("`details.escalation_id`; recorded, nothing created"),
            fail(403, "child_write_surface_tool").note("delegation lockdown"),
            fail(403, "child_self_edit_requested").note("delegation lockdown"),
            fail(404, "not_found").note("`from_run` / `from_session` not a run / session of the caller"),
            fail(409, "duplicate_agent"),
            fail(409, "hierarchy_full"),
            fail(422, "unknown_restriction"),
            fail(422, "unknown_capability"),
            fail(422, "reserved_agent_id"),
            fail(422, "depth_exceeded"),
            fail(422, "limit_exceeded"),
            fail(422, "child_self_edit_flag_invalid"),
            fail(422, "child_config_invalid"),
        ],
    }
    GET "/v1/agents/{id}" => agents::get::<S>, {
        id: "getAgent",
        access: Access::OperatorOrAgent,
        callers: "operator, the agent, an ancestor",
        summary: "An agent, its lineage and capabilities",
        response: Payload::Json(wire!(AgentResponse)),
        errors: &[fail(404, "not_found").note("missing or not visible: same answer")],
    }
    DELETE "/v1/agents/{id}" => agents::revoke::<S>, {
        id: "revokeAgent",
        access: Access::OperatorOrAgent,
        callers: "operator, an ancestor",
        summary: "Revoke an agent and its descendants",
        response: Payload::Json(wire!(RevokedResponse)),
        outcome: "the agent and its descendants",
        errors: &[
            fail(403, "not_an_ancestor").note("self"),
            fail(404, "not_found"),
            fail(405, "method_not_allowed").note("`id` `self`: `/v1/agents/self` is the caller's own route, GET only"),
        ],
    }
    POST "/v1/agents/{id}/tokens" => agents::issue_token::<S>, {
        id: "issueToken",
        access: Access::Operator,
        summary: "Issue a revocable token for an agent",
        success: &[201],
        response: Payload::Json(wire!(TokenIssuedResponse)),
        errors: &[fail(404, "not_found"), fail(409, "agent_revoked")],
    }
    DELETE "/v1/tokens/{token_id}" => agents::revoke_token::<S>, {
        id: "revokeToken",
        access: Access::Operator,
        summary: "Revoke one token; the agent stays active",
        response: Payload::Json(wire!(TokenRevokedResponse)),
        errors: &[fail(404, "not_found").note("also for a malformed token id")],
        path_not_found: true,
    }
    GET "/v1/memory/{namespace}/{key}" => memory::read::<S>, {
        id: "readMemory",
        access: Access::Agent,
        summary: "Resolve a key toward the root, with provenance",
        response: Payload::Json(wire!(MemoryValueResponse)),
        errors: &[
            fail(403, "capability_not_inherited"),
            fail(404, "not_found").note("missing, not visible, secret, expired: same answer; the log keeps the reason"),
        ],
    }
    PUT "/v1/memory/{namespace}/{key}" => memory::write::<S>, {
        id: "writeMemory",
        access: Access::Agent,
        summary: "Write a record in the caller's own scope (201 when created)",
        request: Some(wire!(PutMemoryRequest)),
        success: &[201, 200],
        response: Payload::Json(wire!(MemoryWrittenResponse)),
        outcome: "201 created, 200 updated",
        errors: &[
            fail(403, "actor_is_not_owner").note("recorded"),
            fail(403, "capability_not_inherited"),
            fail(409, "revision_conflict").note("`details.current_revision`"),
            fail(413, "value_too_large"),
            fail(422, "invalid_record"),
            fail(429, "quota_max_records"),
            fail(429, "quota_max_bytes"),
        ],
    }
    DELETE "/v1/memory/{namespace}/{key}" => memory::delete::<S>, {
        id: "deleteMemory",
        access: Access::Agent,
        summary: "Delete one of the caller's own records",
        query: Some(wire!(DeleteMemoryQuery)),
        response: Payload::Json(wire!(MemoryDeletedResponse)),
        errors: &[
            fail(403, "capability_not_inherited"),
            fail(404, "not_found"),
            fail(409, "revision_conflict"),
        ],
    }
    POST "/v1/sops/validate" => runs::validate::<S>, {
        id: "validateSop",
        access: Access::Agent,
        summary: "Preflight an SOP or a plan: every step's decision and the provenance of its guarded arguments, nothing runs",
        request: Some(wire!(ValidateSopRequest)),
        response: Payload::Json(wire!(ValidateResponse)),
        outcome: "the `sop` may be a plan (argument values `{\"$bind\": ...}`), admitted as a session admits it; `provenance`: per step, how each argument a provenance rule guards will be vouched for",
        errors: &[
            fail(422, "invalid_sop").note("`details.field`, `details.reason`"),
            fail(422, "invalid_plan").note("`details.field`, `details.reason`"),
        ],
    }
    POST "/v1/runs" => runs::admit::<S>, {
        id: "admitRun",
        access: Access::Agent,
        summary: "Admit an SOP as a run (403 sop_rejected with every step's decision)",
        request: Some(wire!(AdmitRunRequest)),
        success: &[201, 200],
        response: Payload::Json(wire!(RunAdmittedResponse)),
        outcome: "201 new, 200 existing (same `run_id`, same SOP)",
        errors: &[
            fail(403, "sop_rejected").note("`details.decisions`: every step"),
            fail(409, "run_id_conflict"),
            fail(422, "invalid_sop"),
            fail(429, "quota_max_runs_in_flight"),
        ],
    }
    POST "/v1/runs/{run}/steps/{step}/begin" => runs::begin::<S>, {
        id: "beginStep",
        access: Access::Agent,
        callers: "the run's agent",
        summary: "The per-step gate (proceed / replay / executed; 403 step_denied; 409 step_in_progress)",
        query: Some(wire!(BeginStepQuery)),
        response: Payload::Json(wire!(GateResponse)),
        outcome: "`gate: proceed` with `operation_id`, `action`, `arguments` and the step's lease (`lease_id`, `lease_expires_at`); `gate: replay` or `gate: executed` (memory steps run by the server) with `outcome`",
        errors: &[
            fail(403, "step_denied").note("`details.decision`; a context denial such as `restricted_by:no_external_export` records the step `Denied`"),
            fail(403, "step_escalated").note("`details.decision`, `details.escalation_id`: approve it, then `begin` again"),
            fail(404, "not_found"),
            fail(409, "step_out_of_order"),
            fail(409, "run_stopped"),
            fail(409, "step_in_progress").note("another worker holds the step's lease until `details.lease_expires_at`; recorded"),
            fail(422, "invalid_value").note("`lease_id`"),
        ],
    }
    POST "/v1/runs/{run}/steps/{step}/complete" => runs::complete::<S>, {
        id: "completeStep",
        access: Access::Agent,
        callers: "the run's agent",
        summary: "Record a step's outcome exactly once",
        request: Some(wire!(CompleteStepRequest)),
        response: Payload::Json(wire!(OutcomeBody)),
        outcome: "a repeat returns the first",
        errors: &[
            fail(404, "not_found"),
            fail(409, "step_not_begun"),
            fail(409, "step_lease_held").note("not the holder of the step's live lease (`details.lease_expires_at`); recorded, nothing stored"),
            fail(422, "limit_exceeded"),
        ],
    }
    GET "/v1/runs/{run}/envelope" => context::envelope::<S>, {
        id: "getRunEnvelope",
        access: Access::OperatorOrAgent,
        callers: "the run's agent, operator",
        summary: "A run's context envelope: labels, derived labels, sensitivity, restrictions, version, delegation depth, parent (never data)",
        response: Payload::Json(wire!(EnvelopeResponse)),
        outcome: "never data; recorded `context.read`",
        errors: &[ENVELOPE_404, fail(404, "no_envelope")],
    }
    POST "/v1/runs/{run}/declassify" => context::declassify::<S>, {
        id: "declassifyRun",
        access: Access::Agent,
        callers: "the run's agent or an ancestor of it; the bundle's `context.declassifiers` decide",
        summary: "Lower a run's envelope (the bundle's declassifiers only; 403 declassification_not_authorized, recorded)",
        request: Some(wire!(DeclassifyRequest)),
        response: Payload::Json(wire!(DeclassifyResponse)),
        outcome: "recorded with the justification",
        errors: &[
            fail(403, "declassification_not_authorized").note("recorded, unchanged"),
            fail(403, "declassification_invalid").note("a `to` above the current level or below what the labels left imply; recorded, unchanged"),
            ENVELOPE_404,
            fail(404, "no_envelope"),
            fail(409, "envelope_contention"),
            fail(422, "invalid_value").note("`to`, empty justification or control characters"),
            fail(422, "limit_exceeded").note("justification over 1024 bytes"),
            fail(422, "unknown_label"),
        ],
    }
    GET "/v1/runs/{run}/envelope/signed" => context::signed::<S>, {
        id: "exportRunEnvelope",
        access: Access::OperatorOrAgent,
        callers: "the run's agent, operator",
        summary: "The run's envelope signed with the server's Ed25519 key (verify with GET /v1/envelope-key)",
        response: Payload::Json(wire!(SignedEnvelope)),
        outcome: "recorded `envelope_exported`",
        errors: &[ENVELOPE_404, fail(404, "no_envelope")],
    }
    GET "/v1/runs/{run}/receipt" => context::receipt::<S>, {
        id: "runEnvelopeReceipt",
        access: Access::OperatorOrAgent,
        callers: "the run's agent, operator",
        summary: "An opaque receipt for the run's envelope (reference, sensitivity tier, resolvable_until)",
        response: Payload::Json(wire!(ReceiptResponse)),
        outcome: "recorded `receipt_issued`",
        errors: &[ENVELOPE_404, fail(404, "no_envelope")],
    }
    GET "/v1/envelope-key" => context::envelope_key::<S>, {
        id: "envelopeKey",
        summary: "The issuer id and Ed25519 public key that verify exported envelopes",
        response: Payload::Json(wire!(EnvelopeKeyResponse)),
    }
    POST "/v1/sessions" => sessions::open::<S>, {
        id: "openSession",
        access: Access::OperatorOrAgent,
        callers: "the agent, an ancestor or the operator (for `agent_id`)",
        summary: "Open a tool-call session with trusted inputs, an optional plan or imported envelope",
        request: Some(wire!(OpenSessionRequest)),
        success: &[201, 200],
        response: Payload::Json(wire!(SessionBody)),
        outcome: "201 opened, 200 the same request found the session it opened",
        errors: &[
            fail(403, "session_refused").note("`details.reason`: `not_session_agent`, `agent_revoked`, `plan_rejected` (with `details.reasons`), `envelope_forged`, `envelope_replayed`, `envelope_downgraded`...; recorded, nothing created"),
            fail(409, "session_conflict").note("the session id exists with other content"),
            fail(422, "invalid_sop").note("the plan is not a well-formed SOP"),
            fail(422, "invalid_plan").note("a malformed binding, an empty or repeated step id; `details.field`, `details.reason`"),
        ],
    }
    GET "/v1/sessions/{id}" => sessions::get::<S>, {
        id: "getSession",
        access: Access::OperatorOrAgent,
        callers: "the agent, an ancestor, the operator",
        summary: "A session: envelope, plan, index size and every call with its provenance",
        response: Payload::Json(wire!(SessionBody)),
        errors: &[fail(404, "not_found").note("missing or not visible: same answer")],
    }
    POST "/v1/sessions/{id}/calls" => sessions::call::<S>, {
        id: "sessionCall",
        access: Access::Agent,
        callers: "the session's agent",
        summary: "Decide one tool call before it runs (200 whatever the verdict)",
        request: Some(wire!(SessionCallRequest)),
        response: Payload::Json(wire!(CallResponse)),
        outcome: "the verdict, reasons and the provenance of every guarded argument; recorded with the call",
        errors: &[
            fail(404, "not_found"),
            fail(409, "call_conflict").note("the call id was decided with another action or arguments"),
            fail(409, "session_contention"),
        ],
    }
    POST "/v1/sessions/{id}/calls/{call}/result" => sessions::result::<S>, {
        id: "recordCallResult",
        access: Access::Agent,
        callers: "the session's agent",
        summary: "Record what an allowed call's tool returned",
        request: Some(wire!(CallResultRequest)),
        response: Payload::Json(wire!(CallResponse)),
        errors: &[
            fail(404, "not_found"),
            fail(409, "call_not_allowed").note("denied or escalated: nothing ran"),
            fail(409, "call_result_conflict").note("a different result was recorded"),
            fail(409, "session_contention"),
            fail(422, "invalid_value").note("an unknown label, an oversized result"),
        ],
    }
    POST "/v1/sessions/{id}/cancel" => sessions::cancel::<S>, {
        id: "cancelSession",
        access: Access::OperatorOrAgent,
        callers: "the agent, an ancestor, the operator",
        summary: "Cancel a session: later calls denied, pending escalations withdrawn",
        request: Some(wire!(CancelSessionRequest)),
        response: Payload::Json(wire!(SessionBody)),
        errors: &[fail(404, "not_found")],
    }
    GET "/v1/escalations" => context::list_escalations::<S>, {
        id: "listEscalations",
        access: Access::Operator,
        summary: "The escalation queue, oldest first",
        query: Some(wire!(EscalationQuery)),
        response: Payload::Json(wire!(EscalationListResponse)),
    }
    GET "/v1/escalations/{id}" => context::get_escalation::<S>, {
        id: "getEscalation",
        access: Access::Operator,
        summary: "One escalation",
        response: Payload::Json(wire!(EscalationBody)),
        errors: &[fail(404, "not_found")],
    }
    POST "/v1/escalations/{id}/approve" => context::approve::<S>, {
        id: "approveEscalation",
        access: Access::OperatorOrAgent,
        callers: "operator, an active ancestor of the requester",
        summary: "Approve an escalation (operator, or an ancestor of the requester): the held request proceeds once",
        response: Payload::Json(wire!(ReviewResponse)),
        outcome: "the held request proceeds once, the next time exactly that request is made (`begin`, the same call, the same delegation: its `request_digest`); other pending requests for the same child, step or call are then withdrawn",
        errors: &[
            fail(403, "escalation_reviewer_not_authorized").note("the requester itself; recorded"),
            fail(404, "not_found").note("missing, or an agent outside the requester's lineage; recorded"),
            fail(409, "escalation_not_pending").note("recorded"),
            fail(409, "escalation_unbound").note("stored before approvals were bound to a request: reject it; recorded"),
        ],
    }
    POST "/v1/escalations/{id}/reject" => context::reject::<S>, {
        id: "rejectEscalation",
        access: Access::OperatorOrAgent,
        callers: "operator, an active ancestor of the requester",
        summary: "Reject an escalation (operator, or an ancestor of the requester): the held request is denied",
        request: Some(wire!(RejectEscalationRequest)),
        response: Payload::Json(wire!(ReviewResponse)),
        outcome: "a held step is recorded `Denied` and its run stops",
        errors: &[
            fail(403, "escalation_reviewer_not_authorized").note("the requester itself; recorded"),
            fail(404, "not_found").note("missing, or an agent outside the requester's lineage; recorded"),
            fail(409, "escalation_not_pending").note("recorded"),
            fail(422, "invalid_value").note("`reason`"),
            fail(422, "limit_exceeded").note("`reason`"),
        ],
    }
    GET "/v1/audit" => audit::page::<S>, {
        id: "auditPage",
        access: Access::Operator,
        summary: "Page through the decision log",
        query: Some(wire!(AuditQuery)),
        response: Payload::Json(wire!(AuditPageResponse)),
        outcome: "`limit` clamped to 1..=1000, default 100",
    }
    GET "/v1/audit/verify" => audit::verify::<S>, {
        id: "auditVerify",
        access: Access::Operator,
        summary: "Recompute the decision log's hash chain",
        response: Payload::Json(wire!(VerifyResponse)),
    }
    GET "/healthz" => meta::healthz::<S>, {
        id: "health",
        summary: "Liveness",
        response: Payload::Json(wire!(HealthResponse)),
    }
    GET "/metrics" => meta::metrics::<S>, {
        id: "metrics",
        summary: "Prometheus metrics (text exposition format)",
        response: Payload::Prometheus,
    }
    GET "/openapi.json" => meta::openapi, {
        id: "openapi",
        summary: "This document",
        response: Payload::OpenApi,
    }
}

/// The API's router over `state`: every route of [`API`], the shared 404
/// and 405 answers, and the middleware.
pub fn router<S: Store>(state: AppState<S>) -> Router {
    with_routes(Router::new())
        .nest("/console", crate::console::router())
        .merge(crate::mcp::routes(&state))
        .fallback(meta::no_route)
        .method_not_allowed_fallback(meta::method_not_allowed)
        .layer(from_fn_with_state(
            state.clone(),
            crate::middleware::observe::<S>,
        ))
        .with_state(state)
}

/// Path parameters, percent-decoded, as strings.
#[derive(Debug)]
pub(crate) struct PathParams(Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for PathParams {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| {
                ApiError::bad_request("invalid_path", "a path segment is not valid UTF-8")
            })?;
        Ok(Self(
            raw.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ))
    }
}

impl PathParams {
    /// The parameter `name` parsed as an identifier (400
    /// `invalid_identifier` otherwise).
    pub(crate) fn ident<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, IdentifierError>,
    ) -> ApiResult<T> {
        let raw = self
            .0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("");
        parse(raw).map_err(|e| {
            ApiError::bad_request("invalid_identifier", format!("path segment `{name}`: {e}"))
                .with_details(json!({"field": name}))
        })
    }
}
