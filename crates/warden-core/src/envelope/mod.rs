//! Context envelopes: accumulation, aggregation, delegation, declassification
//! and signatures.
//!
//! A workflow can be compliant at every step and still become unsafe through
//! aggregation: a name, usage analytics and financial indicators are each
//! moderate, together they are a restricted customer risk profile. An
//! [`Envelope`] is the workflow's accumulated governance state (labels, a
//! sensitivity on the [`Sensitivity`] ladder, derived labels, grow-only
//! restrictions, a monotonic version), and the next action or delegation is
//! decided against it.
//!
//! # Flow
//!
//! 1. The engine starts a workflow with [`Envelope::root`].
//! 2. Before a step runs, [`decide`] answers `allow`, `constrain` (allowed,
//!    with [`Obligation`](crate::decision::Obligation)s), `deny` or
//!    `escalate`; for a run step, [`ContextGate`] keeps that answer for the
//!    step's begin and its completion.
//! 3. After it ran, [`Envelope::fold`] accumulates the labels its result
//!    actually carries (never a projection of output not yet produced).
//! 4. [`Envelope::delegate`] builds a child's envelope, and
//!    [`effective_delegated_authority`] what the child may do.
//! 5. [`Envelope::declassify`] is the one way down.
//! 6. Across a trust boundary the envelope travels signed ([`sign`]).
//!
//! Every transition returns the new envelope and a [`Transition`] for the
//! audit log (ids, label, restriction and rule names, levels; never data).
//!
//! # Semantics
//!
//! - **Labels are declared.** Each label has a base sensitivity in the
//!   policy (`labels:`), or is derived by a rule. Folding an unknown label is
//!   an error ([`EnvelopeError::UnknownLabels`]), not a silent drop and not a
//!   guess: nothing is folded, the engine fails the step's completion
//!   (`unknown_label`), and nothing is lowered.
//! - **Only labels and rules elevate.** Sensitivity is the highest of the
//!   stored level, the labels' base levels and the level of every rule whose
//!   `all_labels` the envelope holds. Growth alone (many harmless labels)
//!   never elevates; that is the backstop's business, and it escalates
//!   instead. Rules may depend on labels other rules derive; they are applied
//!   to a fixpoint, so the result does not depend on fold order.
//! - **Decisions project.** [`decide`] evaluates the envelope as it would be
//!   with every triggered rule applied, so a rule's restriction binds the
//!   very next request even when the stored envelope predates the rule (a
//!   record restored under a newer policy, or one written by a fold-only
//!   implementation).
//! - **Restrictions are hard gates.** A restriction that denies the action
//!   (by name or catalogue tag) or the delegation (by trust zone) is a
//!   `deny` with `restricted_by:<restriction>`, whatever the sensitivity.
//! - **The floor escalates.** At or above `restricted_floor`, an action
//!   tagged `export` or `external`, or an external delegation, that no
//!   restriction denies is escalated with `sensitivity_floor`: a human looks
//!   at a high-sensitivity flow out that the policy did not decide.
//! - **The backstop** fires when no rule applies and the envelope holds at
//!   least `min_labels` distinct labels at or above `at_or_above`
//!   (`aggregation_backstop`, `escalate` by default). Any applied rule means
//!   the organisation has governed the combination, so it suppresses the
//!   backstop. Without a `backstop:` entry there is none.
//! - **Conservative inference.** At or above `inherit_threshold`, a
//!   permitted step is constrained: its result must carry every label of the
//!   projected envelope (which, folded anywhere under the same policy,
//!   reproduces at least the envelope's level); [`Transition::result_sensitivity`]
//!   states the level. Whenever the envelope holds restrictions, children
//!   inherit them (an `InheritRestrictions` obligation).
//! - **Delegation** only goes through [`Envelope::delegate`]: child
//!   restrictions are the parent's (projected) plus the declared ones,
//!   sensitivity at least the parent's, labels optionally redacted. An
//!   external delegation to an agent able to perform an action the envelope
//!   restricts is denied (`delegation_denied:<action>`): beyond the trust
//!   boundary nothing in this deployment enforces the child envelope.
//! - **Declassification** needs an agent listed in `declassifiers` and a
//!   justification; it may remove labels and lower the level, but only to a
//!   level the remaining labels do not exceed. Restrictions are never
//!   removed, by anything.
//! - **Unknown restrictions** declared on a delegation are an error.
//!
//! # Relation to the Python reference
//!
//! Warden follows the agent-governance-toolkit 5.0.0 implementation
//! (`context_accumulation`, `context_aggregation`) where the designs agree:
//! replayed on its benchmark workload, with outcomes mapped as below, Warden
//! reproduces the reference's per-step outcome and child-restriction digests
//! exactly (see `the_reference_workload_digests_match_under_the_outcome_mapping`).
//! Deliberate differences:
//!
//! - a restriction that gates the request is a `deny` (`restricted_by:…`);
//!   the reference answers `CONSTRAIN` and relies on the host to refuse;
//! - at the floor the reference answers `CONSTRAIN` with the stored
//!   restrictions as obligations, possibly none, which a host with an
//!   obligation channel lets through; Warden escalates
//!   (`sensitivity_floor`), and only flows out (`export`/`external` tags,
//!   external delegation), where the reference also gates `memory_write`;
//! - the reference gates on the stored restrictions; Warden projects rules
//!   first (the reference's fold-only gap);
//! - restriction denials take precedence over the backstop (the reference
//!   checks the backstop first; the two differ only when restrictions were
//!   inherited or declared rather than produced by a rule);
//! - permitted requests carrying obligations are `constrain`, not `allow`;
//! - labels must be declared (the reference folds any string), result
//!   sensitivity comes from the policy rather than from the caller, a redacted
//!   child keeps its parent's sensitivity, and a fold is one version (the
//!   reference's `accumulate` counts two).
//!
//! # Performance
//!
//! [`ContextPolicy::compile`] interns labels (≤ 128), restrictions (≤ 64)
//! and rules (≤ 64) to indices, with hashed name lookups; envelopes hold
//! bitsets and share their ids behind one `Arc`. Every envelope built by a
//! transition is closed under the policy that built it and remembers so (by
//! a hash of the policy's whole content), so deciding on it needs no rule
//! evaluation; anything else (a restored record, another policy with the same
//! vocabulary) is re-projected. Nothing allocates on the allow and constrain
//! paths (obligations are materialised on demand).

mod bits;
mod decide;
mod gate;
mod ident;
mod names;
mod policy;
pub mod sign;
mod state;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use decide::{
    ActionRef, ContextDecision, ContextObligations, ContextRequest, RestrictionSet, decide,
    effective_delegated_authority,
};
pub use gate::ContextGate;
pub use ident::{EnvelopeId, IssuerId, WorkflowId};
pub use policy::{
    AggregationRuleSpec, BackstopSpec, BackstopVerdict, ContextPolicy, ContextPolicyError,
    ContextPolicySpec, DelegationScope, NO_EXTERNAL_DELEGATION, NO_EXTERNAL_EXPORT,
    NO_MEMORY_WRITE, NameSet, RestrictionSpec, RestrictionVerdict, Sensitivity, TAG_EXPORT,
    TAG_EXTERNAL, TrustZone,
};
pub use state::{
    Declassification, Envelope, EnvelopeError, EnvelopeRecord, MAX_JUSTIFICATION_BYTES, Transition,
    TransitionKind,
};

/// The reason codes of context decisions, transitions and verification.
pub mod reasons {
    use crate::decision::Reason;

    /// Prefix: a restriction denies the action or delegation
    /// (`restricted_by:no_external_export`).
    pub const RESTRICTED_BY: &str = "restricted_by";
    /// Prefix: an external delegation whose delegatee holds an action a
    /// restriction denies (`delegation_denied:external.upload`).
    pub const DELEGATION_DENIED: &str = "delegation_denied";
    /// Many labels, no rule covering them.
    pub const AGGREGATION_BACKSTOP: Reason = Reason::code("aggregation_backstop");
    /// A flow out at or above the floor that no restriction decides.
    pub const SENSITIVITY_FLOOR: Reason = Reason::code("sensitivity_floor");
    /// Nothing in the envelope bears on the request.
    pub const CONTEXT_ALLOWED: Reason = Reason::code("context_allowed");
    /// Allowed, with obligations.
    pub const CONTEXT_CONSTRAINED: Reason = Reason::code("context_constrained");
    /// The envelope belongs to another policy vocabulary.
    pub const ENVELOPE_POLICY_MISMATCH: Reason = Reason::code("envelope_policy_mismatch");
    /// A result (or a declassification) named a label the policy lacks.
    pub const UNKNOWN_LABEL: Reason = Reason::code("unknown_label");
    /// A delegation (or record) named a restriction the policy lacks.
    pub const UNKNOWN_RESTRICTION: Reason = Reason::code("unknown_restriction");
    /// Transition: a result was folded in.
    pub const CONTEXT_ACCUMULATED: Reason = Reason::code("context_accumulated");
    /// Transition: a child envelope was built.
    pub const CONTEXT_DELEGATED: Reason = Reason::code("context_delegated");
    /// Transition: the envelope was declassified.
    pub const DECLASSIFIED: Reason = Reason::code("declassified");
    /// Declassification by an agent not in `declassifiers`.
    pub const DECLASSIFICATION_NOT_AUTHORIZED: Reason =
        Reason::code("declassification_not_authorized");
    /// Declassification refused: justification, target or remaining labels.
    pub const DECLASSIFICATION_INVALID: Reason = Reason::code("declassification_invalid");
    /// An envelope record that contradicts itself.
    pub const ENVELOPE_RECORD_INVALID: Reason = Reason::code("envelope_record_invalid");
    /// Version or depth counter exhausted.
    pub const ENVELOPE_EXHAUSTED: Reason = Reason::code("envelope_exhausted");
    /// A token that is not a token.
    pub const ENVELOPE_MALFORMED: Reason = Reason::code("envelope_malformed");
    /// Unknown issuer, or a signature that does not verify.
    pub const ENVELOPE_FORGED: Reason = Reason::code("envelope_forged");
    /// Lower version or fewer restrictions than already accepted.
    pub const ENVELOPE_DOWNGRADED: Reason = Reason::code("envelope_downgraded");
    /// An `(envelope_id, version)` already accepted.
    pub const ENVELOPE_REPLAYED: Reason = Reason::code("envelope_replayed");
}
