//! What a plan's provenance will be, said before anything runs.
//!
//! [`explain_plan`] reads a plan (or, with [`explain_sop`], an SOP: a plan
//! of literals) against the catalogue and says, per step and per argument
//! path an action's `provenance:` rule guards, how the plan meets the rule
//! and what a call using the step will meet at the gate. Nothing is
//! searched (no session exists yet): the explanation follows from the
//! plan, the rules and the trust the catalogue declares for each action's
//! results. It is pure and deterministic.
//!
//! # Per guarded position
//!
//! A rule's path (`recipients[*]`) is followed through the step's
//! arguments; every position it reaches is one [`PositionExplanation`]
//! with a stable reason (`<code>:<argument path>`):
//!
//! - `literal_vouched`: a literal of the plan. A call using the step must
//!   carry exactly this value, and the plan vouches for it (origin `plan`):
//!   it is not searched.
//! - `argument_absent` (the rule's path): the step puts no value there, so
//!   no call using it can (a call adds no keys); the rule checks nothing.
//! - `rule_path_mismatch`: the plan's structure does not fit the rule's
//!   path (a key below a scalar or an array, `[*]` on a non-array): every
//!   call using the step is denied (`argument_wrong_type:<path>`).
//! - A binding, filled at call time, whose value the gate searches in the
//!   session's sources. When the binding names a `step`, the value must
//!   occur in that step's result, whose origins the catalogue fixes (its
//!   action's `output:` trust; an action without one, or unknown, gives
//!   `untrusted`, and so does a call that reports an error). If none of those origins is one the rule accepts (the
//!   rule's `from`, or the binding's own `from`), the value can be vouched
//!   for only by also occurring in another source of an accepted origin
//!   (the user's request, typically); otherwise the call meets the
//!   `otherwise` of the constraint that fails: `binding_needs_review`
//!   when that is `escalate` (a human decides), `binding_denied` when it
//!   is `deny` (deny wins). Otherwise the binding is `binding_checked`:
//!   the value is checked when the call is made, and a source the rule
//!   accepts can vouch for it.
//!
//! A binding above the rule's path (`recipients` bound whole under a rule
//! on `recipients[*]`) is reported at the binding's position: the rule
//! checks whatever the call puts there.
//!
//! # Bound positions no rule guards
//!
//! A binding no rule of the action reaches is reported on its own
//! ([`StepExplanation::unguarded`]): `binding_unguarded` (nothing but the
//! binding's own `step` and `from`, if it has them, checks where the value
//! comes from), or `binding_needs_review` / `binding_denied` when the
//! binding's own `from` cannot be met by the step it names.
//!
//! [`StepExplanation::findings`] lists the reasons a reader should look at
//! (everything but `literal_vouched`, `argument_absent` and
//! `binding_checked`), in step order.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::Plan;
use super::path::{ArgPath, ArgSeg};
use super::template::{Binding, Node};
use crate::catalogue::ActionCatalogue;
use crate::decision::Reason;
use crate::ids::{ActionName, StepId};
use crate::provenance::{MatchMode, Origin, Otherwise, ProvenanceRule, Within};
use crate::sop::Sop;

/// The explanation's reason codes; each takes an argument path.
pub mod codes {
    /// A plan literal fills the position: vouched for by the plan.
    pub const LITERAL_VOUCHED: &str = "literal_vouched";
    /// The step puts no value at the rule's path: nothing to check.
    pub const ARGUMENT_ABSENT: &str = "argument_absent";
    /// The plan's structure does not fit the rule's path: every call using
    /// the step is denied.
    pub const RULE_PATH_MISMATCH: &str = "rule_path_mismatch";
    /// Bound; checked at call time, and an accepted source can vouch for it.
    pub const BINDING_CHECKED: &str = "binding_checked";
    /// Bound to a step whose results carry no accepted origin: the call
    /// escalates unless the value also occurs in an accepted source.
    pub const BINDING_NEEDS_REVIEW: &str = "binding_needs_review";
    /// As [`BINDING_NEEDS_REVIEW`], but the failing constraint denies.
    pub const BINDING_DENIED: &str = "binding_denied";
    /// Bound, and no provenance rule guards the position.
    pub const BINDING_UNGUARDED: &str = "binding_unguarded";
}

/// The provenance of every step of a plan, before anything runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanExplanation {
    /// One per step, in plan order.
    pub steps: Vec<StepExplanation>,
}

impl PlanExplanation {
    /// Every finding of every step, in step order, without repeats.
    pub fn findings(&self) -> Vec<Reason> {
        let mut out: Vec<Reason> = Vec::new();
        for r in self.steps.iter().flat_map(|s| &s.findings) {
            if !out.contains(r) {
                out.push(r.clone());
            }
        }
        out
    }
}

/// One step's provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepExplanation {
    /// The step id as written (`""` when empty).
    pub step_id: String,
    /// The action as written.
    pub action: String,
    /// Whether the catalogue has the action (an unknown one has no rules;
    /// preflight denies it).
    pub known_action: bool,
    /// The action is an outbound read (what it fetches is gated like an
    /// effect).
    pub outbound_read: bool,
    /// The origins the action's results can get, by its declared `output:`
    /// trust (`[untrusted]` when it declares none).
    pub result_origins: Vec<Origin>,
    /// Per provenance rule of the action, in bundle order.
    pub rules: Vec<RuleExplanation>,
    /// Bound positions no rule guards, in document order.
    pub unguarded: Vec<PositionExplanation>,
    /// The reasons worth a reader's attention (see the [module
    /// docs](self)), in order, without repeats.
    pub findings: Vec<Reason>,
}

/// One provenance rule and how the step meets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleExplanation {
    /// The rule's argument path (`recipients[*]`).
    pub argument: String,
    /// The origins it accepts.
    pub from: Vec<Origin>,
    /// What an unvouched value gets.
    pub otherwise: Otherwise,
    /// How values are compared, as written.
    #[serde(rename = "match")]
    pub matching: MatchMode,
    /// The embedded targets it checks instead of the whole value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
    /// What the rule does, in one line.
    pub rule: String,
    /// Every position the rule reaches in the step, in document order
    /// (one `argument_absent` entry when it reaches none).
    pub positions: Vec<PositionExplanation>,
}

/// What fills a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fill {
    /// A literal of the plan.
    Literal,
    /// A binding, filled at call time.
    Binding,
    /// Nothing: the step puts no value there.
    Absent,
    /// The plan's structure does not fit the rule's path.
    Mismatch,
}

/// One position of a step's arguments and what the gate will make of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PositionExplanation {
    /// The argument path (`recipient`, `cc[1]`; the rule's own path when
    /// absent).
    pub path: String,
    /// What fills it.
    pub fill: Fill,
    /// The stable reason: `<code>:<path>` (see [`codes`]).
    pub reason: Reason,
    /// The binding, for a bound position.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingExplanation>,
    /// One line saying it.
    pub explain: String,
}

/// A binding and what the step it names can vouch for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BindingExplanation {
    /// The earlier step whose result must hold the value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<StepId>,
    /// That step's action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_action: Option<ActionName>,
    /// The origins that step's results can get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_origins: Option<Vec<Origin>>,
    /// The binding's own `from`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<Origin>>,
    /// The binding's own `otherwise` (as written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otherwise: Option<Otherwise>,
    /// The binding's `match` (as written).
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub matching: Option<MatchMode>,
    /// The constraints on the value the named step's results cannot meet
    /// (each needs the value to occur in another source of an origin it
    /// accepts): empty when the step can vouch, or when the binding names
    /// no step.
    pub unmet: Vec<Unmet>,
}

/// Who sets a constraint on a bound value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintBy {
    /// The action's provenance rule.
    Rule,
    /// The binding's own `from`.
    Binding,
}

/// A constraint the named step's results cannot meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unmet {
    /// The rule or the binding.
    pub by: ConstraintBy,
    /// The origins it accepts.
    pub from: Vec<Origin>,
    /// What the call gets when no such source holds the value.
    pub otherwise: Otherwise,
}

/// A step as the explanation reads it.
struct StepView<'a> {
    step_id: String,
    action: &'a ActionName,
    arguments: Node,
}

/// The provenance explanation of `plan` (see the [module docs](self)).
pub fn explain_plan(catalogue: &ActionCatalogue, plan: &Plan) -> PlanExplanation {
    let steps: Vec<StepView<'_>> = plan
        .steps()
        .iter()
        .map(|s| StepView {
            step_id: s.step_id.to_string(),
            action: &s.action,
            arguments: s.arguments.clone(),
        })
        .collect();
    explain_steps(catalogue, &steps)
}

/// The provenance explanation of an SOP: every argument a literal (an
/// object holding `$bind` is data here).
pub fn explain_sop(catalogue: &ActionCatalogue, sop: &Sop) -> PlanExplanation {
    let steps: Vec<StepView<'_>> = sop
        .steps
        .iter()
        .map(|s| StepView {
            step_id: s.step_id_str().to_owned(),
            action: &s.action,
            arguments: literal_node(&s.arguments),
        })
        .collect();
    explain_steps(catalogue, &steps)
}

/// A JSON value as a template of literals only.
fn literal_node(v: &Value) -> Node {
    match v {
        Value::Object(m) => Node::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), literal_node(v)))
                .collect(),
        ),
        Value::Array(items) => Node::Array(items.iter().map(literal_node).collect()),
        scalar => Node::Literal(scalar.clone()),
    }
}

/// The origins results of `action` can get; `[untrusted]` when unknown.
fn result_origins(catalogue: &ActionCatalogue, action: &str) -> Vec<Origin> {
    catalogue.by_name(action).map_or_else(
        || vec![Origin::Untrusted],
        |a| a.provenance().output().origins(),
    )
}

fn explain_steps(catalogue: &ActionCatalogue, steps: &[StepView<'_>]) -> PlanExplanation {
    let named = |step: &StepId| -> Option<(&ActionName, Vec<Origin>)> {
        steps
            .iter()
            .find(|s| s.step_id == step.as_str())
            .map(|s| (s.action, result_origins(catalogue, s.action.as_str())))
    };
    let out = steps
        .iter()
        .map(|step| {
            let compiled = catalogue.by_name(step.action.as_str());
            let rules: &[ProvenanceRule] = compiled.map_or(&[], |a| a.provenance().rules());
            let mut reached: Vec<Vec<ArgSeg>> = Vec::new();
            let rules: Vec<RuleExplanation> = rules
                .iter()
                .map(|rule| {
                    let mut found = Vec::new();
                    reach(
                        &step.arguments,
                        &rule_steps(rule.path().as_str()),
                        &mut Vec::new(),
                        &mut found,
                    );
                    let positions = if found.is_empty() {
                        let path = rule.path().to_string();
                        vec![PositionExplanation {
                            reason: Reason::with_param(codes::ARGUMENT_ABSENT, &path),
                            explain: format!(
                                "`{path}`: the step puts no value here, so no call using it can; \
                                 nothing to check"
                            ),
                            path,
                            fill: Fill::Absent,
                            binding: None,
                        }]
                    } else {
                        found
                            .into_iter()
                            .map(|r| match r {
                                Reached::Literal(segs) => literal(&segs),
                                Reached::Mismatch(segs) => mismatch(&segs),
                                Reached::Bind(segs, b) => {
                                    let p = bound(&segs, b, Some(rule), &named);
                                    reached.push(segs);
                                    p
                                }
                            })
                            .collect()
                    };
                    RuleExplanation {
                        argument: rule.path().to_string(),
                        from: rule.from().to_vec(),
                        otherwise: rule.otherwise(),
                        matching: rule.matching(),
                        within: rule.within(),
                        rule: rule.explain(),
                        positions,
                    }
                })
                .collect();
            let mut unguarded = Vec::new();
            step.arguments.walk(&mut Vec::new(), &mut |segs, leaf| {
                if let super::template::Leaf::Bind(b) = leaf
                    && !reached.iter().any(|r| r == segs)
                {
                    unguarded.push(bound(segs, b, None, &named));
                }
            });
            let mut findings: Vec<Reason> = Vec::new();
            for p in rules.iter().flat_map(|r| &r.positions).chain(&unguarded) {
                let notable = !matches!(
                    p.reason.kind(),
                    codes::LITERAL_VOUCHED | codes::ARGUMENT_ABSENT | codes::BINDING_CHECKED
                );
                if notable && !findings.contains(&p.reason) {
                    findings.push(p.reason.clone());
                }
            }
            StepExplanation {
                step_id: step.step_id.clone(),
                action: step.action.to_string(),
                known_action: compiled.is_some(),
                outbound_read: compiled.is_some_and(|a| a.provenance().is_outbound_read()),
                result_origins: result_origins(catalogue, step.action.as_str()),
                rules,
                unguarded,
                findings,
            }
        })
        .collect();
    PlanExplanation { steps: out }
}

/// One step of a rule's argument path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleStep<'a> {
    Key(&'a str),
    Each,
}

/// The steps of a compiled rule path (`a.b[*].c`): keys separated by `.`,
/// each followed by any number of `[*]`. The path was validated when the
/// catalogue compiled, so this reads it without checking.
fn rule_steps(path: &str) -> Vec<RuleStep<'_>> {
    let mut out = Vec::new();
    for segment in path.split('.') {
        let key_end = segment.find('[').unwrap_or(segment.len());
        let (key, mut rest) = segment.split_at(key_end);
        if !key.is_empty() {
            out.push(RuleStep::Key(key));
        }
        while let Some(r) = rest.strip_prefix("[*]") {
            out.push(RuleStep::Each);
            rest = r;
        }
    }
    out
}

/// A position a rule reaches.
enum Reached<'a> {
    Literal(Vec<ArgSeg>),
    Bind(Vec<ArgSeg>, &'a Binding),
    Mismatch(Vec<ArgSeg>),
}

/// Follow `steps` through `node` (at `path`), in document order, as the
/// gate's path selection does over the call's arguments.
fn reach<'a>(
    node: &'a Node,
    steps: &[RuleStep<'_>],
    path: &mut Vec<ArgSeg>,
    out: &mut Vec<Reached<'a>>,
) {
    if let Node::Bind(b) = node {
        out.push(Reached::Bind(path.clone(), b));
        return;
    }
    let Some((first, rest)) = steps.split_first() else {
        // The rule checks every leaf below.
        match node {
            Node::Literal(_) => out.push(Reached::Literal(path.clone())),
            Node::Object(m) if m.is_empty() => out.push(Reached::Literal(path.clone())),
            Node::Array(items) if items.is_empty() => out.push(Reached::Literal(path.clone())),
            _ => reach_children(node, &[], path, out),
        }
        return;
    };
    match (first, node) {
        (RuleStep::Key(k), Node::Object(m)) => {
            if let Some(child) = m.get(*k) {
                path.push(ArgSeg::Key((*k).to_owned()));
                reach(child, rest, path, out);
                path.pop();
            }
        }
        (RuleStep::Each, Node::Array(_)) => reach_children(node, rest, path, out),
        _ => out.push(Reached::Mismatch(path.clone())),
    }
}

/// [`reach`] into every child of a container.
fn reach_children<'a>(
    node: &'a Node,
    steps: &[RuleStep<'_>],
    path: &mut Vec<ArgSeg>,
    out: &mut Vec<Reached<'a>>,
) {
    match node {
        Node::Object(m) => {
            for (k, child) in m {
                path.push(ArgSeg::Key(k.clone()));
                reach(child, steps, path, out);
                path.pop();
            }
        }
        Node::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(ArgSeg::Index(i));
                reach(child, steps, path, out);
                path.pop();
            }
        }
        Node::Literal(_) | Node::Bind(_) => {}
    }
}

fn render(segs: &[ArgSeg]) -> String {
    ArgPath::new(segs.to_vec()).map_or_else(|| "$".to_owned(), |p| p.argument())
}

fn literal(segs: &[ArgSeg]) -> PositionExplanation {
    let path = render(segs);
    PositionExplanation {
        reason: Reason::with_param(codes::LITERAL_VOUCHED, &path),
        explain: format!("`{path}`: a plan literal, vouched for by the plan (origin plan)"),
        path,
        fill: Fill::Literal,
        binding: None,
    }
}

fn mismatch(segs: &[ArgSeg]) -> PositionExplanation {
    let path = render(segs);
    PositionExplanation {
        reason: Reason::with_param(codes::RULE_PATH_MISMATCH, &path),
        explain: format!(
            "`{path}`: the plan's value here does not fit the rule's path, so every call using \
             the step is denied"
        ),
        path,
        fill: Fill::Mismatch,
        binding: None,
    }
}

fn origins_list(origins: &[Origin]) -> String {
    let names: Vec<&str> = origins.iter().map(|o| o.as_str()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// A bound position, under `rule` (`None`: no rule guards it).
fn bound<'s>(
    segs: &[ArgSeg],
    binding: &Binding,
    rule: Option<&ProvenanceRule>,
    named: &impl Fn(&StepId) -> Option<(&'s ActionName, Vec<Origin>)>,
) -> PositionExplanation {
    let path = render(segs);
    let step = binding.step.as_ref().and_then(named);
    // The constraints on the value, each with what its failure gets.
    let mut constraints: Vec<(ConstraintBy, &[Origin], Otherwise)> = Vec::new();
    if let Some(rule) = rule {
        constraints.push((ConstraintBy::Rule, rule.from(), rule.otherwise()));
    }
    if let Some(from) = &binding.from {
        constraints.push((
            ConstraintBy::Binding,
            from,
            binding.otherwise.unwrap_or(Otherwise::Escalate),
        ));
    }
    // With a named step, a constraint none of its origins meets needs
    // another source; the worst such failure decides.
    let mut unmet: Vec<Unmet> = Vec::new();
    let mut failing: Option<Otherwise> = None;
    if let Some((_, origins)) = &step {
        for (by, from, otherwise) in constraints {
            if !from.iter().any(|o| origins.contains(o)) {
                unmet.push(Unmet {
                    by,
                    from: from.to_vec(),
                    otherwise,
                });
                failing = Some(match (failing, otherwise) {
                    (Some(Otherwise::Deny), _) | (_, Otherwise::Deny) => Otherwise::Deny,
                    _ => Otherwise::Escalate,
                });
            }
        }
    }
    let code = match (failing, rule) {
        (Some(Otherwise::Deny), _) => codes::BINDING_DENIED,
        (Some(Otherwise::Escalate), _) => codes::BINDING_NEEDS_REVIEW,
        (None, Some(_)) => codes::BINDING_CHECKED,
        (None, None) => codes::BINDING_UNGUARDED,
    };
    let mut explain = format!("`{path}`: bound");
    match (&binding.step, &step) {
        (Some(s), Some((action, origins))) => {
            let _ = write!(
                explain,
                " to step `{s}` (`{action}`, results {})",
                origins_list(origins)
            );
        }
        (Some(s), None) => {
            let _ = write!(explain, " to step `{s}`");
        }
        (None, _) => {}
    }
    if let Some(from) = &binding.from {
        let _ = write!(explain, ", from {}", origins_list(from));
    }
    match failing {
        Some(o) => {
            let what = match o {
                Otherwise::Escalate => "escalates to a human",
                Otherwise::Deny => "is denied",
            };
            let each: Vec<String> = unmet
                .iter()
                .map(|u| {
                    format!(
                        "{} (from {})",
                        match u.by {
                            ConstraintBy::Rule => "the rule",
                            ConstraintBy::Binding => "the binding",
                        },
                        origins_list(&u.from)
                    )
                })
                .collect();
            let _ = write!(
                explain,
                "; that step's results cannot meet {}, so the call {what} unless the value \
                 also occurs in a source of origin {}",
                each.join(" nor "),
                match unmet.as_slice() {
                    [one] => origins_list(&one.from),
                    _ => "each of them accepts".to_owned(),
                }
            );
        }
        None if rule.is_some() => {
            explain.push_str("; checked against the rule when the call is made");
        }
        None => {
            explain.push_str("; no provenance rule guards it");
            if binding.step.is_none() && binding.from.is_none() {
                explain.push_str(", so nothing checks where its value comes from");
            } else {
                explain.push_str(", only the binding itself checks it");
            }
        }
    }
    if failing.is_some() && rule.is_none() {
        explain.push_str(" (no provenance rule guards it)");
    }
    PositionExplanation {
        reason: Reason::with_param(code, &path),
        explain,
        path,
        fill: Fill::Binding,
        binding: Some(BindingExplanation {
            step: binding.step.clone(),
            step_action: step.as_ref().map(|(a, _)| (*a).clone()),
            step_origins: step.map(|(_, o)| o),
            from: binding.from.clone(),
            otherwise: binding.otherwise,
            matching: binding.matching,
            unmet,
        }),
    }
}
