//! The bundle-facing shape of the catalogue: what a policy author writes under
//! `actions:`. These types only describe; [`super::ActionCatalogue::compile`]
//! checks and compiles them.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::Label;
use crate::provenance::{OutputSpec, ProvenanceRuleSpec};

/// One action as declared in the policy bundle.
///
/// Every field is optional; a bare `document.summarize: {}` declares a known
/// action with no argument schema, no rules, no tags and default limits.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ActionSpec {
    /// A JSON Schema the step's `arguments` object must satisfy. Compiled
    /// offline: remote and file `$ref`s are refused, `format` is asserted and
    /// `pattern` uses a linear-time regex engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// Typed argument rules, checked in addition to the schema.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ArgumentRule>,
    /// Tags that restrictions refer to (`external`, `export`,
    /// `state_changing`, ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<Label>,
    /// Execution limits the runtime applies to the handler.
    pub limits: ExecutionLimits,
    /// Labels every result of this action carries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_labels: Vec<Label>,
    /// Provenance rules: where each guarded argument's values, or the
    /// URLs, email addresses or host names inside them (`within:`), must
    /// come from (see [`crate::provenance`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub provenance: Vec<ProvenanceRuleSpec>,
    /// The trust of the action's results (default: every field untrusted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSpec>,
    /// The action fetches something its arguments name (a URL the model
    /// chose): an effect even though it reads. Needs a provenance rule.
    #[serde(skip_serializing_if = "is_false")]
    pub outbound_read: bool,
}

/// Limits the runtime applies when it executes an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutionLimits {
    /// Wall-clock budget of one execution, in milliseconds (at least 1).
    pub timeout_ms: u64,
    /// Largest result the handler may return, in bytes (at least 1).
    pub max_output_bytes: u64,
}

impl ExecutionLimits {
    /// Default timeout: 30 seconds.
    pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
    /// Default output cap: 1 MiB.
    pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
}

impl Default for ExecutionLimits {
    fn default() -> Self {
        Self {
            timeout_ms: Self::DEFAULT_TIMEOUT_MS,
            max_output_bytes: Self::DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

/// A typed rule about one argument of an action.
///
/// Written externally tagged: `{path_within: {argument: path, globs: [...]}}`.
/// `argument` names a top-level argument, or a dotted path (`target.path`)
/// into nested objects; a key that itself contains a dot cannot be addressed.
/// A rule whose argument is absent fails with `argument_missing:<argument>`
/// unless it says `optional: true`. A `null` value is present, not absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArgumentRule {
    /// A relative path that, after lexical normalisation, matches a glob.
    PathWithin(PathWithinRule),
    /// A URL whose scheme and host are allowlisted.
    HostIn(HostInRule),
    /// A size cap on the argument.
    MaxBytes(MaxBytesRule),
    /// A string that fully matches a regular expression.
    Pattern(PatternRule),
    /// A media type (`type/subtype`) from an allowlist.
    MimeIn(MimeInRule),
    /// A data classification no higher than a ceiling.
    ClassificationAtMost(ClassificationAtMostRule),
}

impl ArgumentRule {
    /// The argument (or dotted path) the rule is about.
    pub fn argument(&self) -> &str {
        match self {
            ArgumentRule::PathWithin(r) => &r.argument,
            ArgumentRule::HostIn(r) => &r.argument,
            ArgumentRule::MaxBytes(r) => &r.argument,
            ArgumentRule::Pattern(r) => &r.argument,
            ArgumentRule::MimeIn(r) => &r.argument,
            ArgumentRule::ClassificationAtMost(r) => &r.argument,
        }
    }

    /// Whether an absent argument passes the rule.
    pub fn optional(&self) -> bool {
        match self {
            ArgumentRule::PathWithin(r) => r.optional,
            ArgumentRule::HostIn(r) => r.optional,
            ArgumentRule::MaxBytes(r) => r.optional,
            ArgumentRule::Pattern(r) => r.optional,
            ArgumentRule::MimeIn(r) => r.optional,
            ArgumentRule::ClassificationAtMost(r) => r.optional,
        }
    }

    /// The rule's snake_case name, as written in the bundle.
    pub fn kind(&self) -> &'static str {
        match self {
            ArgumentRule::PathWithin(_) => "path_within",
            ArgumentRule::HostIn(_) => "host_in",
            ArgumentRule::MaxBytes(_) => "max_bytes",
            ArgumentRule::Pattern(_) => "pattern",
            ArgumentRule::MimeIn(_) => "mime_in",
            ArgumentRule::ClassificationAtMost(_) => "classification_at_most",
        }
    }
}

/// `path_within`: the argument is a relative path inside one of `globs`.
///
/// The path is checked before matching: NUL and other control characters,
/// backslashes, absolute paths (`/x`, `C:x`) and percent-encoded octets
/// (`%2e`, also `%25`) are refused outright as `path_traversal`; `.` and `..`
/// segments are then resolved lexically, and a `..` that climbs above the
/// root is `path_traversal` too. The normalised path must match a glob, in
/// which `*` and `?` never cross `/` (use `**` for that).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathWithinRule {
    /// The argument holding the path.
    pub argument: String,
    /// Globs the normalised path must match (at least one).
    pub globs: Vec<String>,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// `host_in`: the argument is an absolute URL whose scheme and host are
/// allowed.
///
/// A host entry is a domain (`uploads.example.com`), a wildcard
/// (`*.cdn.example.com`: any subdomain at any depth, never the apex), an IP
/// literal (`10.0.0.7`, `[2001:db8::1]`), each optionally followed by
/// `:port`. Without a port only the scheme's default port is allowed. URLs
/// with userinfo (`https://a@b`), whitespace, control characters or
/// backslashes are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostInRule {
    /// The argument holding the URL.
    pub argument: String,
    /// Allowed hosts (at least one).
    pub hosts: Vec<String>,
    /// Allowed URL schemes, lowercase; `[https]` when omitted.
    #[serde(default = "default_schemes")]
    pub schemes: Vec<String>,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// `max_bytes`: the argument is at most `max` bytes: the UTF-8 length of a
/// string, or the compact JSON encoding of any other value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MaxBytesRule {
    /// The argument to measure.
    pub argument: String,
    /// The largest size allowed, in bytes.
    pub max: u64,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// `pattern`: the argument is a string that matches `regex` in full (the
/// expression is anchored at both ends for you).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PatternRule {
    /// The argument to match.
    pub argument: String,
    /// A regular expression in the syntax of the `regex` crate.
    pub regex: String,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// `mime_in`: the argument is a media type `type/subtype` (parameters after
/// `;` ignored, case-insensitive) matching one of `types`, where `image/*`
/// allows any image subtype and `*/*` anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MimeInRule {
    /// The argument holding the media type.
    pub argument: String,
    /// Allowed media types (at least one).
    pub types: Vec<String>,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// `classification_at_most`: the argument names a data classification no
/// higher than `ceiling`. Names outside the ladder fail closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassificationAtMostRule {
    /// The argument holding the classification name.
    pub argument: String,
    /// The highest classification allowed.
    pub ceiling: Classification,
    /// Whether an absent argument passes.
    #[serde(default, skip_serializing_if = "is_false")]
    pub optional: bool,
}

/// The data-classification ladder, lowest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Classification {
    /// Anyone may see it.
    Public,
    /// Inside the organisation.
    Internal,
    /// A need-to-know group.
    Confidential,
    /// Named people only.
    Restricted,
    /// The top of the ladder.
    TopSecret,
}

impl Classification {
    /// Every classification, lowest first.
    pub const ALL: [Classification; 5] = [
        Classification::Public,
        Classification::Internal,
        Classification::Confidential,
        Classification::Restricted,
        Classification::TopSecret,
    ];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Classification::Public => "public",
            Classification::Internal => "internal",
            Classification::Confidential => "confidential",
            Classification::Restricted => "restricted",
            Classification::TopSecret => "top_secret",
        }
    }

    /// Parse a name, ASCII case-insensitively; `None` for anything off the
    /// ladder (callers must treat that as above every ceiling).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_schemes() -> Vec<String> {
    vec!["https".to_owned()]
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_example_deserialises() {
        let json = serde_json::json!({
            "document.summarize": {
                "arguments": {"type": "object", "required": ["document_id"],
                              "additionalProperties": false,
                              "properties": {"document_id": {"type": "string", "maxLength": 128}}}
            },
            "artifact.save": {
                "arguments": {"type": "object", "required": ["path"],
                              "properties": {"path": {"type": "string"}}},
                "rules": [{"path_within": {"argument": "path", "globs": ["internal/**"]}}]
            },
            "external.upload": {
                "tags": ["external", "export", "state_changing"],
                "rules": [{"host_in": {"argument": "destination",
                                       "hosts": ["uploads.example.com", "*.cdn.example.com"],
                                       "schemes": ["https"]}}],
                "limits": {"timeout_ms": 30000, "max_output_bytes": 1048576},
                "output_labels": ["external"]
            }
        });
        let specs: std::collections::BTreeMap<String, ActionSpec> =
            serde_json::from_value(json).unwrap();
        assert_eq!(specs.len(), 3);
        let upload = &specs["external.upload"];
        assert_eq!(upload.tags.len(), 3);
        assert_eq!(upload.limits, ExecutionLimits::default());
        let ArgumentRule::HostIn(rule) = &upload.rules[0] else {
            panic!("expected host_in")
        };
        assert_eq!(rule.hosts.len(), 2);
        assert_eq!(specs["document.summarize"].limits.timeout_ms, 30_000);
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let spec: ActionSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(spec, ActionSpec::default());
        assert!(serde_json::from_str::<ActionSpec>(r#"{"argumnets": {}}"#).is_err());
        assert!(serde_json::from_str::<ActionSpec>(r#"{"limits": {"timeout": 1}}"#).is_err());
        let rule: ArgumentRule =
            serde_json::from_str(r#"{"host_in": {"argument": "d", "hosts": ["a.b"]}}"#).unwrap();
        let ArgumentRule::HostIn(h) = &rule else {
            panic!("expected host_in")
        };
        assert_eq!(h.schemes, vec!["https".to_owned()]);
        assert!(!rule.optional());
        assert_eq!(rule.kind(), "host_in");
        assert!(
            serde_json::from_str::<ArgumentRule>(
                r#"{"max_bytes": {"argument": "d", "max": 1, "maximum": 2}}"#
            )
            .is_err()
        );
        assert!(serde_json::from_str::<ArgumentRule>(r#"{"shell": {"argument": "d"}}"#).is_err());
    }

    #[test]
    fn classification_ladder() {
        assert!(Classification::Public < Classification::Internal);
        assert!(Classification::Restricted < Classification::TopSecret);
        assert_eq!(
            Classification::parse("Confidential"),
            Some(Classification::Confidential)
        );
        assert_eq!(
            Classification::parse("top_secret"),
            Some(Classification::TopSecret)
        );
        assert_eq!(Classification::parse("secret"), None);
        assert_eq!(Classification::parse(""), None);
        let c: Classification = serde_json::from_str("\"top_secret\"").unwrap();
        assert_eq!(c, Classification::TopSecret);
    }

    #[test]
    fn json_schema_is_generated() {
        let schema = schemars::schema_for!(ActionSpec);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("path_within"));
        assert!(text.contains("classification_at_most"));
    }
}
