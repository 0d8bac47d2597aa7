//! The transitions of an envelope: fold, delegate, declassify.

use super::*;

impl Envelope {
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
