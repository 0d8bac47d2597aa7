//! The console's pages: escalations, hierarchy, memory, sessions, audit.
//! Each reads through the engine with the viewer's identity; each action
//! is one engine call made as the operator (agents sign in read-only).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use warden::{Caller, EngineError, Revocation, RunAccess, RunVisibility};
use warden_core::audit::AuditEntry;
use warden_core::decision::Subject;
use warden_core::ids::{AgentId, Key, Namespace, RunId, SessionId, check_identifier};
use warden_core::memory::{MemoryRecord, RecordClass, Resolution, resolve};
use warden_store::{EscalationRecord, EscalationStatus, EscalationTarget, Store, StoredAgent};

use super::html::{Section, csrf_field, esc, page, reason, time, url_part, verdict, who};
use super::session::Viewer;
use super::{Console, HasCsrf, html, message, see_other};

/// Entries read per audit page from the store.
const AUDIT_BATCH: usize = 500;
/// Most entries one audit page scans for matches.
const AUDIT_SCAN: usize = 20_000;

fn ok(v: &Viewer, section: Section, title: &str, body: &str) -> Response {
    html(StatusCode::OK, page(Some(v), section, title, body))
}

fn failed(v: &Viewer, e: &EngineError) -> Response {
    match e {
        EngineError::NotFound { .. } => not_found(v),
        other => {
            tracing::error!(error = %other, "console: engine call failed");
            message(
                Some(v),
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong",
                "The request failed; the server log has the details.",
            )
        }
    }
}

fn not_found(v: &Viewer) -> Response {
    message(
        Some(v),
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such record, or it is outside what you may see.",
    )
}

fn read_only(v: &Viewer) -> Response {
    message(
        Some(v),
        StatusCode::FORBIDDEN,
        "Read-only",
        "An agent's sign-in is read-only: only the operator may approve, reject or revoke. Nothing was changed.",
    )
}

/// Whether the viewer may see what `subject` did or asked.
fn may_see<S: Store>(c: &Console<S>, v: &Viewer, subject: &Subject) -> bool {
    match (&v.caller, subject) {
        (Caller::Operator, _) => true,
        (Caller::Agent(_), Subject::Operator) => false,
        (Caller::Agent(_), Subject::Agent(a)) => c
            .app
            .engine()
            .may_manage(&v.caller, a, true)
            .unwrap_or(false),
    }
}

fn may_see_agent<S: Store>(c: &Console<S>, v: &Viewer, a: &AgentId) -> bool {
    c.app
        .engine()
        .may_manage(&v.caller, a, true)
        .unwrap_or(false)
}

/// The whole decision log, oldest first.
async fn whole_audit<S: Store>(c: &Console<S>) -> Result<Vec<AuditEntry>, EngineError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = c.app.engine().audit_page(after, AUDIT_BATCH).await?;
        let n = page.len();
        if let Some(last) = page.last() {
            after = last.seq;
        }
        out.extend(page);
        if n < AUDIT_BATCH {
            return Ok(out);
        }
    }
}

fn audit_table(entries: &[&AuditEntry]) -> String {
    if entries.is_empty() {
        return "<p>No entries.</p>".to_owned();
    }
    let mut t = String::from(
        "<div class=\"scroll\"><table><thead><tr><th>#</th><th>Time</th><th>Who</th><th>Operation</th>\
         <th>Resource</th><th>Verdict</th><th>Reason</th></tr></thead><tbody>",
    );
    for e in entries {
        let d = &e.draft;
        let _ = write!(
            t,
            "<tr><td>{}</td><td class=\"time\">{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            e.seq,
            time(d.time),
            esc(&d.subject),
            esc(&d.operation),
            esc(&d.resource),
            verdict(d.verdict.as_str()),
            reason(&d.reason)
        );
    }
    t.push_str("</tbody></table></div>");
    t
}

fn list(items: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    let items: Vec<String> = items
        .into_iter()
        .map(|s| format!("<code>{}</code>", esc(s.as_ref())))
        .collect();
    if items.is_empty() {
        "<span class=\"none\">none</span>".to_owned()
    } else {
        items.join(" ")
    }
}

fn provenance_table(provenance: &Value) -> String {
    let Some(rows) = provenance.as_array().filter(|r| !r.is_empty()) else {
        return "<p class=\"none\">No guarded arguments.</p>".to_owned();
    };
    let mut t = String::from(
        "<table class=\"prov\"><thead><tr><th>Argument</th><th>Came from</th><th>Sources</th>\
         <th>Allowed from</th><th>Vouched</th></tr></thead><tbody>",
    );
    for r in rows {
        let strs = |k: &str| -> Vec<String> {
            r[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let sources: Vec<String> = r["sources"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        let field = s["field"].as_str().unwrap_or("");
                        format!(
                            "{} ({}{})",
                            s["source"].as_str().unwrap_or("?"),
                            s["origin"].as_str().unwrap_or("?"),
                            if field.is_empty() {
                                String::new()
                            } else {
                                format!(", field {field}")
                            }
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let vouched = r["vouched"].as_bool().unwrap_or(false);
        let _ = write!(
            t,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(r["path"].as_str().unwrap_or("?")),
            list(strs("origins")),
            list(sources),
            list(strs("from")),
            if vouched {
                "<span class=\"badge v-allow\">yes</span>"
            } else {
                "<span class=\"badge v-deny\">no</span>"
            }
        );
    }
    t.push_str("</tbody></table>");
    t
}

fn target_text(t: &EscalationTarget) -> String {
    match t {
        EscalationTarget::Step {
            run_id, step_id, ..
        } => format!(
            "step <code>{}</code> of run <a href=\"/console/runs/{}\"><code>{}</code></a>",
            esc(step_id.as_str()),
            url_part(run_id.as_str()),
            esc(run_id.as_str())
        ),
        EscalationTarget::Call {
            session_id,
            call_id,
            ..
        } => format!(
            "call <code>{}</code> of session <a href=\"/console/sessions/{}\"><code>{}</code></a>",
            esc(call_id.as_str()),
            url_part(session_id.as_str()),
            esc(session_id.as_str())
        ),
        EscalationTarget::Delegation { parent, child, .. } => format!(
            "registering <code>{}</code> under <code>{}</code>",
            esc(child.as_str()),
            esc(parent.as_str())
        ),
    }
}

/// One escalation: who asked, what, labels and sensitivity, provenance of
/// every argument (for a call), why; with the review forms when pending
/// and the viewer is the operator.
async fn escalation_card<S: Store>(
    c: &Console<S>,
    v: &Viewer,
    e: &EscalationRecord,
    link: bool,
) -> String {
    let engine = c.app.engine();
    let mut s = String::new();
    let id = esc(&e.escalation_id);
    let title = if link {
        format!(
            "<a href=\"/console/escalations/{}\">{id}</a>",
            url_part(&e.escalation_id)
        )
    } else {
        id.clone()
    };
    let _ = write!(
        s,
        "<article class=\"card\" data-escalation=\"{id}\"><h2>{title} <span class=\"badge s-{st}\">{st}</span></h2><dl>\
         <dt>Who asked</dt><dd>{}</dd><dt>What</dt><dd><code>{}</code> on {}</dd>\
         <dt>Why it waits</dt><dd>{}</dd><dt>Asked at</dt><dd>{}</dd><dt>Sensitivity</dt><dd>{}</dd>",
        esc(&who(&e.requested_by)),
        esc(&e.operation),
        target_text(&e.target),
        reason(e.reason.as_str()),
        time(e.created_at),
        esc(e.classification.as_str()),
        st = e.status.as_str(),
    );
    if let (Some(env), Some(ver)) = (&e.envelope_id, e.envelope_version) {
        match engine.envelope(env, Some(ver)).await {
            Ok(Some(r)) => {
                let _ = write!(
                    s,
                    "<dt>Labels</dt><dd>{}</dd><dt>Derived</dt><dd>{}</dd><dt>Restrictions</dt><dd>{}</dd>",
                    list(r.labels.iter().map(|l| l.as_str().to_owned())),
                    list(r.derived.iter().map(|l| l.as_str().to_owned())),
                    list(r.restrictions.iter().map(|l| l.as_str().to_owned()))
                );
            }
            Ok(None) | Err(_) => {
                s.push_str("<dt>Labels</dt><dd class=\"none\">envelope not found</dd>")
            }
        }
    }
    if !e.obligations.is_empty() {
        let obligations = serde_json::to_string(&e.obligations).unwrap_or_default();
        let _ = write!(
            s,
            "<dt>If approved</dt><dd><code>{}</code></dd>",
            esc(&obligations)
        );
    }
    if let Some(by) = &e.resolved_by {
        let _ = write!(
            s,
            "<dt>Decided by</dt><dd>{} at {}</dd>",
            esc(&who(by)),
            e.resolved_at.map(time).unwrap_or_default()
        );
    }
    if let Some(r) = &e.rejection_reason {
        let _ = write!(s, "<dt>Rejected because</dt><dd>{}</dd>", esc(r));
    }
    if let Some(t) = e.consumed_at {
        let _ = write!(s, "<dt>Approval used</dt><dd>{}</dd>", time(t));
    }
    s.push_str("</dl>");
    // The request itself: an approval lets exactly this through, once.
    s.push_str("<h3>The request</h3>");
    match (&e.request, e.target.request_digest()) {
        (Some(request), Some(digest)) => {
            let text = serde_json::to_string_pretty(request).unwrap_or_default();
            let _ = write!(
                s,
                "<p>An approval lets exactly this request through, once (digest <code>{}</code>); any other request escalates afresh.</p><pre class=\"request\">{}</pre>",
                esc(&digest.to_hex()),
                esc(&text)
            );
        }
        _ => s.push_str(
            "<p class=\"none\">This escalation was stored before approvals were bound to a request: it cannot be approved, only rejected.</p>",
        ),
    }
    if let EscalationTarget::Call {
        session_id,
        call_id,
        ..
    } = &e.target
    {
        s.push_str("<h3>Where each argument came from</h3>");
        match engine.session(&v.caller, session_id).await {
            Ok(view) => match view.state.call(call_id) {
                Some(call) => {
                    let _ = write!(
                        s,
                        "<p>Action <code>{}</code>; every check's reasons: {}</p>",
                        esc(call.action.as_str()),
                        list(
                            call.detail
                                .get("reasons")
                                .unwrap_or(&Value::Null)
                                .as_array()
                                .map(|a| a
                                    .iter()
                                    .filter_map(|x| x.as_str().map(str::to_owned))
                                    .collect::<Vec<_>>())
                                .unwrap_or_default()
                        )
                    );
                    s.push_str(&provenance_table(
                        call.detail.get("provenance").unwrap_or(&Value::Null),
                    ));
                }
                None => s.push_str("<p class=\"none\">The call is not recorded.</p>"),
            },
            Err(_) => s.push_str("<p class=\"none\">The session is not visible.</p>"),
        }
    }
    if e.status == EscalationStatus::Pending && v.is_operator() {
        let action = format!("/console/escalations/{}", url_part(&e.escalation_id));
        let _ = write!(
            s,
            "<div class=\"actions\"><form method=\"post\" action=\"{action}/approve\">{csrf}\
             <button type=\"submit\" class=\"approve\">Approve</button></form>\
             <form method=\"post\" action=\"{action}/reject\" class=\"reject\">{csrf}\
             <label for=\"reason-{id}\">Reason for rejecting</label>\
             <input id=\"reason-{id}\" name=\"reason\" required maxlength=\"1024\">\
             <button type=\"submit\" class=\"danger\">Reject</button></form></div>",
            csrf = csrf_field(v)
        );
    }
    s.push_str("</article>");
    s
}

/// `GET /console/escalations`: the pending queue, oldest first, then the
/// latest resolved ones.
pub(crate) async fn escalations<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let all = match c.app.engine().list_escalations(None).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let all: Vec<_> = all
        .into_iter()
        .filter(|e| may_see(&c, &v, &e.requested_by))
        .collect();
    let mut body = String::new();
    let pending: Vec<_> = all
        .iter()
        .filter(|e| e.status == EscalationStatus::Pending)
        .collect();
    let _ = write!(
        body,
        "<section aria-labelledby=\"pending\"><h2 id=\"pending\">Waiting for review ({})</h2>",
        pending.len()
    );
    if pending.is_empty() {
        body.push_str("<p>Nothing is waiting.</p>");
    }
    for e in pending {
        body.push_str(&escalation_card(&c, &v, e, true).await);
    }
    body.push_str(
        "</section><section aria-labelledby=\"resolved\"><h2 id=\"resolved\">Recently decided</h2>",
    );
    let mut resolved: Vec<_> = all
        .iter()
        .filter(|e| e.status != EscalationStatus::Pending)
        .collect();
    resolved.sort_by_key(|e| std::cmp::Reverse(e.resolved_at.unwrap_or(e.created_at)));
    if resolved.is_empty() {
        body.push_str("<p>None yet.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\"><table><thead><tr><th>Escalation</th><th>Status</th><th>Who asked</th>\
             <th>What</th><th>Decided by</th></tr></thead><tbody>",
        );
        for e in resolved.into_iter().take(20) {
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/escalations/{}\">{}</a></td><td><span class=\"badge s-{st}\">{st}</span></td>\
                 <td>{}</td><td>{}</td><td>{}</td></tr>",
                url_part(&e.escalation_id),
                esc(&e.escalation_id),
                esc(&who(&e.requested_by)),
                target_text(&e.target),
                e.resolved_by
                    .as_ref()
                    .map(|s| esc(&who(s)))
                    .unwrap_or_default(),
                st = e.status.as_str()
            );
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("</section>");
    ok(&v, Section::Escalations, "Escalations", &body)
}

#[derive(Deserialize)]
pub(crate) struct Done {
    done: Option<String>,
}

/// `GET /console/escalations/{id}`: one escalation with the audit entries
/// it produced.
pub(crate) async fn escalation<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<Done>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if check_identifier(&id).is_err() {
        return not_found(&v);
    }
    let e = match c.app.engine().escalation(&id).await {
        Ok(e) => e,
        Err(e) => return failed(&v, &e),
    };
    if !may_see(&c, &v, &e.requested_by) {
        return not_found(&v);
    }
    let mut body = String::new();
    match q.done.as_deref() {
        Some("approved") => body.push_str("<p class=\"notice ok\" role=\"status\">Approved: the held request proceeds once, the next time it is made.</p>"),
        Some("rejected") => body.push_str("<p class=\"notice ok\" role=\"status\">Rejected: the held request is denied.</p>"),
        Some("not_pending") => body.push_str("<p class=\"notice\" role=\"alert\">It was already decided; nothing was changed (the attempt is recorded).</p>"),
        _ => {}
    }
    body.push_str(&escalation_card(&c, &v, &e, false).await);
    let audit = match whole_audit(&c).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let related: Vec<&AuditEntry> = audit
        .iter()
        .filter(|a| {
            a.draft.resource == id
                || a.draft.details.get("escalation_id").and_then(Value::as_str) == Some(id.as_str())
        })
        .filter(|a| v.is_operator() || may_see_subject_str(&c, &v, &a.draft.subject))
        .collect();
    body.push_str("<h2>Audit entries</h2>");
    body.push_str(&audit_table(&related));
    ok(&v, Section::Escalations, &format!("Escalation {id}"), &body)
}

fn may_see_subject_str<S: Store>(c: &Console<S>, v: &Viewer, subject: &str) -> bool {
    AgentId::parse(subject).is_ok_and(|a| may_see_agent(c, v, &a))
}

#[derive(Deserialize)]
pub(crate) struct RejectForm {
    csrf: Option<String>,
    reason: Option<String>,
}

impl HasCsrf for RejectForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// The answer to a review: back to the escalation, saying what happened.
fn reviewed(id: &str, out: &warden::ReviewOutcome, v: &Viewer) -> Response {
    use warden::engine_reasons as er;
    let r = &out.decision.reason;
    let done = if *r == er::ESCALATION_APPROVED {
        "approved"
    } else if *r == er::ESCALATION_REJECTED {
        "rejected"
    } else if *r == er::ESCALATION_NOT_PENDING {
        "not_pending"
    } else {
        return message(
            Some(v),
            StatusCode::FORBIDDEN,
            "Refused",
            &format!(
                "The engine refused the review: {}",
                super::reasons::explain(r.as_str())
            ),
        );
    };
    see_other(&format!(
        "/console/escalations/{}?done={done}",
        url_part(id)
    ))
}

/// `POST /console/escalations/{id}/approve` (operator).
pub(crate) async fn approve<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (v, _) = match c
        .form::<super::CsrfOnly>(&method, &uri, &headers, &body)
        .await
    {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return read_only(&v);
    }
    if check_identifier(&id).is_err() {
        return not_found(&v);
    }
    match c.app.engine().approve_escalation(&id, &v.caller).await {
        Ok(out) => reviewed(&id, &out, &v),
        Err(e) => failed(&v, &e),
    }
}

/// `POST /console/escalations/{id}/reject` `reason` (operator).
pub(crate) async fn reject<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (v, form) = match c.form::<RejectForm>(&method, &uri, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return read_only(&v);
    }
    if check_identifier(&id).is_err() {
        return not_found(&v);
    }
    let reason = form.reason.unwrap_or_default();
    match c
        .app
        .engine()
        .reject_escalation(&id, &v.caller, reason.trim())
        .await
    {
        Ok(out) => reviewed(&id, &out, &v),
        Err(EngineError::Input { .. }) => message(
            Some(&v),
            StatusCode::UNPROCESSABLE_ENTITY,
            "Reason needed",
            "A rejection needs a reason: one line, at most 1024 bytes, no control characters. Nothing was changed.",
        ),
        Err(e) => failed(&v, &e),
    }
}

/// The stored agents the viewer may see, in registration order.
async fn visible_agents<S: Store>(
    c: &Console<S>,
    v: &Viewer,
) -> Result<Vec<StoredAgent>, EngineError> {
    let all = c
        .app
        .engine()
        .store()
        .load_agents()
        .await
        .map_err(EngineError::from)?;
    Ok(all
        .into_iter()
        .filter(|a| may_see_agent(c, v, &a.id))
        .collect())
}

fn subtree(all: &[StoredAgent], root: &AgentId) -> Vec<AgentId> {
    let mut out = vec![root.clone()];
    let mut i = 0;
    while let Some(parent) = out.get(i).cloned() {
        out.extend(
            all.iter()
                .filter(|a| a.parent.as_ref() == Some(&parent))
                .map(|a| a.id.clone()),
        );
        i += 1;
    }
    out
}

/// `GET /console/agents`: the tree with declared and effective
/// capabilities and what each level removed.
pub(crate) async fn agents<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let agents = match visible_agents(&c, &v).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let ids: BTreeSet<&AgentId> = agents.iter().map(|a| &a.id).collect();
    let mut children: BTreeMap<Option<&AgentId>, Vec<&StoredAgent>> = BTreeMap::new();
    for a in &agents {
        let parent = a.parent.as_ref().filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(a);
    }
    fn render<S: Store>(
        c: &Console<S>,
        v: &Viewer,
        children: &BTreeMap<Option<&AgentId>, Vec<&StoredAgent>>,
        at: Option<&AgentId>,
        out: &mut String,
    ) {
        let Some(kids) = children.get(&at) else {
            return;
        };
        out.push_str(if at.is_none() {
            "<ul class=\"tree\">"
        } else {
            "<ul>"
        });
        for a in kids {
            let Ok(view) = c.app.engine().agent(&a.id) else {
                continue;
            };
            let effective: BTreeSet<&str> = view
                .effective_capabilities
                .iter()
                .map(|x| x.as_str())
                .collect();
            let removed: Vec<&str> = view
                .declared_capabilities
                .iter()
                .map(|x| x.as_str())
                .filter(|x| !effective.contains(x))
                .collect();
            let status = match view.status {
                warden_core::hierarchy::AgentStatus::Active => "active",
                warden_core::hierarchy::AgentStatus::Revoked => "revoked",
            };
            let _ = write!(
                out,
                "<li data-agent=\"{id}\"><div class=\"agent\"><h2><code>{id}</code> <span class=\"badge a-{status}\">{status}</span></h2>\
                 <dl><dt>Declared</dt><dd>{}</dd><dt>Effective</dt><dd>{}</dd><dt>Removed at this level</dt><dd>{}</dd></dl>\
                 <p class=\"links\"><a href=\"/console/memory?agent={u}\">Memory</a> · <a href=\"/console/sessions?agent={u}\">Sessions</a>",
                list(
                    view.declared_capabilities
                        .iter()
                        .map(|x| x.as_str().to_owned())
                ),
                list(
                    view.effective_capabilities
                        .iter()
                        .map(|x| x.as_str().to_owned())
                ),
                list(removed),
                id = esc(a.id.as_str()),
                u = url_part(a.id.as_str()),
            );
            if v.is_operator() && status == "active" {
                let _ = write!(
                    out,
                    " · <a class=\"danger\" href=\"/console/agents/{}/revoke\">Revoke subtree…</a>",
                    url_part(a.id.as_str())
                );
            }
            out.push_str("</p></div>");
            render(c, v, children, Some(&a.id), out);
            out.push_str("</li>");
        }
        out.push_str("</ul>");
    }
    let mut body = String::new();
    if agents.is_empty() {
        body.push_str("<p>No agents.</p>");
    }
    render(&c, &v, &children, None, &mut body);
    ok(&v, Section::Hierarchy, "Hierarchy", &body)
}

/// `GET /console/agents/{id}/revoke` (operator): the confirmation step.
pub(crate) async fn revoke_confirm<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return read_only(&v);
    }
    let Ok(agent) = AgentId::parse(&id) else {
        return not_found(&v);
    };
    let all = match visible_agents(&c, &v).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    if !all.iter().any(|a| a.id == agent) {
        return not_found(&v);
    }
    let affected = subtree(&all, &agent);
    let body = format!(
        "<p class=\"notice\" role=\"alert\">Revoking <code>{id}</code> revokes these {n} agents at once: every request with their tokens is refused from then on. This cannot be undone.</p>\
         <p>{}</p><form method=\"post\" action=\"/console/agents/{u}/revoke\">{}\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <button type=\"submit\" class=\"danger\" data-autofocus>Revoke {n} agents</button> <a href=\"/console/agents\">Cancel</a></form>",
        list(affected.iter().map(|a| a.as_str().to_owned())),
        csrf_field(&v),
        id = esc(agent.as_str()),
        u = url_part(agent.as_str()),
        n = affected.len(),
    );
    ok(&v, Section::Hierarchy, &format!("Revoke {agent}?"), &body)
}

#[derive(Deserialize)]
pub(crate) struct RevokeForm {
    csrf: Option<String>,
    confirm: Option<String>,
}

impl HasCsrf for RevokeForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// `POST /console/agents/{id}/revoke` `confirm=yes` (operator).
pub(crate) async fn revoke<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (v, form) = match c.form::<RevokeForm>(&method, &uri, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return read_only(&v);
    }
    let Ok(agent) = AgentId::parse(&id) else {
        return not_found(&v);
    };
    if form.confirm.as_deref() != Some("yes") {
        return message(
            Some(&v),
            StatusCode::BAD_REQUEST,
            "Not confirmed",
            "A revocation needs the confirmation step. Nothing was changed.",
        );
    }
    match c.app.engine().revoke_agent(&v.caller, &agent).await {
        Ok(Revocation::Revoked { decision, agents }) => {
            let body = format!(
                "<p class=\"notice ok\" role=\"status\">Revoked {} agents: {}</p><p>Recorded as {}.</p><p><a href=\"/console/agents\">Back to the hierarchy</a></p>",
                agents.len(),
                list(agents.iter().map(|a| a.as_str().to_owned())),
                reason(decision.reason.as_str())
            );
            ok(&v, Section::Hierarchy, &format!("Revoked {agent}"), &body)
        }
        Ok(Revocation::Refused { decision }) => message(
            Some(&v),
            StatusCode::FORBIDDEN,
            "Refused",
            &super::reasons::explain(decision.reason.as_str()),
        ),
        Err(e) => failed(&v, &e),
    }
}

#[derive(Deserialize)]
pub(crate) struct AgentQuery {
    agent: Option<String>,
}

fn agent_picker(agents: &[StoredAgent], current: Option<&AgentId>, action: &str) -> String {
    let mut s = format!(
        "<form method=\"get\" action=\"{action}\" class=\"picker\"><label for=\"agent\">Agent</label><select id=\"agent\" name=\"agent\">"
    );
    for a in agents {
        let sel = if Some(&a.id) == current {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            s,
            "<option value=\"{0}\"{sel}>{0}</option>",
            esc(a.id.as_str())
        );
    }
    s.push_str("</select><button type=\"submit\">Show</button></form>");
    s
}

fn value_cell(r: &MemoryRecord) -> String {
    if matches!(r.class, RecordClass::Secret { .. }) {
        return "<span class=\"none\">secret: never shown</span>".to_owned();
    }
    let mut text = r.value.to_string();
    if text.len() > 200 {
        let cut = (0..=200)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    format!("<code>{}</code>", esc(&text))
}

/// `GET /console/memory?agent=…`: an agent's own records and what it
/// resolves from its ancestors (as a read would, without recording one).
pub(crate) async fn memory<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let agents = match visible_agents(&c, &v).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let chosen = match (&q.agent, &v.caller) {
        (Some(a), _) => AgentId::parse(a).ok(),
        (None, Caller::Agent(me)) => Some(me.clone()),
        (None, Caller::Operator) => agents.first().map(|a| a.id.clone()),
    };
    let Some(agent) = chosen.filter(|a| agents.iter().any(|x| &x.id == a)) else {
        if q.agent.is_some() {
            return not_found(&v);
        }
        return ok(&v, Section::Memory, "Memory", "<p>No agents.</p>");
    };
    let engine = c.app.engine();
    let view = match engine.agent(&agent) {
        Ok(x) => x,
        Err(e) => return failed(&v, &e),
    };
    // Every key the deployment knows of: the bundle's seeds and every key
    // a write was recorded for.
    let mut keys: BTreeSet<(String, String)> = engine
        .policy()
        .memory
        .iter()
        .map(|m| (m.namespace.as_str().to_owned(), m.key.as_str().to_owned()))
        .collect();
    match whole_audit(&c).await {
        Ok(audit) => keys.extend(
            audit
                .iter()
                .filter(|e| e.draft.operation == warden::ops::MEMORY_WRITE)
                // `owner:namespace.key`
                .filter_map(|e| e.draft.resource.split_once(':'))
                .filter_map(|(_, name)| name.split_once('.'))
                .map(|(n, k)| (n.to_owned(), k.to_owned())),
        ),
        Err(e) => return failed(&v, &e),
    }
    let now = engine.now();
    let mut owned = String::new();
    let mut inherited = String::new();
    for (ns, key) in &keys {
        let (Ok(n), Ok(k)) = (Namespace::parse(ns), Key::parse(key)) else {
            continue;
        };
        let records = match engine.store().get_records(n, k, view.lineage.clone()).await {
            Ok(r) => r,
            Err(e) => return failed(&v, &EngineError::from(e)),
        };
        let name = esc(&format!("{ns}.{key}"));
        if let Some(r) = records.iter().find(|r| r.owner == agent) {
            let _ = write!(
                owned,
                "<tr><td><code>{name}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(r.class.name()),
                esc(r.visibility.as_str()),
                r.revision,
                value_cell(r)
            );
        }
        match resolve(
            &agent,
            view.lineage.iter(),
            |o| records.iter().find(|r| &r.owner == o),
            now,
        ) {
            Resolution::Found {
                record,
                reason: why,
            } if record.owner != agent => {
                let _ = write!(
                    inherited,
                    "<tr><td><code>{name}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(record.owner.as_str()),
                    esc(record.class.name()),
                    esc(record.visibility.as_str()),
                    record.revision,
                    value_cell(record),
                    reason(why.as_str())
                );
            }
            Resolution::Combined {
                value,
                contributors,
                reason: why,
                ..
            } => {
                let owners: Vec<String> = contributors
                    .iter()
                    .map(|c| format!("{} (rev {})", c.owner_agent_id, c.revision))
                    .collect();
                let _ = write!(
                    inherited,
                    "<tr><td><code>{name}</code></td><td>{}</td><td>policy</td><td>descendants</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                    list(owners),
                    contributors.first().map_or(0, |c| c.revision),
                    esc(&value.to_string()),
                    reason(why.as_str())
                );
            }
            Resolution::Denied { reason: why } if v.is_operator() => {
                let _ = write!(
                    inherited,
                    "<tr><td><code>{name}</code></td><td colspan=\"5\" class=\"none\">not visible to {}</td><td>{}</td></tr>",
                    esc(agent.as_str()),
                    reason(why.as_str())
                );
            }
            _ => {}
        }
    }
    let table = |head: &str, rows: &str| {
        if rows.is_empty() {
            "<p>None.</p>".to_owned()
        } else {
            format!(
                "<div class=\"scroll\"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
            )
        }
    };
    let body = format!(
        "{}<p>Lineage: {}</p><h2>Records {} owns</h2>{}<h2>What it resolves from its ancestors</h2>\
         <p class=\"hint\">As a read by this agent would resolve it now; showing it records nothing.</p>{}",
        agent_picker(&agents, Some(&agent), "/console/memory"),
        list(view.lineage.iter().map(|a| a.as_str().to_owned())),
        esc(agent.as_str()),
        table(
            "<th>Key</th><th>Class</th><th>Visibility</th><th>Revision</th><th>Value</th>",
            &owned
        ),
        table(
            "<th>Key</th><th>Owner</th><th>Class</th><th>Visibility</th><th>Revision</th><th>Value</th><th>Why</th>",
            &inherited
        ),
    );
    ok(&v, Section::Memory, &format!("Memory of {agent}"), &body)
}

/// `GET /console/sessions?agent=…`: the sessions the viewer may see.
pub(crate) async fn sessions<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<AgentQuery>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let agents = match visible_agents(&c, &v).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let filter = match q.agent.as_deref().filter(|a| !a.is_empty()) {
        Some(a) => match AgentId::parse(a) {
            Ok(a) => Some(a),
            Err(_) => return not_found(&v),
        },
        None => None,
    };
    let list_of = |a: Option<AgentId>| {
        let caller = v.caller.clone();
        let engine = c.app.engine();
        async move { engine.list_sessions(&caller, a.as_ref(), 500).await }
    };
    let mut records = Vec::new();
    match (&filter, &v.caller) {
        (Some(_), _) | (None, Caller::Operator) => match list_of(filter.clone()).await {
            Ok(r) => records = r,
            Err(e) => return failed(&v, &e),
        },
        (None, Caller::Agent(_)) => {
            for a in &agents {
                match list_of(Some(a.id.clone())).await {
                    Ok(r) => records.extend(r),
                    Err(e) => return failed(&v, &e),
                }
            }
        }
    }
    let mut body = agent_picker(&agents, filter.as_ref(), "/console/sessions");
    body.push_str(
        "<form method=\"get\" action=\"/console/runs\" class=\"picker\"><label for=\"run\">Run id</label>\
         <input id=\"run\" name=\"run\" required><button type=\"submit\">Open run</button></form>",
    );
    if records.is_empty() {
        body.push_str("<p>No sessions.</p>");
    } else {
        body.push_str(
            "<div class=\"scroll\"><table><thead><tr><th>Session</th><th>Agent</th><th>Opened by</th><th>Opened</th>\
             <th>Status</th></tr></thead><tbody>",
        );
        for s in &records {
            let _ = write!(
                body,
                "<tr><td><a href=\"/console/sessions/{}\"><code>{}</code></a></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                url_part(s.session_id.as_str()),
                esc(s.session_id.as_str()),
                esc(s.agent.as_str()),
                esc(&who(&s.opened_by)),
                time(s.created_at),
                esc(&format!("{:?}", s.status).to_lowercase())
            );
        }
        body.push_str("</tbody></table></div>");
    }
    ok(&v, Section::Sessions, "Sessions", &body)
}

/// `GET /console/sessions/{id}`: the calls with their decisions and the
/// provenance of every argument, and the envelope's versions.
pub(crate) async fn session<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Ok(sid) = SessionId::parse(&id) else {
        return not_found(&v);
    };
    let engine = c.app.engine();
    let view = match engine.session(&v.caller, &sid).await {
        Ok(x) => x,
        Err(e) => return failed(&v, &e),
    };
    let s = &view.state.session;
    let mut body = format!(
        "<dl class=\"facts\"><dt>Agent</dt><dd><code>{}</code></dd><dt>Opened by</dt><dd>{}</dd><dt>Opened</dt><dd>{}</dd>\
         <dt>Status</dt><dd>{}</dd><dt>Policy</dt><dd><code>{}</code></dd><dt>Plan</dt><dd>{}</dd>\
         <dt>Index</dt><dd>{} sources, {} fields, {} bytes recorded (fingerprints only)</dd></dl>",
        esc(s.agent.as_str()),
        esc(&who(&s.opened_by)),
        time(s.created_at),
        esc(&format!("{:?}", s.status).to_lowercase()),
        esc(&s.policy_version),
        if s.plan.is_some() {
            "admitted plan"
        } else {
            "none"
        },
        view.index.sources,
        view.index.fields,
        view.index.recorded_bytes,
    );
    body.push_str("<h2>Calls</h2>");
    if view.state.calls.is_empty() {
        body.push_str("<p>No calls yet.</p>");
    }
    body.push_str("<ol class=\"timeline\">");
    for call in &view.state.calls {
        let esc_link = call
            .escalation_id
            .as_ref()
            .map(|e| {
                format!(
                    " · <a href=\"/console/escalations/{}\">escalation {}</a>",
                    url_part(e),
                    esc(e)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<li class=\"call\" data-call=\"{cid}\"><h3>#{} <code>{cid}</code> <code>{}</code> {} <span class=\"badge s-{st}\">{st}</span></h3>\
             <p>{} · decided {}{esc_link}</p><p>Result labels: {}</p>{}</li>",
            call.seq,
            esc(call.action.as_str()),
            verdict(call.verdict.as_str()),
            reason(call.reason.as_str()),
            time(call.decided_at),
            list(call.result_labels.iter().map(|l| l.as_str().to_owned())),
            provenance_table(call.detail.get("provenance").unwrap_or(&Value::Null)),
            cid = esc(call.call_id.as_str()),
            st = call.status.as_str(),
        );
    }
    body.push_str("</ol><h2>Envelope</h2>");
    body.push_str(&envelope_versions(&c, s.envelope_id.as_ref()).await);
    ok(&v, Section::Sessions, &format!("Session {sid}"), &body)
}

#[derive(Deserialize, Default)]
pub(crate) struct AuditFilter {
    after: Option<u64>,
    limit: Option<usize>,
    subject: Option<String>,
    operation: Option<String>,
    verdict: Option<String>,
    reason: Option<String>,
}

impl AuditFilter {
    fn matches(&self, e: &AuditEntry) -> bool {
        let d = &e.draft;
        let has = |f: &Option<String>, value: &str| {
            f.as_deref()
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .is_none_or(|f| value.contains(f))
        };
        has(&self.subject, &d.subject)
            && has(&self.operation, &d.operation)
            && has(&self.reason, &d.reason)
            && self
                .verdict
                .as_deref()
                .filter(|f| !f.is_empty())
                .is_none_or(|f| d.verdict.as_str() == f)
    }

    fn query(&self) -> String {
        let mut q = String::new();
        for (k, f) in [
            ("subject", &self.subject),
            ("operation", &self.operation),
            ("verdict", &self.verdict),
            ("reason", &self.reason),
        ] {
            if let Some(f) = f.as_deref().filter(|f| !f.is_empty()) {
                let _ = write!(q, "&{k}={}", url_part(f));
            }
        }
        q
    }
}

/// `GET /console/audit` (operator): the chain's status and head, and the
/// log, filtered.
pub(crate) async fn audit<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(f): Query<AuditFilter>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return message(
            Some(&v),
            StatusCode::FORBIDDEN,
            "Operator only",
            "The decision log is the operator's.",
        );
    }
    let engine = c.app.engine();
    let verify = match engine.verify_audit().await {
        Ok(x) => x,
        Err(e) => return failed(&v, &e),
    };
    let limit = f.limit.unwrap_or(100).clamp(1, 1000);
    let mut after = f.after.unwrap_or(0);
    let mut found = Vec::new();
    let mut scanned = 0;
    let mut more = false;
    'scan: loop {
        let page = match engine.audit_page(after, AUDIT_BATCH).await {
            Ok(p) => p,
            Err(e) => return failed(&v, &e),
        };
        let n = page.len();
        for e in page {
            after = e.seq;
            scanned += 1;
            if f.matches(&e) {
                found.push(e);
                if found.len() == limit {
                    more = true;
                    break 'scan;
                }
            }
            if scanned >= AUDIT_SCAN {
                more = true;
                break 'scan;
            }
        }
        if n < AUDIT_BATCH {
            break;
        }
    }
    let status = match &verify.problem {
        None => format!(
            "<p class=\"notice ok\" role=\"status\" data-chain=\"valid\">The chain is intact: {} entries verified up to the recorded head.</p>",
            verify.head.count
        ),
        Some(p) => format!(
            "<p class=\"notice\" role=\"alert\" data-chain=\"invalid\">The chain is broken at entry {}: {}</p>",
            p.seq,
            esc(&p.message)
        ),
    };
    let sel = |x: &str| {
        if f.verdict.as_deref() == Some(x) {
            " selected"
        } else {
            ""
        }
    };
    let val = |x: &Option<String>| esc(x.as_deref().unwrap_or(""));
    let mut body = format!(
        "{status}<dl class=\"facts\"><dt>Head</dt><dd>entry {} · <code class=\"hash\">{}</code></dd></dl>\
         <form method=\"get\" action=\"/console/audit\" class=\"filters\">\
         <label>Who <input name=\"subject\" value=\"{}\"></label>\
         <label>Operation <input name=\"operation\" value=\"{}\"></label>\
         <label>Reason <input name=\"reason\" value=\"{}\"></label>\
         <label>Verdict <select name=\"verdict\"><option value=\"\">any</option>\
         <option{}>allow</option><option{}>constrain</option><option{}>deny</option><option{}>escalate</option></select></label>\
         <button type=\"submit\">Filter</button></form>\
         <p><a href=\"/console/audit/export?{}\" download>Export these entries (JSON Lines)</a></p>",
        verify.head.seq,
        esc(&verify.head.hash.to_hex()),
        val(&f.subject),
        val(&f.operation),
        val(&f.reason),
        sel("allow"),
        sel("constrain"),
        sel("deny"),
        sel("escalate"),
        f.query().trim_start_matches('&'),
    );
    let refs: Vec<&AuditEntry> = found.iter().collect();
    body.push_str(&audit_table(&refs));
    if more {
        let _ = write!(
            body,
            "<p><a href=\"/console/audit?after={after}&limit={limit}{}\">Later entries</a></p>",
            f.query()
        );
    }
    ok(&v, Section::Audit, "Audit", &body)
}

/// `GET /console/audit/export` (operator): the matching entries as JSON
/// Lines, as stored (hashes included, so the export can be verified).
pub(crate) async fn audit_export<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(f): Query<AuditFilter>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if !v.is_operator() {
        return message(
            Some(&v),
            StatusCode::FORBIDDEN,
            "Operator only",
            "The decision log is the operator's.",
        );
    }
    let all = match whole_audit(&c).await {
        Ok(a) => a,
        Err(e) => return failed(&v, &e),
    };
    let mut out = String::new();
    for e in all.iter().filter(|e| f.matches(e)) {
        if let Ok(line) = serde_json::to_string(e) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let mut r = (StatusCode::OK, out).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"warden-audit.jsonl\""),
    );
    r
}

#[derive(Deserialize)]
pub(crate) struct RunQuery {
    run: Option<String>,
}

/// `GET /console/runs?run=…`: to the run's page.
pub(crate) async fn run_lookup<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<RunQuery>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    match q.run.as_deref().map(str::trim).map(RunId::parse) {
        Some(Ok(run)) => see_other(&format!("/console/runs/{}", url_part(run.as_str()))),
        _ => not_found(&v),
    }
}

/// `GET /console/runs/{id}`: a run's steps with each outcome, and its
/// envelope's versions (the run's agent, an ancestor, the operator).
pub(crate) async fn run<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let v = match c.viewer(&method, &uri, &headers).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Ok(run_id) = RunId::parse(&id) else {
        return not_found(&v);
    };
    let engine = c.app.engine();
    match engine
        .run_visibility(
            &v.caller,
            &run_id,
            warden::ops::CONTEXT_READ,
            RunAccess::OwnerOrAncestor,
        )
        .await
    {
        Ok(RunVisibility::Visible(_)) => {}
        Ok(RunVisibility::Hidden { .. }) => return not_found(&v),
        Err(e) => return failed(&v, &e),
    }
    let state = match engine.store().get_run(run_id.clone()).await {
        Ok(Some(s)) => s,
        Ok(None) => return not_found(&v),
        Err(e) => return failed(&v, &EngineError::from(e)),
    };
    let r = &state.run;
    let mut body = format!(
        "<dl class=\"facts\"><dt>Agent</dt><dd><code>{}</code></dd><dt>Admitted</dt><dd>{}</dd>\
         <dt>Policy</dt><dd><code>{}</code></dd></dl><h2>Steps</h2><ol class=\"timeline\">",
        esc(r.agent.as_str()),
        time(r.created_at),
        esc(&r.policy_version)
    );
    for step in &r.steps {
        let outcome = state.outcomes.get(&step.step_id);
        let status = outcome.map_or("not begun".to_owned(), |o| {
            format!("{:?}", o.status).to_lowercase()
        });
        let _ = write!(
            body,
            "<li class=\"call\"><h3><code>{}</code> <code>{}</code> <span class=\"badge s-{st}\">{st}</span></h3>",
            esc(step.step_id.as_str()),
            esc(step.action.as_str()),
            st = esc(&status)
        );
        if let Some(o) = outcome {
            let _ = write!(
                body,
                "<p>Recorded {}{} · result labels: {}</p>",
                time(o.recorded_at),
                o.error
                    .as_deref()
                    .map(|e| format!(" · {}", reason(e)))
                    .unwrap_or_default(),
                list(o.labels.iter().map(|l| l.as_str().to_owned()))
            );
        }
        body.push_str("</li>");
    }
    body.push_str("</ol><h2>Envelope</h2>");
    body.push_str(&envelope_versions(&c, r.envelope_id.as_ref()).await);
    ok(&v, Section::Sessions, &format!("Run {run_id}"), &body)
}

/// Every version of an envelope, oldest first.
async fn envelope_versions<S: Store>(
    c: &Console<S>,
    id: Option<&warden_core::envelope::EnvelopeId>,
) -> String {
    let engine = c.app.engine();
    let Some(id) = id else {
        return "<p>No context envelope.</p>".to_owned();
    };
    let Ok(Some(latest)) = engine.envelope(id, None).await else {
        return "<p class=\"none\">The envelope is not stored.</p>".to_owned();
    };
    let mut body = String::from(
        "<div class=\"scroll\"><table><thead><tr><th>Version</th><th>Sensitivity</th><th>Labels</th>\
         <th>Derived</th><th>Restrictions</th></tr></thead><tbody>",
    );
    for ver in 1..=latest.version {
        if let Ok(Some(r)) = engine.envelope(id, Some(ver)).await {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                r.version,
                esc(r.aggregate_sensitivity.as_str()),
                list(r.labels.iter().map(|l| l.as_str().to_owned())),
                list(r.derived.iter().map(|l| l.as_str().to_owned())),
                list(r.restrictions.iter().map(|l| l.as_str().to_owned()))
            );
        }
    }
    body.push_str("</tbody></table></div>");
    body
}
