//! The envelope value, its transitions and its record form.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use super::bits::{LabelBits, RestrictionBits, RuleBits};
use super::ident::{EnvelopeId, WorkflowId};
use super::policy::{Closure, ContextPolicy, NameSet, Sensitivity, Vocab};
use super::reasons;
use crate::decision::Reason;
use crate::ids::{AgentId, Label};

mod error;
mod record;
mod transition;
mod transitions;

pub use error::EnvelopeError;
pub(crate) use error::backticked;
pub use record::EnvelopeRecord;
pub use transition::{Declassification, Transition, TransitionKind};

/// Longest declassification justification accepted, in bytes.
pub const MAX_JUSTIFICATION_BYTES: usize = 1024;
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
}

impl Envelope {
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
