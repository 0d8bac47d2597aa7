//! Memory records with provenance, and the rules that read and write them.
//!
//! Reading and writing use different addressing on purpose (the lab
//! document's central rule):
//!
//! - a **read** walks from the reader toward the root and resolves the key
//!   along that lineage ([`resolve`]; [`resolve_in`] reaches the same answer
//!   from a [`MemoryIndex`] view without the walk when the key holds few
//!   records);
//! - a **write** names an exact owner scope and is permitted only to that
//!   owner ([`check_write`]), optionally as a compare-and-set on the revision
//!   ([`apply_put`], which a store runs inside its transaction).
//!
//! Record classes change how a key resolves:
//!
//! - `preference`: the nearest record on the lineage wins (shadowing allowed);
//!   if it is not visible to the reader the read is denied, it does not skip
//!   to a farther record.
//! - `policy`: mandatory. If any visible record on the lineage is of class
//!   `policy`, every visible `policy` record is combined with the combinator
//!   of the root-most one, and records of other classes at that key are
//!   ignored, so a descendant can neither shadow nor loosen the value.
//! - `secret`: never resolved through the hierarchy: visible only to its
//!   owner and to agents named in its grants.
//! - `task`: private temporary state with an optional expiry.

mod index;
mod resolve;
#[cfg(test)]
mod tests;
mod write;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{AgentId, Key, Namespace};
use crate::time::Timestamp;

pub use index::{KeyRecords, KeyView, MemoryIndex};
pub use resolve::{
    FEW_RECORDS, POLICY_TYPE_MISMATCH, Resolution, resolve, resolve_bounded, resolve_for,
    resolve_in,
};
pub use write::{INVALID_RECORD, Put, PutRejection, apply_put, check_result, check_write};

/// Who besides the owner may read a record.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// The owner only.
    #[default]
    Private,
    /// The owner and its direct children.
    Children,
    /// The owner and all its descendants.
    Descendants,
}

impl Visibility {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Visibility::Private => "private",
            Visibility::Children => "children",
            Visibility::Descendants => "descendants",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "private" => Some(Self::Private),
            "children" => Some(Self::Children),
            "descendants" => Some(Self::Descendants),
            _ => None,
        }
    }
}

impl std::str::FromStr for Visibility {
    type Err = String;

    /// Parse the snake_case name ([`Visibility::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Visibility::parse(s).ok_or_else(|| format!("unknown visibility `{s}`"))
    }
}

/// How `policy` records along a lineage combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Combinator {
    /// Booleans: true only if every level says true.
    All,
    /// Booleans: true if any level says true.
    Any,
    /// Numbers: the smallest.
    Min,
    /// Numbers: the largest.
    Max,
    /// Arrays: the elements every level lists.
    Intersection,
}

impl Combinator {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Combinator::All => "all",
            Combinator::Any => "any",
            Combinator::Min => "min",
            Combinator::Max => "max",
            Combinator::Intersection => "intersection",
        }
    }

    /// Parse the snake_case name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(Self::All),
            "any" => Some(Self::Any),
            "min" => Some(Self::Min),
            "max" => Some(Self::Max),
            "intersection" => Some(Self::Intersection),
            _ => None,
        }
    }

    /// Whether `value` has the type this combinator combines.
    pub fn accepts(self, value: &Value) -> bool {
        match self {
            Combinator::All | Combinator::Any => value.is_boolean(),
            Combinator::Min | Combinator::Max => value.is_number(),
            Combinator::Intersection => value.is_array(),
        }
    }
}

/// A record's class and the data only that class has.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum RecordClass {
    /// Nearest-visible resolution.
    #[default]
    Preference,
    /// Mandatory, combined along the lineage.
    Policy {
        /// How the levels combine.
        combine: Combinator,
    },
    /// Never resolved through the hierarchy.
    Secret {
        /// Agents besides the owner that may read it.
        #[serde(default)]
        grants: Vec<AgentId>,
    },
    /// Private temporary state.
    Task {
        /// When it stops resolving.
        #[serde(default)]
        expires_at: Option<Timestamp>,
    },
}

impl RecordClass {
    /// The class name.
    pub fn name(&self) -> &'static str {
        match self {
            RecordClass::Preference => "preference",
            RecordClass::Policy { .. } => "policy",
            RecordClass::Secret { .. } => "secret",
            RecordClass::Task { .. } => "task",
        }
    }
}

impl std::str::FromStr for Combinator {
    type Err = String;

    /// Parse the snake_case name ([`Combinator::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Combinator::parse(s).ok_or_else(|| format!("unknown combinator `{s}`"))
    }
}

/// One stored memory record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// Namespace.
    pub namespace: Namespace,
    /// Key within the namespace.
    pub key: Key,
    /// The value.
    pub value: Value,
    /// The only agent that may write or delete it.
    pub owner: AgentId,
    /// Who else may read it.
    pub visibility: Visibility,
    /// Its class.
    #[serde(flatten)]
    pub class: RecordClass,
    /// 1 on create, +1 per write.
    pub revision: u64,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}

impl MemoryRecord {
    /// The resource name used in decisions: `namespace.key`.
    pub fn resource(&self) -> String {
        format!("{}.{}", self.namespace, self.key)
    }

    fn expired(&self, now: Timestamp) -> bool {
        matches!(self.class, RecordClass::Task { expires_at: Some(t) } if t <= now)
    }
}

/// One record that contributed to a combined `policy` value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contributor {
    /// Its owner.
    pub owner_agent_id: AgentId,
    /// Its revision.
    pub revision: u64,
    /// Its own value.
    pub value: Value,
}
