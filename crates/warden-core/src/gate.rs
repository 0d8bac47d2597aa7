//! The one decision of a proposed tool call, made before it runs.
//!
//! A session's call and a run's step are decided by the same function,
//! [`assess`]: a run is a plan-bound session whose plan is fully literal
//! (its SOP), so a step is the call of its planned step with the plan's own
//! arguments. In order, every check contributing its verdict (deny wins
//! over escalate, escalate over constrain, constrain over allow; the
//! reported reason is the first of the winning verdict):
//!
//! 1. what the caller found before the gate (a cancelled session, a full
//!    session), passed in as [`Verdicts`];
//! 2. the static checks of [`check_call`]: the agent is known and active,
//!    holds the capability, memory arguments are well formed, the arguments
//!    pass the catalogue's schema and rules;
//! 3. the plan ([`PlanUse`]): a session's call must match an unused planned
//!    step (`unplanned_call`, escalated or denied as the bundle's
//!    `sessions.unplanned` says), and each bound value must satisfy its
//!    binding (`binding_not_satisfied:<path>`); literal arguments of the
//!    plan are vouched for by the plan. A planned effect (a state change or
//!    an outbound read) is used once; a planned read stays available;
//! 4. the provenance of every argument value the action's rules guard
//!    (`argument_not_vouched:<path>`, `argument_confusable:<path>`), against
//!    the session's [`SourceIndex`], except what the plan's literals fill;
//! 5. the context envelope (restrictions, the backstop, the sensitivity
//!    floor), with the origins of every argument value when a restriction
//!    applies by origin ([`argument_origins`]); its obligations turn an
//!    allow into a constrain.
//!
//! Pure: the caller loads the session (or run), its index and its envelope,
//! and records what this returns.

use serde::Serialize;
use serde_json::{Value, json};

use crate::bundle::Policy;
use crate::decision::{Obligation, Reason, Verdict, reasons};
use crate::envelope::{ActionRef, ContextDecision, ContextRequest, Envelope, decide};
use crate::hierarchy::Hierarchy;
use crate::ids::{ActionName, AgentId, CallId, StepId};
use crate::plan::{Plan, PlanMatch, match_call};
use crate::preflight::{PreflightContext, check_call};
use crate::provenance::{
    MatchMode, Origin, OriginSet, Otherwise, SourceId, SourceIndex, ValueProvenance,
};

/// A call matched no planned step.
pub const UNPLANNED_CALL: Reason = Reason::code("unplanned_call");
/// A bound value does not meet its binding (parameter: the path).
pub const BINDING_NOT_SATISFIED: &str = "binding_not_satisfied";
/// A call was allowed (the reason when nothing objected).
pub const CALL_ALLOWED: Reason = Reason::code("call_allowed");

/// What the gate reads besides the call: the agent forest and the policy.
#[derive(Debug, Clone, Copy)]
pub struct GateContext<'a> {
    /// The agent forest (capabilities, revocation).
    pub hierarchy: &'a Hierarchy,
    /// The compiled policy (catalogue, sessions, context).
    pub policy: &'a Policy,
}

/// How a call relates to a plan.
#[derive(Debug, Clone, Copy)]
pub enum PlanUse<'a> {
    /// No plan: provenance decides every guarded value.
    None,
    /// A session's plan: the call must match a planned step not used yet
    /// (`used_by`: per step in plan order, the call that used it).
    Match {
        /// The admitted plan.
        plan: &'a Plan,
        /// Per planned step, the allowed call that used it.
        used_by: &'a [Option<CallId>],
    },
    /// A run's step: the planned step itself, of a fully literal plan, with
    /// the plan's own arguments (every argument vouched for by the plan).
    Literal {
        /// The step's position in the plan.
        index: usize,
        /// The step's id.
        step_id: &'a StepId,
    },
}

/// One call to decide.
#[derive(Debug, Clone, Copy)]
pub struct GateCall<'a> {
    /// The calling agent (from its credential, never from a payload).
    pub actor: &'a AgentId,
    /// The action, as named by the caller.
    pub action: &'a str,
    /// Its arguments (a JSON object).
    pub arguments: &'a Value,
    /// The plan it must follow.
    pub plan: PlanUse<'a>,
    /// Where the session's values came from.
    pub index: &'a SourceIndex,
    /// The context envelope, when the policy has a `context:` section.
    pub envelope: Option<&'a Envelope>,
}

/// Verdicts and reasons, collected in check order (a reason counts once).
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    found: Vec<(Verdict, Reason)>,
}

impl Verdicts {
    /// Add a check's verdict; an allow adds nothing.
    pub fn add(&mut self, verdict: Verdict, reason: Reason) {
        if verdict != Verdict::Allow && !self.found.iter().any(|(_, r)| *r == reason) {
            self.found.push((verdict, reason));
        }
    }

    /// The strongest verdict and the first reason given for it
    /// ([`CALL_ALLOWED`] when nothing objected).
    pub fn winner(&self) -> (Verdict, Reason) {
        let verdict = self
            .found
            .iter()
            .map(|(v, _)| *v)
            .max_by_key(|v| rank(*v))
            .unwrap_or(Verdict::Allow);
        let reason = self
            .found
            .iter()
            .find(|(v, _)| *v == verdict)
            .map_or(CALL_ALLOWED, |(_, r)| r.clone());
        (verdict, reason)
    }

    /// Every reason given, in check order.
    pub fn reasons(&self) -> Vec<Reason> {
        self.found.iter().map(|(_, r)| r.clone()).collect()
    }
}

/// Verdicts by strength.
fn rank(v: Verdict) -> u8 {
    match v {
        Verdict::Allow => 0,
        Verdict::Constrain => 1,
        Verdict::Escalate => 2,
        Verdict::Deny => 3,
    }
}

/// The verdict a failed rule or binding asks for.
pub fn otherwise_verdict(o: Otherwise) -> Verdict {
    match o {
        Otherwise::Escalate => Verdict::Escalate,
        Otherwise::Deny => Verdict::Deny,
    }
}

/// One guarded argument value, as the gate checked it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckedValue {
    /// The rule's argument path (`recipients[*]`).
    pub rule: String,
    /// The origins the rule accepts.
    pub from: Vec<Origin>,
    /// A literal of the plan fills it: vouched for by the plan.
    pub by_plan: bool,
    /// Where the value occurs.
    pub provenance: ValueProvenance,
}

impl CheckedValue {
    /// Whether the value is vouched for (by the plan, or by an accepted
    /// origin).
    pub fn vouched(&self) -> bool {
        self.by_plan
            || self
                .provenance
                .origins
                .iter()
                .any(|o| self.from.contains(o))
    }

    /// The answer form: path, rule, origins (`plan` for a plan literal),
    /// the sources holding it, and the flags.
    pub fn to_json(&self) -> Value {
        let p = &self.provenance;
        json!({
            "path": p.path,
            "rule": self.rule,
            "from": self.from,
            "origins": if self.by_plan { vec![Origin::Plan] } else { p.origins.clone() },
            "sources": p.hits.iter().map(|h| json!({
                "origin": h.origin, "source": h.source.to_string(), "field": h.field, "owner": h.owner,
            })).collect::<Vec<_>>(),
            "vouched": self.vouched(),
            "short": p.short,
            "invisible": p.invisible,
            "unsearchable_content": p.unsearchable_content,
            "confusable_with": p.confusable_with.as_ref().map(|h| json!({
                "origin": h.origin, "source": h.source.to_string(), "field": h.field,
            })),
        })
    }
}

/// What the gate found about one call.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// The verdict.
    pub verdict: Verdict,
    /// Its reason: the first reason of the winning verdict.
    pub reason: Reason,
    /// Every reason any check gave, in check order.
    pub reasons: Vec<Reason>,
    /// Obligations of the envelope (binding on allow, and on approval of
    /// an escalation).
    pub obligations: Vec<Obligation>,
    /// The planned step the call uses: its position and id.
    pub plan_step: Option<(usize, StepId)>,
    /// Every guarded value the provenance check looked at.
    pub provenance: Vec<CheckedValue>,
    /// What the envelope decided (`None` without an envelope).
    pub context: Option<ContextDecision>,
}

impl Assessment {
    /// The provenance of every checked value, in answer form.
    pub fn provenance_json(&self) -> Vec<Value> {
        self.provenance.iter().map(CheckedValue::to_json).collect()
    }
}

/// The catalogue description of `name` for the envelope (an unknown action
/// has no tags).
pub fn action_ref<'a>(policy: &'a Policy, name: &'a str) -> ActionRef<'a> {
    ActionRef {
        name,
        tags: policy.catalogue.by_name(name).map_or(&[], |a| a.tags()),
    }
}

/// Decide one call (see the [module docs](self)). `prior` holds what the
/// caller found before the gate (checked first).
pub fn assess(ctx: &GateContext<'_>, call: &GateCall<'_>, prior: Verdicts) -> Assessment {
    let mut v = prior;
    let policy = ctx.policy;
    let action = ActionName::parse(call.action).ok();
    match &action {
        None => v.add(Verdict::Deny, reasons::UNKNOWN_ACTION),
        Some(action) => {
            let pctx = PreflightContext {
                hierarchy: ctx.hierarchy,
                catalogue: &policy.catalogue,
                policy_version: &policy.version,
            };
            for r in check_call(&pctx, call.actor, action, call.arguments) {
                v.add(Verdict::Deny, r);
            }
        }
    }
    // The plan.
    let mut plan_step = None;
    let mut exempt: Vec<String> = Vec::new();
    match call.plan {
        PlanUse::None => {}
        PlanUse::Literal { index, step_id } => {
            exempt = call
                .arguments
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            plan_step = Some((index, step_id.clone()));
        }
        PlanUse::Match { plan, used_by } => {
            let found = match &action {
                Some(action) => {
                    match_call(plan, &used(policy, plan, used_by), action, call.arguments)
                }
                None => PlanMatch::Unplanned { closest: None },
            };
            match found {
                PlanMatch::Unplanned { .. } => {
                    v.add(
                        otherwise_verdict(policy.sessions().unplanned),
                        UNPLANNED_CALL,
                    );
                }
                PlanMatch::Step {
                    index,
                    step_id,
                    literal_paths,
                    bound,
                } => {
                    exempt = literal_paths;
                    for b in &bound {
                        let mode = b.binding.matching.unwrap_or_default();
                        let mut ok = true;
                        if let Some(step) = &b.binding.step {
                            let source = plan
                                .steps()
                                .iter()
                                .position(|s| &s.step_id == step)
                                .and_then(|p| used_by.get(p).cloned().flatten());
                            ok = source.is_some_and(|c| {
                                SourceId::parse(c.as_str())
                                    .is_ok_and(|sid| call.index.occurs_in(&sid, &b.value, mode))
                            });
                        }
                        if ok && let Some(from) = &b.binding.from {
                            let p = call.index.provenance(b.path.clone(), &b.value, mode);
                            ok = p.origins.iter().any(|o| from.contains(o));
                        }
                        if !ok {
                            v.add(
                                otherwise_verdict(
                                    b.binding.otherwise.unwrap_or(Otherwise::Escalate),
                                ),
                                Reason::with_param(BINDING_NOT_SATISFIED, &b.path),
                            );
                        }
                    }
                    plan_step = Some((index, step_id));
                }
            }
        }
    }
    // Provenance of every guarded value.
    let mut provenance = Vec::new();
    if let Some(compiled) = policy.catalogue.by_name(call.action) {
        let pd = compiled
            .provenance()
            .decide_except(call.arguments, call.index, &exempt);
        provenance.reserve_exact(pd.arguments.iter().map(|a| a.values.len()).sum());
        for arg in pd.arguments {
            // The rule's path and origins go to each of its values: cloned
            // for all but the last, which takes them.
            let last = arg.values.len().saturating_sub(1);
            let (mut rule, mut from) = (arg.argument, arg.from);
            for (i, p) in arg.values.into_iter().enumerate() {
                let by_plan = exempt.iter().any(|e| covers(e, &p.path));
                let (rule, from) = if i == last {
                    (std::mem::take(&mut rule), std::mem::take(&mut from))
                } else {
                    (rule.clone(), from.clone())
                };
                provenance.push(CheckedValue {
                    rule,
                    from,
                    by_plan,
                    provenance: p,
                });
            }
        }
        v.add(pd.verdict, pd.reason.clone());
        for r in pd.reasons {
            v.add(pd.verdict, r);
        }
    }
    // The envelope.
    let mut obligations = Vec::new();
    let mut context = None;
    if let (Some(envelope), Some(cp)) = (call.envelope, policy.context.as_ref()) {
        // A restriction applied by origin needs each argument value's
        // origins; found only when one exists.
        let origins = if cp.has_conditional_restrictions() {
            argument_origins(call.arguments, call.index, &exempt)
        } else {
            Vec::new()
        };
        let cd = decide(
            envelope,
            cp,
            &ContextRequest::Call {
                action: action_ref(policy, call.action),
                arguments: &origins,
            },
        );
        v.add(cd.verdict, cd.reason.clone());
        obligations = cd.obligations.to_vec();
        context = Some(cd);
    }
    let (mut verdict, reason) = v.winner();
    if verdict == Verdict::Allow && !obligations.is_empty() {
        verdict = Verdict::Constrain;
    }
    Assessment {
        verdict,
        reason,
        reasons: v.reasons(),
        obligations,
        plan_step,
        provenance,
        context,
    }
}

/// Which planned steps a call can no longer use: a planned effect (a state
/// change or an outbound read) once an allowed call used it; a planned read
/// stays available, so a read the model repeats (or one an injection adds)
/// never takes the user's.
fn used(policy: &Policy, plan: &Plan, used_by: &[Option<CallId>]) -> Vec<bool> {
    used_by
        .iter()
        .zip(plan.steps())
        .map(|(u, step)| {
            u.is_some()
                && policy
                    .catalogue
                    .by_name(step.action.as_str())
                    .is_none_or(|a| a.is_effect())
        })
        .collect()
}

/// The origins of every argument value (every leaf of the arguments, in
/// document order): `plan` where a plan literal fills it (`exempt`),
/// otherwise every origin the index finds for it (`none` if none holds it),
/// compared case-sensitively (the stricter reading: fewer vouching
/// matches).
pub fn argument_origins(
    arguments: &Value,
    index: &SourceIndex,
    exempt: &[String],
) -> Vec<OriginSet> {
    let mut out = Vec::new();
    leaves(arguments, &mut String::new(), &mut |path, value| {
        if exempt.iter().any(|e| covers(e, path)) {
            out.push(OriginSet::of(&[Origin::Plan]));
        } else {
            let p = index.provenance(path.to_owned(), value, MatchMode::Text);
            out.push(OriginSet::of(&p.origins));
        }
    });
    out
}

/// The origins of the arguments of a fully literal plan's step: `plan`
/// for every value.
pub fn literal_origins(arguments: &Value) -> Vec<OriginSet> {
    let mut out = Vec::new();
    leaves(arguments, &mut String::new(), &mut |_, _| {
        out.push(OriginSet::of(&[Origin::Plan]));
    });
    out
}

/// Visit every scalar leaf of `value` with its path (`a.b`, `list[2]`).
fn leaves(value: &Value, path: &mut String, visit: &mut impl FnMut(&str, &Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                leaves(v, path, visit);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                leaves(v, path, visit);
                path.truncate(len);
            }
        }
        _ => visit(path, value),
    }
}

/// Whether exempt path `e` covers value path `path` (itself, or inside it).
fn covers(e: &str, path: &str) -> bool {
    path == e
        || path
            .strip_prefix(e)
            .is_some_and(|rest| rest.starts_with('[') || rest.starts_with('.'))
}
