//! The record form of an envelope, and restoring one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;

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

impl Envelope {
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
}
