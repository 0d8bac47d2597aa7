//! Access: who a bearer token names, whether that caller may use a route,
//! within its request rate, and which agents and runs it may see. Every
//! refusal a subject can be named for is a recorded decision.
//!
//! [`Engine::authenticate`] looks the token's hash up in the store **on
//! every request** (so a revocation made by any engine sharing the store
//! takes effect on the next request) and compares the stored hash with the
//! computed one in constant time. A token whose agent this engine's cache
//! does not know yet (another engine sharing the store registered it
//! moments ago) makes the engine look the agent up in the store once
//! ([`Engine::refresh_agent`]) rather than refuse it.
//!
//! Outcomes, and what is recorded (`auth.request`, resource = the route):
//!
//! - an unknown or malformed token: [`Authentication::Invalid`], a revoked
//!   one: [`Authentication::TokenRevoked`]; not recorded (there is no
//!   subject to record, and recording them would let anyone grow the log);
//! - a genuine token of a revoked agent: [`Authentication::AgentRevoked`],
//!   recorded `agent_revoked`;
//! - an agent over its `requests_per_second`:
//!   [`Authentication::Throttled`], recorded `quota_requests_per_second`.
//!   The token bucket (burst = the rate, refilled from the engine's clock)
//!   is kept **per engine**, in memory: engines sharing a store each allow
//!   the rate, and a restart refills every bucket.
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
use warden_store::{RunRecord, Store, TokenSubject};

use crate::agents::AgentView;
use crate::engine::{Caller, Engine, engine_reasons as er, ops};
use crate::error::{EngineError, Missing};
use crate::tokens::{hash_token, well_formed};

/// Longest route (audit resource) recorded for a request, in bytes.
const MAX_ROUTE_BYTES: usize = 256;

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
    /// The agent is over its `requests_per_second`; the denial was
    /// recorded.
    Throttled {
        /// The recorded decision (`quota_requests_per_second`).
        decision: Decision,
        /// The agent's rate.
        requests_per_second: u32,
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

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ms: i64,
}

/// Per-agent token buckets for `requests_per_second`, in this engine's
/// memory.
#[derive(Debug, Default)]
pub(crate) struct RequestBuckets {
    buckets: Mutex<HashMap<AgentId, Bucket>>,
}

impl RequestBuckets {
    /// Take one request from `agent`'s bucket; `Err(retry_after_ms)` when
    /// it is empty.
    pub(crate) fn take(&self, agent: &AgentId, rps: u32, now_ms: i64) -> Result<(), u64> {
        let rate = f64::from(rps.max(1));
        let Ok(mut map) = self.buckets.lock() else {
            return Ok(());
        };
        let bucket = match map.get_mut(agent) {
            Some(b) => b,
            None => map.entry(agent.clone()).or_insert(Bucket {
                tokens: rate,
                last_ms: now_ms,
            }),
        };
        let elapsed = (now_ms - bucket.last_ms).max(0) as f64;
        bucket.tokens = (bucket.tokens + elapsed * rate / 1000.0).min(rate);
        bucket.last_ms = bucket.last_ms.max(now_ms);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - bucket.tokens) * 1000.0 / rate).ceil() as u64)
        }
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
        let Some(record) = self.inner.store.find_token(hash).await? else {
            return Ok(Authentication::Invalid);
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
        if let Some(rps) = self
            .inner
            .policy
            .quota_for(&agent)
            .and_then(|q| q.requests_per_second)
            && let Err(retry_after_ms) = self.inner.buckets.take(&agent, rps, self.now().0)
        {
            let decision = self.refusal(&caller, er::QUOTA_REQUESTS_PER_SECOND, route);
            self.record(&decision).await?;
            return Ok(Authentication::Throttled {
                decision,
                requests_per_second: rps,
                retry_after_ms,
            });
        }
        Ok(Authentication::Agent(agent))
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
    fn token_bucket_allows_a_burst_then_refills_at_the_rate() {
        let q = RequestBuckets::default();
        let a = AgentId::parse("a").unwrap();
        assert!(q.take(&a, 2, 0).is_ok());
        assert!(q.take(&a, 2, 0).is_ok());
        assert_eq!(q.take(&a, 2, 0), Err(500));
        assert_eq!(q.take(&a, 2, 250), Err(250));
        assert!(q.take(&a, 2, 500).is_ok());
        assert!(q.take(&a, 2, 10_000).is_ok());
        assert!(q.take(&a, 2, 10_000).is_ok());
        assert!(q.take(&a, 2, 10_000).is_err());
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
