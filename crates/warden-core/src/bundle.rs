//! The policy bundle: the one document that configures Warden.
//!
//! A bundle is YAML or JSON (JSON is tried first when the text starts with
//! `{`). It is parsed into [`BundleSpec`] (strict: unknown fields are errors)
//! and then compiled into a [`Policy`], which checks everything that refers
//! to something else: capabilities name known actions, agents form a valid
//! hierarchy, delegated agents carry no block-write surface, memory seeds
//! name registered owners and fit their class, the context section names
//! declared labels. Every problem is reported with its location, and all
//! problems are reported at once (`warden policy lint`).
//!
//! The bundle's JSON Schema is generated from these types ([`schema`]).

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::Digest;
use crate::capability::CapSet;
use crate::catalogue::{ActionCatalogue, ActionSpec};
use crate::envelope::{ContextPolicy, ContextPolicySpec};
use crate::hierarchy::{AgentSpec, Hierarchy, HierarchyError, HierarchyLimits};
use crate::ids::{ActionName, AgentId, Key, Namespace};
use crate::lockdown::{self, BLOCK_WRITE_TAG};
use crate::memory::{Combinator, RecordClass, Visibility};
use crate::sop::SopLimits;
use crate::time::Timestamp;

/// The bundle as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BundleSpec {
    /// The version every decision records (1 to 128 printable characters).
    pub policy_version: String,
    /// Capabilities the environment offers at all; every agent's effective
    /// set is within these.
    #[serde(default)]
    pub environment_capabilities: Vec<ActionName>,
    /// Structural limits.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// The action catalogue: the allowlist of known actions.
    #[serde(default)]
    pub actions: BTreeMap<ActionName, ActionSpec>,
    /// Agents registered when a store is first created.
    #[serde(default)]
    pub agents: Vec<AgentSeed>,
    /// Memory records seeded when a store is first created.
    #[serde(default)]
    pub memory: Vec<MemorySeed>,
    /// Context accumulation: labels, aggregation rules, restrictions.
    #[serde(default)]
    pub context: Option<ContextPolicySpec>,
    /// Per-agent quotas enforced by the server.
    #[serde(default)]
    pub quotas: QuotasSpec,
}

/// Structural limits; each defaults to the documented value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Most agents on one lineage (default 64).
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// Most steps in one SOP (default 50).
    #[serde(default)]
    pub max_steps: Option<usize>,
    /// Largest serialised `arguments` of one step, in bytes (default 65536).
    #[serde(default)]
    pub max_argument_bytes: Option<usize>,
    /// Deepest JSON nesting of `arguments` (default 32).
    #[serde(default)]
    pub max_nesting_depth: Option<usize>,
}

/// An agent declared in the bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSeed {
    /// Its id.
    pub id: AgentId,
    /// Its parent, declared earlier or later in the list.
    #[serde(default)]
    pub parent: Option<AgentId>,
    /// Declared capabilities.
    #[serde(default)]
    pub capabilities: Vec<ActionName>,
    /// Tools it is built with (checked by delegation lockdown).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Its framework config (checked by delegation lockdown).
    #[serde(default)]
    pub config: Option<Value>,
}

/// A memory record seeded from the bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemorySeed {
    /// Owner.
    pub owner: AgentId,
    /// Namespace.
    pub namespace: Namespace,
    /// Key.
    pub key: Key,
    /// Value.
    pub value: Value,
    /// Visibility (default private).
    #[serde(default)]
    pub visibility: Visibility,
    /// Class (default preference).
    #[serde(default)]
    pub class: ClassName,
    /// Combinator, required for `policy`.
    #[serde(default)]
    pub combine: Option<Combinator>,
    /// Grantees, for `secret`.
    #[serde(default)]
    pub grants: Vec<AgentId>,
    /// Expiry in ms since the epoch, for `task`.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

/// A record class as written in the bundle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClassName {
    /// Nearest-visible.
    #[default]
    Preference,
    /// Mandatory, combined.
    Policy,
    /// Owner and grantees only.
    Secret,
    /// Private, temporary.
    Task,
}

/// Quotas for agents, enforced by the server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotasSpec {
    /// Applies to every agent without its own entry.
    #[serde(default)]
    pub default: Option<Quota>,
    /// Per-agent quotas.
    #[serde(default)]
    pub agents: BTreeMap<AgentId, Quota>,
}

/// Limits on what one agent may consume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Requests per second (token bucket, burst = the same number).
    #[serde(default)]
    pub requests_per_second: Option<u32>,
    /// Memory records owned.
    #[serde(default)]
    pub max_records: Option<u64>,
    /// Bytes of memory values owned.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Runs admitted and not finished.
    #[serde(default)]
    pub max_runs_in_flight: Option<u32>,
}

/// One problem in a bundle, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleIssue {
    /// A path into the document (`agents[2].parent`), or `line:column` for
    /// syntax errors.
    pub location: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for BundleIssue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// Why a bundle was refused: every problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy bundle has {} problem(s); first: {}", .issues.len(), .issues.first().map(|i| i.to_string()).unwrap_or_default())]
pub struct BundleError {
    /// The problems, in document order.
    pub issues: Vec<BundleIssue>,
}

impl BundleError {
    fn one(location: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            issues: vec![BundleIssue {
                location: location.into(),
                message: message.into(),
            }],
        }
    }
}

/// A compiled, validated policy.
#[derive(Debug)]
pub struct Policy {
    /// The version every decision records.
    pub version: String,
    /// The action catalogue.
    pub catalogue: ActionCatalogue,
    /// Environment capabilities as a set.
    pub environment: CapSet,
    /// Actions no delegated (non-root) agent may hold: those tagged
    /// `block_write`.
    pub non_root_forbidden: CapSet,
    /// Hierarchy limits.
    pub hierarchy_limits: HierarchyLimits,
    /// SOP parsing limits.
    pub sop_limits: SopLimits,
    /// Agents to seed, validated.
    pub agents: Vec<AgentSeed>,
    /// Memory to seed, validated.
    pub memory: Vec<MemorySeed>,
    /// Context accumulation policy, if configured.
    pub context: Option<ContextPolicy>,
    /// Quotas.
    pub quotas: QuotasSpec,
    /// SHA-256 of the bundle text.
    pub source_hash: Digest,
    /// The bundle as parsed.
    pub spec: BundleSpec,
}

/// Parse bundle text (YAML or JSON) into its spec, with located syntax errors.
pub fn parse_spec(text: &str) -> Result<BundleSpec, BundleError> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| BundleError::one(format!("{}:{}", e.line(), e.column()), e.to_string()))
    } else {
        serde_saphyr::from_str(text).map_err(|e| BundleError::one("yaml", e.to_string()))
    }
}

/// Parse and compile bundle text.
pub fn compile(text: &str) -> Result<Policy, BundleError> {
    let spec = parse_spec(text)?;
    Policy::compile(spec, Digest::of(text.as_bytes()))
}

/// The bundle's JSON Schema.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(BundleSpec)).unwrap_or(Value::Null)
}

impl Policy {
    /// Validate a parsed bundle.
    pub fn compile(spec: BundleSpec, source_hash: Digest) -> Result<Self, BundleError> {
        let mut issues = Vec::new();
        let mut push =
            |location: String, message: String| issues.push(BundleIssue { location, message });

        let v = &spec.policy_version;
        if v.is_empty() || v.len() > 128 || v.chars().any(|c| c.is_control()) {
            push(
                "policy_version".into(),
                "must be 1 to 128 printable characters".into(),
            );
        }

        let catalogue = match ActionCatalogue::compile(&spec.actions) {
            Ok(c) => Some(c),
            Err(e) => {
                push(e.location(), e.to_string());
                None
            }
        };

        let context = match &spec.context {
            None => None,
            Some(c) => match ContextPolicy::compile(c) {
                Ok(p) => Some(p),
                Err(e) => {
                    push("context".into(), e.to_string());
                    None
                }
            },
        };

        let limits = &spec.limits;
        let hierarchy_limits = HierarchyLimits {
            max_depth: limits.max_depth.unwrap_or(64),
        };
        if hierarchy_limits.max_depth == 0 {
            push("limits.max_depth".into(), "must be at least 1".into());
        }
        let defaults = SopLimits::default();
        let sop_limits = SopLimits {
            max_steps: limits.max_steps.unwrap_or(defaults.max_steps),
            max_argument_bytes: limits
                .max_argument_bytes
                .unwrap_or(defaults.max_argument_bytes),
            max_depth: limits.max_nesting_depth.unwrap_or(defaults.max_depth),
            ..defaults
        };

        let Some(catalogue) = catalogue else {
            return Err(BundleError { issues });
        };

        let index_of = |a: &ActionName| catalogue.index_of(a.as_str()).map(|i| i.get());
        for (i, cap) in spec.environment_capabilities.iter().enumerate() {
            if index_of(cap).is_none() {
                push(
                    format!("environment_capabilities[{i}]"),
                    format!("unknown action `{cap}`: declare it under `actions`"),
                );
            }
        }
        let environment =
            CapSet::from_indices(spec.environment_capabilities.iter().filter_map(index_of));
        let non_root_forbidden = CapSet::from_indices(
            catalogue
                .iter()
                .filter(|a| a.has_tag(BLOCK_WRITE_TAG))
                .map(|a| a.index().get()),
        );

        // Agents: references, lockdown, then the hierarchy itself.
        for (i, a) in spec.agents.iter().enumerate() {
            for (j, cap) in a.capabilities.iter().enumerate() {
                if index_of(cap).is_none() {
                    push(
                        format!("agents[{i}].capabilities[{j}]"),
                        format!("unknown action `{cap}`: declare it under `actions`"),
                    );
                }
            }
            if a.parent.is_some()
                && let Err(e) = lockdown::check_prebuilt_child(&a.tools, a.config.as_ref())
            {
                push(format!("agents[{i}]"), e.to_string());
            }
        }
        let mut hierarchy = Hierarchy::new(
            environment.clone(),
            non_root_forbidden.clone(),
            hierarchy_limits,
        );
        let specs: Vec<AgentSpec> = spec.agents.iter().map(seed_spec).collect();
        if let Err(e) = hierarchy.register_all(&specs, &index_of) {
            let at = match &e {
                HierarchyError::DuplicateAgent(id)
                | HierarchyError::Cycle(id)
                | HierarchyError::UnknownParent { agent: id, .. }
                | HierarchyError::ParentRevoked { agent: id, .. }
                | HierarchyError::TooDeep { agent: id, .. } => {
                    spec.agents.iter().position(|a| &a.id == id)
                }
                _ => None,
            };
            let loc = at.map_or_else(|| "agents".to_string(), |i| format!("agents[{i}]"));
            push(loc, e.to_string());
        }

        // Output labels must be labels the context policy knows: folding an
        // unknown label fails the step, so catch it when the bundle loads.
        if let Some(cp) = &context {
            for action in catalogue.iter() {
                for (j, label) in action.output_labels().iter().enumerate() {
                    if cp.base_sensitivity(label.as_str()).is_none() {
                        push(
                            format!("actions.{}.output_labels[{j}]", action.name()),
                            format!("unknown label `{label}`: declare it under `context.labels`"),
                        );
                    }
                }
            }
        }

        // Memory seeds.
        let mut seen = BTreeSet::new();
        for (i, m) in spec.memory.iter().enumerate() {
            let loc = format!("memory[{i}]");
            if hierarchy.index_of(m.owner.as_str()).is_none() {
                push(
                    format!("{loc}.owner"),
                    format!("unknown agent `{}`", m.owner),
                );
            }
            if !seen.insert((m.owner.clone(), m.namespace.clone(), m.key.clone())) {
                push(
                    loc.clone(),
                    format!(
                        "duplicate record `{}.{}` for owner `{}`",
                        m.namespace, m.key, m.owner
                    ),
                );
            }
            if let Err(msg) = seed_class(m) {
                push(loc, msg);
            }
        }

        if !issues.is_empty() {
            return Err(BundleError { issues });
        }
        Ok(Policy {
            version: spec.policy_version.clone(),
            catalogue,
            environment,
            non_root_forbidden,
            hierarchy_limits,
            sop_limits,
            agents: spec.agents.clone(),
            memory: spec.memory.clone(),
            context,
            quotas: spec.quotas.clone(),
            source_hash,
            spec,
        })
    }

    /// An empty hierarchy configured by this policy.
    pub fn empty_hierarchy(&self) -> Hierarchy {
        Hierarchy::new(
            self.environment.clone(),
            self.non_root_forbidden.clone(),
            self.hierarchy_limits,
        )
    }

    /// Map an action name to its catalogue index.
    pub fn action_index(&self, name: &ActionName) -> Option<u16> {
        self.catalogue.index_of(name.as_str()).map(|i| i.get())
    }

    /// Names of the actions in `set`.
    pub fn action_names(&self, set: &CapSet) -> Vec<ActionName> {
        self.catalogue
            .iter()
            .filter(|a| set.contains(a.index().get()))
            .map(|a| a.name().clone())
            .collect()
    }

    /// One line per provenance rule, output trust and outbound read of
    /// every bundle-declared action, prefixed with the action's location
    /// (`actions.send_money: argument ...`), for `warden policy lint`.
    pub fn explain_provenance(&self) -> Vec<String> {
        let mut out = Vec::new();
        for action in self.catalogue.iter() {
            if !self.spec.actions.contains_key(action.name()) {
                continue;
            }
            for line in action.provenance().explain() {
                out.push(format!("actions.{}: {line}", action.name()));
            }
        }
        out
    }

    /// The quota that applies to `agent`.
    pub fn quota_for(&self, agent: &AgentId) -> Option<Quota> {
        self.quotas
            .agents
            .get(agent)
            .copied()
            .or(self.quotas.default)
    }
}

/// The hierarchy-facing part of a seed.
pub fn seed_spec(a: &AgentSeed) -> AgentSpec {
    AgentSpec {
        id: a.id.clone(),
        parent: a.parent.clone(),
        capabilities: a.capabilities.iter().cloned().collect(),
    }
}

/// The record class of a seed, checked against its other fields.
pub fn seed_class(m: &MemorySeed) -> Result<RecordClass, String> {
    let class = match m.class {
        ClassName::Preference => RecordClass::Preference,
        ClassName::Policy => {
            let Some(combine) = m.combine else {
                return Err(
                    "a `policy` record needs `combine` (all, any, min, max, intersection)".into(),
                );
            };
            if !combine.accepts(&m.value) {
                return Err(format!(
                    "value does not fit combinator `{}`",
                    combine.as_str()
                ));
            }
            RecordClass::Policy { combine }
        }
        ClassName::Secret => RecordClass::Secret {
            grants: m.grants.clone(),
        },
        ClassName::Task => RecordClass::Task {
            expires_at: m.expires_at.map(Timestamp),
        },
    };
    if m.combine.is_some() && m.class != ClassName::Policy {
        return Err("`combine` applies only to `policy` records".into());
    }
    if !m.grants.is_empty() && m.class != ClassName::Secret {
        return Err("`grants` applies only to `secret` records".into());
    }
    if m.expires_at.is_some() && m.class != ClassName::Task {
        return Err("`expires_at` applies only to `task` records".into());
    }
    if matches!(m.class, ClassName::Secret | ClassName::Task) && m.visibility != Visibility::Private
    {
        return Err("`secret` and `task` records are always private".into());
    }
    Ok(class)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LAB: &str = include_str!("../../../examples/report-hierarchy/policy.yaml");

    #[test]
    fn the_example_bundle_compiles() {
        let p = compile(LAB).unwrap();
        assert_eq!(p.version, "lab-1");
        assert!(p.catalogue.index_of("memory.read").is_some());
        assert_eq!(p.agents.len(), 3);
    }

    #[test]
    fn json_and_yaml_give_the_same_policy() {
        let spec = parse_spec(LAB).unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(parse_spec(&json).unwrap(), spec);
    }

    #[test]
    fn problems_are_located_and_all_reported() {
        let bad = LAB
            .replace("    parent: researcher\n", "    parent: nobody\n")
            .replace(
                "environment_capabilities:\n",
                "environment_capabilities:\n  - shell.eval\n",
            )
            .replace("class: policy, combine: all", "class: policy");
        let err = compile(&bad).unwrap_err();
        let locations: Vec<&str> = err.issues.iter().map(|i| i.location.as_str()).collect();
        assert!(
            locations.contains(&"environment_capabilities[0]"),
            "{locations:?}"
        );
        assert!(locations.contains(&"agents[2]"), "{locations:?}");
        assert!(
            locations.iter().any(|l| l.starts_with("memory[")),
            "{locations:?}"
        );
    }

    #[test]
    fn syntax_errors_and_unknown_fields_are_refused() {
        assert!(compile("policy_version: [unclosed").is_err());
        assert!(compile("{\"policy_version\": \"x\", \"surprise\": 1}").is_err());
        let err = compile("policy_version: x\nagents:\n  - {id: a, parnet: b}\n").unwrap_err();
        assert!(err.issues[0].message.contains("parnet"), "{err:?}");
    }

    #[test]
    fn the_schema_names_every_top_level_field() {
        let schema = schema();
        let props = schema["properties"].as_object().unwrap();
        for field in [
            "policy_version",
            "environment_capabilities",
            "actions",
            "agents",
            "memory",
            "context",
            "quotas",
            "limits",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The bundle parser never panics, whatever the text.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            let _ = compile(&text);
        }

        /// Mutating the example bundle byte by byte never panics.
        #[test]
        fn mutated_bundles_never_panic(at in 0usize..4000, byte in any::<u8>()) {
            let mut bytes = LAB.as_bytes().to_vec();
            if let Some(b) = bytes.get_mut(at % LAB.len()) {
                *b = byte;
            }
            if let Ok(text) = String::from_utf8(bytes) {
                let _ = compile(&text);
            }
        }
    }
}
