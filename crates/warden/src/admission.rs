//! SOPs: preflight, validation and admission of runs.

use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::audit::Digest;
use warden_core::canonical::to_canonical;
use warden_core::decision::{Decision, Reason, Verdict};
use warden_core::ids::{AgentId, RunId};
use warden_core::plan::{PlanDocument, PlanExplanation};
use warden_core::preflight::{Preflight, PreflightContext, RunContext, admit, preflight};
use warden_core::sop::Sop;
use warden_core::time::Timestamp;
use warden_store::{AuditFn, CreateRun, RunRecord, RunStep, RunsInFlight, Store};

use crate::error::{ConflictKind, EngineError};

use crate::engine::{Caller, Engine, engine_reasons as er, ops, random_id};

impl<S: Store> Engine<S> {
    // ------------------------------------------------------------------
    // SOPs
    // ------------------------------------------------------------------

    /// Preflight `sop` for `actor` without recording anything (offline
    /// checks, `warden check`).
    pub fn preflight(&self, actor: &AgentId, sop: &Sop) -> Result<Preflight, EngineError> {
        let now = self.now();
        let state = self.read_state()?;
        let ctx = PreflightContext {
            hierarchy: &state.hierarchy,
            catalogue: &self.inner.policy.catalogue,
            policy_version: &self.inner.policy.version,
        };
        Ok(preflight(&ctx, actor, sop, now))
    }

    /// Preflight `sop` for `actor` and record every step's decision.
    pub async fn validate_sop(&self, actor: &AgentId, sop: &Sop) -> Result<Preflight, EngineError> {
        let result = self.preflight(actor, sop)?;
        let drafts = result
            .steps
            .iter()
            .map(|s| {
                self.draft(&result.decision(s))
                    .with_details(violations_details(&s.violations))
            })
            .collect();
        self.inner.store.append_audit(drafts).await?;
        Ok(result)
    }

    /// Admit `document` (a plan, or an SOP: see
    /// [`warden_core::plan::parse_document`]) for `actor` without recording
    /// anything, as a session admits its plan (no envelope): for an SOP, or
    /// a plan of literals, exactly what [`Engine::preflight`] decides. With
    /// the provenance explanation of every step.
    pub fn preflight_document(
        &self,
        actor: &AgentId,
        document: &PlanDocument,
    ) -> Result<PlanCheck, EngineError> {
        let now = self.now();
        let state = self.read_state()?;
        let ctx = PreflightContext {
            hierarchy: &state.hierarchy,
            catalogue: &self.inner.policy.catalogue,
            policy_version: &self.inner.policy.version,
        };
        Ok(PlanCheck {
            preflight: document.admit(&ctx, actor, None, now),
            provenance: document.explain(&self.inner.policy.catalogue),
        })
    }

    /// [`Engine::preflight_document`], recording every step's decision as
    /// [`Engine::validate_sop`] does; a step with provenance findings
    /// records them too (`details.provenance`).
    pub async fn validate_document(
        &self,
        actor: &AgentId,
        document: &PlanDocument,
    ) -> Result<PlanCheck, EngineError> {
        let result = self.preflight_document(actor, document)?;
        let drafts = result
            .preflight
            .steps
            .iter()
            .zip(&result.provenance.steps)
            .map(|(s, p)| {
                let mut details = violations_details(&s.violations);
                if !p.findings.is_empty() {
                    let findings: Vec<&str> = p.findings.iter().map(|r| r.as_str()).collect();
                    match &mut details {
                        Value::Object(m) => {
                            m.insert("provenance".into(), json!(findings));
                        }
                        _ => details = json!({"provenance": findings}),
                    }
                }
                self.draft(&result.preflight.decision(s))
                    .with_details(details)
            })
            .collect();
        self.inner.store.append_audit(drafts).await?;
        Ok(result)
    }

    /// Admit `sop` as a run. A rejected SOP creates no run and runs nothing;
    /// every step's decision is recorded either way. A reused `run_id` with
    /// the same SOP and agent returns the existing run (idempotent).
    ///
    /// With a `context:` policy the run gets its own envelope: a new, empty
    /// root, or, for an agent holding an inherited envelope, one delegated
    /// from it (same restrictions, sensitivity at least as high). A step the
    /// starting restrictions already deny (`restricted_by:…`) rejects the
    /// whole SOP here, since restrictions never shrink. Admission stays
    /// all-or-nothing over what is known up front: later steps can still be
    /// denied or escalated by what earlier steps accumulate.
    pub async fn admit_run(
        &self,
        actor: &AgentId,
        sop: &Sop,
        run_id: Option<RunId>,
    ) -> Result<Admission, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let run_id = match run_id {
            Some(r) => r,
            None => new_run_id()?,
        };
        let sop_value = serde_json::to_value(sop).map_err(EngineError::internal)?;
        let sop_hash = Digest::of(&to_canonical(&sop_value));
        let mut opened = None;
        let result = match self.context_policy() {
            None => self.preflight(actor, sop)?,
            Some(policy) => {
                if let Some(state) = self.inner.store.get_run(run_id.clone()).await? {
                    // An existing run keeps its envelope: open none for it.
                    let result = self.preflight(actor, sop)?;
                    if result.admitted {
                        return existing_admission(state, actor, sop_hash, result, &run_id);
                    }
                    result
                } else {
                    // The complete admission in one pass: static checks,
                    // then every step against the run's starting envelope.
                    let (envelope, draft) = self.open_run_envelope(actor, &run_id, now).await?;
                    let result = {
                        let state = self.read_state()?;
                        let ctx = PreflightContext {
                            hierarchy: &state.hierarchy,
                            catalogue: &self.inner.policy.catalogue,
                            policy_version: &self.inner.policy.version,
                        };
                        let run = RunContext {
                            envelope: &envelope,
                            policy,
                        };
                        admit(&ctx, actor, sop, Some(run), now)
                    };
                    if result.admitted {
                        opened = Some((envelope, draft));
                    }
                    result
                }
            }
        };
        let mut drafts: Vec<AuditDraft> = result
            .steps
            .iter()
            .map(|s| {
                self.draft(&result.decision(s))
                    .with_details(violations_details(&s.violations))
            })
            .collect();
        if !result.admitted {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                er::RUN_REJECTED,
                ops::RUN_ADMIT,
                sop.sop_id.to_string(),
                now,
            );
            drafts.push(self.draft(&d));
            self.inner.store.append_audit(drafts).await?;
            return Ok(Admission::Rejected(result));
        }
        let steps: Vec<RunStep> = sop
            .steps
            .iter()
            .filter_map(|s| {
                s.step_id.clone().map(|step_id| RunStep {
                    operation_id: format!("{run_id}:{step_id}"),
                    step_id,
                    action: s.action.clone(),
                })
            })
            .collect();
        let record = RunRecord {
            run_id: run_id.clone(),
            agent: actor.clone(),
            sop_hash,
            sop: sop_value,
            steps,
            policy_version: self.inner.policy.version.clone(),
            created_at: now,
            envelope_id: opened.as_ref().map(|(e, _)| e.envelope_id().clone()),
        };
        let d = self.decision(
            &caller,
            Verdict::Allow,
            er::RUN_ADMITTED,
            ops::RUN_ADMIT,
            run_id.to_string(),
            now,
        );
        drafts.push(
            self.draft(&d).with_details(
                json!({"sop_id": sop.sop_id.as_str(), "sop_hash": sop_hash.to_hex()}),
            ),
        );
        if let Some((envelope, draft)) = opened {
            // The envelope first (inert until the run names it); its opening
            // is recorded with the admission.
            self.create_envelope(envelope.to_record()).await?;
            drafts.push(draft);
        }
        // `max_runs_in_flight` is counted in the create's transaction (exact
        // across servers sharing the store); a refusal records only itself.
        let limit = self
            .policy()
            .quota_for(actor)
            .and_then(|q| q.max_runs_in_flight)
            .map(|max| RunsInFlight {
                max,
                since: Timestamp(now.0.saturating_sub(self.run_ttl_ms())),
            });
        let over = self.decision(
            &caller,
            Verdict::Deny,
            er::QUOTA_MAX_RUNS_IN_FLIGHT,
            ops::RUN_ADMIT,
            sop.sop_id.to_string(),
            now,
        );
        let refused = self.draft(&over);
        let audit: AuditFn<CreateRun> = Box::new(move |o| match o {
            CreateRun::Created => drafts,
            CreateRun::Existing(_) => Vec::new(),
            CreateRun::OverQuota { limit, in_flight } => {
                vec![refused.with_details(json!({"limit": limit, "in_flight": in_flight}))]
            }
        });
        match self
            .inner
            .store
            .create_run(record.clone(), limit, audit)
            .await?
        {
            CreateRun::Created => Ok(Admission::Admitted {
                run: record,
                preflight: result,
                existing: false,
            }),
            CreateRun::Existing(state) => {
                existing_admission(*state, actor, sop_hash, result, &run_id)
            }
            CreateRun::OverQuota { limit, in_flight } => Ok(Admission::OverQuota {
                decision: over,
                limit,
                in_flight,
                preflight: result,
            }),
        }
    }
}

/// The admission of a run that already exists under `run_id`: the same run
/// if the SOP and agent match, a conflict otherwise.
fn existing_admission(
    state: warden_store::RunState,
    actor: &AgentId,
    sop_hash: Digest,
    preflight: Preflight,
    run_id: &RunId,
) -> Result<Admission, EngineError> {
    if state.run.sop_hash == sop_hash && &state.run.agent == actor {
        Ok(Admission::Admitted {
            run: state.run,
            preflight,
            existing: true,
        })
    } else {
        Err(EngineError::Conflict {
            kind: ConflictKind::RunId,
            id: run_id.to_string(),
        })
    }
}

/// A document's admission and what provenance its steps will meet.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanCheck {
    /// Every step's decision.
    pub preflight: Preflight,
    /// Per step, the provenance explanation.
    pub provenance: PlanExplanation,
}

/// The result of admitting a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Admitted (or already admitted with the same SOP).
    Admitted {
        /// The run.
        run: RunRecord,
        /// Every step's decision.
        preflight: Preflight,
        /// Whether the run existed already.
        existing: bool,
    },
    /// Rejected: nothing will run.
    Rejected(Preflight),
    /// Refused: the agent already has `max_runs_in_flight` runs admitted and
    /// not finished (recorded; nothing was created).
    OverQuota {
        /// The deny decision (`quota_max_runs_in_flight`).
        decision: Decision,
        /// The limit.
        limit: u32,
        /// Runs in flight when it was refused.
        in_flight: u32,
        /// Every step's decision (the SOP itself would have been admitted).
        preflight: Preflight,
    },
}

fn violations_details(v: &[Reason]) -> Value {
    if v.len() <= 1 {
        Value::Null
    } else {
        json!({"violations": v.iter().map(|r| r.as_str()).collect::<Vec<_>>()})
    }
}

fn new_run_id() -> Result<RunId, EngineError> {
    RunId::parse(&random_id("run")?).map_err(EngineError::internal)
}
