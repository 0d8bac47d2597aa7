//! Access: who a bearer token names, whether that caller may use a route,
//! within its request rate, and which agents and runs it may see. Every
//! refusal a subject can be named for is a recorded decision.
//!
//! [`Engine::authenticate`] looks the token's hash up in the engine's
//! token cache, else in the store (a token found active is cached; see
//! `tokens` for how revocations leave the cache: at once through this
//! engine, within the hierarchy cache's bound through another), and
//! compares the stored hash with the computed one in constant time. A
//! token whose agent this engine's cache does not know yet (another engine
//! sharing the store registered it moments ago) makes the engine look the
//! agent up in the store once ([`Engine::refresh_agent`]) rather than
//! refuse it.
//!
//! Outcomes, and what is recorded (`auth.request`, resource = the route):
//!
//! - an unknown or malformed token: [`Authentication::Invalid`], a revoked
//!   one: [`Authentication::TokenRevoked`]; not recorded (there is no
//!   subject to record, and recording them would let anyone grow the log);
//! - a genuine token of a revoked agent: [`Authentication::AgentRevoked`],
//!   recorded `agent_revoked`;
//! - an agent over a request rate: [`Authentication::Throttled`], reason
//!   `quota_requests_per_second`. Each request is charged to the agent's
//!   own `requests_per_second` bucket and to the `tree_requests_per_second`
//!   bucket of the agent and of every ancestor that has one, all or none
//!   (so ten children of one parent share the parent's tree rate). The
//!   first refusal of an agent opens a one-second window and is recorded
//!   (details: `limit` `agent` or `tree`, the `tree`'s agent, the rate);
//!   later refusals in the window are only counted, and the count is
//!   recorded as one entry (`{"suppressed": N, "window_start": MS,
//!   "window_end": MS}`, resource `requests refused in the window`) at the
//!   agent's next recorded refusal or accepted request, or when any request
//!   (or [`Engine::flush_refusal_counts`]) finds the window closed. A
//!   throttled agent adds at most about two entries per window, and the
//!   entries still say how many requests were refused: the recorded ones
//!   plus the `suppressed` counts. Counts still open when the process
//!   stops are lost with it.
//!
//!   The buckets are the **store's** ([`Store::take_request_tokens`], the
//!   one rule of `warden_store::rates`, burst = rate): engines sharing a
//!   store share them, so the rates hold across servers (PostgreSQL
//!   charges them in one statement; the in-memory store and SQLite keep
//!   them in the process, which is then the whole deployment, and a
//!   restart refills them). A request of an agent with no rate quota on
//!   its lineage costs no round trip. The refusal windows are kept per
//!   engine: each server records an agent's first refusal of a window
//!   and counts the rest.
//!
//! Route refusals ([`Engine::refuse_route`]: `operator_only`,
//! `agent_token_required`) are recorded under `auth.request` too.
//!
//! Visibility: an agent is visible to the operator, to itself and to its
//! active ancestors ([`Engine::read_agent`], [`Engine::agent_visibility`]);
//! a run to its agent, the operator and, where the operation allows it, an
//! active ancestor of its agent ([`Engine::run_visibility`]). A missing
//! thing and one the caller may not see are told apart only in the log.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::json;
use subtle::ConstantTimeEq;
use warden_core::decision::{Decision, Reason, Verdict, reasons};
use warden_core::envelope::EnvelopeRecord;
use warden_core::hierarchy::AgentStatus;
use warden_core::ids::{AgentId, RunId};
use warden_core::time::Timestamp;
use warden_store::{RateCharge, RunRecord, Store, TakeTokens, TokenSubject};

use crate::agents::AgentView;
use crate::engine::{Caller, Engine, engine_reasons as er, ops};
use crate::error::{EngineError, Missing};
use crate::tokens::{hash_token, well_formed};

/// Longest route (audit resource) recorded for a request, in bytes.
const MAX_ROUTE_BYTES: usize = 256;

/// The resource of an entry counting refusals not recorded one by one.
const SUPPRESSED_RESOURCE: &str = "requests refused in the window";

/// Who a token names, or why it names no one who may act now.
#[derive(Debug, Clone, PartialEq)]
pub enum Authentication {
    /// The operator's token.
    Operator,
    /// An active agent's token, within the agent's request rate.
    Agent(AgentId),
    /// Unknown or malformed (not recorded).
    Invalid,
    /// A revoked token (not recorded).
    TokenRevoked,
    /// A genuine token of a revoked agent; the denial was recorded.
    AgentRevoked {
        /// The recorded decision (`agent_revoked`).
        decision: Decision,
    },
    /// The agent is over its `requests_per_second`, or its request would
    /// take its own or an ancestor's subtree over `tree_requests_per_second`.
    /// Recorded if it is the agent's first refusal in its window, counted
    /// otherwise (see the module docs).
    Throttled {
        /// The decision (`quota_requests_per_second`).
        decision: Decision,
        /// Whether this refusal has its own entry (false: it was counted,
        /// and the count is recorded later).
        recorded: bool,
        /// The rate of the limit that refused it.
        requests_per_second: u32,
        /// The agent whose `tree_requests_per_second` refused it (itself
        /// or an ancestor); `None` for its own `requests_per_second`.
        tree: Option<AgentId>,
        /// How long until the next request would be taken, in
        /// milliseconds.
        retry_after_ms: u64,
    },
}

impl Authentication {
    /// The caller, if the token names one who may act.
    pub fn caller(&self) -> Option<Caller> {
        match self {
            Authentication::Operator => Some(Caller::Operator),
            Authentication::Agent(a) => Some(Caller::Agent(a.clone())),
            _ => None,
        }
    }
}

/// Why an authenticated caller may not use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteRefusal {
    /// The route needs the operator token; an agent's was presented.
    OperatorOnly,
    /// The route acts as an agent; the operator token was presented.
    AgentTokenRequired,
}

impl RouteRefusal {
    /// The reason recorded.
    pub fn reason(self) -> Reason {
        match self {
            RouteRefusal::OperatorOnly => er::OPERATOR_ONLY,
            RouteRefusal::AgentTokenRequired => er::AGENT_TOKEN_REQUIRED,
        }
    }
}

/// What [`Engine::read_agent`] decided (recorded either way, `agent.read`).
#[derive(Debug, Clone)]
pub enum AgentRead {
    /// The caller may see the agent.
    Visible {
        /// The agent.
        agent: Box<AgentView>,
        /// The recorded decision (`operator`, `self`, `ancestor`).
        decision: Decision,
    },
    /// The agent is missing or not the caller's to see.
    Hidden {
        /// The recorded decision (`unknown_agent`, `not_an_ancestor`).
        decision: Decision,
    },
}

/// What [`Engine::agent_visibility`] decided (recorded only when hidden).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentVisibility {
    /// The caller may see the agent, for this reason (`operator`, `self`,
    /// `ancestor`; not recorded: the operation that follows records its
    /// own decision).
    Visible {
        /// Why.
        reason: Reason,
    },
    /// The agent is missing or not the caller's to see.
    Hidden {
        /// The recorded decision (`unknown_agent`, `not_an_ancestor`).
        decision: Decision,
    },
}

/// Who besides the run's agent and the operator may act on a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAccess {
    /// Only the run's agent and the operator.
    Owner,
    /// Also an active ancestor of the run's agent.
    OwnerOrAncestor,
}

/// What [`Engine::run_visibility`] decided.
#[derive(Debug, Clone)]
pub enum RunVisibility {
    /// The caller may act on the run (not recorded: the operation that
    /// follows records its own decision).
    Visible(Box<RunRecord>),
    /// The run exists and is not the caller's; the denial was recorded
    /// (`not_run_agent`).
    Hidden {
        /// The recorded decision.
        decision: Decision,
    },
}

/// What [`Engine::read_envelope`] decided.
#[derive(Debug, Clone)]
pub enum EnvelopeRead {
    /// The run's latest envelope; the read was recorded (`context.read`,
    /// `envelope_read`, with the run, version and classification).
    Read {
        /// The envelope.
        envelope: Box<EnvelopeRecord>,
        /// The recorded decision.
        decision: Decision,
    },
    /// The run is not the caller's; the denial was recorded
    /// (`not_run_agent`).
    Hidden {
        /// The recorded decision.
        decision: Decision,
    },
}

/// Which bucket a request is charged to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum BucketKey {
    /// The agent's own `requests_per_second`.
    Agent(AgentId),
    /// The `tree_requests_per_second` of this agent's subtree.
    Tree(AgentId),
}

impl BucketKey {
    /// The key the store keeps the bucket under: `agent:ID` or `tree:ID`.
    pub(crate) fn store_key(&self) -> String {
        match self {
            BucketKey::Agent(a) => format!("agent:{a}"),
            BucketKey::Tree(a) => format!("tree:{a}"),
        }
    }
}

/// One limit a request is charged to: a bucket and its rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Charge {
    /// The bucket.
    pub(crate) key: BucketKey,
    /// Its rate (and burst), per second.
    pub(crate) rate: u32,
}

/// The limit that refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The bucket that was empty (the one with the longest wait).
    pub(crate) key: BucketKey,
    /// Its rate.
    pub(crate) rate: u32,
    /// Milliseconds until it has a token again.
    pub(crate) retry_after_ms: u64,
}

/// How long a refusal window lasts: the first refusal of an agent opens
/// one and is recorded; later refusals in it are only counted.
pub(crate) const REFUSAL_WINDOW_MS: i64 = 1_000;

/// An agent's open refusal window.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: i64,
    suppressed: u64,
}

/// A count of refusals that were not recorded one by one, due for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Suppressed {
    pub(crate) agent: AgentId,
    pub(crate) window_start_ms: i64,
    pub(crate) count: u64,
}

/// What to do with one refusal.
#[derive(Debug)]
pub(crate) struct RefusalPlan {
    /// Record this refusal (the first of its window).
    pub(crate) record: bool,
    /// Counts of closed windows to record first.
    pub(crate) flush: Vec<Suppressed>,
}

/// Per-agent refusal windows: bounds what a throttled agent adds to the
/// log (one entry per window plus one count per window with more) without
/// losing how many requests were refused.
#[derive(Debug, Default)]
pub(crate) struct RefusalWindows {
    windows: Mutex<HashMap<AgentId, Window>>,
}

impl RefusalWindows {
    /// A refusal of `agent` at `now_ms`.
    pub(crate) fn refused(&self, agent: &AgentId, now_ms: i64) -> RefusalPlan {
        let Ok(mut map) = self.windows.lock() else {
            return RefusalPlan {
                record: true,
                flush: Vec::new(),
            };
        };
        let mut flush = Self::closed(&mut map, now_ms);
        match map.get_mut(agent) {
            Some(w) if now_ms < w.start_ms.saturating_add(REFUSAL_WINDOW_MS) => {
                w.suppressed += 1;
                RefusalPlan {
                    record: false,
                    flush,
                }
            }
            found => {
                if let Some(w) = found.copied()
                    && w.suppressed > 0
                {
                    flush.push(Suppressed {
                        agent: agent.clone(),
                        window_start_ms: w.start_ms,
                        count: w.suppressed,
                    });
                }
                map.insert(
                    agent.clone(),
                    Window {
                        start_ms: now_ms,
                        suppressed: 0,
                    },
                );
                RefusalPlan {
                    record: true,
                    flush,
                }
            }
        }
    }

    /// Counts due at `now_ms`: every closed window's, and `accepted`'s own
    /// open window's (its next request was taken, so the count is recorded
    /// now, before what follows).
    pub(crate) fn due(&self, accepted: Option<&AgentId>, now_ms: i64) -> Vec<Suppressed> {
        let Ok(mut map) = self.windows.lock() else {
            return Vec::new();
        };
        if map.is_empty() {
            return Vec::new();
        }
        let mut out = Self::closed(&mut map, now_ms);
        if let Some(agent) = accepted
            && let Some(w) = map.remove(agent)
            && w.suppressed > 0
        {
            out.push(Suppressed {
                agent: agent.clone(),
                window_start_ms: w.start_ms,
                count: w.suppressed,
            });
        }
        out
    }

    /// Remove the windows closed at `now_ms`; the counts of those with
    /// suppressed refusals.
    fn closed(map: &mut HashMap<AgentId, Window>, now_ms: i64) -> Vec<Suppressed> {
        let mut out = Vec::new();
        map.retain(|agent, w| {
            if now_ms < w.start_ms.saturating_add(REFUSAL_WINDOW_MS) {
                return true;
            }
            if w.suppressed > 0 {
                out.push(Suppressed {
                    agent: agent.clone(),
                    window_start_ms: w.start_ms,
                    count: w.suppressed,
                });
            }
            false
        });
        out.sort_by(|a, b| (a.window_start_ms, &a.agent).cmp(&(b.window_start_ms, &b.agent)));
        out
    }
}

/// `route` cut to [`MAX_ROUTE_BYTES`] on a character boundary.
fn bounded(route: &str) -> String {
    let mut end = route.len().min(MAX_ROUTE_BYTES);
    while !route.is_char_boundary(end) {
        end -= 1;
    }
    route.get(..end).unwrap_or_default().to_owned()
}

impl<S: Store> Engine<S> {
    /// Who the bearer `secret` names, checked active and within its request
    /// rate; `route` names the request in the refusals recorded (cut to 256
    /// bytes).
    pub async fn authenticate(
        &self,
        secret: &str,
        route: &str,
    ) -> Result<Authentication, EngineError> {
        if !well_formed(secret) {
            return Ok(Authentication::Invalid);
        }
        let hash = hash_token(secret);
        let record = match self.inner.tokens.get(&hash) {
            Ok(record) => record,
            Err(generation) => {
                let Some(record) = self.inner.store.find_token(hash).await? else {
                    return Ok(Authentication::Invalid);
                };
                self.inner.tokens.fill(generation, &record);
                record
            }
        };
        if !bool::from(record.hash.0.ct_eq(&hash.0)) {
            return Ok(Authentication::Invalid);
        }
        if record.revoked {
            return Ok(Authentication::TokenRevoked);
        }
        let agent = match record.subject {
            TokenSubject::Operator => return Ok(Authentication::Operator),
            TokenSubject::Agent(a) => a,
        };
        // A valid token of an agent this engine's cache does not know yet
        // was issued for an agent another engine registered moments ago:
        // look it up in the store (agents are never deleted, so this
        // happens once per agent and engine) rather than refuse it.
        if self.agent(&agent).is_err() && !self.refresh_agent(&agent).await? {
            return Ok(Authentication::Invalid);
        }
        let Ok(view) = self.agent(&agent) else {
            return Ok(Authentication::Invalid);
        };
        let caller = Caller::Agent(agent.clone());
        if view.status == AgentStatus::Revoked {
            let decision = self.refusal(&caller, reasons::AGENT_REVOKED, route);
            self.record(&decision).await?;
            return Ok(Authentication::AgentRevoked { decision });
        }
        let now = self.now();
        let charges = self.charges(&view.lineage);
        let taken = self.take_tokens(&charges, now).await?;
        match taken {
            Ok(()) => {
                self.record_suppressed(self.inner.refusals.due(Some(&agent), now.0))
                    .await?;
                Ok(Authentication::Agent(agent))
            }
            Err(refused) => {
                let plan = self.inner.refusals.refused(&agent, now.0);
                self.record_suppressed(plan.flush).await?;
                let decision = self.refusal(&caller, er::QUOTA_REQUESTS_PER_SECOND, route);
                if plan.record {
                    let (limit, tree) = match &refused.key {
                        BucketKey::Agent(_) => ("agent", None),
                        BucketKey::Tree(of) => ("tree", Some(of.clone())),
                    };
                    let draft = self.draft(&decision).with_details(json!({
                        "limit": limit,
                        "tree": tree,
                        "requests_per_second": refused.rate,
                    }));
                    self.inner.store.append_audit(vec![draft]).await?;
                }
                Ok(Authentication::Throttled {
                    decision,
                    recorded: plan.record,
                    requests_per_second: refused.rate,
                    tree: match refused.key {
                        BucketKey::Agent(_) => None,
                        BucketKey::Tree(of) => Some(of),
                    },
                    retry_after_ms: refused.retry_after_ms,
                })
            }
        }
    }

    /// Charge one request to `charges` in the store's buckets (shared by
    /// every engine on the store): `Err` names the refusing limit. No
    /// charges, no round trip.
    async fn take_tokens(
        &self,
        charges: &[Charge],
        now: Timestamp,
    ) -> Result<Result<(), Refused>, EngineError> {
        if charges.is_empty() {
            return Ok(Ok(()));
        }
        let stored = charges
            .iter()
            .map(|c| RateCharge {
                bucket: c.key.store_key(),
                rate: c.rate,
                burst: c.rate,
            })
            .collect();
        match self.inner.store.take_request_tokens(stored, now).await? {
            TakeTokens::Taken => Ok(Ok(())),
            TakeTokens::Refused {
                index,
                retry_after_ms,
            } => {
                let charge = charges.get(index).ok_or_else(|| {
                    EngineError::internal(format!(
                        "the store refused bucket {index} of {}",
                        charges.len()
                    ))
                })?;
                Ok(Err(Refused {
                    key: charge.key.clone(),
                    rate: charge.rate,
                    retry_after_ms,
                }))
            }
        }
    }

    /// The buckets a request of the agent with `lineage` (itself first,
    /// then its ancestors) is charged to: its own `requests_per_second`,
    /// and the `tree_requests_per_second` of itself and every ancestor that
    /// has one.
    fn charges(&self, lineage: &[AgentId]) -> Vec<Charge> {
        let policy = &self.inner.policy;
        let mut out = Vec::new();
        if let Some(own) = lineage.first()
            && let Some(rate) = policy.quota_for(own).and_then(|q| q.requests_per_second)
        {
            out.push(Charge {
                key: BucketKey::Agent(own.clone()),
                rate,
            });
        }
        for a in lineage {
            if let Some(rate) = policy.quota_for(a).and_then(|q| q.tree_requests_per_second) {
                out.push(Charge {
                    key: BucketKey::Tree(a.clone()),
                    rate,
                });
            }
        }
        out
    }

    /// Record the counts of refusals that were not recorded one by one:
    /// one `quota_requests_per_second` entry per window, with
    /// `{"suppressed": N, "window_start": MS, "window_end": MS}`.
    async fn record_suppressed(&self, due: Vec<Suppressed>) -> Result<(), EngineError> {
        if due.is_empty() {
            return Ok(());
        }
        let now = self.now();
        let drafts = due
            .into_iter()
            .map(|s| {
                let decision = self.refusal(
                    &Caller::Agent(s.agent),
                    er::QUOTA_REQUESTS_PER_SECOND,
                    SUPPRESSED_RESOURCE,
                );
                self.draft(&decision).with_details(json!({
                    "suppressed": s.count,
                    "window_start": s.window_start_ms,
                    "window_end": s.window_start_ms.saturating_add(REFUSAL_WINDOW_MS).min(now.0.max(s.window_start_ms)),
                }))
            })
            .collect();
        self.inner.store.append_audit(drafts).await?;
        Ok(())
    }

    /// Record the counts of every refusal window that has closed by now
    /// (a server calls this periodically and on shutdown, so an agent that
    /// stops sending does not leave its count unrecorded).
    pub async fn flush_refusal_counts(&self) -> Result<(), EngineError> {
        let due = self.inner.refusals.due(None, self.now().0);
        self.record_suppressed(due).await
    }

    /// Record that `caller` may not use `route` (`auth.request`, deny).
    pub async fn refuse_route(
        &self,
        caller: &Caller,
        route: &str,
        refusal: RouteRefusal,
    ) -> Result<Decision, EngineError> {
        let decision = self.refusal(caller, refusal.reason(), route);
        self.record(&decision).await?;
        Ok(decision)
    }

    fn refusal(&self, caller: &Caller, reason: Reason, route: &str) -> Decision {
        self.decision(
            caller,
            Verdict::Deny,
            reason,
            ops::AUTH_REQUEST,
            bounded(route),
            self.now(),
        )
    }

    /// Whether `caller` may see `target`, and why.
    fn decide_visibility(
        &self,
        caller: &Caller,
        target: &AgentId,
    ) -> Result<(bool, Reason), EngineError> {
        let exists = self.agent(target).is_ok();
        Ok(match caller {
            Caller::Operator if exists => (true, er::OPERATOR),
            Caller::Operator => (false, reasons::UNKNOWN_AGENT),
            Caller::Agent(a) if !exists => (a == target, reasons::UNKNOWN_AGENT),
            Caller::Agent(a) if a == target => (true, er::SELF),
            Caller::Agent(_) => {
                if self.may_manage(caller, target, true)? {
                    (true, er::ANCESTOR)
                } else {
                    (false, er::NOT_AN_ANCESTOR)
                }
            }
        })
    }

    /// `caller` reads the view of `target`: visible to the operator, to
    /// itself and to its active ancestors. Recorded either way
    /// (`agent.read`). An agent asking for itself that no longer exists is
    /// recorded and answered [`EngineError::NotFound`].
    pub async fn read_agent(
        &self,
        caller: &Caller,
        target: &AgentId,
    ) -> Result<AgentRead, EngineError> {
        let (ok, reason) = self.decide_visibility(caller, target)?;
        let verdict = if ok { Verdict::Allow } else { Verdict::Deny };
        let decision = self.decision(
            caller,
            verdict,
            reason,
            ops::AGENT_READ,
            target.to_string(),
            self.now(),
        );
        self.record(&decision).await?;
        if !ok {
            return Ok(AgentRead::Hidden { decision });
        }
        let agent = self.agent(target)?;
        Ok(AgentRead::Visible {
            agent: Box::new(agent),
            decision,
        })
    }

    /// Whether `caller` may see `target` before `operation` on it; a
    /// hidden agent is recorded as a denial of `operation`.
    pub async fn agent_visibility(
        &self,
        caller: &Caller,
        target: &AgentId,
        operation: &str,
    ) -> Result<AgentVisibility, EngineError> {
        let (ok, reason) = self.decide_visibility(caller, target)?;
        if ok {
            return Ok(AgentVisibility::Visible { reason });
        }
        let decision = self.decision(
            caller,
            Verdict::Deny,
            reason,
            operation,
            target.to_string(),
            self.now(),
        );
        self.record(&decision).await?;
        Ok(AgentVisibility::Hidden { decision })
    }

    /// The run, if `caller` may act on it under `access` before
    /// `operation`. A missing run is [`EngineError::NotFound`] (not
    /// recorded); an existing run the caller may not see is recorded as a
    /// denial of `operation` (`not_run_agent`).
    pub async fn run_visibility(
        &self,
        caller: &Caller,
        run_id: &RunId,
        operation: &str,
        access: RunAccess,
    ) -> Result<RunVisibility, EngineError> {
        let run = self
            .inner
            .store
            .get_run(run_id.clone())
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Run, run_id))?
            .run;
        let ok = match caller {
            Caller::Operator => true,
            Caller::Agent(a) if *a == run.agent => true,
            Caller::Agent(_) => {
                access == RunAccess::OwnerOrAncestor
                    && self.may_manage(caller, &run.agent, false)?
            }
        };
        if ok {
            return Ok(RunVisibility::Visible(Box::new(run)));
        }
        let decision = self.decision(
            caller,
            Verdict::Deny,
            er::NOT_RUN_AGENT,
            operation,
            run_id.to_string(),
            self.now(),
        );
        self.record(&decision).await?;
        Ok(RunVisibility::Hidden { decision })
    }

    /// `caller` reads the latest version of `run_id`'s envelope (the run's
    /// agent or the operator). A missing run is [`EngineError::NotFound`]
    /// with [`Missing::Run`], a run without an envelope with
    /// [`Missing::RunEnvelope`].
    pub async fn read_envelope(
        &self,
        caller: &Caller,
        run_id: &RunId,
    ) -> Result<EnvelopeRead, EngineError> {
        if let RunVisibility::Hidden { decision } = self
            .run_visibility(caller, run_id, ops::CONTEXT_READ, RunAccess::Owner)
            .await?
        {
            return Ok(EnvelopeRead::Hidden { decision });
        }
        let record = self
            .run_envelope(run_id)
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::RunEnvelope, run_id))?;
        let decision = self.decision(
            caller,
            Verdict::Allow,
            er::ENVELOPE_READ,
            ops::CONTEXT_READ,
            record.envelope_id.to_string(),
            self.now(),
        );
        let draft = self.draft(&decision).with_details(json!({
            "run_id": run_id,
            "envelope_version": record.version,
            "classification": record.aggregate_sensitivity,
        }));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(EnvelopeRead::Read {
            envelope: Box::new(record),
            decision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_recorded_once_per_window_and_counted() {
        let w = RefusalWindows::default();
        let a = AgentId::parse("a").unwrap();
        assert!(w.refused(&a, 0).record);
        for t in 1..100 {
            let plan = w.refused(&a, t);
            assert!(!plan.record && plan.flush.is_empty());
        }
        // The next refusal after the window: recorded, with the count.
        let plan = w.refused(&a, REFUSAL_WINDOW_MS);
        assert!(plan.record);
        assert_eq!(
            plan.flush,
            vec![Suppressed {
                agent: a.clone(),
                window_start_ms: 0,
                count: 99
            }]
        );
        // An accepted request flushes the open window's count at once.
        w.refused(&a, REFUSAL_WINDOW_MS + 1);
        assert_eq!(w.due(Some(&a), REFUSAL_WINDOW_MS + 2)[0].count, 1);
        assert!(w.due(Some(&a), REFUSAL_WINDOW_MS + 3).is_empty());
        // A closed window is flushed by anyone's request.
        assert!(w.refused(&a, 5_000).record);
        w.refused(&a, 5_001);
        assert!(w.due(None, 5_500).is_empty());
        assert_eq!(w.due(None, 6_000)[0].count, 1);
    }

    #[test]
    fn routes_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("GET /v1/agents"), "GET /v1/agents");
        let long = format!("GET /{}", "é".repeat(200));
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_ROUTE_BYTES);
        assert!(long.starts_with(&cut));
        assert!(cut.len() >= MAX_ROUTE_BYTES - 1);
    }
}
