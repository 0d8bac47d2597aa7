//! Provenance rules as the bundle writes them, compiled, explained and
//! decided.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::embedded::{Within, embedded_targets};
use super::index::SourceIndex;
use super::path::{Concrete, ValuePath};
use super::{EmbeddedAt, Origin, ValueProvenance, reasons};
use crate::decision::{Reason, Verdict};

/// Most argument values one call may put under provenance rules; past it
/// the call is denied (`argument_too_many_values:<argument>`).
pub const MAX_VALUES_PER_CALL: usize = 1024;

/// What happens to a call whose argument is not vouched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Otherwise {
    /// A human decides (the call waits in the escalation queue).
    Escalate,
    /// The call is refused.
    Deny,
}

impl Otherwise {
    fn verdict(self) -> Verdict {
        match self {
            Otherwise::Escalate => Verdict::Escalate,
            Otherwise::Deny => Verdict::Deny,
        }
    }
}

/// How an argument value is compared with recorded text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    /// Case-sensitive (paths, passwords, case-sensitive identifiers): the
    /// default.
    #[default]
    Text,
    /// Case folded (emails, host names, URLs, IBANs, identifiers the target
    /// system compares without case).
    Caseless,
}

/// The trust of an action's results.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// The tool's own data, not writable by third parties.
    Trusted,
    /// Content a third party may have written: the default.
    #[default]
    Untrusted,
}

impl Trust {
    fn origin(self) -> Origin {
        match self {
            Trust::Trusted => Origin::Trusted,
            Trust::Untrusted => Origin::Untrusted,
        }
    }
}

/// One provenance rule as written under an action's `provenance:`.
///
/// `{argument: "recipients[*]", from: [user, trusted], otherwise: escalate}`:
/// every value the path selects must occur in a source of one of the listed
/// origins, by the matching rules of the [`crate::provenance`] module;
/// otherwise the call escalates (or is denied).
///
/// With `within: urls | emails | hosts` the rule applies instead to each
/// URL, email address or host name found inside the value's text (see
/// [`embedded_targets`] for exactly what is found), each checked whole by
/// the same matching rules; a value with none passes the rule, and so does
/// a value that is not a string. Host names and email addresses are always
/// compared without case; URLs as `match:` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProvenanceRuleSpec {
    /// The argument path: `recipient`, `recipients[*]`, `a.b[*].c`.
    pub argument: String,
    /// Origins that vouch for the value (not `none`; at least one).
    pub from: Vec<Origin>,
    /// What happens when no listed origin vouches for a value.
    pub otherwise: Otherwise,
    /// How values are compared (default `text`: case-sensitive).
    #[serde(default, rename = "match", skip_serializing_if = "is_default")]
    pub matching: MatchMode,
    /// Check the targets embedded in the value's text rather than the
    /// whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
}

/// The trust of an action's results, as written under `output:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Trust of every result field (default `untrusted`).
    #[serde(default)]
    pub trust: Trust,
    /// Per-field overrides by result path (`[*].subject`, `items[*].body`):
    /// a path covers its subtree; where patterns overlap, `untrusted` wins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, Trust>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// Why an action's provenance section does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvenanceSpecError {
    /// The argument path does not parse.
    #[error("provenance rule {rule}: invalid argument path `{argument}`: {message}")]
    InvalidArgument {
        /// Position in `provenance`.
        rule: usize,
        /// The path as written.
        argument: String,
        /// Why.
        message: &'static str,
    },
    /// `from` is empty.
    #[error("provenance rule {rule}: `from` is empty, so no value could ever be vouched for")]
    EmptyFrom {
        /// Position in `provenance`.
        rule: usize,
    },
    /// `from` lists `none`.
    #[error("provenance rule {rule}: `none` cannot vouch for a value; list where it may come from")]
    NoneInFrom {
        /// Position in `provenance`.
        rule: usize,
    },
    /// Two rules on one argument path (and the same `within`).
    #[error(
        "provenance rule {rule}: a second rule on argument `{argument}`{}; merge them into one",
        within_suffix(*.within)
    )]
    DuplicateArgument {
        /// Position in `provenance`.
        rule: usize,
        /// The path.
        argument: String,
        /// The rules' `within`.
        within: Option<Within>,
    },
    /// A result field path does not parse.
    #[error("invalid result field path `{path}`: {message}")]
    InvalidResultField {
        /// The path as written.
        path: String,
        /// Why.
        message: &'static str,
    },
    /// An outbound read without a provenance rule on its target.
    #[error("an outbound read needs a provenance rule on the argument that names what it fetches")]
    OutboundWithoutRule,
}

fn within_suffix(within: Option<Within>) -> String {
    within.map_or_else(String::new, |w| format!(" within {}", w.as_str()))
}

impl ProvenanceSpecError {
    /// Where the problem is, below `actions.<name>`.
    pub fn location(&self) -> String {
        match self {
            ProvenanceSpecError::InvalidArgument { rule, .. }
            | ProvenanceSpecError::EmptyFrom { rule }
            | ProvenanceSpecError::NoneInFrom { rule }
            | ProvenanceSpecError::DuplicateArgument { rule, .. } => format!("provenance[{rule}]"),
            ProvenanceSpecError::InvalidResultField { .. } => "output.fields".to_owned(),
            ProvenanceSpecError::OutboundWithoutRule => "outbound_read".to_owned(),
        }
    }
}

/// A compiled provenance rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenanceRule {
    path: ValuePath,
    from: Vec<Origin>,
    otherwise: Otherwise,
    matching: MatchMode,
    within: Option<Within>,
}

impl ProvenanceRule {
    /// The argument path.
    pub fn path(&self) -> &ValuePath {
        &self.path
    }

    /// The accepted origins, sorted.
    pub fn from(&self) -> &[Origin] {
        &self.from
    }

    /// The verdict for an unvouched value.
    pub fn otherwise(&self) -> Otherwise {
        self.otherwise
    }

    /// The comparison as written (targets found by `within: emails` or
    /// `within: hosts` are compared caselessly whatever it says).
    pub fn matching(&self) -> MatchMode {
        self.matching
    }

    /// The embedded targets the rule checks, if it checks those rather
    /// than the whole value.
    pub fn within(&self) -> Option<Within> {
        self.within
    }

    /// The comparison applied to what the rule checks.
    fn effective_matching(&self) -> MatchMode {
        match self.within {
            Some(w) if w.caseless() => MatchMode::Caseless,
            _ => self.matching,
        }
    }

    /// One line saying what the rule does.
    pub fn explain(&self) -> String {
        let each = if self.path.has_each() {
            " (every element)"
        } else {
            ""
        };
        let from: Vec<&str> = self.from.iter().map(|o| o.describe()).collect();
        let from = match from.as_slice() {
            [] => String::new(),
            [one] => (*one).to_owned(),
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
        };
        let how = match self.effective_matching() {
            MatchMode::Text => "case-sensitive",
            MatchMode::Caseless => "case-insensitive",
        };
        let otherwise = match self.otherwise {
            Otherwise::Escalate => "escalate to a human",
            Otherwise::Deny => "deny the call",
        };
        match self.within {
            None => format!(
                "argument `{}`{each} must occur whole in {from} ({how}); otherwise {otherwise}",
                self.path
            ),
            Some(w) => format!(
                "{} inside argument `{}`{each} must occur whole in {from} ({how}; invisible \
                 characters, compatibility forms and IDNA dots are read through to find it, \
                 and a look-alike of a vouched one is denied); otherwise {otherwise}; a value \
                 with none passes",
                w.describe(),
                self.path
            ),
        }
    }
}

/// The compiled trust of an action's results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTrust {
    default: Origin,
    fields: Vec<(ValuePath, Origin)>,
    /// Compiled from an `output:` section (rather than the default of an
    /// action that declares none).
    declared: bool,
}

impl Default for OutputTrust {
    fn default() -> Self {
        Self::untrusted()
    }
}

impl OutputTrust {
    /// Every field untrusted: the trust of an undeclared or unknown action.
    pub fn untrusted() -> Self {
        Self {
            default: Origin::Untrusted,
            fields: Vec::new(),
            declared: false,
        }
    }

    /// Compile an `output:` section.
    pub fn compile(spec: &OutputSpec) -> Result<Self, ProvenanceSpecError> {
        let mut fields = Vec::with_capacity(spec.fields.len());
        for (path, trust) in &spec.fields {
            let p = ValuePath::result_field(path).map_err(|message| {
                ProvenanceSpecError::InvalidResultField {
                    path: path.clone(),
                    message,
                }
            })?;
            fields.push((p, trust.origin()));
        }
        Ok(Self {
            default: spec.trust.origin(),
            fields,
            declared: true,
        })
    }

    /// The origin of the result field at `path`: `untrusted` if any pattern
    /// covering it says so, else `trusted` if one does, else the default.
    pub(crate) fn origin_of(&self, path: &[Concrete<'_>]) -> Origin {
        let mut covered = None;
        for (pattern, origin) in &self.fields {
            if pattern.covers(path) {
                if *origin == Origin::Untrusted {
                    return Origin::Untrusted;
                }
                covered = Some(*origin);
            }
        }
        covered.unwrap_or(self.default)
    }

    /// Every origin a result field can get: the default's and each field
    /// override's, sorted, without repeats.
    pub fn origins(&self) -> Vec<Origin> {
        let mut out: Vec<Origin> = std::iter::once(self.default)
            .chain(self.fields.iter().map(|(_, o)| *o))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether an `output:` section declared the trust (rather than the
    /// untrusted default of an action that declares none).
    pub fn is_declared(&self) -> bool {
        self.declared
    }

    /// Lines saying what trust the results get.
    pub fn explain(&self) -> Vec<String> {
        let mut out = vec![format!(
            "results are {}{}",
            self.default.as_str(),
            if !self.declared {
                " (the default: no trust declared)"
            } else {
                ""
            }
        )];
        for (path, origin) in &self.fields {
            out.push(format!(
                "result field `{path}` and everything below it is {}",
                origin.as_str()
            ));
        }
        out
    }
}

/// An action's compiled provenance: its rules, its output trust, and
/// whether it is an outbound read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionProvenance {
    rules: Vec<ProvenanceRule>,
    output: OutputTrust,
    outbound_read: bool,
}

/// The provenance of the values under one rule, and that rule's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgumentProvenance {
    /// The rule's argument path.
    pub argument: String,
    /// The rule's `within`: the values are targets found inside the
    /// argument's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
    /// The origins the rule accepts.
    pub from: Vec<Origin>,
    /// `allow` if every value is vouched for, else the rule's verdict
    /// (`deny` for a look-alike or a structure mismatch).
    pub verdict: Verdict,
    /// Each value checked, in argument order: the values the path
    /// selected, or with `within:` the targets found inside them.
    pub values: Vec<ValueProvenance>,
}

/// The outcome of the provenance gate for one call: a value, never an
/// error. The engine turns it into a [`crate::decision::Decision`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvenanceDecision {
    /// `allow`, `escalate` or `deny`: deny wins over escalate.
    pub verdict: Verdict,
    /// The first reason of the winning verdict (`arguments_vouched` when
    /// allowed).
    pub reason: Reason,
    /// Every reason, in rule and value order, without repeats.
    pub reasons: Vec<Reason>,
    /// Per rule, the provenance found.
    pub arguments: Vec<ArgumentProvenance>,
}

impl ActionProvenance {
    /// Compile an action's `provenance:`, `output:` and `outbound_read`.
    pub fn compile(
        rules: &[ProvenanceRuleSpec],
        output: &OutputSpec,
        outbound_read: bool,
    ) -> Result<Self, ProvenanceSpecError> {
        let mut compiled: Vec<ProvenanceRule> = Vec::with_capacity(rules.len());
        for (rule, spec) in rules.iter().enumerate() {
            let path = ValuePath::argument(&spec.argument).map_err(|message| {
                ProvenanceSpecError::InvalidArgument {
                    rule,
                    argument: spec.argument.clone(),
                    message,
                }
            })?;
            if spec.from.is_empty() {
                return Err(ProvenanceSpecError::EmptyFrom { rule });
            }
            if spec.from.contains(&Origin::None) {
                return Err(ProvenanceSpecError::NoneInFrom { rule });
            }
            if compiled
                .iter()
                .any(|r| r.path == path && r.within == spec.within)
            {
                return Err(ProvenanceSpecError::DuplicateArgument {
                    rule,
                    argument: spec.argument.clone(),
                    within: spec.within,
                });
            }
            let mut from = spec.from.clone();
            from.sort_unstable();
            from.dedup();
            compiled.push(ProvenanceRule {
                path,
                from,
                otherwise: spec.otherwise,
                matching: spec.matching,
                within: spec.within,
            });
        }
        if outbound_read && compiled.is_empty() {
            return Err(ProvenanceSpecError::OutboundWithoutRule);
        }
        Ok(Self {
            rules: compiled,
            output: OutputTrust::compile(output)?,
            outbound_read,
        })
    }

    /// Merge another spec's compiled provenance into this one (a bundle
    /// adding to a built-in action): rules are appended, the output trust
    /// and the outbound flag of `other` apply if it declares them.
    pub(crate) fn extend(&mut self, other: ActionProvenance, declares_output: bool) {
        self.rules.extend(other.rules);
        if declares_output {
            self.output = other.output;
        }
        self.outbound_read |= other.outbound_read;
    }

    /// The rules, in bundle order.
    pub fn rules(&self) -> &[ProvenanceRule] {
        &self.rules
    }

    /// The trust of the action's results.
    pub fn output(&self) -> &OutputTrust {
        &self.output
    }

    /// Whether the action is an outbound read: a fetch whose target the
    /// model chose, an effect even though it reads.
    pub fn is_outbound_read(&self) -> bool {
        self.outbound_read
    }

    /// One line per rule, output trust and outbound flag, for `warden
    /// policy lint`.
    pub fn explain(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.outbound_read {
            out.push(
                "outbound read: what it fetches is chosen by the call, so it is gated like an effect"
                    .to_owned(),
            );
        }
        out.extend(self.rules.iter().map(ProvenanceRule::explain));
        out.extend(self.output.explain());
        out
    }

    /// The provenance gate: every rule's values checked against `sources`.
    ///
    /// Per value: vouched (some hit's origin is in `from`) passes; a
    /// look-alike of a source whose origin is in `from` is denied
    /// (`argument_confusable:<path>`); anything else gets the rule's
    /// `otherwise` (`argument_not_vouched:<path>`). A path that does not fit
    /// the arguments' structure is denied (`argument_wrong_type:<path>`); an
    /// absent argument selects no value and passes (whether it may be
    /// absent is the schema's decision; no value of it reaches the tool).
    /// Arrays and objects under a path are checked leaf by leaf; a rule
    /// with `within:` checks each target found inside each string leaf.
    pub fn decide(&self, arguments: &Value, sources: &SourceIndex) -> ProvenanceDecision {
        self.decide_except(arguments, sources, &[])
    }

    /// [`ActionProvenance::decide`], with the values at `skip_paths`
    /// exempted: the literal positions of an admitted plan, which the plan
    /// vouches for. A skip path is a concrete argument path as this module
    /// writes them (`recipient`, `to[1]`, `a.b[0].c`); it exempts the value
    /// there and everything below it (`to` exempts `to[0]`, `to[1]`, ...;
    /// never `total`). An exempted value is reported with origin `plan`,
    /// vouched, and is not searched (nor, under `within:`, its targets).
    pub fn decide_except(
        &self,
        arguments: &Value,
        sources: &SourceIndex,
        skip_paths: &[String],
    ) -> ProvenanceDecision {
        let mut out = Vec::with_capacity(self.rules.len());
        let mut reasons: Vec<(Verdict, Reason)> = Vec::new();
        let mut budget = MAX_VALUES_PER_CALL;
        for rule in &self.rules {
            let mut arg = ArgumentProvenance {
                argument: rule.path.as_str().to_owned(),
                within: rule.within,
                from: rule.from.clone(),
                verdict: Verdict::Allow,
                values: Vec::new(),
            };
            let selected = match rule.path.select(arguments) {
                Ok(s) => s,
                Err(at) => {
                    arg.verdict = Verdict::Deny;
                    reasons.push((
                        Verdict::Deny,
                        Reason::with_param(reasons::ARGUMENT_WRONG_TYPE, &at),
                    ));
                    out.push(arg);
                    continue;
                }
            };
            let mut leaves = Vec::with_capacity(selected.len());
            for (path, value) in selected {
                collect_leaves(path, value, &mut leaves);
            }
            let checks = checks(rule.within, leaves, skip_paths, budget);
            if checks.len() > budget {
                arg.verdict = Verdict::Deny;
                reasons.push((
                    Verdict::Deny,
                    Reason::with_param(reasons::ARGUMENT_TOO_MANY_VALUES, rule.path.as_str()),
                ));
                out.push(arg);
                budget = 0;
                continue;
            }
            budget -= checks.len();
            arg.values.reserve_exact(checks.len());
            let matching = rule.effective_matching();
            for check in checks {
                let (path, value, embedded) = match check {
                    Check::Exempt(path) => {
                        arg.values.push(ValueProvenance::plan_literal(path));
                        continue;
                    }
                    Check::Value {
                        path,
                        value,
                        embedded,
                    } => (path, value, embedded),
                };
                let mut p = sources.provenance(path, &value, matching);
                p.embedded = embedded;
                p.vouched = p.origins.iter().any(|o| rule.from.contains(o));
                if !p.vouched {
                    let (verdict, code) = match &p.confusable_with {
                        Some(hit) if rule.from.contains(&hit.origin) => {
                            (Verdict::Deny, reasons::ARGUMENT_CONFUSABLE)
                        }
                        _ => (rule.otherwise.verdict(), reasons::ARGUMENT_NOT_VOUCHED),
                    };
                    arg.verdict = worse(arg.verdict, verdict);
                    reasons.push((verdict, Reason::with_param(code, &p.path)));
                }
                arg.values.push(p);
            }
            out.push(arg);
        }
        let verdict = reasons.iter().map(|(v, _)| *v).fold(Verdict::Allow, worse);
        let reason = reasons
            .iter()
            .find(|(v, _)| *v == verdict)
            .map(|(_, r)| r.clone())
            .unwrap_or(reasons::ARGUMENTS_VOUCHED);
        let mut all: Vec<Reason> = Vec::with_capacity(reasons.len());
        for (_, r) in reasons {
            if !all.contains(&r) {
                all.push(r);
            }
        }
        ProvenanceDecision {
            verdict,
            reason,
            reasons: all,
            arguments: out,
        }
    }
}

/// One value a rule checks.
enum Check<'a> {
    /// At a literal position of the plan.
    Exempt(String),
    /// Searched in the index.
    Value {
        path: String,
        value: Cow<'a, Value>,
        embedded: Option<EmbeddedAt>,
    },
}

/// Whether the concrete path `path` is at or below one of `skip_paths`.
fn exempt(path: &str, skip_paths: &[String]) -> bool {
    skip_paths.iter().any(|s| {
        path.strip_prefix(s.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    })
}

/// What a rule checks among `leaves`: each leaf, or with `within` each
/// target found in each string leaf; exempted leaves as such. Stops past
/// `budget` values (the caller refuses the call then).
fn checks<'a>(
    within: Option<Within>,
    leaves: Vec<(String, &'a Value)>,
    skip_paths: &[String],
    budget: usize,
) -> Vec<Check<'a>> {
    let mut out = Vec::with_capacity(leaves.len());
    for (path, value) in leaves {
        if out.len() > budget {
            break;
        }
        if exempt(&path, skip_paths) {
            out.push(Check::Exempt(path));
            continue;
        }
        let Some(within) = within else {
            out.push(Check::Value {
                path,
                value: Cow::Borrowed(value),
                embedded: None,
            });
            continue;
        };
        // A number, boolean or null holds no embedded target.
        let Value::String(text) = value else {
            continue;
        };
        for target in embedded_targets(text, within) {
            out.push(Check::Value {
                path: path.clone(),
                value: Cow::Owned(Value::String(target.text)),
                embedded: Some(EmbeddedAt {
                    within,
                    start: target.start,
                    end: target.end,
                }),
            });
            if out.len() > budget {
                break;
            }
        }
    }
    out
}

/// The more restrictive of two verdicts among allow, escalate and deny.
fn worse(a: Verdict, b: Verdict) -> Verdict {
    let rank = |v: Verdict| match v {
        Verdict::Allow | Verdict::Constrain => 0,
        Verdict::Escalate => 1,
        Verdict::Deny => 2,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// Scalars under `value` (itself if it is one), with concrete paths.
fn collect_leaves<'a>(path: String, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    if !matches!(value, Value::Array(_) | Value::Object(_)) {
        out.push((path, value));
        return;
    }
    // An explicit stack: argument nesting is bounded by the SOP limits, but
    // a value built in-process need not be.
    let mut stack = vec![(path, value)];
    while let Some((path, value)) = stack.pop() {
        match value {
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate().rev() {
                    stack.push((super::path::indexed(&path, i), v));
                }
            }
            Value::Object(map) => {
                let children: Vec<_> = map.iter().collect();
                for (k, v) in children.into_iter().rev() {
                    let key = super::path::render(&[Concrete::Key(k)]);
                    let sep = if key.starts_with('[') { "" } else { "." };
                    // `[?]`: a key not fit for a reason; the path still
                    // locates the value among its siblings' order.
                    stack.push((format!("{path}{sep}{key}"), v));
                }
            }
            scalar => out.push((path, scalar)),
        }
        if out.len() > MAX_VALUES_PER_CALL {
            break;
        }
    }
}
