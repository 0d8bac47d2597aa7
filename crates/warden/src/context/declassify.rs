//! Declassification, signed export and receipts.

use serde_json::json;
use warden_core::decision::Verdict;
use warden_core::envelope::sign::{Receipt, SignedEnvelope, SigningKey, sign};
use warden_core::envelope::{IssuerId, Sensitivity};
use warden_core::ids::{AgentId, Label, RunId};
use warden_core::time::Timestamp;
use warden_store::{PutEnvelope, Store};

use crate::engine::{Caller, Engine, engine_reasons as er, ops};
use crate::error::{ConflictKind, EngineError, Missing};

use super::*;

impl<S: Store> Engine<S> {
    // ------------------------------------------------------------------
    // Declassification, export, receipts
    // ------------------------------------------------------------------

    /// Lower run `run_id`'s envelope to `to`, removing `remove_labels`: the
    /// only way an envelope's sensitivity ever drops.
    ///
    /// Allowed to an active agent the bundle lists under
    /// `context.declassifiers`, with a justification, and only as far as the
    /// labels left allow (see `Envelope::declassify`); restrictions are never
    /// removed. Recorded either way: an allowed declassification with the
    /// justification and the declassifier, a refusal with its reason.
    pub async fn declassify(
        &self,
        by: &AgentId,
        run_id: &RunId,
        to: Sensitivity,
        remove_labels: &[Label],
        justification: &str,
    ) -> Result<DeclassifyOutcome, EngineError> {
        let now = self.now();
        let policy = self
            .context_policy()
            .ok_or_else(|| EngineError::not_found(Missing::RunEnvelope, run_id.to_string()))?;
        let caller = Caller::Agent(by.clone());
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let resource = envelope_id.to_string();
        let inactive = {
            let state = self.read_state()?;
            match state.hierarchy.get(by.as_str()) {
                None => Some(warden_core::decision::reasons::UNKNOWN_AGENT),
                Some(n) if !n.is_active() => Some(warden_core::decision::reasons::AGENT_REVOKED),
                Some(_) => None,
            }
        };
        for _ in 0..MAX_ENVELOPE_ATTEMPTS {
            let current = self.load_envelope(policy, &envelope_id).await?;
            let result = match &inactive {
                Some(reason) => Err((reason.clone(), String::from("the agent is not active"))),
                None => current
                    .declassify(policy, by, to, remove_labels, justification)
                    .map_err(|e| (e.reason(), e.to_string())),
            };
            let (next, t) = match result {
                Ok(x) => x,
                Err((reason, message)) => {
                    let d = self.decision(
                        &caller,
                        Verdict::Deny,
                        reason,
                        ops::CONTEXT_DECLASSIFY,
                        resource,
                        now,
                    );
                    let draft = self.draft(&d).with_details(json!({
                        "run_id": run_id,
                        "envelope_id": envelope_id,
                        "envelope_version": current.version(),
                        "classification": current.aggregate_sensitivity(),
                        "requested": to,
                        "remove_labels": remove_labels,
                        "justification_bytes": justification.len(),
                        "message": message,
                    }));
                    self.inner.store.append_audit(vec![draft]).await?;
                    return Ok(DeclassifyOutcome {
                        decision: d,
                        envelope: None,
                    });
                }
            };
            let d = self.decision(
                &caller,
                Verdict::Allow,
                t.reason(),
                ops::CONTEXT_DECLASSIFY,
                resource.clone(),
                now,
            );
            let draft = self.transition_draft(
                &caller,
                ops::CONTEXT_DECLASSIFY,
                &t,
                json!({"run_id": run_id}),
                now,
            );
            let record = next.to_record();
            let written = self
                .inner
                .store
                .put_envelope(
                    record.clone(),
                    Some(current.version()),
                    Box::new(move |o| match o {
                        PutEnvelope::Written => vec![draft],
                        PutEnvelope::Conflict { .. } => Vec::new(),
                    }),
                )
                .await?;
            if written == PutEnvelope::Written {
                return Ok(DeclassifyOutcome {
                    decision: d,
                    envelope: Some(record),
                });
            }
        }
        Err(EngineError::Conflict {
            kind: ConflictKind::EnvelopeContention,
            id: envelope_id.to_string(),
        })
    }

    /// Sign the latest version of run `run_id`'s envelope as `issuer` with
    /// `key`, for a trust boundary (verify it with the core's `Verifier`).
    /// Recorded (`envelope_exported`) with the version and classification.
    pub async fn export_envelope(
        &self,
        caller: &Caller,
        run_id: &RunId,
        issuer: &IssuerId,
        key: &SigningKey,
    ) -> Result<SignedEnvelope, EngineError> {
        let now = self.now();
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let record = self
            .envelope(&envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Envelope, envelope_id.to_string()))?;
        let token = sign(&record, issuer, key).map_err(EngineError::internal)?;
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::ENVELOPE_EXPORTED,
            ops::CONTEXT_EXPORT,
            envelope_id.to_string(),
            now,
        );
        let draft = self.draft(&d).with_details(json!({
            "run_id": run_id,
            "envelope_version": record.version,
            "issuer": issuer,
            "classification": record.aggregate_sensitivity,
        }));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(token)
    }

    /// A receipt for the latest version of run `run_id`'s envelope: an
    /// opaque reference, the sensitivity tier and the window in which
    /// `issuer` keeps it resolvable. Recorded (`receipt_issued`).
    pub async fn receipt(
        &self,
        caller: &Caller,
        run_id: &RunId,
        issuer: &IssuerId,
        resolvable_until: Timestamp,
    ) -> Result<Receipt, EngineError> {
        let now = self.now();
        let (_, envelope_id) = self.run_envelope_id(run_id).await?;
        let record = self
            .envelope(&envelope_id, None)
            .await?
            .ok_or_else(|| EngineError::not_found(Missing::Envelope, envelope_id.to_string()))?;
        let receipt = Receipt::issue(&record, issuer, resolvable_until);
        let d = self.decision(
            caller,
            Verdict::Allow,
            er::RECEIPT_ISSUED,
            ops::CONTEXT_RECEIPT,
            envelope_id.to_string(),
            now,
        );
        let draft = self.draft(&d).with_details(json!({
            "run_id": run_id,
            "envelope_ref": receipt.envelope_ref,
            "envelope_version": record.version,
            "issuer": issuer,
            "classification": record.aggregate_sensitivity,
            "resolvable_until": resolvable_until,
        }));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(receipt)
    }
}
