//! Console sessions: signing in with a token, the session cookie, CSRF
//! tokens, expiry.
//!
//! A console session lives in this server process's memory (a restart
//! signs everyone out; several servers behind one address need sticky
//! routing). Its id (256 random bits) is the only thing the browser holds,
//! in a cookie `HttpOnly; SameSite=Strict; Path=/console` (plus `Secure`
//! when configured). The token that signed in is kept with the session,
//! in memory only, and verified again by the engine on every request
//! ([`warden::Engine::authenticate`], the same path as the API's bearer
//! tokens), so a revoked token or agent is signed out on its next page.
//! Every state-changing form carries the session's CSRF token
//! (synchroniser token, compared in constant time). The sign-in form,
//! which comes before any session, carries a token that must equal the
//! one in its own short-lived cookie (`warden_console_signin`, same flags),
//! which a page of another site can neither read nor set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq;
use warden::{Authentication, Caller};
use warden_store::Store;

use crate::state::AppState;

/// The cookie's name.
pub(crate) const COOKIE: &str = "warden_console";

/// The cookie holding the sign-in form's CSRF token.
pub(crate) const PRE_COOKIE: &str = "warden_console_signin";

/// An unused session ends after this long (milliseconds).
pub(crate) const IDLE_MS: i64 = 30 * 60 * 1000;

/// Any session ends this long after sign-in (milliseconds).
pub(crate) const ABSOLUTE_MS: i64 = 12 * 60 * 60 * 1000;

/// Most sessions held at once; past it, sign-in is refused until some
/// expire or sign out.
pub(crate) const MAX_SESSIONS: usize = 4096;

/// The environment variable that adds `Secure` to the cookie (`1` or
/// `true`): set it when the console is served over HTTPS.
pub const SECURE_COOKIE_ENV: &str = "WARDEN_CONSOLE_SECURE_COOKIE";

struct Entry {
    secret: String,
    caller: Caller,
    csrf: String,
    created_ms: i64,
    seen_ms: i64,
}

/// Who is signed in on this request.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    /// The token's identity.
    pub(crate) caller: Caller,
    /// The session's CSRF token.
    pub(crate) csrf: String,
    /// The session id.
    pub(crate) id: String,
}

impl Viewer {
    pub(crate) fn is_operator(&self) -> bool {
        matches!(self.caller, Caller::Operator)
    }
}

/// Why a request has no viewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoViewer {
    /// No cookie, or no such session.
    SignedOut,
    /// The session expired.
    Expired,
    /// The token or its agent was revoked since sign-in.
    Revoked,
    /// The agent is over its request rate.
    Throttled,
}

/// The sessions of one server.
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Entry>>,
    secure: bool,
}

/// 256 random bits, hex.
pub(crate) fn random_hex() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)?;
    Ok(hex::encode(b))
}

impl Sessions {
    pub(crate) fn new(secure: bool) -> Arc<Self> {
        Arc::new(Self {
            map: Mutex::new(HashMap::new()),
            secure,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Start a session for `caller`, signed in with `secret`. `None` when
    /// the table is full or no randomness is available.
    pub(crate) fn create(&self, secret: &str, caller: Caller, now_ms: i64) -> Option<String> {
        let id = random_hex().ok()?;
        let csrf = random_hex().ok()?;
        let mut map = self.lock();
        map.retain(|_, e| live(e, now_ms));
        if map.len() >= MAX_SESSIONS {
            return None;
        }
        map.insert(
            id.clone(),
            Entry {
                secret: secret.to_owned(),
                caller,
                csrf,
                created_ms: now_ms,
                seen_ms: now_ms,
            },
        );
        Some(id)
    }

    /// End a session.
    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// The `Set-Cookie` value starting the session `id`.
    pub(crate) fn cookie(&self, id: &str) -> String {
        format!(
            "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{}",
            ABSOLUTE_MS / 1000,
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The `Set-Cookie` value carrying the sign-in form's CSRF token
    /// (before there is a session, the form's token must equal this
    /// cookie's: a page of another site can set neither).
    pub(crate) fn pre_cookie(&self, token: &str) -> String {
        format!(
            "{PRE_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/console; Max-Age=900{}",
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The `Set-Cookie` value ending the sign-in form's token.
    pub(crate) fn clear_pre_cookie(&self) -> String {
        format!(
            "{PRE_COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0{}",
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The `Set-Cookie` value ending the session.
    pub(crate) fn clear_cookie(&self) -> String {
        format!(
            "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0{}",
            if self.secure { "; Secure" } else { "" }
        )
    }

    /// The viewer of a request: its session, still live, whose token the
    /// engine still accepts (`route` is what a refusal records).
    pub(crate) async fn viewer<S: Store>(
        &self,
        app: &AppState<S>,
        headers: &HeaderMap,
        route: &str,
    ) -> Result<Viewer, NoViewer> {
        let id = session_id(headers).ok_or(NoViewer::SignedOut)?;
        let now = app.now_ms();
        let secret = {
            let mut map = self.lock();
            let Some(e) = map.get(&id) else {
                return Err(NoViewer::SignedOut);
            };
            if !live(e, now) {
                map.remove(&id);
                return Err(NoViewer::Expired);
            }
            e.secret.clone()
        };
        let caller = match app.engine().authenticate(&secret, route).await {
            Ok(Authentication::Operator) => Caller::Operator,
            Ok(Authentication::Agent(a)) => Caller::Agent(a),
            Ok(Authentication::Throttled { .. }) => return Err(NoViewer::Throttled),
            Ok(_) => {
                self.remove(&id);
                return Err(NoViewer::Revoked);
            }
            Err(e) => {
                tracing::warn!(error = %e, "console: authentication failed");
                return Err(NoViewer::SignedOut);
            }
        };
        let mut map = self.lock();
        let Some(e) = map.get_mut(&id) else {
            return Err(NoViewer::SignedOut);
        };
        if e.caller != caller {
            map.remove(&id);
            return Err(NoViewer::Revoked);
        }
        e.seen_ms = now;
        Ok(Viewer {
            caller,
            csrf: e.csrf.clone(),
            id,
        })
    }
}

fn live(e: &Entry, now_ms: i64) -> bool {
    now_ms.saturating_sub(e.seen_ms) < IDLE_MS && now_ms.saturating_sub(e.created_ms) < ABSOLUTE_MS
}

/// The value of the request's cookie `name`, if it is 64 hex digits.
pub(crate) fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The session id of the request's cookie, if it has one of the right
/// shape.
fn session_id(headers: &HeaderMap) -> Option<String> {
    cookie_value(headers, COOKIE)
}

/// Whether two tokens are equal (constant time).
pub(crate) fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Whether `sent` is the session's CSRF token (constant time).
pub(crate) fn csrf_ok(viewer: &Viewer, sent: Option<&str>) -> bool {
    sent.is_some_and(|s| same_token(s, &viewer.csrf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer(csrf: &str) -> Viewer {
        Viewer {
            caller: Caller::Operator,
            csrf: csrf.to_owned(),
            id: "x".into(),
        }
    }

    #[test]
    fn csrf_must_match_exactly() {
        let v = viewer("abc");
        assert!(csrf_ok(&v, Some("abc")));
        assert!(!csrf_ok(&v, Some("abd")));
        assert!(!csrf_ok(&v, Some("ab")));
        assert!(!csrf_ok(&v, Some("")));
        assert!(!csrf_ok(&v, None));
    }

    #[test]
    fn sessions_expire_when_idle_or_old() {
        let s = Sessions::new(false);
        let id = s.create("t", Caller::Operator, 0).unwrap();
        assert_eq!(id.len(), 64);
        let map = s.lock();
        let e = map.get(&id).unwrap();
        assert!(live(e, IDLE_MS - 1));
        assert!(!live(e, IDLE_MS));
        drop(map);
        let mut map = s.lock();
        let e = map.get_mut(&id).unwrap();
        e.seen_ms = ABSOLUTE_MS - 1;
        assert!(!live(e, ABSOLUTE_MS));
    }

    #[test]
    fn cookie_flags() {
        let c = Sessions::new(false).cookie("ab");
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict"));
        assert!(c.contains("Path=/console") && !c.contains("Secure"));
        assert!(Sessions::new(true).cookie("ab").ends_with("; Secure"));
    }

    #[test]
    fn only_well_formed_session_ids_are_read() {
        let mut h = HeaderMap::new();
        let id = "a".repeat(64);
        h.insert(
            header::COOKIE,
            format!("other=1; {COOKIE}={id}").parse().unwrap(),
        );
        assert_eq!(session_id(&h), Some(id));
        h.insert(header::COOKIE, format!("{COOKIE}=zz").parse().unwrap());
        assert_eq!(session_id(&h), None);
    }
}
