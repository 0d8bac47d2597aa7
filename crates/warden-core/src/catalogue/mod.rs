//! The action catalogue: the allowlist of known actions and the typed rules
//! their arguments must satisfy.
//!
//! A policy bundle declares actions under `actions:` as [`ActionSpec`]s;
//! [`ActionCatalogue::compile`] checks and compiles them once (JSON Schemas,
//! globs, regexes, host and media-type lists), adds the built-in
//! `memory.read` and `memory.write`, and numbers the actions densely by name
//! ([`ActionIndex`]) so other tables (capability sets, for instance) can be
//! bitsets.
//!
//! [`ActionCatalogue::check_arguments`] is on the preflight hot path: it
//! compiles nothing, allocates nothing when every rule passes (apart from
//! the schema caveat on that method), and returns every violation rather
//! than the first. Reasons name arguments, never their values: a value may
//! be a secret, and reasons end up in the audit log.
//!
//! # Built-in actions
//!
//! `memory.read` and `memory.write` are always present, with a fixed
//! argument schema (see [`builtin_specs`]); `memory.write` carries the
//! `state_changing` tag. A bundle may list them too, to add: its tags and
//! output labels are merged in, its rules are appended, and its `arguments`
//! schema is checked *in addition to* the built-in one, so a bundle can
//! narrow a built-in but never widen it. The bundle's `limits` replace the
//! built-in defaults.

mod host;
mod names;
mod path;
mod rules;
mod spec;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock};

use jsonschema::error::ValidationErrorKind;
use jsonschema::{PatternOptions, ValidationError, Validator};
use serde_json::{Map, Value, json};

use crate::decision::{Reason, reasons::UNKNOWN_ACTION};
use crate::ids::{ActionName, Label, MAX_IDENTIFIER_LEN};
use crate::provenance::{ActionProvenance, ProvenanceSpecError};

pub(crate) use rules::encoded_json_len_exceeds;
use rules::{CompiledRule, one_line};
pub use spec::{
    ActionSpec, ArgumentRule, Classification, ClassificationAtMostRule, ExecutionLimits,
    HostInRule, MaxBytesRule, MimeInRule, PathWithinRule, PatternRule,
};

/// Reason-code prefixes of argument checks. Each is used as
/// `prefix:<argument>` through [`Reason::with_param`]; the parameter is the
/// argument's name (or, for schema violations, a JSON pointer), never its
/// value.
pub mod reasons {
    /// The arguments fail the action's JSON Schema; the parameter is a JSON
    /// pointer to the offending location (`/document_id`), or `$` for the
    /// arguments object as a whole.
    pub const ARGUMENT_SCHEMA_VIOLATION: &str = "argument_schema_violation";
    /// The normalised path matches none of the allowed globs.
    pub const PATH_OUTSIDE_ALLOWED: &str = "path_outside_allowed";
    /// The path is absolute, climbs above the root, or holds NUL/control
    /// characters, backslashes or percent-encoded octets.
    pub const PATH_TRAVERSAL: &str = "path_traversal";
    /// A path component holds a character that NFKC normalisation would
    /// change (fullwidth dots, the one-dot leader, compatibility forms), an
    /// invisible or bidi-control character, or non-ASCII whitespace.
    pub const PATH_AMBIGUOUS_UNICODE: &str = "path_ambiguous_unicode";
    /// The URL is not a URL, has userinfo (even empty: `https://@host`), a
    /// percent-encoded, non-NFKC or invisible character or a trailing dot
    /// in its host, an IPv4 address not in dotted-decimal form, or its host
    /// or port is not allowed.
    pub const HOST_NOT_ALLOWED: &str = "host_not_allowed";
    /// The URL's scheme is not allowed.
    pub const SCHEME_NOT_ALLOWED: &str = "scheme_not_allowed";
    /// The argument is over its byte cap.
    pub const ARGUMENT_TOO_LARGE: &str = "argument_too_large";
    /// The argument does not fully match the rule's regex.
    pub const PATTERN_MISMATCH: &str = "pattern_mismatch";
    /// The media type is malformed or not allowed.
    pub const MIME_NOT_ALLOWED: &str = "mime_not_allowed";
    /// The classification is above the ceiling, or not on the ladder.
    pub const CLASSIFICATION_ABOVE_CEILING: &str = "classification_above_ceiling";
    /// A rule's (non-optional) argument is absent.
    pub const ARGUMENT_MISSING: &str = "argument_missing";
    /// The argument has the wrong JSON type for the rule (a number where a
    /// path is expected, or a dotted path through a non-object).
    pub const ARGUMENT_WRONG_TYPE: &str = "argument_wrong_type";
}

/// The parameter of a schema violation on the arguments object itself.
const ROOT_POINTER: &str = "$";
/// Longest JSON pointer put into a reason; longer ones are cut (at a char
/// boundary), since object keys come from the untrusted SOP.
const MAX_POINTER_LEN: usize = 128;
/// Size limit of each compiled `pattern` inside argument schemas.
const SCHEMA_REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The two actions every catalogue holds.
pub const BUILTIN_ACTIONS: [&str; 2] = ["memory.read", "memory.write"];

/// The dense index of an action in its catalogue: actions sorted by name are
/// numbered `0..len`. Only meaningful for the catalogue that produced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionIndex(u16);

impl ActionIndex {
    /// The raw index.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The index as a `usize`, for indexing dense tables.
    pub const fn as_usize(self) -> usize {
        self.0 as usize
    }
}

/// Why a catalogue does not compile. Every variant names the action, and
/// the rule's position in that action's `rules` list where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogueError {
    /// The `arguments` JSON Schema is invalid or refers to something that
    /// cannot be resolved offline.
    #[error("action `{action}`: invalid argument schema: {message}")]
    InvalidSchema {
        /// The action.
        action: ActionName,
        /// What the schema compiler said.
        message: String,
    },
    /// A rule's `argument` is not a valid (dotted) argument name.
    #[error("action `{action}`, rule {rule}: invalid argument name `{argument}`: {message}")]
    InvalidArgument {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The name as written.
        argument: String,
        /// Why it is invalid.
        message: &'static str,
    },
    /// A list the rule matches against is empty, so it could never pass.
    #[error("action `{action}`, rule {rule}: `{field}` is empty, so the rule would allow nothing")]
    EmptyList {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The empty field.
        field: &'static str,
    },
    /// A `path_within` glob does not compile or could never match.
    #[error("action `{action}`, rule {rule}: invalid glob `{glob}`: {message}")]
    InvalidGlob {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The glob as written.
        glob: String,
        /// Why it is invalid.
        message: String,
    },
    /// A `pattern` regex does not compile (or is too large).
    #[error("action `{action}`, rule {rule}: invalid regex `{regex}`: {message}")]
    InvalidRegex {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The regex as written.
        regex: String,
        /// What the regex compiler said.
        message: String,
    },
    /// A `host_in` host entry is invalid.
    #[error("action `{action}`, rule {rule}: invalid host `{host}`: {message}")]
    InvalidHost {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The entry as written.
        host: String,
        /// Why it is invalid.
        message: &'static str,
    },
    /// A `host_in` scheme is not a lowercase URL scheme.
    #[error(
        "action `{action}`, rule {rule}: invalid scheme `{scheme}`: write it in lowercase, e.g. `https`"
    )]
    InvalidScheme {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The scheme as written.
        scheme: String,
    },
    /// A `mime_in` entry is not `type/subtype`, `type/*` or `*/*`.
    #[error(
        "action `{action}`, rule {rule}: invalid media type `{mime}`: expected `type/subtype`, `type/*` or `*/*`"
    )]
    InvalidMimeType {
        /// The action.
        action: ActionName,
        /// Position of the rule in `rules`.
        rule: usize,
        /// The entry as written.
        mime: String,
    },
    /// An execution limit is zero.
    #[error("action `{action}`: `limits.{field}` must be at least 1")]
    InvalidLimit {
        /// The action.
        action: ActionName,
        /// The limit.
        field: &'static str,
    },
    /// The action's `provenance`, `output` or `outbound_read` is invalid.
    #[error("action `{action}`: {error}")]
    Provenance {
        /// The action.
        action: ActionName,
        /// What is wrong.
        error: ProvenanceSpecError,
    },
    /// More actions than an [`ActionIndex`] can number.
    #[error("the catalogue declares {count} actions, the limit is {max}")]
    TooManyActions {
        /// How many were declared (built-ins included).
        count: usize,
        /// The limit.
        max: usize,
    },
}

impl CatalogueError {
    /// The action the error is about, if any.
    pub fn action(&self) -> Option<&ActionName> {
        match self {
            CatalogueError::InvalidSchema { action, .. }
            | CatalogueError::InvalidArgument { action, .. }
            | CatalogueError::EmptyList { action, .. }
            | CatalogueError::InvalidGlob { action, .. }
            | CatalogueError::InvalidRegex { action, .. }
            | CatalogueError::InvalidHost { action, .. }
            | CatalogueError::InvalidScheme { action, .. }
            | CatalogueError::InvalidMimeType { action, .. }
            | CatalogueError::InvalidLimit { action, .. }
            | CatalogueError::Provenance { action, .. } => Some(action),
            CatalogueError::TooManyActions { .. } => None,
        }
    }

    /// The rule's position in the action's `rules` list, if the error is
    /// about a rule.
    pub fn rule(&self) -> Option<usize> {
        match self {
            CatalogueError::InvalidArgument { rule, .. }
            | CatalogueError::EmptyList { rule, .. }
            | CatalogueError::InvalidGlob { rule, .. }
            | CatalogueError::InvalidRegex { rule, .. }
            | CatalogueError::InvalidHost { rule, .. }
            | CatalogueError::InvalidScheme { rule, .. }
            | CatalogueError::InvalidMimeType { rule, .. } => Some(*rule),
            _ => None,
        }
    }

    /// Where the error is in the bundle: `actions.<name>.rules[<i>]`,
    /// `actions.<name>.provenance[<i>]`, `actions.<name>`, or `actions`.
    pub fn location(&self) -> String {
        match (self.action(), self) {
            (Some(a), CatalogueError::Provenance { error, .. }) => {
                format!("actions.{a}.{}", error.location())
            }
            (Some(a), _) => match self.rule() {
                Some(r) => format!("actions.{a}.rules[{r}]"),
                None => format!("actions.{a}"),
            },
            (None, _) => "actions".to_owned(),
        }
    }
}

/// One compiled action.
pub struct CompiledAction {
    index: ActionIndex,
    name: ActionName,
    /// Sorted and deduplicated, for [`CompiledAction::has_tag`].
    tags: Vec<Label>,
    limits: ExecutionLimits,
    output_labels: Vec<Label>,
    /// The built-in schema (if any) first, then the bundle's. Shared: the
    /// built-in ones are compiled once per process ([`BUILTINS`]).
    schemas: Vec<Arc<Validator>>,
    rules: Vec<CompiledRule>,
    provenance: ActionProvenance,
}

impl fmt::Debug for CompiledAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledAction")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("tags", &self.tags)
            .field("limits", &self.limits)
            .field("output_labels", &self.output_labels)
            .field("schemas", &self.schemas.len())
            .field("rules", &self.rules)
            .field("provenance", &self.provenance)
            .finish()
    }
}

impl CompiledAction {
    /// Its index in the catalogue.
    pub fn index(&self) -> ActionIndex {
        self.index
    }

    /// Its name.
    pub fn name(&self) -> &ActionName {
        &self.name
    }

    /// Its tags, sorted and deduplicated.
    pub fn tags(&self) -> &[Label] {
        &self.tags
    }

    /// Whether it carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.binary_search_by(|t| t.as_str().cmp(tag)).is_ok()
    }

    /// Its execution limits.
    pub fn limits(&self) -> &ExecutionLimits {
        &self.limits
    }

    /// Labels its results always carry, sorted and deduplicated.
    pub fn output_labels(&self) -> &[Label] {
        &self.output_labels
    }

    /// Its provenance rules, output trust and outbound-read flag.
    pub fn provenance(&self) -> &ActionProvenance {
        &self.provenance
    }

    /// Whether calling it is an effect: tagged `state_changing`, or an
    /// outbound read.
    pub fn is_effect(&self) -> bool {
        self.provenance.is_outbound_read() || self.has_tag("state_changing")
    }

    /// Whether it has at least one argument schema.
    pub fn has_schema(&self) -> bool {
        !self.schemas.is_empty()
    }

    /// Every violation of `args`, schema first, then rules in order.
    /// `value` is `args` wrapped as a JSON value when the caller has one.
    fn check(&self, args: &Map<String, Value>, value: Option<&Value>) -> Vec<Reason> {
        let mut out = Vec::new();
        if !self.schemas.is_empty() {
            // The validator takes a `&Value`; wrap the map only when the
            // caller could not hand us one.
            let owned;
            let instance = match value {
                Some(v) => v,
                None => {
                    owned = Value::Object(args.clone());
                    &owned
                }
            };
            for schema in &self.schemas {
                if !schema.is_valid(instance) {
                    for error in schema.iter_errors(instance) {
                        schema_reasons(&error, &mut out);
                    }
                }
            }
        }
        for rule in &self.rules {
            if let Some(reason) = rule.check(args) {
                out.push(reason);
            }
        }
        out
    }
}

/// Turn one schema error into reasons, naming locations, never values.
fn schema_reasons(error: &ValidationError<'_>, out: &mut Vec<Reason>) {
    let base = error.instance_path().as_str();
    let mut push = |pointer: &str| {
        let pointer = if pointer.is_empty() {
            ROOT_POINTER
        } else {
            truncate(pointer, MAX_POINTER_LEN)
        };
        let reason = Reason::with_param(reasons::ARGUMENT_SCHEMA_VIOLATION, pointer);
        if !out.contains(&reason) {
            out.push(reason);
        }
    };
    match error.kind() {
        ValidationErrorKind::Required { property } => match property.as_str() {
            Some(name) => push(&child_pointer(base, name)),
            None => push(base),
        },
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            if unexpected.is_empty() {
                push(base);
            }
            for name in unexpected {
                push(&child_pointer(base, name));
            }
        }
        _ => push(base),
    }
}

/// `base/escaped(name)` per RFC 6901.
fn child_pointer(base: &str, name: &str) -> String {
    let mut s = String::with_capacity(base.len() + 1 + name.len());
    s.push_str(base);
    s.push('/');
    for ch in name.chars() {
        match ch {
            '~' => s.push_str("~0"),
            '/' => s.push_str("~1"),
            c => s.push(c),
        }
    }
    s
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// The compiled allowlist of actions.
pub struct ActionCatalogue {
    /// Sorted by name; position = [`ActionIndex`].
    actions: Vec<CompiledAction>,
    /// Name to position (every step of a preflight, every call and every
    /// declared capability looks its action up): a short name is its own
    /// key, compared as three words (`names`).
    positions: names::NameTable,
}

impl fmt::Debug for ActionCatalogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.actions.iter().map(|a| a.name.as_str()))
            .finish()
    }
}

impl ActionCatalogue {
    /// Compile the bundle's action specs, adding the built-in actions.
    pub fn compile(specs: &BTreeMap<ActionName, ActionSpec>) -> Result<Self, CatalogueError> {
        let builtins = &*BUILTINS;
        let mut names: Vec<&ActionName> = specs.keys().chain(builtins.keys()).collect();
        names.sort();
        names.dedup();
        let max = usize::from(u16::MAX) + 1;
        if names.len() > max {
            return Err(CatalogueError::TooManyActions {
                count: names.len(),
                max,
            });
        }
        let mut actions = Vec::with_capacity(names.len());
        for (position, name) in names.into_iter().enumerate() {
            let index = u16::try_from(position).map(ActionIndex).map_err(|_| {
                CatalogueError::TooManyActions {
                    count: position + 1,
                    max,
                }
            })?;
            actions.push(compile_action(
                index,
                name,
                builtins.get(name),
                specs.get(name),
            )?);
        }
        let positions = names::NameTable::new(actions.iter().map(|a| (a.name.as_str(), a.index)));
        Ok(Self { actions, positions })
    }

    /// The index of the action called `name`, if it is known.
    pub fn index_of(&self, name: &str) -> Option<ActionIndex> {
        self.positions.get(name)
    }

    /// The action at `idx`; `None` for an index from another catalogue that
    /// is out of range here.
    pub fn get(&self, idx: ActionIndex) -> Option<&CompiledAction> {
        self.actions.get(idx.as_usize())
    }

    /// The action called `name`, if it is known.
    pub fn by_name(&self, name: &str) -> Option<&CompiledAction> {
        self.index_of(name).and_then(|idx| self.get(idx))
    }

    /// How many actions it holds (built-ins included).
    pub fn len(&self) -> usize {
        self.actions.len()
    }

    /// Whether it holds no action (never true: the built-ins are always
    /// there).
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// The actions in index (= name) order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &CompiledAction> + '_ {
        self.actions.iter()
    }

    /// Every violation of `args` against the action at `idx`: the JSON
    /// Schema first, then each rule in order. Empty means the arguments are
    /// acceptable. An index this catalogue does not hold yields
    /// `unknown_action` (fail closed).
    ///
    /// If the action has an argument schema, the map is cloned into a
    /// [`Value`] for the validator; callers that hold the arguments as a
    /// `Value` already should use [`ActionCatalogue::check_argument_value`].
    pub fn check_arguments(&self, idx: ActionIndex, args: &Map<String, Value>) -> Vec<Reason> {
        match self.get(idx) {
            Some(action) => action.check(args, None),
            None => vec![UNKNOWN_ACTION],
        }
    }

    /// [`ActionCatalogue::check_arguments`] for arguments held as a JSON
    /// value; never clones. Anything but an object is a schema violation of
    /// the whole (`argument_schema_violation:$`).
    #[inline]
    pub fn check_argument_value(&self, idx: ActionIndex, args: &Value) -> Vec<Reason> {
        let Some(action) = self.get(idx) else {
            return vec![UNKNOWN_ACTION];
        };
        match args {
            // Most actions have neither schema nor rule: any object passes.
            Value::Object(_) if action.schemas.is_empty() && action.rules.is_empty() => Vec::new(),
            Value::Object(map) => action.check(map, Some(args)),
            _ => vec![Reason::with_param(
                reasons::ARGUMENT_SCHEMA_VIOLATION,
                ROOT_POINTER,
            )],
        }
    }
}

/// A built-in action's spec with its argument schema compiled.
struct Builtin {
    spec: ActionSpec,
    schema: Option<Arc<Validator>>,
}

/// The built-in actions, their schemas compiled once per process: every
/// catalogue holds them, so compiling a bundle compiles only the bundle's
/// own schemas (a schema's compilation, its regexes included, is most of
/// the cost of a small bundle).
static BUILTINS: LazyLock<BTreeMap<ActionName, Builtin>> = LazyLock::new(|| {
    builtin_specs()
        .into_iter()
        .map(|(name, spec)| {
            // A schema that did not compile is compiled again (and its
            // error returned) by every catalogue: fail closed.
            let schema = spec
                .arguments
                .as_ref()
                .and_then(|s| compile_schema(&name, s).ok())
                .map(Arc::new);
            (name, Builtin { spec, schema })
        })
        .collect()
});

fn compile_action(
    index: ActionIndex,
    name: &ActionName,
    builtin: Option<&Builtin>,
    bundle: Option<&ActionSpec>,
) -> Result<CompiledAction, CatalogueError> {
    let mut tags = Vec::new();
    let mut output_labels = Vec::new();
    let mut schemas = Vec::new();
    let mut rules = Vec::new();
    let mut provenance = ActionProvenance::default();
    // The bundle's limits win; a built-in only supplies defaults.
    let limits = bundle
        .or(builtin.map(|b| &b.spec))
        .map(|s| s.limits)
        .unwrap_or_default();
    if limits.timeout_ms == 0 {
        return Err(CatalogueError::InvalidLimit {
            action: name.clone(),
            field: "timeout_ms",
        });
    }
    if limits.max_output_bytes == 0 {
        return Err(CatalogueError::InvalidLimit {
            action: name.clone(),
            field: "max_output_bytes",
        });
    }
    let cached = builtin.and_then(|b| b.schema.as_ref());
    for (spec, cached) in builtin
        .map(|b| (&b.spec, cached))
        .into_iter()
        .chain(bundle.map(|s| (s, None)))
    {
        tags.extend(spec.tags.iter().cloned());
        output_labels.extend(spec.output_labels.iter().cloned());
        match (cached, &spec.arguments) {
            (Some(compiled), _) => schemas.push(Arc::clone(compiled)),
            (None, Some(schema)) => schemas.push(Arc::new(compile_schema(name, schema)?)),
            (None, None) => {}
        }
        for (position, rule) in spec.rules.iter().enumerate() {
            rules.push(CompiledRule::compile(name, position, rule)?);
        }
        let output = spec.output.clone().unwrap_or_default();
        let compiled = ActionProvenance::compile(&spec.provenance, &output, spec.outbound_read)
            .map_err(|error| CatalogueError::Provenance {
                action: name.clone(),
                error,
            })?;
        provenance.extend(compiled, spec.output.is_some());
    }
    tags.sort();
    tags.dedup();
    output_labels.sort();
    output_labels.dedup();
    Ok(CompiledAction {
        index,
        name: name.clone(),
        tags,
        limits,
        output_labels,
        schemas,
        rules,
        provenance,
    })
}

fn compile_schema(action: &ActionName, schema: &Value) -> Result<Validator, CatalogueError> {
    jsonschema::options()
        .offline()
        .should_validate_formats(true)
        .with_pattern_options(PatternOptions::regex().size_limit(SCHEMA_REGEX_SIZE_LIMIT))
        .build(schema)
        .map_err(|e| CatalogueError::InvalidSchema {
            action: action.clone(),
            message: one_line(&e.to_string()),
        })
}

/// The built-in actions' specs, as if a bundle had declared them.
///
/// `memory.read` takes `{namespace, key}`; `memory.write` takes
/// `{namespace, key, value}` plus optional `owner_agent_id`,
/// `expected_revision` (≥ 1), `visibility`, `class`, `combine` and
/// `expires_at` (milliseconds since the epoch). Unknown arguments are
/// refused. The schema checks shape only: whether the caller may write
/// that owner's record is the preflight's decision, made from the runtime
/// identity.
pub fn builtin_specs() -> BTreeMap<ActionName, ActionSpec> {
    let identifier = json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_IDENTIFIER_LEN,
        "pattern": "^[A-Za-z0-9._:-]+$"
    });
    let read = ActionSpec {
        arguments: Some(json!({
            "type": "object",
            "required": ["namespace", "key"],
            "additionalProperties": false,
            "properties": {"namespace": identifier, "key": identifier}
        })),
        ..ActionSpec::default()
    };
    let write = ActionSpec {
        arguments: Some(json!({
            "type": "object",
            "required": ["namespace", "key", "value"],
            "additionalProperties": false,
            "properties": {
                "namespace": identifier,
                "key": identifier,
                "value": true,
                "owner_agent_id": identifier,
                "expected_revision": {"type": "integer", "minimum": 1},
                "visibility": {"enum": ["private", "children", "descendants"]},
                "class": {"enum": ["preference", "policy", "secret", "task"]},
                "combine": {"enum": ["all", "any", "min", "max", "intersection"]},
                "expires_at": {"type": "integer", "minimum": 0}
            }
        })),
        tags: Label::parse("state_changing").into_iter().collect(),
        ..ActionSpec::default()
    };
    let mut out = BTreeMap::new();
    for (name, spec) in BUILTIN_ACTIONS.into_iter().zip([read, write]) {
        if let Ok(name) = ActionName::parse(name) {
            out.insert(name, spec);
        }
    }
    out
}

#[cfg(test)]
mod tests;
