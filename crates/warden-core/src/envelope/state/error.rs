//! Why an envelope transition (or restore) was refused.

use super::super::ident::EnvelopeId;
use super::super::policy::Sensitivity;
use super::super::reasons;
use super::MAX_JUSTIFICATION_BYTES;
use crate::decision::Reason;
use crate::ids::{AgentId, Label};

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
