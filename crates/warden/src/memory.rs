//! Memory: resolve, write and delete, each decided and recorded.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use warden_core::audit::AuditDraft;
use warden_core::decision::{Decision, Reason, Verdict, reasons};
use warden_core::ids::{AgentId, Key, Namespace};
use warden_core::memory::{
    Combinator, Contributor, INVALID_RECORD, MemoryRecord, Put, RecordClass, Resolution,
    Visibility, check_write, resolve,
};
use warden_store::{Delete, DeleteOutcome, PutOutcome, QuotaKind, StorageQuota, Store};

use crate::error::EngineError;

use crate::engine::{Caller, Engine, engine_reasons as er, ops};

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
    /// What the decision means for the caller.
    pub status: ReadStatus,
}

/// What a read's decision means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadStatus {
    /// A value was resolved.
    Found,
    /// Nothing the reader may see: no record, a record not visible to it,
    /// a secret it holds no grant for, expired task state. These look the
    /// same to a non-owner (the log keeps the true reason).
    Hidden,
    /// The read itself is refused (no `memory.read` capability, a revoked
    /// agent, a policy value of the wrong type along the lineage).
    Denied,
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
    /// What the decision means for the caller.
    pub status: WriteStatus,
}

/// What a write's (or delete's) decision means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum WriteStatus {
    /// Stored (or deleted).
    Done,
    /// Not at the expected revision; nothing changed.
    Conflict,
    /// No such record (delete only); nothing changed.
    NotFound,
    /// The record would be invalid for its class; nothing changed.
    InvalidRecord,
    /// The write would exceed the owner's storage quota; nothing changed.
    OverQuota {
        /// Which quota.
        quota: QuotaKind,
        /// The limit.
        limit: u64,
        /// The owner's usage before the write.
        used: u64,
    },
    /// Refused (capability, owner scope); nothing changed.
    Denied,
}

/// The reason code of a write refused by `quota`.
pub fn quota_reason(quota: QuotaKind) -> Reason {
    match quota {
        QuotaKind::Records => er::QUOTA_MAX_RECORDS,
        QuotaKind::Bytes => er::QUOTA_MAX_BYTES,
    }
}

/// Reasons under which a resolution is hidden from a reader.
fn is_hidden(reason: &Reason) -> bool {
    matches!(
        reason.kind(),
        reasons::NOT_VISIBLE_FROM | "record_not_found" | "record_expired" | "secret_not_granted"
    )
}

/// The outcome of a delete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteResult {
    /// What the decision means for the caller.
    pub status: WriteStatus,
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
        self.read_recorded(reader, namespace, key, Vec::new()).await
    }

    /// [`Engine::read`], recording `pre` (entries of the decision that led
    /// to it, such as a step's gate) in the same transaction, before it.
    pub(crate) async fn read_recorded(
        &self,
        reader: &AgentId,
        namespace: &Namespace,
        key: &Key,
        mut pre: Vec<AuditDraft>,
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
                pre.push(self.draft(&d));
                self.inner.store.append_audit(pre).await?;
                return Ok(ReadOutcome {
                    decision: d,
                    value: None,
                    status: ReadStatus::Denied,
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
        let status = match (&value, verdict) {
            (Some(_), Verdict::Allow) => ReadStatus::Found,
            _ if is_hidden(&reason) => ReadStatus::Hidden,
            _ => ReadStatus::Denied,
        };
        let d = self.decision(&caller, verdict, reason, ops::MEMORY_READ, resource, now);
        pre.push(self.draft(&d));
        self.inner.store.append_audit(pre).await?;
        Ok(ReadOutcome {
            decision: d,
            value,
            status,
        })
    }

    /// Write one record in the caller's own scope.
    pub async fn write(
        &self,
        actor: &AgentId,
        req: WriteRequest,
    ) -> Result<WriteOutcome, EngineError> {
        self.write_recorded(actor, req, Vec::new()).await
    }

    /// [`Engine::write`], recording `pre` in the same transaction, before
    /// the write's own entry.
    /// A secret's grant must name an agent that exists: a grant to an id
    /// nobody holds yet would go to whoever registers it first (any agent
    /// may register it as its own child). Agent ids are never reused, so
    /// a grant stays bound to the agent it named.
    fn unknown_grantee(&self, put: &Put) -> Result<Option<Reason>, EngineError> {
        let Some(warden_core::memory::RecordClass::Secret { grants }) = &put.class else {
            return Ok(None);
        };
        let state = self.read_state()?;
        Ok(grants
            .iter()
            .any(|g| state.hierarchy.index_of(g.as_str()).is_none())
            .then(|| Reason::with_param(warden_core::memory::INVALID_RECORD, "unknown_grantee")))
    }

    pub(crate) async fn write_recorded(
        &self,
        actor: &AgentId,
        req: WriteRequest,
        mut pre: Vec<AuditDraft>,
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
        let checked = match self.lineage_of(actor, ops::MEMORY_WRITE)? {
            Err(reason) => Err(reason),
            Ok(_) => match check_write(actor, &put) {
                Err(reason) => Err(reason),
                Ok(()) => self.unknown_grantee(&put)?.map_or(Ok(()), Err),
            },
        };
        if let Err(reason) = checked {
            let status = if reason.kind() == INVALID_RECORD {
                WriteStatus::InvalidRecord
            } else {
                WriteStatus::Denied
            };
            let d = self.decision(
                &caller,
                Verdict::Deny,
                reason,
                ops::MEMORY_WRITE,
                resource,
                now,
            );
            pre.push(self.draft(&d));
            self.inner.store.append_audit(pre).await?;
            return Ok(WriteOutcome {
                decision: d,
                record: None,
                current_revision: None,
                status,
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
        let quota = self.storage_quota(actor);
        let outcome = self
            .inner
            .store
            .put_record(
                put,
                now,
                quota,
                // Called once per attempt at the put (`PutAuditFn`).
                Box::new(move |o| {
                    let mut drafts = pre.clone();
                    drafts.push(match o {
                        PutOutcome::Written { record, .. } => AuditDraft::from_decision(&a)
                            .with_details(json!({"revision": record.revision})),
                        PutOutcome::Conflict { .. } => AuditDraft::from_decision(&c),
                        PutOutcome::Rejected { reason } => AuditDraft::from_decision(&Decision {
                            reason: Reason::from_string(reason.clone()),
                            ..r.clone()
                        }),
                        PutOutcome::OverQuota { quota, limit, used } => {
                            AuditDraft::from_decision(&Decision {
                                reason: quota_reason(*quota),
                                ..r.clone()
                            })
                            .with_details(json!({"limit": limit, "used": used}))
                        }
                    });
                    drafts
                }),
            )
            .await?;
        Ok(match outcome {
            PutOutcome::Written { record, .. } => WriteOutcome {
                decision: allow,
                record: Some(record),
                current_revision: None,
                status: WriteStatus::Done,
            },
            PutOutcome::Conflict { current } => WriteOutcome {
                decision: conflict,
                record: None,
                current_revision: current,
                status: WriteStatus::Conflict,
            },
            PutOutcome::Rejected { reason } => WriteOutcome {
                decision: Decision {
                    reason: Reason::from_string(reason),
                    ..rejected
                },
                record: None,
                current_revision: None,
                status: WriteStatus::InvalidRecord,
            },
            PutOutcome::OverQuota { quota, limit, used } => WriteOutcome {
                decision: Decision {
                    reason: quota_reason(quota),
                    ..rejected
                },
                record: None,
                current_revision: None,
                status: WriteStatus::OverQuota { quota, limit, used },
            },
        })
    }

    /// The bundle's storage quota for `owner` (records and bytes it may hold),
    /// checked by the store inside the write's transaction.
    pub(crate) fn storage_quota(&self, owner: &AgentId) -> StorageQuota {
        self.policy()
            .quota_for(owner)
            .map_or_else(StorageQuota::default, |q| StorageQuota {
                max_records: q.max_records,
                max_bytes: q.max_bytes,
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
                status: WriteStatus::Denied,
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
                status: WriteStatus::Done,
                decision,
                revision: Some(revision),
                current_revision: None,
            },
            DeleteOutcome::NotFound => DeleteResult {
                status: WriteStatus::NotFound,
                decision,
                revision: None,
                current_revision: None,
            },
            DeleteOutcome::Conflict { current } => DeleteResult {
                status: WriteStatus::Conflict,
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
