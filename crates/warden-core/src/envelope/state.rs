//! The envelope value, its transitions and its record form.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bits::{LabelBits, RestrictionBits, RuleBits};
use super::ident::{EnvelopeId, WorkflowId};
use super::policy::{Closure, ContextPolicy, NameSet, Sensitivity, Vocab};
use super::reasons;
use crate::decision::Reason;
use crate::ids::{AgentId, Label};

/// Longest declassification justification accepted, in bytes.
pub const MAX_JUSTIFICATION_BYTES: usize = 1024;

/// Why an envelope transition (or restore) was refused. The envelope it was
/// asked of is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The envelope was built under a policy with another vocabulary.
    #[error(
        "envelope `{envelope_id}` was built under another context policy vocabulary; restore it under this one"
    )]
    PolicyMismatch {
        /// The envelope.
        envelope_id: EnvelopeId,
    },
    /// Labels the policy does not know (fail closed: nothing is folded).
    #[error("labels unknown to the context policy: {}", backticked(.labels))]
    UnknownLabels {
        /// The unknown labels, in input order.
        labels: Vec<Label>,
    },
    /// Restrictions the policy does not know.
    #[error("restrictions unknown to the context policy: {}", backticked(.restrictions))]
    UnknownRestrictions {
        /// The unknown restrictions, in input order.
        restrictions: Vec<Label>,
    },
    /// Declassification by an agent not listed in `declassifiers`.
    #[error("agent `{agent}` is not allowed to declassify")]
    NotADeclassifier {
        /// The agent.
        agent: AgentId,
    },
    /// Declassification without a justification.
    #[error("declassification needs a non-empty justification")]
    MissingJustification,
    /// A justification over [`MAX_JUSTIFICATION_BYTES`].
    #[error(
        "declassification justification is {len} bytes, the limit is {MAX_JUSTIFICATION_BYTES}"
    )]
    JustificationTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A justification with control characters (it goes into the audit log).
    #[error("declassification justification contains a control character")]
    JustificationControlCharacter,
    /// A declassification target above the current level.
    #[error("declassification to `{to}` would raise envelope `{envelope_id}` from `{from}`")]
    NotALowering {
        /// The envelope.
        envelope_id: EnvelopeId,
        /// Its current (projected) level.
        from: Sensitivity,
        /// The requested level.
        to: Sensitivity,
    },
    /// The labels left after declassification still imply a higher level.
    #[error(
        "labels left on envelope `{envelope_id}` still imply `{implied}`, above the declassification target `{to}`"
    )]
    StillImplied {
        /// The envelope.
        envelope_id: EnvelopeId,
        /// What the remaining labels imply.
        implied: Sensitivity,
        /// The requested level.
        to: Sensitivity,
    },
    /// A child envelope id equal to its parent's.
    #[error("child envelope id `{envelope_id}` is the parent's own id")]
    ChildIdIsParentId {
        /// The id.
        envelope_id: EnvelopeId,
    },
    /// The delegation depth counter is exhausted.
    #[error("envelope `{envelope_id}` is at the deepest delegation depth")]
    DepthExhausted {
        /// The parent envelope.
        envelope_id: EnvelopeId,
    },
    /// The version counter is exhausted.
    #[error("envelope `{envelope_id}` is at the highest version")]
    VersionExhausted {
        /// The envelope.
        envelope_id: EnvelopeId,
    },
    /// A record whose parent and depth disagree.
    #[error("envelope record `{envelope_id}` is inconsistent: {detail}")]
    InconsistentRecord {
        /// The envelope.
        envelope_id: EnvelopeId,
        /// What is wrong.
        detail: &'static str,
    },
}

impl EnvelopeError {
    /// The stable reason code to record when the engine turns this error into
    /// a decision.
    pub fn reason(&self) -> Reason {
        match self {
            EnvelopeError::PolicyMismatch { .. } => reasons::ENVELOPE_POLICY_MISMATCH,
            EnvelopeError::UnknownLabels { .. } => reasons::UNKNOWN_LABEL,
            EnvelopeError::UnknownRestrictions { .. } => reasons::UNKNOWN_RESTRICTION,
            EnvelopeError::NotADeclassifier { .. } => reasons::DECLASSIFICATION_NOT_AUTHORIZED,
            EnvelopeError::MissingJustification
            | EnvelopeError::JustificationTooLong { .. }
            | EnvelopeError::JustificationControlCharacter
            | EnvelopeError::NotALowering { .. }
            | EnvelopeError::StillImplied { .. } => reasons::DECLASSIFICATION_INVALID,
            EnvelopeError::ChildIdIsParentId { .. } | EnvelopeError::InconsistentRecord { .. } => {
                reasons::ENVELOPE_RECORD_INVALID
            }
            EnvelopeError::DepthExhausted { .. } | EnvelopeError::VersionExhausted { .. } => {
                reasons::ENVELOPE_EXHAUSTED
            }
        }
    }
}

pub(crate) fn backticked(names: &[Label]) -> String {
    let mut out = String::new();
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('`');
        out.push_str(n.as_str());
        out.push('`');
    }
    out
}

/// What stays the same across every version of one envelope.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) envelope_id: EnvelopeId,
    pub(crate) parent_envelope_id: Option<EnvelopeId>,
    pub(crate) workflow_id: WorkflowId,
    pub(crate) agent_id: AgentId,
    pub(crate) delegation_depth: u32,
    pub(crate) vocab: Arc<Vocab>,
}

/// Accumulated governance state of a workflow: labels, sensitivity, derived
/// labels, grow-only restrictions and a monotonic version.
///
/// An immutable value: every transition ([`fold`](Self::fold),
/// [`delegate`](Self::delegate), [`declassify`](Self::declassify)) returns a
/// new envelope plus a [`Transition`] for the audit log. A root comes from
/// [`Envelope::root`], a child only from [`Envelope::delegate`] (so inheritance
/// cannot be forgotten), and [`Envelope::restore`] reproduces a stored or
/// verified record.
#[derive(Clone)]
pub struct Envelope {
    pub(crate) ident: Arc<Identity>,
    pub(crate) labels: LabelBits,
    pub(crate) derived: LabelBits,
    pub(crate) restrictions: RestrictionBits,
    pub(crate) sensitivity: Sensitivity,
    pub(crate) version: u64,
    /// Cache: the rules applied, valid when `closed_by` is the deciding
    /// policy's closure id (the envelope is then already closed under it and
    /// needs no re-projection). 0 = unknown.
    rules: RuleBits,
    closed_by: u64,
}

/// Equality of content; the closure cache does not take part.
impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        self.ident == other.ident
            && self.labels == other.labels
            && self.derived == other.derived
            && self.restrictions == other.restrictions
            && self.sensitivity == other.sensitivity
            && self.version == other.version
    }
}

impl Eq for Envelope {}

impl Envelope {
    /// A new, empty root envelope (`public`, no labels, no restrictions,
    /// version 0, depth 0) bound to `policy`'s vocabulary.
    pub fn root(
        policy: &ContextPolicy,
        envelope_id: EnvelopeId,
        workflow_id: WorkflowId,
        agent_id: AgentId,
    ) -> Self {
        Self {
            ident: Arc::new(Identity {
                envelope_id,
                parent_envelope_id: None,
                workflow_id,
                agent_id,
                delegation_depth: 0,
                vocab: Arc::clone(policy.vocab()),
            }),
            labels: LabelBits::EMPTY,
            derived: LabelBits::EMPTY,
            restrictions: RestrictionBits::EMPTY,
            sensitivity: Sensitivity::Public,
            version: 0,
            // Rules need at least one label, so an empty envelope is closed.
            rules: RuleBits::EMPTY,
            closed_by: policy.closure_id(),
        }
    }

    /// The closed state `c` as an envelope with `ident` and `version`.
    fn closed(ident: Arc<Identity>, c: &Closure, version: u64, policy: &ContextPolicy) -> Self {
        Self {
            ident,
            labels: c.labels,
            derived: c.derived,
            restrictions: c.restrictions,
            sensitivity: c.sensitivity,
            version,
            rules: c.rules,
            closed_by: policy.closure_id(),
        }
    }

    /// The envelope's id (shared by all its versions).
    pub fn envelope_id(&self) -> &EnvelopeId {
        &self.ident.envelope_id
    }

    /// The parent envelope, for a delegated child.
    pub fn parent_envelope_id(&self) -> Option<&EnvelopeId> {
        self.ident.parent_envelope_id.as_ref()
    }

    /// The workflow.
    pub fn workflow_id(&self) -> &WorkflowId {
        &self.ident.workflow_id
    }

    /// The agent the envelope belongs to.
    pub fn agent_id(&self) -> &AgentId {
        &self.ident.agent_id
    }

    /// 0 for a root, parent's + 1 for a child.
    pub fn delegation_depth(&self) -> u32 {
        self.ident.delegation_depth
    }

    /// The version: +1 per fold or declassification; 0 for a new envelope.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The stored aggregate sensitivity.
    pub fn aggregate_sensitivity(&self) -> Sensitivity {
        self.sensitivity
    }

    /// Labels folded in from results (sorted).
    pub fn labels(&self) -> NameSet<'_> {
        self.ident.vocab.label_names(self.labels)
    }

    /// Labels derived by aggregation rules (sorted).
    pub fn derived(&self) -> NameSet<'_> {
        self.ident.vocab.label_names(self.derived)
    }

    /// Restrictions (sorted).
    pub fn restrictions(&self) -> NameSet<'_> {
        self.ident.vocab.restriction_names(self.restrictions)
    }

    /// The record form (names; for storage, signing and JSON).
    pub fn to_record(&self) -> EnvelopeRecord {
        EnvelopeRecord {
            envelope_id: self.ident.envelope_id.clone(),
            parent_envelope_id: self.ident.parent_envelope_id.clone(),
            workflow_id: self.ident.workflow_id.clone(),
            agent_id: self.ident.agent_id.clone(),
            labels: self.labels().iter().cloned().collect(),
            aggregate_sensitivity: self.sensitivity,
            derived: self.derived().iter().cloned().collect(),
            delegation_depth: self.ident.delegation_depth,
            restrictions: self.restrictions().iter().cloned().collect(),
            version: self.version,
        }
    }

    /// Rebuild an envelope from its record under `policy` (a storage
    /// round-trip, a verified import, or a move to a new policy version).
    ///
    /// The record is reproduced as is, not re-evaluated: rules its labels
    /// trigger are still taken into account by every decision (which projects
    /// them) and applied by the next fold. Unknown labels or restrictions are
    /// an error, never dropped.
    pub fn restore(record: &EnvelopeRecord, policy: &ContextPolicy) -> Result<Self, EnvelopeError> {
        let labels = policy
            .resolve_labels(&record.labels)
            .map_err(|labels| EnvelopeError::UnknownLabels { labels })?;
        let derived = policy
            .resolve_labels(&record.derived)
            .map_err(|labels| EnvelopeError::UnknownLabels { labels })?;
        let restrictions = policy
            .resolve_restrictions(&record.restrictions)
            .map_err(|restrictions| EnvelopeError::UnknownRestrictions { restrictions })?;
        let inconsistent = |detail| EnvelopeError::InconsistentRecord {
            envelope_id: record.envelope_id.clone(),
            detail,
        };
        match (&record.parent_envelope_id, record.delegation_depth) {
            (None, 0) => {}
            (None, _) => return Err(inconsistent("a root envelope has delegation depth 0")),
            (Some(_), 0) => {
                return Err(inconsistent(
                    "a child envelope has delegation depth 1 or more",
                ));
            }
            (Some(p), _) if *p == record.envelope_id => {
                return Err(inconsistent("an envelope cannot be its own parent"));
            }
            (Some(_), _) => {}
        }
        let c = policy.close(labels, derived, record.aggregate_sensitivity, restrictions);
        let is_closed = c.derived == derived
            && c.restrictions == restrictions
            && c.sensitivity == record.aggregate_sensitivity;
        Ok(Self {
            ident: Arc::new(Identity {
                envelope_id: record.envelope_id.clone(),
                parent_envelope_id: record.parent_envelope_id.clone(),
                workflow_id: record.workflow_id.clone(),
                agent_id: record.agent_id.clone(),
                delegation_depth: record.delegation_depth,
                vocab: Arc::clone(policy.vocab()),
            }),
            labels,
            derived,
            restrictions,
            sensitivity: record.aggregate_sensitivity,
            version: record.version,
            rules: c.rules,
            closed_by: if is_closed { policy.closure_id() } else { 0 },
        })
    }

    pub(crate) fn check_policy(&self, policy: &ContextPolicy) -> Result<(), EnvelopeError> {
        if Vocab::same(&self.ident.vocab, policy.vocab()) {
            Ok(())
        } else {
            Err(EnvelopeError::PolicyMismatch {
                envelope_id: self.ident.envelope_id.clone(),
            })
        }
    }

    /// The envelope as it is once every rule its labels trigger is applied
    /// (itself, when it is known to be closed under `policy`).
    #[inline]
    pub(crate) fn closure(&self, policy: &ContextPolicy) -> Closure {
        if self.closed_by != 0 && self.closed_by == policy.closure_id() {
            Closure {
                labels: self.labels,
                derived: self.derived,
                sensitivity: self.sensitivity,
                restrictions: self.restrictions,
                rules: self.rules,
            }
        } else {
            policy.close(
                self.labels,
                self.derived,
                self.sensitivity,
                self.restrictions,
            )
        }
    }

    fn next_version(&self) -> Result<u64, EnvelopeError> {
        self.version
            .checked_add(1)
            .ok_or_else(|| EnvelopeError::VersionExhausted {
                envelope_id: self.ident.envelope_id.clone(),
            })
    }

    /// Accumulate a step's result after it ran.
    ///
    /// `result_labels` are the labels the result actually carries;
    /// `declared_output_labels` are those the catalogue says the action always
    /// produces (both are folded, so an adapter that under-reports cannot
    /// lower anything). Labels join the envelope; sensitivity rises to the
    /// highest base sensitivity of its labels and of every rule the labels now
    /// trigger; rules add their derived labels and restrictions. Nothing is
    /// ever removed and the version goes up by one.
    ///
    /// An unknown label fails the whole fold ([`EnvelopeError::UnknownLabels`])
    /// and leaves the envelope unchanged: the engine must treat the step's
    /// completion as failed, not retry without the label.
    #[inline]
    pub fn fold(
        &self,
        policy: &ContextPolicy,
        result_labels: &[Label],
        declared_output_labels: &[Label],
    ) -> Result<(Envelope, Transition), EnvelopeError> {
        self.check_policy(policy)?;
        let new = policy
            .resolve_labels(result_labels.iter().chain(declared_output_labels))
            .map_err(|labels| EnvelopeError::UnknownLabels { labels })?;
        let version = self.next_version()?;
        let after = policy.close(
            self.labels.union(new),
            self.derived,
            self.sensitivity,
            self.restrictions,
        );
        // The result's own classification, raised to the envelope's as it
        // stood when the step ran if that was at or above the threshold.
        let own = policy.own_level(new, after.rules);
        let result_sensitivity = if after.sensitivity >= policy.inherit_threshold() {
            let before = self.closure(policy).sensitivity;
            if before >= policy.inherit_threshold() {
                own.max(before)
            } else {
                own
            }
        } else {
            own
        };
        let next = Envelope::closed(Arc::clone(&self.ident), &after, version, policy);
        let mut t = Transition::between(TransitionKind::Accumulated, self, &next, after.rules);
        t.result_sensitivity = Some(result_sensitivity);
        Ok((next, t))
    }

    /// Build the envelope of a delegated child. The only way to make one.
    ///
    /// The child gets: this envelope's restrictions *as projected* (every rule
    /// the labels trigger applied) ∪ `declared_restrictions`; sensitivity at
    /// least the projected one; the labels and derived labels, or none when
    /// `redact_labels` (the payload is reduced; sensitivity and restrictions
    /// are kept regardless); depth + 1; this envelope as parent; the same
    /// workflow; version 0.
    #[inline]
    pub fn delegate(
        &self,
        policy: &ContextPolicy,
        child_agent: AgentId,
        child_envelope_id: EnvelopeId,
        declared_restrictions: &[Label],
        redact_labels: bool,
    ) -> Result<(Envelope, Transition), EnvelopeError> {
        self.check_policy(policy)?;
        if child_envelope_id == self.ident.envelope_id {
            return Err(EnvelopeError::ChildIdIsParentId {
                envelope_id: child_envelope_id,
            });
        }
        let declared = policy
            .resolve_restrictions(declared_restrictions)
            .map_err(|restrictions| EnvelopeError::UnknownRestrictions { restrictions })?;
        let depth = self.ident.delegation_depth.checked_add(1).ok_or_else(|| {
            EnvelopeError::DepthExhausted {
                envelope_id: self.ident.envelope_id.clone(),
            }
        })?;
        let p = self.closure(policy);
        let (labels, derived, rules) = if redact_labels {
            (LabelBits::EMPTY, LabelBits::EMPTY, RuleBits::EMPTY)
        } else {
            (p.labels, p.derived, p.rules)
        };
        let child = Envelope {
            ident: Arc::new(Identity {
                envelope_id: child_envelope_id,
                parent_envelope_id: Some(self.ident.envelope_id.clone()),
                workflow_id: self.ident.workflow_id.clone(),
                agent_id: child_agent,
                delegation_depth: depth,
                vocab: Arc::clone(&self.ident.vocab),
            }),
            labels,
            derived,
            restrictions: p.restrictions.union(declared),
            sensitivity: p.sensitivity,
            version: 0,
            // Closed: the parent's closure (restrictions do not trigger
            // rules), or no labels at all at the parent's level.
            rules,
            closed_by: policy.closure_id(),
        };
        let mut t = Transition::between(TransitionKind::Delegated, self, &child, rules);
        t.redacted = redact_labels;
        Ok((child, t))
    }

    /// Lower the envelope to `to`, removing `remove_labels` (observed or
    /// derived). The only way sensitivity ever drops.
    ///
    /// Refused unless `by` is a declassifier, the justification is non-empty,
    /// at most [`MAX_JUSTIFICATION_BYTES`] and free of control characters,
    /// `to` is not above the current (projected) level, and the labels left
    /// imply nothing above `to` (otherwise the next fold would silently undo
    /// the declassification). Restrictions are never removed, not even here:
    /// children may already have inherited them, and invariant 8 lets only
    /// sensitivity drop. The version goes up by one.
    pub fn declassify(
        &self,
        policy: &ContextPolicy,
        by: &AgentId,
        to: Sensitivity,
        remove_labels: &[Label],
        justification: &str,
    ) -> Result<(Envelope, Transition), EnvelopeError> {
        self.check_policy(policy)?;
        if !policy.is_declassifier(by) {
            return Err(EnvelopeError::NotADeclassifier { agent: by.clone() });
        }
        if justification.trim().is_empty() {
            return Err(EnvelopeError::MissingJustification);
        }
        if justification.len() > MAX_JUSTIFICATION_BYTES {
            return Err(EnvelopeError::JustificationTooLong {
                len: justification.len(),
            });
        }
        if justification.chars().any(char::is_control) {
            return Err(EnvelopeError::JustificationControlCharacter);
        }
        let remove = policy
            .resolve_labels(remove_labels)
            .map_err(|labels| EnvelopeError::UnknownLabels { labels })?;
        let current = self.closure(policy);
        if to > current.sensitivity {
            return Err(EnvelopeError::NotALowering {
                envelope_id: self.ident.envelope_id.clone(),
                from: current.sensitivity,
                to,
            });
        }
        let left = policy.close(
            current.labels.minus(remove),
            current.derived.minus(remove),
            Sensitivity::Public,
            current.restrictions,
        );
        if left.sensitivity > to {
            return Err(EnvelopeError::StillImplied {
                envelope_id: self.ident.envelope_id.clone(),
                implied: left.sensitivity,
                to,
            });
        }
        let version = self.next_version()?;
        // Closed: `to` is at least what the remaining labels imply.
        let lowered = Closure {
            sensitivity: to,
            ..left
        };
        let next = Envelope::closed(Arc::clone(&self.ident), &lowered, version, policy);
        let mut t = Transition::between(TransitionKind::Declassified, self, &next, left.rules);
        t.declassification = Some(Box::new(Declassification {
            by: by.clone(),
            justification: justification.to_owned(),
        }));
        Ok((next, t))
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("envelope_id", &self.ident.envelope_id)
            .field("parent_envelope_id", &self.ident.parent_envelope_id)
            .field("workflow_id", &self.ident.workflow_id)
            .field("agent_id", &self.ident.agent_id)
            .field("labels", &self.labels())
            .field("aggregate_sensitivity", &self.sensitivity)
            .field("derived", &self.derived())
            .field("delegation_depth", &self.ident.delegation_depth)
            .field("restrictions", &self.restrictions())
            .field("version", &self.version)
            .finish()
    }
}

impl Serialize for Envelope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_record().serialize(serializer)
    }
}

/// The record form of an envelope: names only, for storage, JSON and signed
/// tokens. Sets are sorted. Turn it back into an [`Envelope`] with
/// [`Envelope::restore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeRecord {
    /// The envelope's id.
    pub envelope_id: EnvelopeId,
    /// The parent's id (`null` for a root).
    pub parent_envelope_id: Option<EnvelopeId>,
    /// The workflow.
    pub workflow_id: WorkflowId,
    /// The agent the envelope belongs to.
    pub agent_id: AgentId,
    /// Labels folded in from results.
    pub labels: BTreeSet<Label>,
    /// The aggregate sensitivity.
    pub aggregate_sensitivity: Sensitivity,
    /// Labels derived by aggregation rules.
    pub derived: BTreeSet<Label>,
    /// 0 for a root.
    pub delegation_depth: u32,
    /// Restrictions.
    pub restrictions: BTreeSet<Label>,
    /// The version.
    pub version: u64,
}

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
    result_sensitivity: Option<Sensitivity>,
    redacted: bool,
    declassification: Option<Box<Declassification>>,
}

impl Transition {
    fn between(kind: TransitionKind, from: &Envelope, to: &Envelope, rules: RuleBits) -> Self {
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
