//! Delegating a child from a signed envelope of another deployment.
//!
//! The envelope is imported the one way Warden imports envelopes: into a
//! session (of the parent) opened `from_envelope`, whose creation checks it
//! against every earlier import of the same envelope in the store's
//! transaction (forged, replayed and downgraded envelopes are refused and
//! nothing is created). The child is then delegated `from_session` that
//! carrier, so the imported restrictions and sensitivity bind it like an
//! inherited envelope. The carrier's id is derived from the child's id and
//! the envelope's id and version: a repeated delegation (a retry, or the
//! same request after an escalation was approved) finds the same import.

use warden_core::audit::Digest;
use warden_core::ids::SessionId;
use warden_store::Store;

use crate::agents::{DelegationOptions, RegisterAgent, Registration, RegistrationRefusal};
use crate::engine::{Caller, Engine};
use crate::error::EngineError;
use crate::sessions::{OpenSession, SessionOpening};

impl<S: Store> Engine<S> {
    /// `options` with `from_envelope` replaced by the session carrying its
    /// import (see the module docs), or the recorded refusal.
    pub(crate) async fn import_for_child(
        &self,
        caller: &Caller,
        req: &RegisterAgent,
        mut options: DelegationOptions,
    ) -> Result<Result<DelegationOptions, Registration>, EngineError> {
        let Some(token) = options.from_envelope.take() else {
            return Ok(Ok(options));
        };
        let Some(parent) = req.parent.clone() else {
            return Err(EngineError::input(
                "from_envelope",
                "an imported envelope is inherited by a child: name its parent",
            ));
        };
        if options.from_run.is_some() || options.from_session.is_some() {
            return Err(EngineError::input(
                "from_envelope",
                "a child inherits from one run, one session or one envelope",
            ));
        }
        let digest = Digest::of(
            format!(
                "warden.child-import.v1\n{}\n{}\n{}\n{}",
                req.id, token.issuer, token.envelope.envelope_id, token.envelope.version
            )
            .as_bytes(),
        );
        let hex = digest.to_hex();
        let carrier = SessionId::parse(&format!("import.{}", &hex[..32]))
            .map_err(|e| EngineError::internal(format!("carrier session id: {e}")))?;
        let opening = self
            .open_session(
                caller,
                OpenSession {
                    session_id: Some(carrier.clone()),
                    agent: Some(parent),
                    trusted_inputs: Vec::new(),
                    plan: None,
                    from_envelope: Some(token),
                },
            )
            .await?;
        match opening {
            SessionOpening::Opened { .. } => {
                options.from_session = Some(carrier);
                Ok(Ok(options))
            }
            SessionOpening::Refused { decision, .. } => Ok(Err(Registration::Refused {
                decision,
                refusal: RegistrationRefusal::Context,
            })),
        }
    }
}
