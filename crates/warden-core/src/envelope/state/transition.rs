//! The audit record of one envelope transition.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

/// What a transition was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    /// A step's result was folded in ([`Envelope::fold`]).
    Accumulated,
    /// A child envelope was built ([`Envelope::delegate`]).
    Delegated,
    /// The envelope was lowered ([`Envelope::declassify`]).
    Declassified,
}

impl TransitionKind {
    /// The reason code recorded for this kind of transition.
    pub fn reason(self) -> Reason {
        match self {
            TransitionKind::Accumulated => reasons::CONTEXT_ACCUMULATED,
            TransitionKind::Delegated => reasons::CONTEXT_DELEGATED,
            TransitionKind::Declassified => reasons::DECLASSIFIED,
        }
    }
}

/// Who declassified, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declassification {
    /// The declassifying agent.
    pub by: AgentId,
    /// The justification as given.
    pub justification: String,
}

/// The record of one envelope transition, for the audit log: ids, labels,
/// restriction and rule names, levels and versions, never data.
///
/// It describes the difference between the source envelope (the same
/// envelope's previous version, or the parent for a delegation) and the
/// resulting one. It serialises to a flat JSON object.
#[derive(Clone, PartialEq, Eq)]
pub struct Transition {
    kind: TransitionKind,
    /// The resulting envelope's identity.
    ident: Arc<Identity>,
    source_version: u64,
    version: u64,
    sensitivity_from: Sensitivity,
    sensitivity_to: Sensitivity,
    labels_added: LabelBits,
    derived_added: LabelBits,
    labels_removed: LabelBits,
    restrictions_added: RestrictionBits,
    rules_applied: RuleBits,
    pub(super) result_sensitivity: Option<Sensitivity>,
    pub(super) redacted: bool,
    pub(super) declassification: Option<Box<Declassification>>,
}

impl Transition {
    pub(super) fn between(
        kind: TransitionKind,
        from: &Envelope,
        to: &Envelope,
        rules: RuleBits,
    ) -> Self {
        let before = from.labels.union(from.derived);
        let after = to.labels.union(to.derived);
        Self {
            kind,
            ident: Arc::clone(&to.ident),
            source_version: from.version,
            version: to.version,
            sensitivity_from: from.sensitivity,
            sensitivity_to: to.sensitivity,
            labels_added: to.labels.minus(from.labels),
            derived_added: to.derived.minus(from.derived),
            labels_removed: before.minus(after),
            restrictions_added: to.restrictions.minus(from.restrictions),
            rules_applied: rules,
            result_sensitivity: None,
            redacted: false,
            declassification: None,
        }
    }

    /// What happened.
    pub fn kind(&self) -> TransitionKind {
        self.kind
    }

    /// The reason code to record ([`TransitionKind::reason`]).
    pub fn reason(&self) -> Reason {
        self.kind.reason()
    }

    /// The resulting envelope.
    pub fn envelope_id(&self) -> &EnvelopeId {
        &self.ident.envelope_id
    }

    /// The envelope the transition started from: the same envelope, or the
    /// parent for a delegation.
    pub fn source_envelope_id(&self) -> &EnvelopeId {
        match (self.kind, &self.ident.parent_envelope_id) {
            (TransitionKind::Delegated, Some(parent)) => parent,
            _ => &self.ident.envelope_id,
        }
    }

    /// The agent the resulting envelope belongs to.
    pub fn agent_id(&self) -> &AgentId {
        &self.ident.agent_id
    }

    /// The workflow.
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.ident.workflow_id
    }

    /// The source envelope's version.
    pub fn source_version(&self) -> u64 {
        self.source_version
    }

    /// The resulting envelope's version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The source envelope's stored sensitivity.
    pub fn sensitivity_from(&self) -> Sensitivity {
        self.sensitivity_from
    }

    /// The resulting envelope's sensitivity.
    pub fn sensitivity_to(&self) -> Sensitivity {
        self.sensitivity_to
    }

    /// The classification of the audit entry itself: the higher of the two
    /// levels (an entry naming restricted labels is itself restricted).
    pub fn classification(&self) -> Sensitivity {
        self.sensitivity_from.max(self.sensitivity_to)
    }

    /// Observed labels added.
    pub fn labels_added(&self) -> NameSet<'_> {
        self.ident.vocab.label_names(self.labels_added)
    }

    /// Derived labels added.
    pub fn derived_added(&self) -> NameSet<'_> {
        self.ident.vocab.label_names(self.derived_added)
    }

    /// Labels (observed or derived) removed: by declassification, or every
    /// label for a redacted delegation.
    pub fn labels_removed(&self) -> NameSet<'_> {
        self.ident.vocab.label_names(self.labels_removed)
    }

    /// Restrictions added.
    pub fn restrictions_added(&self) -> NameSet<'_> {
        self.ident.vocab.restriction_names(self.restrictions_added)
    }

    /// Every rule whose combination the resulting state contains (declaration
    /// order).
    pub fn rules_applied(&self) -> NameSet<'_> {
        self.ident.vocab.rule_names(self.rules_applied)
    }

    /// For a fold: the classification the step's result must carry (its own
    /// labels' level, raised to the envelope's when the envelope was at or
    /// above `inherit_threshold` while the step ran).
    pub fn result_sensitivity(&self) -> Option<Sensitivity> {
        self.result_sensitivity
    }

    /// For a delegation: whether the child's labels were redacted.
    pub fn redacted(&self) -> bool {
        self.redacted
    }

    /// For a declassification: who and why.
    pub fn declassification(&self) -> Option<&Declassification> {
        self.declassification.as_deref()
    }
}

impl fmt::Debug for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transition")
            .field("kind", &self.kind)
            .field("envelope_id", self.envelope_id())
            .field("source_envelope_id", self.source_envelope_id())
            .field("source_version", &self.source_version)
            .field("version", &self.version)
            .field("sensitivity_from", &self.sensitivity_from)
            .field("sensitivity_to", &self.sensitivity_to)
            .field("labels_added", &self.labels_added())
            .field("derived_added", &self.derived_added())
            .field("labels_removed", &self.labels_removed())
            .field("restrictions_added", &self.restrictions_added())
            .field("rules_applied", &self.rules_applied())
            .field("result_sensitivity", &self.result_sensitivity)
            .field("redacted", &self.redacted)
            .field("declassification", &self.declassification)
            .finish()
    }
}

#[derive(Serialize)]
struct TransitionJson<'a> {
    kind: TransitionKind,
    reason: Reason,
    envelope_id: &'a EnvelopeId,
    source_envelope_id: &'a EnvelopeId,
    workflow_id: &'a WorkflowId,
    agent_id: &'a AgentId,
    delegation_depth: u32,
    source_version: u64,
    version: u64,
    sensitivity_from: Sensitivity,
    sensitivity_to: Sensitivity,
    classification: Sensitivity,
    labels_added: NameSet<'a>,
    derived_added: NameSet<'a>,
    labels_removed: NameSet<'a>,
    restrictions_added: NameSet<'a>,
    rules_applied: NameSet<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_sensitivity: Option<Sensitivity>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    redacted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    declassified_by: Option<&'a AgentId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    justification: Option<&'a str>,
}

impl Serialize for Transition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        TransitionJson {
            kind: self.kind,
            reason: self.reason(),
            envelope_id: self.envelope_id(),
            source_envelope_id: self.source_envelope_id(),
            workflow_id: self.workflow_id(),
            agent_id: self.agent_id(),
            delegation_depth: self.ident.delegation_depth,
            source_version: self.source_version,
            version: self.version,
            sensitivity_from: self.sensitivity_from,
            sensitivity_to: self.sensitivity_to,
            classification: self.classification(),
            labels_added: self.labels_added(),
            derived_added: self.derived_added(),
            labels_removed: self.labels_removed(),
            restrictions_added: self.restrictions_added(),
            rules_applied: self.rules_applied(),
            result_sensitivity: self.result_sensitivity,
            redacted: self.redacted,
            declassified_by: self.declassification.as_ref().map(|d| &d.by),
            justification: self
                .declassification
                .as_ref()
                .map(|d| d.justification.as_str()),
        }
        .serialize(serializer)
    }
}
