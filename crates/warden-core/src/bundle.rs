//! The policy bundle: the one document that configures Warden.
//!
//! A bundle is YAML or JSON (JSON is tried first when the text starts with
//! `{`). It is parsed into [`BundleSpec`] (strict: unknown fields are errors)
//! and then compiled into a [`Policy`], which checks everything that refers
//! to something else: capabilities name known actions, agents form a valid
//! hierarchy, delegated agents carry no block-write surface, memory seeds
//! name registered owners and fit their class, the context section names
//! declared labels, trusted issuers' keys decode. Every problem is reported with its location, and all
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
use crate::envelope::sign::VerifyingKey;
use crate::envelope::{ContextPolicy, ContextPolicySpec, IssuerId};
use crate::hierarchy::{AgentSpec, Hierarchy, HierarchyError, HierarchyLimits};
use crate::ids::{ActionName, AgentId, Key, Namespace};
use crate::json::{PathSeg, render_path};
use crate::lockdown::{self, BLOCK_WRITE_TAG, LockdownSpec, Vocabulary};
use crate::mcp::{McpServer, McpServerSpec, compile_servers};
use crate::memory::{Combinator, RecordClass, Visibility};
use crate::provenance::{IndexLimits, Otherwise, OutputSpec};
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
    /// Tool-call sessions: what an unplanned call gets, and the bounds of a
    /// session's source index (defaults apply when absent).
    #[serde(default)]
    pub sessions: Option<SessionsSpec>,
    /// Issuers whose signed envelopes may open a session `from_envelope`:
    /// issuer id (an identifier) to its Ed25519 public key, 32 bytes in
    /// standard base64.
    #[serde(default)]
    pub trusted_issuers: BTreeMap<String, String>,
    /// Upstream MCP servers the gateway reaches (see [`crate::mcp`]): tool
    /// `T` of server `S` is the action `S.T`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
    /// Delegation lockdown: tool names, presets and patterns added to the
    /// built-in write-surface vocabulary (see [`crate::lockdown`]). It can
    /// only add; the built-in vocabulary is always on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockdown: Option<LockdownSpec>,
}

/// The `sessions:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionsSpec {
    /// What happens to a call that matches no planned step of a plan-bound
    /// session: `deny` (the default) or `escalate`.
    #[serde(default)]
    pub unplanned: Option<Otherwise>,
    /// Most bytes of recorded text one session's source index searches
    /// (default 1048576); past it, content is unsearchable and vouches for
    /// nothing.
    #[serde(default)]
    pub max_recorded_bytes: Option<u64>,
    /// Most sources one session's index remembers (default 4096).
    #[serde(default)]
    pub max_sources: Option<u32>,
}

/// The compiled `sessions:` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    /// What happens to a call that matches no planned step.
    pub unplanned: Otherwise,
    /// Most bytes of recorded text a session's index searches.
    pub max_recorded_bytes: u64,
    /// Most sources a session's index remembers.
    pub max_sources: u32,
}

impl Default for SessionPolicy {
    /// Deny unplanned calls; the default [`IndexLimits`] (1 MiB, 4096
    /// sources).
    fn default() -> Self {
        let limits = IndexLimits::default();
        Self {
            unplanned: Otherwise::Deny,
            max_recorded_bytes: limits.max_bytes,
            max_sources: limits.max_sources,
        }
    }
}

impl SessionPolicy {
    /// The bounds of a session's source index (fields at the default).
    pub fn index_limits(&self) -> IndexLimits {
        IndexLimits {
            max_bytes: self.max_recorded_bytes,
            max_sources: self.max_sources,
            ..IndexLimits::default()
        }
    }

    fn compile(spec: &SessionsSpec, push: &mut impl FnMut(String, String)) -> Self {
        let defaults = Self::default();
        let policy = Self {
            unplanned: spec.unplanned.unwrap_or(defaults.unplanned),
            max_recorded_bytes: spec
                .max_recorded_bytes
                .unwrap_or(defaults.max_recorded_bytes),
            max_sources: spec.max_sources.unwrap_or(defaults.max_sources),
        };
        if policy.max_recorded_bytes == 0 {
            push(
                "sessions.max_recorded_bytes".into(),
                "must be at least 1".into(),
            );
        }
        if policy.max_sources == 0 {
            push("sessions.max_sources".into(), "must be at least 1".into());
        }
        policy
    }

    fn explain(&self) -> String {
        let unplanned = match self.unplanned {
            Otherwise::Deny => "denied",
            Otherwise::Escalate => "escalated to a human",
        };
        format!(
            "a call matching no planned step of a plan-bound session is {unplanned}; \
             a session's sources are searched up to {} bytes of recorded text and {} sources",
            self.max_recorded_bytes, self.max_sources
        )
    }
}

/// Decode the `trusted_issuers:` section, reporting each bad entry.
fn compile_issuers(
    spec: &BTreeMap<String, String>,
    push: &mut impl FnMut(String, String),
) -> BTreeMap<IssuerId, VerifyingKey> {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;

    let mut out = BTreeMap::new();
    for (id, key) in spec {
        let issuer = match IssuerId::parse(id) {
            Ok(issuer) => issuer,
            Err(e) => {
                push(
                    render_path("trusted_issuers", [PathSeg::Key(id)]),
                    format!("invalid issuer id: {e}"),
                );
                continue;
            }
        };
        let at = format!("trusted_issuers.{issuer}");
        let bytes = match BASE64.decode(key.trim().as_bytes()) {
            Ok(bytes) => bytes,
            Err(e) => {
                push(
                    at,
                    format!(
                        "the key is not standard base64: {}",
                        e.to_string().trim_end_matches('.')
                    ),
                );
                continue;
            }
        };
        let Ok(raw) = <[u8; 32]>::try_from(bytes.as_slice()) else {
            push(
                at,
                format!(
                    "the key is {} bytes, an Ed25519 public key is 32",
                    bytes.len()
                ),
            );
            continue;
        };
        match VerifyingKey::from_bytes(&raw) {
            Ok(k) if k.is_weak() => push(
                at,
                "the key is a weak (small-order) point, which verifies forged signatures".into(),
            ),
            Ok(k) => {
                out.insert(issuer, k);
            }
            Err(_) => push(at, "the key is not a valid Ed25519 public key".into()),
        }
    }
    out
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
    /// How long the first `begin` of a client-executed step holds it, in
    /// milliseconds (default 300000, five minutes; 1000 to 86400000): until
    /// then every other `begin` answers `in_progress` and only the holder
    /// may complete it; after, anyone may take the step over.
    #[serde(default)]
    pub step_lease_ms: Option<u64>,
}

/// The default of `limits.step_lease_ms`: five minutes.
pub const DEFAULT_STEP_LEASE_MS: u64 = 300_000;
/// The bounds of `limits.step_lease_ms`: a second to a day.
pub const STEP_LEASE_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=86_400_000;

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
    /// Requests per second of this agent alone (token bucket, burst = the
    /// same number).
    #[serde(default)]
    pub requests_per_second: Option<u32>,
    /// Requests per second of this agent and all its descendants together
    /// (one token bucket for the subtree, burst = the same number). Every
    /// request of an agent is charged to its own `requests_per_second`
    /// bucket and to the tree bucket of itself and of every ancestor that
    /// has this limit; it is taken only if all of them have a token. A
    /// descendant can therefore never exceed an ancestor's tree limit,
    /// whatever its own quota says, and delegating to more children does
    /// not multiply the rate.
    #[serde(default)]
    pub tree_requests_per_second: Option<u32>,
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
    /// How long a client-executed step's lease lasts, in milliseconds
    /// (`limits.step_lease_ms`).
    pub step_lease_ms: u64,
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
    sessions: SessionPolicy,
    trusted_issuers: BTreeMap<IssuerId, VerifyingKey>,
    mcp_servers: Vec<McpServer>,
    lockdown: Vocabulary,
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

        // Upstream MCP servers; a tool's action without an `output:` gets
        // its server's trust.
        let mcp_servers = compile_servers(&spec.mcp_servers, &mut push);
        let mut actions = std::borrow::Cow::Borrowed(&spec.actions);
        for server in &mcp_servers {
            let prefix = format!("{}.", server.name);
            let defaults: Vec<ActionName> = actions
                .iter()
                .filter(|(n, a)| n.as_str().starts_with(&prefix) && a.output.is_none())
                .map(|(n, _)| n.clone())
                .collect();
            for name in defaults {
                if let Some(a) = actions.to_mut().get_mut(&name) {
                    a.output = Some(OutputSpec {
                        trust: server.trust,
                        fields: BTreeMap::new(),
                    });
                }
            }
        }

        let catalogue = match ActionCatalogue::compile(&actions) {
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
        let step_lease_ms = limits.step_lease_ms.unwrap_or(DEFAULT_STEP_LEASE_MS);
        if !STEP_LEASE_MS_RANGE.contains(&step_lease_ms) {
            push(
                "limits.step_lease_ms".into(),
                format!(
                    "must be between {} and {}",
                    STEP_LEASE_MS_RANGE.start(),
                    STEP_LEASE_MS_RANGE.end()
                ),
            );
        }

        let sessions =
            SessionPolicy::compile(&spec.sessions.clone().unwrap_or_default(), &mut push);
        let trusted_issuers = compile_issuers(&spec.trusted_issuers, &mut push);
        let vocabulary = match &spec.lockdown {
            None => Vocabulary::builtin().clone(),
            Some(section) => Vocabulary::compile(section).unwrap_or_else(|found| {
                for issue in found {
                    push(issue.location, issue.message);
                }
                Vocabulary::builtin().clone()
            }),
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
                && let Err(e) =
                    lockdown::check_prebuilt_child(&vocabulary, &a.tools, a.config.as_ref())
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
                // The duplicate is the second declaration, not the first.
                HierarchyError::DuplicateAgent(id) => spec
                    .agents
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| &a.id == id)
                    .nth(1)
                    .map(|(i, _)| i),
                HierarchyError::Cycle(id)
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
            // A grant names an agent that exists: a grant to an id nobody
            // holds yet would go to whoever registers it first.
            for (j, g) in m.grants.iter().enumerate() {
                if hierarchy.index_of(g.as_str()).is_none() {
                    push(
                        format!("{loc}.grants[{j}]"),
                        format!("unknown agent `{g}`: a secret is granted to an agent that exists"),
                    );
                }
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
            step_lease_ms,
            agents: spec.agents.clone(),
            memory: spec.memory.clone(),
            context,
            quotas: spec.quotas.clone(),
            source_hash,
            spec,
            sessions,
            trusted_issuers,
            mcp_servers,
            lockdown: vocabulary,
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

    /// The delegation-lockdown vocabulary: the built-in one plus the
    /// bundle's `lockdown:` section. Every check of a delegated child's tool
    /// names goes through it.
    pub fn lockdown(&self) -> &Vocabulary {
        &self.lockdown
    }

    /// One line per part of the lockdown vocabulary (built-in rules, then
    /// the bundle's presets, names and patterns), for `warden policy lint`.
    pub fn explain_lockdown(&self) -> Vec<String> {
        self.lockdown.explain()
    }

    /// The `mcp_servers:` section, by name.
    pub fn mcp_servers(&self) -> &[McpServer] {
        &self.mcp_servers
    }

    /// The `sessions:` section (its defaults when the bundle has none).
    pub fn sessions(&self) -> &SessionPolicy {
        &self.sessions
    }

    /// The issuers whose signed envelopes may open a session.
    pub fn trusted_issuers(&self) -> &BTreeMap<IssuerId, VerifyingKey> {
        &self.trusted_issuers
    }

    /// One line per provenance rule, output trust and outbound read of
    /// every bundle-declared action, prefixed with the action's location
    /// (`actions.send_money: argument ...`), then one for the `sessions:`
    /// section if the bundle has one and one per trusted issuer
    /// (`trusted_issuers.<id>: ...`), for `warden policy lint`.
    pub fn explain_provenance(&self) -> Vec<String> {
        use base64::Engine;
        use base64::engine::general_purpose::STANDARD as BASE64;

        let mut out = Vec::new();
        for action in self.catalogue.iter() {
            if !self.spec.actions.contains_key(action.name()) {
                continue;
            }
            for line in action.provenance().explain() {
                out.push(format!("actions.{}: {line}", action.name()));
            }
        }
        if self.spec.sessions.is_some() {
            out.push(format!("sessions: {}", self.sessions.explain()));
        }
        if let Some(context) = &self.spec.context {
            for (name, r) in &context.restrictions {
                out.push(format!(
                    "context.restrictions.{name}: {}",
                    explain_restriction(r)
                ));
            }
        }
        for (issuer, key) in &self.trusted_issuers {
            out.push(format!(
                "trusted_issuers.{issuer}: envelopes signed by Ed25519 key {} may open a session",
                BASE64.encode(key.as_bytes())
            ));
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

/// What a declared restriction does, in one sentence.
fn explain_restriction(r: &crate::envelope::RestrictionSpec) -> String {
    let list = |xs: Vec<String>| xs.join(", ");
    let mut covers = Vec::new();
    if !r.denies_actions.is_empty() {
        covers.push(format!(
            "the actions {}",
            list(r.denies_actions.iter().map(|a| format!("`{a}`")).collect())
        ));
    }
    if !r.denies_tags.is_empty() {
        covers.push(format!(
            "actions tagged {}",
            list(r.denies_tags.iter().map(|t| format!("`{t}`")).collect())
        ));
    }
    if let Some(scope) = r.denies_delegation {
        covers.push(match scope {
            crate::envelope::DelegationScope::External => "delegation to an external zone".into(),
            crate::envelope::DelegationScope::All => "every delegation".into(),
        });
    }
    let verb = if r.verdict.is_deny() {
        "denies"
    } else {
        "escalates to a human"
    };
    let when = if r.when_arguments_from.is_empty() {
        String::new()
    } else {
        format!(
            ", but only a call with an argument value that comes from nothing but {}",
            list(
                r.when_arguments_from
                    .iter()
                    .map(|o| o.as_str().to_owned())
                    .collect()
            )
        )
    };
    format!("once held, {verb} {}{when}", list(covers))
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
            "sessions",
            "trusted_issuers",
            "mcp_servers",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
        let text = schema.to_string();
        for word in ["unplanned", "max_recorded_bytes", "max_sources"] {
            assert!(text.contains(word), "{word}");
        }
    }

    #[test]
    fn a_secret_seed_grants_only_existing_agents() {
        let found = issues(
            "policy_version: g\nenvironment_capabilities: []\nagents:\n  - {id: owner}\nmemory:\n  - {owner: owner, namespace: keys, key: k, value: s, class: secret, grants: [owner, ghost]}\n",
        );
        assert!(
            found
                .iter()
                .any(|(at, m)| at == "memory[0].grants[1]" && m.contains("ghost")),
            "{found:?}"
        );
    }

    #[test]
    fn a_duplicate_agent_is_located_at_its_second_declaration() {
        let found = issues(
            "policy_version: d\nenvironment_capabilities: []\nagents:\n  - {id: x}\n  - {id: y}\n  - {id: x}\n",
        );
        assert!(
            found
                .iter()
                .any(|(at, m)| at == "agents[2]" && m.contains("x")),
            "{found:?}"
        );
        assert!(!found.iter().any(|(at, _)| at == "agents[0]"), "{found:?}");
    }

    #[test]
    fn lint_explains_every_declared_restriction() {
        let p = compile(
            "policy_version: r\nagents: []\ncontext:\n  restrictions:\n    untrusted_export: {denies_tags: [export], when_arguments_from: [untrusted, none], verdict: escalate}\n    no_sends: {denies_actions: [send_email]}\n",
        )
        .unwrap();
        let lines = p.explain_provenance();
        assert!(
            lines.contains(
                &"context.restrictions.no_sends: once held, denies the actions `send_email`"
                    .to_owned()
            ),
            "{lines:?}"
        );
        assert!(lines.contains(&"context.restrictions.untrusted_export: once held, escalates to a human actions tagged `export`, but only a call with an argument value that comes from nothing but untrusted, none".to_owned()), "{lines:?}");
        let schema = schema().to_string();
        assert!(schema.contains("when_arguments_from"));
    }

    #[test]
    fn mcp_tools_default_to_their_servers_trust() {
        use crate::provenance::Origin;
        let p = compile(
            "policy_version: s\n\
             mcp_servers:\n  \
               mail: {command: [python3, m.py], trust: trusted}\n  \
               web: {url: 'http://127.0.0.1:1/mcp', trust: untrusted}\n\
             actions:\n  \
               mail.read: {}\n  \
               mail.fetch: {output: {trust: untrusted}}\n  \
               web.get: {}\n  \
               other.x: {}\n",
        )
        .unwrap();
        let names: Vec<&str> = p.mcp_servers().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["mail", "web"]);
        let trust = |a: &str| {
            p.catalogue
                .by_name(a)
                .unwrap()
                .provenance()
                .output()
                .origins()
        };
        assert_eq!(trust("mail.read"), vec![Origin::Trusted]);
        assert_eq!(trust("mail.fetch"), vec![Origin::Untrusted]);
        assert_eq!(trust("web.get"), vec![Origin::Untrusted]);
        assert_eq!(trust("other.x"), vec![Origin::Untrusted]);
        // The spec is kept as written.
        assert!(
            p.spec
                .actions
                .values()
                .filter(|a| a.output.is_some())
                .count()
                == 1
        );
    }

    #[test]
    fn bad_mcp_servers_are_located_with_the_rest() {
        assert_eq!(
            issues(
                "policy_version: s\nmcp_servers:\n  m: {command: [], trust: trusted}\n  \
                 n: {url: nope, trust: trusted}\nenvironment_capabilities: [m.x]\n"
            )
            .into_iter()
            .map(|(l, _)| l)
            .collect::<Vec<_>>(),
            vec![
                "mcp_servers.m.command".to_owned(),
                "mcp_servers.n.url".to_owned(),
                "environment_capabilities[0]".to_owned(),
            ]
        );
    }

    fn issues(text: &str) -> Vec<(String, String)> {
        compile(text)
            .unwrap_err()
            .issues
            .into_iter()
            .map(|i| (i.location, i.message))
            .collect()
    }

    #[test]
    fn sessions_default_to_deny_and_the_index_defaults() {
        let p = compile("policy_version: s\n").unwrap();
        assert_eq!(
            *p.sessions(),
            SessionPolicy {
                unplanned: Otherwise::Deny,
                max_recorded_bytes: 1024 * 1024,
                max_sources: 4096
            }
        );
        assert_eq!(p.sessions().index_limits(), IndexLimits::default());
        assert!(p.trusted_issuers().is_empty());
        // Nothing declared, nothing explained.
        assert!(p.explain_provenance().is_empty());

        let text = "policy_version: s\nsessions: {unplanned: escalate, max_recorded_bytes: 2048, max_sources: 8}\n";
        let p = compile(text).unwrap();
        assert_eq!(p.sessions().unplanned, Otherwise::Escalate);
        assert_eq!(
            p.sessions().index_limits(),
            IndexLimits {
                max_bytes: 2048,
                max_sources: 8,
                ..IndexLimits::default()
            }
        );
        assert_eq!(
            p.explain_provenance(),
            [
                "sessions: a call matching no planned step of a plan-bound session is escalated \
              to a human; a session's sources are searched up to 2048 bytes of recorded text \
              and 8 sources"
            ]
        );
        let p = compile("policy_version: s\nsessions: {}\n").unwrap();
        assert_eq!(*p.sessions(), SessionPolicy::default());
        assert!(p.explain_provenance()[0].contains("is denied"));
        // JSON and YAML agree.
        let spec = parse_spec(text).unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(parse_spec(&json).unwrap(), spec);
    }

    #[test]
    fn bad_sessions_sections_are_located() {
        assert_eq!(
            issues("policy_version: s\nsessions: {max_recorded_bytes: 0, max_sources: 0}\n"),
            [
                (
                    "sessions.max_recorded_bytes".to_owned(),
                    "must be at least 1".to_owned()
                ),
                (
                    "sessions.max_sources".to_owned(),
                    "must be at least 1".to_owned()
                ),
            ]
        );
        for bad in [
            "sessions: {unplanned: allow}",
            "sessions: {unplaned: deny}",
            "sessions: {max_sources: -1}",
            "sessions: deny",
        ] {
            assert!(
                compile(&format!("policy_version: s\n{bad}\n")).is_err(),
                "{bad}"
            );
        }
    }

    fn b64(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn trusted_issuers_decode_and_are_explained() {
        let key = crate::envelope::sign::SigningKey::from_bytes(&[7; 32]).verifying_key();
        let other = crate::envelope::sign::SigningKey::from_bytes(&[9; 32]).verifying_key();
        let text = format!(
            "policy_version: s\ntrusted_issuers:\n  warden.eu-1: \"{}\"\n  hq: {}\n",
            b64(key.as_bytes()),
            b64(other.as_bytes())
        );
        let p = compile(&text).unwrap();
        let issuers: Vec<(&str, &VerifyingKey)> = p
            .trusted_issuers()
            .iter()
            .map(|(id, k)| (id.as_str(), k))
            .collect();
        assert_eq!(issuers, [("hq", &other), ("warden.eu-1", &key)]);
        assert_eq!(
            p.explain_provenance(),
            [
                format!(
                    "trusted_issuers.hq: envelopes signed by Ed25519 key {} may open a session",
                    b64(other.as_bytes())
                ),
                format!(
                    "trusted_issuers.warden.eu-1: envelopes signed by Ed25519 key {} may open a session",
                    b64(key.as_bytes())
                ),
            ]
        );
    }

    #[test]
    fn bad_trusted_issuers_are_located_errors() {
        let good = b64(crate::envelope::sign::SigningKey::from_bytes(&[7; 32])
            .verifying_key()
            .as_bytes());
        // The identity point: small order, verifies forged signatures.
        let mut weak = [0u8; 32];
        weak[0] = 1;
        // A y coordinate with no point on the curve.
        let off_curve = (2u8..=255)
            .map(|y| {
                let mut b = [0u8; 32];
                b[0] = y;
                b
            })
            .find(|b| VerifyingKey::from_bytes(b).is_err())
            .unwrap();
        let text = format!(
            "policy_version: s\ntrusted_issuers:\n  \"bad id\": \"{good}\"\n  a: \"not base64!\"\n  \
             b: \"{}\"\n  c: \"{}\"\n  d: \"{}\"\n  e: \"{good}\"\n",
            b64(&[1; 31]),
            b64(&weak),
            b64(&off_curve),
        );
        let found = issues(&text);
        let locations: Vec<&str> = found.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            locations,
            [
                "trusted_issuers.a",
                "trusted_issuers.b",
                "trusted_issuers[\"bad id\"]",
                "trusted_issuers.c",
                "trusted_issuers.d"
            ],
            "{found:?}"
        );
        assert!(found[0].1.contains("base64"), "{found:?}");
        assert!(found[1].1.contains("31 bytes"), "{found:?}");
        assert!(found[2].1.starts_with("invalid issuer id"), "{found:?}");
        assert!(found[3].1.contains("weak"), "{found:?}");
        assert!(found[4].1.contains("not a valid Ed25519"), "{found:?}");
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

    #[test]
    fn the_lockdown_section_is_described_compiled_and_enforced_on_seeds() {
        let schema = schema();
        let text = schema.to_string();
        assert!(
            schema["properties"]
                .as_object()
                .unwrap()
                .contains_key("lockdown")
        );
        for word in [
            "presets",
            "write_surface_names",
            "write_surface_patterns",
            "langgraph",
            "mcp_memory",
        ] {
            assert!(text.contains(word), "{word}");
        }
        let base = "policy_version: s\nagents:\n  - id: root\n  - id: kid\n    parent: root\n    tools: [manage_memory]\n";
        // Without a preset the LangMem tool is not a write surface ...
        compile(base).unwrap();
        // ... with it, the seed is refused, located.
        let err = compile(&format!("{base}lockdown:\n  presets: [langgraph]\n")).unwrap_err();
        assert!(
            err.issues
                .iter()
                .any(|i| i.location == "agents[1]" && i.message.contains("manage_memory")),
            "{err:?}"
        );
        // The built-in Letta names need no section at all.
        let letta = base.replace("manage_memory", "core_memory_append");
        assert!(compile(&letta).is_err());
        // Bad entries are located; unknown presets and fields are refused.
        let err = compile(
            "policy_version: s\nlockdown:\n  write_surface_names: ['--']\n  write_surface_patterns: ['*']\n",
        )
        .unwrap_err();
        let locations: Vec<&str> = err.issues.iter().map(|i| i.location.as_str()).collect();
        assert_eq!(
            locations,
            [
                "lockdown.write_surface_names[0]",
                "lockdown.write_surface_patterns[0]"
            ]
        );
        assert!(compile("policy_version: s\nlockdown:\n  presets: [nope]\n").is_err());
        assert!(compile("policy_version: s\nlockdown:\n  remove: [letta]\n").is_err());
        // The compiled vocabulary is the policy's, and lint explains it.
        let p = compile("policy_version: s\nlockdown:\n  presets: [mem0]\n  write_surface_names: [save_persona]\n").unwrap();
        assert!(p.lockdown().is_write_surface("add_memories"));
        assert!(p.lockdown().is_write_surface("mcp__x__SavePersona"));
        let lines = p.explain_lockdown();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("mem0 adds whole names add_memories")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("save_persona")),
            "{lines:?}"
        );
        // A bundle without the section gets the built-in vocabulary.
        assert_eq!(
            compile("policy_version: s\n").unwrap().lockdown(),
            Vocabulary::builtin()
        );
    }
}
