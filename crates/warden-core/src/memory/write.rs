//! Writing: owner-only puts, optionally compare-and-set.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{MemoryRecord, RecordClass, Visibility};
use crate::decision::{Reason, reasons};
use crate::ids::{AgentId, Key, Namespace};
use crate::time::Timestamp;

/// A write (create or update) of one record, as an owner asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    /// The owner scope the write names (must be the actor).
    pub owner: AgentId,
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// New value.
    pub value: Value,
    /// Compare-and-set: `Some(0)` means "must not exist yet", `Some(n)` means
    /// "must be at revision n", `None` writes unconditionally.
    pub expected_revision: Option<u64>,
    /// New visibility; `None` keeps the current one (private on create).
    pub visibility: Option<Visibility>,
    /// New class; `None` keeps the current one (preference on create).
    pub class: Option<RecordClass>,
}

/// Why a put could not be applied to the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutRejection {
    /// The revision did not match (`current` is `None` if there is no record).
    Conflict {
        /// The stored revision, if a record exists.
        current: Option<u64>,
    },
}

impl PutRejection {
    /// The reason code a decision record carries for this rejection.
    pub fn reason(&self) -> Reason {
        match self {
            PutRejection::Conflict { .. } => reasons::REVISION_CONFLICT,
        }
    }
}

/// Reason for a record that is invalid for its class.
pub const INVALID_RECORD: &str = "invalid_record";

/// Check a write's authorisation and shape before touching storage.
///
/// Only the owner writes its records; the value must fit the class (a
/// `policy` value must fit its combinator; secrets and task state are
/// private). Returns the denial reason, if any.
pub fn check_write(actor: &AgentId, put: &Put) -> Result<(), Reason> {
    if &put.owner != actor {
        return Err(reasons::ACTOR_IS_NOT_OWNER);
    }
    if let Some(class) = &put.class {
        check_class(class, put.visibility, &put.value)?;
    }
    Ok(())
}

fn check_class(
    class: &RecordClass,
    visibility: Option<Visibility>,
    value: &Value,
) -> Result<(), Reason> {
    match class {
        RecordClass::Policy { combine } if !combine.accepts(value) => Err(Reason::with_param(
            INVALID_RECORD,
            "policy_value_does_not_fit_combinator",
        )),
        RecordClass::Secret { .. } | RecordClass::Task { .. }
            if visibility.is_some_and(|v| v != Visibility::Private) =>
        {
            Err(Reason::with_param(INVALID_RECORD, "class_is_private_only"))
        }
        _ => Ok(()),
    }
}

/// Compute the record a put produces from the current one, or reject it.
///
/// Stores call this inside the transaction that holds the current row, so
/// the compare and the mutation are one atomic step.
pub fn apply_put(
    current: Option<&MemoryRecord>,
    put: &Put,
    now: Timestamp,
) -> Result<MemoryRecord, PutRejection> {
    match (current, put.expected_revision) {
        (None, Some(n)) if n != 0 => return Err(PutRejection::Conflict { current: None }),
        (Some(c), Some(n)) if c.revision != n => {
            return Err(PutRejection::Conflict {
                current: Some(c.revision),
            });
        }
        _ => {}
    }
    Ok(match current {
        None => MemoryRecord {
            namespace: put.namespace.clone(),
            key: put.key.clone(),
            value: put.value.clone(),
            owner: put.owner.clone(),
            visibility: put.visibility.unwrap_or_default(),
            class: put.class.clone().unwrap_or_default(),
            revision: 1,
            created_at: now,
            updated_at: now,
        },
        Some(c) => MemoryRecord {
            namespace: c.namespace.clone(),
            key: c.key.clone(),
            value: put.value.clone(),
            owner: c.owner.clone(),
            visibility: put.visibility.unwrap_or(c.visibility),
            class: put.class.clone().unwrap_or_else(|| c.class.clone()),
            revision: c.revision.saturating_add(1),
            created_at: c.created_at,
            updated_at: now,
        },
    })
}

/// Check the record a put would produce against its class (a put that keeps
/// the class of a `policy` record must still fit its combinator).
pub fn check_result(record: &MemoryRecord) -> Result<(), Reason> {
    check_class(&record.class, Some(record.visibility), &record.value)
}
