//! The context gate of one run step, decided once.
//!
//! A step meets its run's envelope twice: when it begins (may it run now,
//! under which obligations) and when it completes (which labels its outcome
//! carries, and whether it ran although the run's restrictions deny it).
//! Both answers come from the same [`decide`] call on the envelope the step
//! began under. [`ContextGate::decide`] makes that call and keeps the answer
//! as plain values (serialisable, so it can be kept with the run), and its
//! methods give every answer the engine records, so `begin` and `complete`
//! cannot disagree.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::decide::{ActionRef, ContextDecision, ContextRequest, decide};
use super::policy::{ContextPolicy, Sensitivity};
use super::reasons;
use super::state::Envelope;
use crate::decision::{Obligation, Reason, Verdict, reasons as decision_reasons};
use crate::ids::Label;

/// What a step's run envelope says about the step, decided once when the
/// step begins (or, for a step completed without beginning, when it
/// completes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextGate {
    /// The envelope's verdict.
    pub verdict: Verdict,
    /// The envelope's reason (`context_allowed`, `context_constrained`,
    /// `restricted_by:…`, `aggregation_backstop`, `sensitivity_floor`,
    /// `envelope_policy_mismatch`).
    pub context_reason: Reason,
    /// The obligations: on `constrain`, and on `escalate` (they bind if a
    /// reviewer approves). Empty on `allow` and `deny`.
    pub obligations: Vec<Obligation>,
    /// The envelope's sensitivity with every triggered rule applied.
    pub projected_sensitivity: Sensitivity,
    /// Whether the denial can never be lifted: a restriction denies the
    /// step (`restricted_by:…`), and restrictions never shrink.
    pub permanent: bool,
}

impl ContextGate {
    /// Decide `action` against `envelope`, projected under `policy`.
    pub fn decide(envelope: &Envelope, policy: &ContextPolicy, action: ActionRef<'_>) -> Self {
        Self::from_decision(decide(envelope, policy, &ContextRequest::Action(action)))
    }

    /// Decide `request` against `envelope` ([`ContextGate::decide`] for a
    /// call whose argument origins are known).
    pub fn decide_request(
        envelope: &Envelope,
        policy: &ContextPolicy,
        request: &ContextRequest<'_>,
    ) -> Self {
        Self::from_decision(decide(envelope, policy, request))
    }

    /// The gate a context decision describes.
    pub fn from_decision(cd: ContextDecision) -> Self {
        let permanent = cd.is_permanent();
        Self {
            verdict: cd.verdict,
            obligations: cd.obligations.to_vec(),
            projected_sensitivity: cd.projected_sensitivity,
            context_reason: cd.reason,
            permanent,
        }
    }

    /// The verdict and reason `begin` records for the step: `allow` as
    /// `step_allowed`; `constrain`, `deny` and `escalate` with the context
    /// reason. On `allow` and `constrain` the step proceeds with
    /// [`ContextGate::obligations`]; on `deny` it is recorded `Denied` and
    /// the run stops; on `escalate` it waits for a reviewer, unless an
    /// approval is consumed ([`ContextGate::approved`]).
    pub fn begin(&self) -> (Verdict, Reason) {
        match self.verdict {
            Verdict::Allow => (Verdict::Allow, decision_reasons::STEP_ALLOWED),
            v => (v, self.context_reason.clone()),
        }
    }

    /// The verdict and reason recorded when an escalated step proceeds on
    /// an approval: `escalation_approved`, `constrain` if the obligations
    /// bind anything, else `allow`.
    pub fn approved(&self) -> (Verdict, Reason) {
        let verdict = if self.obligations.is_empty() {
            Verdict::Allow
        } else {
            Verdict::Constrain
        };
        (verdict, decision_reasons::ESCALATION_APPROVED)
    }

    /// The labels the step's result must carry (the `ResultLabels`
    /// obligation), empty when there is none.
    pub fn result_labels(&self) -> &[Label] {
        self.obligations
            .iter()
            .find_map(|o| match o {
                Obligation::ResultLabels { labels } => Some(labels.as_slice()),
                Obligation::InheritRestrictions { .. } => None,
            })
            .unwrap_or(&[])
    }

    /// The labels a completed (or failed) step's outcome carries: those the
    /// caller reported, the action's declared output labels and the
    /// `ResultLabels` obligation, sorted and without repeats. The caller
    /// cannot under-report: what the policy knows the step produces is
    /// always there.
    pub fn outcome_labels(&self, reported: &[Label], declared: &[Label]) -> Vec<Label> {
        let mut labels: BTreeSet<Label> = reported.iter().cloned().collect();
        labels.extend(declared.iter().cloned());
        labels.extend(self.result_labels().iter().cloned());
        labels.into_iter().collect()
    }

    /// Whether a completion of this step bypassed the gate: the run's
    /// restrictions deny the step outright, so it should never have run.
    /// Its labels are still folded (it may have produced something), and
    /// it is recorded `Denied` (`completed_without_gate`).
    pub fn bypassed(&self) -> bool {
        self.permanent
    }
}

impl ContextDecision {
    /// Whether the denial can never be lifted: a restriction denies the
    /// request (`restricted_by:…`), and restrictions never shrink.
    pub fn is_permanent(&self) -> bool {
        self.verdict == Verdict::Deny && self.reason.kind() == reasons::RESTRICTED_BY
    }
}
