//! Memory: resolve, write and delete, each decided and recorded.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Reason, Verdict, reasons};
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{
    Combinator, Contributor, MemoryRecord, Put, RecordClass, Resolution, Visibility, check_write,
    resolve,
};
use warden_store::{Delete, DeleteOutcome, PutOutcome, Store};

use crate::error::EngineError;

use crate::engine::{Caller, Engine, ops};

/// A resolved value with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedValue {
    /// The value.
    pub value: Value,
    /// The record's owner (for a combined policy value, the root-most
    /// contributor).
    pub owner_agent_id: AgentId,
    /// Visibility of the record.
    pub visibility: Visibility,
    /// Class name.
    pub class: String,
    /// Revision of the record.
    pub revision: u64,
    /// The combinator, for a `policy` value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub combinator: Option<Combinator>,
    /// Every contributing record, for a `policy` value.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub contributors: Vec<Contributor>,
}

/// The outcome of a read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadOutcome {
    /// The decision (recorded).
    pub decision: Decision,
    /// The value, when allowed.
    pub value: Option<ResolvedValue>,
}

/// The outcome of a write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteOutcome {
    /// The decision (recorded).
    pub decision: Decision,
    /// The stored record, when allowed.
    pub record: Option<MemoryRecord>,
    /// The current revision, on a conflict.
    pub current_revision: Option<u64>,
}

/// The outcome of a delete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteResult {
    /// The decision (recorded).
    pub decision: Decision,
    /// The deleted revision, when allowed.
    pub revision: Option<u64>,
    /// The current revision, on a conflict.
    pub current_revision: Option<u64>,
}

/// A write request in the owner's terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteRequest {
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Value.
    pub value: Value,
    /// Owner scope; defaults to the caller. Any other owner is denied.
    #[serde(default)]
    pub owner_agent_id: Option<AgentId>,
    /// Compare-and-set revision (0 = create only).
    #[serde(default)]
    pub expected_revision: Option<u64>,
    /// Visibility (kept on update when absent).
    #[serde(default)]
    pub visibility: Option<Visibility>,
    /// Class (kept on update when absent).
    #[serde(default)]
    pub class: Option<RecordClass>,
}

impl<S: Store> Engine<S> {
    // ------------------------------------------------------------------
    // Memory
    // ------------------------------------------------------------------

    /// Resolve `namespace.key` for `reader`, walking toward the root.
    pub async fn read(
        &self,
        reader: &AgentId,
        namespace: &Namespace,
        key: &Key,
    ) -> Result<ReadOutcome, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(reader.clone());
        let resource = format!("{namespace}.{key}");
        let lineage = match self.lineage_of(reader, ops::MEMORY_READ)? {
            Ok(l) => l,
            Err(reason) => {
                let d = self.decision(
                    &caller,
                    Verdict::Deny,
                    reason,
                    ops::MEMORY_READ,
                    resource,
                    now,
                );
                self.record(&d).await?;
                return Ok(ReadOutcome {
                    decision: d,
                    value: None,
                });
            }
        };
        let records = self
            .inner
            .store
            .get_records(namespace.clone(), key.clone(), lineage.clone())
            .await?;
        let resolution = resolve(
            reader,
            lineage.iter(),
            |owner| records.iter().find(|r| &r.owner == owner),
            now,
        );
        let (verdict, reason, value) = match resolution {
            Resolution::Found { record, reason } => (
                Verdict::Allow,
                reason,
                Some(ResolvedValue {
                    value: record.value.clone(),
                    owner_agent_id: record.owner.clone(),
                    visibility: record.visibility,
                    class: record.class.name().to_owned(),
                    revision: record.revision,
                    combinator: None,
                    contributors: Vec::new(),
                }),
            ),
            Resolution::Combined {
                value,
                combinator,
                contributors,
                reason,
            } => {
                let root = contributors.last().cloned();
                (
                    Verdict::Allow,
                    reason,
                    root.map(|root| ResolvedValue {
                        value,
                        owner_agent_id: root.owner_agent_id,
                        visibility: Visibility::Descendants,
                        class: "policy".into(),
                        revision: root.revision,
                        combinator: Some(combinator),
                        contributors,
                    }),
                )
            }
            Resolution::Denied { reason } => (Verdict::Deny, reason, None),
            Resolution::NotFound => (Verdict::Deny, reasons::RECORD_NOT_FOUND, None),
        };
        let d = self.decision(&caller, verdict, reason, ops::MEMORY_READ, resource, now);
        self.record(&d).await?;
        Ok(ReadOutcome { decision: d, value })
    }

    /// Write one record in the caller's own scope.
    pub async fn write(
        &self,
        actor: &AgentId,
        req: WriteRequest,
    ) -> Result<WriteOutcome, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let owner = req.owner_agent_id.clone().unwrap_or_else(|| actor.clone());
        let resource = format!("{owner}:{}.{}", req.namespace, req.key);
        let put = Put {
            owner,
            namespace: req.namespace,
            key: req.key,
            value: req.value,
            expected_revision: req.expected_revision,
            visibility: req.visibility,
            class: req.class,
        };
        let pre = match self.lineage_of(actor, ops::MEMORY_WRITE)? {
            Err(reason) => Err(reason),
            Ok(_) => check_write(actor, &put),
        };
        if let Err(reason) = pre {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason,
                ops::MEMORY_WRITE,
                resource,
                now,
            );
            self.record(&d).await?;
            return Ok(WriteOutcome {
                decision: d,
                record: None,
                current_revision: None,
            });
        }
        let allow = self.decision(
            &caller,
            Verdict::Allow,
            reasons::OWNER_WRITE,
            ops::MEMORY_WRITE,
            resource.clone(),
            now,
        );
        let conflict = self.decision(
            &caller,
            Verdict::Deny,
            reasons::REVISION_CONFLICT,
            ops::MEMORY_WRITE,
            resource.clone(),
            now,
        );
        let rejected = self.decision(
            &caller,
            Verdict::Deny,
            reasons::REVISION_CONFLICT,
            ops::MEMORY_WRITE,
            resource,
            now,
        );
        let (a, c, r) = (allow.clone(), conflict.clone(), rejected.clone());
        let outcome = self
            .inner
            .store
            .put_record(
                put,
                now,
                Box::new(move |o| {
                    let d = match o {
                        PutOutcome::Written { record, .. } => {
                            return vec![
                                AuditDraft::from_decision(&a)
                                    .with_details(json!({"revision": record.revision})),
                            ];
                        }
                        PutOutcome::Conflict { .. } => c,
                        PutOutcome::Rejected { reason } => Decision {
                            reason: Reason::from_string(reason.clone()),
                            ..r
                        },
                    };
                    vec![AuditDraft::from_decision(&d)]
                }),
            )
            .await?;
        Ok(match outcome {
            PutOutcome::Written { record, .. } => WriteOutcome {
                decision: allow,
                record: Some(record),
                current_revision: None,
            },
            PutOutcome::Conflict { current } => WriteOutcome {
                decision: conflict,
                record: None,
                current_revision: current,
            },
            PutOutcome::Rejected { reason } => WriteOutcome {
                decision: Decision {
                    reason: Reason::from_string(reason),
                    ..rejected
                },
                record: None,
                current_revision: None,
            },
        })
    }

    /// Delete one of the caller's own records.
    pub async fn delete(
        &self,
        actor: &AgentId,
        owner: Option<AgentId>,
        namespace: Namespace,
        key: Key,
        expected_revision: Option<u64>,
    ) -> Result<DeleteResult, EngineError> {
        let now = self.now();
        let caller = Caller::Agent(actor.clone());
        let owner = owner.unwrap_or_else(|| actor.clone());
        let resource = format!("{owner}:{namespace}.{key}");
        let pre = match self.lineage_of(actor, ops::MEMORY_WRITE)? {
            Err(reason) => Err(reason),
            Ok(_) if &owner != actor => Err(reasons::ACTOR_IS_NOT_OWNER),
            Ok(_) => Ok(()),
        };
        if let Err(reason) = pre {
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason,
                ops::MEMORY_DELETE,
                resource,
                now,
            );
            self.record(&d).await?;
            return Ok(DeleteResult {
                decision: d,
                revision: None,
                current_revision: None,
            });
        }
        let template = self.decision(
            &caller,
            Verdict::Allow,
            reasons::OWNER_DELETE,
            ops::MEMORY_DELETE,
            resource,
            now,
        );
        let t = template.clone();
        let outcome = self
            .inner
            .store
            .delete_record(
                Delete {
                    owner,
                    namespace,
                    key,
                    expected_revision,
                },
                Box::new(move |o| {
                    let d = outcome_decision(&t, o);
                    vec![AuditDraft::from_decision(&d)]
                }),
            )
            .await?;
        let decision = outcome_decision(&template, &outcome);
        Ok(match outcome {
            DeleteOutcome::Deleted { revision } => DeleteResult {
                decision,
                revision: Some(revision),
                current_revision: None,
            },
            DeleteOutcome::NotFound => DeleteResult {
                decision,
                revision: None,
                current_revision: None,
            },
            DeleteOutcome::Conflict { current } => DeleteResult {
                decision,
                revision: None,
                current_revision: Some(current),
            },
        })
    }
}

fn outcome_decision(template: &Decision, o: &DeleteOutcome) -> Decision {
    match o {
        DeleteOutcome::Deleted { .. } => template.clone(),
        DeleteOutcome::NotFound => Decision {
            verdict: Verdict::Deny,
            reason: reasons::RECORD_NOT_FOUND,
            ..template.clone()
        },
        DeleteOutcome::Conflict { .. } => Decision {
            verdict: Verdict::Deny,
            reason: reasons::REVISION_CONFLICT,
            ..template.clone()
        },
    }
}
