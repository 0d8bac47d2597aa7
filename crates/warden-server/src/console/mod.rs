//! The web console at `/console`: the human side of governance, served by
//! the same process as the API and compiled into it (HTML rendered here,
//! one stylesheet and one small script from [`include_str!`]).
//!
//! The console decides nothing itself. Every page reads through the
//! engine, and every action (approve, reject, revoke) is an engine call
//! made with the identity of the signed-in token: the operator's token acts
//! as the operator; an agent's token signs in read-only and sees its own
//! subtree only. Sign-in verifies the token with
//! [`warden::Engine::authenticate`], the API's own path; see [`session`]
//! for the cookie, CSRF and expiry.
//!
//! Every answer carries a strict Content-Security-Policy (no inline
//! script or style), `nosniff`, `Referrer-Policy: same-origin` (so a
//! browser's own form posts carry their `Origin`), `frame-ancestors 'none'`
//! and `no-store`. A POST from another origin (`Origin` not this host) is
//! refused before anything else.

mod html;
mod pages;
mod reasons;
pub(crate) mod session;

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use warden::Authentication;
use warden_store::Store;

use crate::state::AppState;
use html::{Section, esc, page};
use session::{NoViewer, Sessions, Viewer};

pub use session::SECURE_COOKIE_ENV;

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// The Content-Security-Policy of every console answer.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Largest form body, in bytes.
const MAX_FORM_BYTES: usize = 16 * 1024;

/// What console handlers share: the server's state and the sessions.
pub(crate) struct Console<S> {
    pub(crate) app: AppState<S>,
    pub(crate) sessions: Arc<Sessions>,
}

impl<S> Clone for Console<S> {
    fn clone(&self) -> Self {
        Self {
            app: self.app.clone(),
            sessions: Arc::clone(&self.sessions),
        }
    }
}

/// The console's routes, to be nested at `/console` (each router gets its
/// own sessions).
pub(crate) fn router<S: Store>() -> Router<AppState<S>> {
    let secure =
        std::env::var(SECURE_COOKIE_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"));
    Router::new()
        .route("/", get(index::<S>))
        .route("/sign-in", get(sign_in_form::<S>).post(sign_in::<S>))
        .route("/sign-out", post(sign_out::<S>))
        .route("/escalations", get(pages::escalations::<S>))
        .route("/escalations/{id}", get(pages::escalation::<S>))
        .route("/escalations/{id}/approve", post(pages::approve::<S>))
        .route("/escalations/{id}/reject", post(pages::reject::<S>))
        .route("/agents", get(pages::agents::<S>))
        .route(
            "/agents/{id}/revoke",
            get(pages::revoke_confirm::<S>).post(pages::revoke::<S>),
        )
        .route("/memory", get(pages::memory::<S>))
        .route("/sessions", get(pages::sessions::<S>))
        .route("/sessions/{id}", get(pages::session::<S>))
        .route("/runs", get(pages::run_lookup::<S>))
        .route("/runs/{id}", get(pages::run::<S>))
        .route("/audit", get(pages::audit::<S>))
        .route("/audit/export", get(pages::audit_export::<S>))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(map_response(security_headers))
        .layer(Extension(Sessions::new(secure)))
}

impl<S: Store> FromRequestParts<AppState<S>> for Console<S> {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, app: &AppState<S>) -> Result<Self, Response> {
        match parts.extensions.get::<Arc<Sessions>>() {
            Some(sessions) => Ok(Self {
                app: app.clone(),
                sessions: Arc::clone(sessions),
            }),
            None => Err(StatusCode::INTERNAL_SERVER_ERROR.into_response()),
        }
    }
}

async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
        .into_response()
}

/// An HTML answer.
pub(crate) fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// A 303 to `to`.
pub(crate) fn see_other(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// A page with a message and a status.
pub(crate) fn message(
    viewer: Option<&Viewer>,
    status: StatusCode,
    title: &str,
    text: &str,
) -> Response {
    html(
        status,
        page(
            viewer,
            Section::None,
            title,
            &format!("<p class=\"notice\" role=\"alert\">{}</p>", esc(text)),
        ),
    )
}

async fn not_found() -> Response {
    message(
        None,
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page.",
    )
}

impl<S: Store> Console<S> {
    /// The viewer of a request, or the answer to give instead (to sign-in,
    /// with the reason).
    pub(crate) async fn viewer(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Result<Viewer, Box<Response>> {
        let route = format!("{method} /console{}", uri.path());
        match self.sessions.viewer(&self.app, headers, &route).await {
            Ok(v) => Ok(v),
            Err(NoViewer::Throttled) => Err(Box::new(message(
                None,
                StatusCode::TOO_MANY_REQUESTS,
                "Slow down",
                "This agent is over its request rate; try again in a moment.",
            ))),
            Err(why) => {
                let to = match why {
                    NoViewer::Expired => "/console/sign-in?why=expired",
                    NoViewer::Revoked => "/console/sign-in?why=revoked",
                    _ => "/console/sign-in",
                };
                let mut r = see_other(to);
                if let Ok(v) = HeaderValue::from_str(&self.sessions.clear_cookie()) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
                Err(Box::new(r))
            }
        }
    }

    /// The viewer of a state-changing form: signed in, from this origin,
    /// with the session's CSRF token; parsed form fields as `F`.
    pub(crate) async fn form<F: for<'de> Deserialize<'de> + HasCsrf>(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<(Viewer, F), Box<Response>> {
        same_origin(headers)?;
        let viewer = self.viewer(method, uri, headers).await?;
        let refused = || {
            message(
                Some(&viewer),
                StatusCode::FORBIDDEN,
                "Form refused",
                "This form was not sent from this console session (missing or wrong CSRF token). Nothing was changed.",
            )
        };
        let form: F = serde_urlencoded::from_bytes(body).map_err(|_| Box::new(refused()))?;
        if !session::csrf_ok(&viewer, form.csrf()) {
            return Err(Box::new(refused()));
        }
        Ok((viewer, form))
    }
}

/// A form with a CSRF field.
pub(crate) trait HasCsrf {
    fn csrf(&self) -> Option<&str>;
}

/// Refuse a POST whose `Origin` is another site (browsers send it on every
/// POST); a request without one (not a browser's) passes to the CSRF check.
fn same_origin(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = origin.to_str().ok();
    let ok = match (origin, host) {
        (Some(o), Some(h)) => o
            .split_once("://")
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(h)),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Box::new(message(
            None,
            StatusCode::FORBIDDEN,
            "Form refused",
            "This form was sent from another site. Nothing was changed.",
        )))
    }
}

async fn index<S: Store>(c: Console<S>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    match c.viewer(&method, &uri, &headers).await {
        Ok(_) => see_other("/console/escalations"),
        Err(r) => *r,
    }
}

#[derive(Deserialize)]
struct Why {
    why: Option<String>,
}

/// The sign-in form, with a fresh CSRF token in the form and in its cookie.
fn sign_in_page(sessions: &Sessions, status: StatusCode, note: Option<&str>) -> Response {
    let note = note
        .map(|n| format!("<p class=\"notice\" role=\"alert\">{}</p>", esc(n)))
        .unwrap_or_default();
    let Ok(token) = session::random_hex() else {
        return message(
            None,
            StatusCode::INTERNAL_SERVER_ERROR,
            "Sign in",
            "No randomness is available; sign-in is not possible.",
        );
    };
    let mut r = html(
        status,
        page(
            None,
            Section::None,
            "Sign in",
            &format!(
                "{note}<form method=\"post\" action=\"/console/sign-in\" class=\"sign-in\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{token}\">\
                 <label for=\"token\">Token (the operator's, or an agent's for a read-only view of its subtree)</label>\
                 <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required data-autofocus>\
                 <button type=\"submit\">Sign in</button></form>"
            ),
        ),
    );
    if let Ok(v) = HeaderValue::from_str(&sessions.pre_cookie(&token)) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

async fn sign_in_form<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<Why>,
) -> Response {
    if c.sessions
        .viewer(
            &c.app,
            &headers,
            &format!("{method} /console{}", uri.path()),
        )
        .await
        .is_ok()
    {
        return see_other("/console/escalations");
    }
    let note = match q.why.as_deref() {
        Some("expired") => Some("Your session expired; sign in again."),
        Some("revoked") => Some("The token or its agent was revoked; you were signed out."),
        Some("signed-out") => Some("You are signed out."),
        _ => None,
    };
    sign_in_page(&c.sessions, StatusCode::OK, note)
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
    csrf: Option<String>,
}

async fn sign_in<S: Store>(c: Console<S>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = same_origin(&headers) {
        return *r;
    }
    let form = serde_urlencoded::from_bytes::<SignIn>(&body).ok();
    let expected = session::cookie_value(&headers, session::PRE_COOKIE);
    let fresh = match (
        form.as_ref().and_then(|f| f.csrf.as_deref()),
        expected.as_deref(),
    ) {
        (Some(sent), Some(expected)) => session::same_token(sent, expected),
        _ => false,
    };
    if !fresh {
        return sign_in_page(
            &c.sessions,
            StatusCode::FORBIDDEN,
            Some("The sign-in form was not sent from this console (or it expired); try again."),
        );
    }
    let Some(SignIn { token, .. }) = form else {
        return sign_in_page(&c.sessions, StatusCode::BAD_REQUEST, Some("Enter a token."));
    };
    let token = token.trim();
    if token.is_empty() || token.len() > warden::MAX_TOKEN_LEN {
        return sign_in_page(
            &c.sessions,
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid."),
        );
    }
    let caller = match c
        .app
        .engine()
        .authenticate(token, "POST /console/sign-in")
        .await
    {
        Ok(Authentication::Operator) => warden::Caller::Operator,
        Ok(Authentication::Agent(a)) => warden::Caller::Agent(a),
        Ok(Authentication::Throttled { .. }) => {
            return sign_in_page(
                &c.sessions,
                StatusCode::TOO_MANY_REQUESTS,
                Some("Too many requests for this agent; try again in a moment."),
            );
        }
        Ok(Authentication::TokenRevoked) => {
            return sign_in_page(
                &c.sessions,
                StatusCode::UNAUTHORIZED,
                Some("That token was revoked."),
            );
        }
        Ok(Authentication::AgentRevoked { .. }) => {
            return sign_in_page(
                &c.sessions,
                StatusCode::FORBIDDEN,
                Some("That token's agent was revoked."),
            );
        }
        Ok(_) => {
            return sign_in_page(
                &c.sessions,
                StatusCode::UNAUTHORIZED,
                Some("That token is not valid."),
            );
        }
        Err(e) => {
            tracing::error!(error = %e, "console: sign-in failed");
            return sign_in_page(
                &c.sessions,
                StatusCode::INTERNAL_SERVER_ERROR,
                Some("Sign-in failed; see the server log."),
            );
        }
    };
    let Some(id) = c.sessions.create(token, caller, c.app.now_ms()) else {
        return sign_in_page(
            &c.sessions,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("Too many console sessions are open; try again later."),
        );
    };
    let mut r = see_other("/console/escalations");
    for cookie in [c.sessions.cookie(&id), c.sessions.clear_pre_cookie()] {
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            r.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    r
}

#[derive(Deserialize)]
pub(crate) struct CsrfOnly {
    csrf: Option<String>,
}

impl HasCsrf for CsrfOnly {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

async fn sign_out<S: Store>(
    c: Console<S>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (viewer, _) = match c.form::<CsrfOnly>(&method, &uri, &headers, &body).await {
        Ok(v) => v,
        Err(r) => return *r,
    };
    c.sessions.remove(&viewer.id);
    let mut r = see_other("/console/sign-in?why=signed-out");
    if let Ok(v) = HeaderValue::from_str(&c.sessions.clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
