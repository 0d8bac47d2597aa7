//! Whole-SOP preflight: every step is authorised before any handler runs.
//!
//! [`preflight`] evaluates every step of a parsed SOP against the actor's
//! effective capabilities, the action catalogue and the argument rules, and
//! reports a decision for every step (not just the first failure). The SOP is
//! admitted only if every step is allowed. Preflight works on static data
//! only: it never calls a handler, looks up a tool, or touches storage.
//!
//! [`admit`] is the complete admission of a run: the same checks, then, for
//! a run with a context envelope, every step the starting restrictions
//! already deny. Its [`Preflight`] is final; nothing patches it afterwards.
//!
//! [`admit_with_bound`] is [`admit`] for a plan ([`crate::plan`]): some
//! argument positions are bound at call time ([`BoundPositions`]), and a
//! check that fails only at such a position is skipped; [`check_call`] is
//! the same static check of one concrete call, which is where bound
//! positions are checked.
//!
//! The acting agent is the runtime identity passed in; an `actor` or
//! `owner_agent_id` inside a step's arguments is data, checked against that
//! identity, never a source of it.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::hash_table::{Entry, HashTable};
use smallvec::SmallVec;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::catalogue::{ActionCatalogue, reasons as arg};
use crate::decision::{Decision, Reason, SmolStr, Subject, Verdict, reasons};
use crate::envelope::{ActionRef, ContextPolicy, ContextRequest, Envelope, decide};
use crate::hierarchy::{AgentNode, Hierarchy};
use crate::ids::{ActionName, AgentId, check_identifier};
use crate::plan::ArgPath;
use crate::sop::{Sop, Step};
use crate::time::Timestamp;

/// The operation name recorded for step decisions.
pub const OP_SOP_VALIDATE: &str = "sop.validate";
/// Built-in action: read memory.
pub const MEMORY_READ: &str = "memory.read";
/// Built-in action: write memory.
pub const MEMORY_WRITE: &str = "memory.write";
/// A memory step whose `namespace`, `key` or owner is malformed.
pub const MEMORY_ARGUMENT_INVALID: &str = "memory_argument_invalid";

/// What preflight needs from the policy and hierarchy.
#[derive(Debug, Clone, Copy)]
pub struct PreflightContext<'a> {
    /// The agent hierarchy.
    pub hierarchy: &'a Hierarchy,
    /// The action catalogue.
    pub catalogue: &'a ActionCatalogue,
    /// The policy version decisions record.
    pub policy_version: &'a str,
}

/// The check of one step: its violations, from which its decision follows
/// ([`Preflight::decision`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepCheck {
    /// The step id as written (may be empty or repeated: that is a finding).
    pub step_id: SmolStr,
    /// The action as written.
    pub action: SmolStr,
    /// Every violation found for this step, in check order. The step is
    /// allowed if there is none, denied with the first one otherwise.
    pub violations: Violations,
}

/// A step's violations: most steps have none or one, held inline.
pub type Violations = SmallVec<[Reason; 2]>;

/// The reason of an allowed step, as a place to borrow it from.
static STEP_ALLOWED: Reason = reasons::STEP_ALLOWED;

impl StepCheck {
    /// Whether the step is allowed (it has no violation).
    pub fn permits(&self) -> bool {
        self.violations.is_empty()
    }

    /// `allow`, or `deny` if the step has a violation.
    pub fn verdict(&self) -> Verdict {
        if self.permits() {
            Verdict::Allow
        } else {
            Verdict::Deny
        }
    }

    /// The decision's reason: the first violation, or `step_allowed`.
    pub fn reason(&self) -> &Reason {
        self.violations.first().unwrap_or(&STEP_ALLOWED)
    }
}

/// The result of preflight.
///
/// Every step's [`Decision`] shares its subject (the actor), operation
/// (`sop.validate`), policy version and time, and its resource is
/// `sop_id:step_id`: a step keeps only its own part ([`StepCheck`]), and
/// [`Preflight::decision`] builds the full decision when it is recorded or
/// shown. It is serialised (and compared) with every step's full decision,
/// as `{admitted, steps: [{step_id, action, decision, violations}]}`.
#[derive(Debug, Clone)]
pub struct Preflight {
    /// Whether every step is allowed.
    pub admitted: bool,
    /// One check per step, in order.
    pub steps: Vec<StepCheck>,
    /// What every step's decision shares.
    shared: Shared,
}

/// The part of a step's decision every step of one preflight shares.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shared {
    actor: AgentId,
    sop_id: SmolStr,
    policy_version: SmolStr,
    time: Timestamp,
}

impl Preflight {
    /// The steps that were denied.
    pub fn rejected(&self) -> impl Iterator<Item = &StepCheck> {
        self.steps.iter().filter(|s| !s.permits())
    }

    /// The full decision of `step` (one of [`Preflight::steps`]): its
    /// verdict and reason ([`StepCheck::verdict`], [`StepCheck::reason`]),
    /// the actor as subject, operation `sop.validate`, resource
    /// `sop_id:step_id`, the policy version and the time of the preflight.
    pub fn decision(&self, step: &StepCheck) -> Decision {
        let s = &self.shared;
        Decision {
            verdict: step.verdict(),
            reason: step.reason().clone(),
            subject: Subject::Agent(s.actor.clone()),
            operation: SmolStr::new_static(OP_SOP_VALIDATE),
            resource: SmolStr::from_iter([s.sop_id.as_str(), ":", step.step_id.as_str()]),
            policy_version: s.policy_version.clone(),
            obligations: Vec::new(),
            time: s.time,
        }
    }

    /// Every step with its full decision, in order.
    pub fn decisions(&self) -> impl Iterator<Item = (&StepCheck, Decision)> {
        self.steps.iter().map(|s| (s, self.decision(s)))
    }
}

impl PartialEq for Preflight {
    /// The same verdict, steps and step decisions.
    fn eq(&self, other: &Self) -> bool {
        self.admitted == other.admitted
            && self.steps == other.steps
            && (self.shared == other.shared
                || self
                    .steps
                    .iter()
                    .all(|s| self.decision(s) == other.decision(s)))
    }
}

impl Eq for Preflight {}

/// One step as serialised: with its full decision.
#[derive(Serialize, Deserialize)]
struct StepRecord {
    step_id: SmolStr,
    action: SmolStr,
    decision: Decision,
    violations: Violations,
}

/// A preflight as serialised.
#[derive(Serialize, Deserialize)]
struct PreflightRecord {
    admitted: bool,
    steps: Vec<StepRecord>,
}

impl Serialize for Preflight {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        PreflightRecord {
            admitted: self.admitted,
            steps: self
                .decisions()
                .map(|(s, decision)| StepRecord {
                    step_id: s.step_id.clone(),
                    action: s.action.clone(),
                    decision,
                    violations: s.violations.clone(),
                })
                .collect(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Preflight {
    /// The serialised form read back; refused unless every step's decision
    /// is the one its check and the shared part give (as preflight makes
    /// them).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = PreflightRecord::deserialize(deserializer)?;
        let shared = match wire.steps.first() {
            None => Shared {
                actor: AgentId::parse("unknown").map_err(D::Error::custom)?,
                sop_id: SmolStr::default(),
                policy_version: SmolStr::default(),
                time: Timestamp(0),
            },
            Some(first) => {
                let d = &first.decision;
                let Some(actor) = d.subject.agent() else {
                    return Err(D::Error::custom(
                        "a step decision's subject is not an agent",
                    ));
                };
                let sop_id = d
                    .resource
                    .strip_suffix(first.step_id.as_str())
                    .and_then(|r| r.strip_suffix(':'))
                    .ok_or_else(|| {
                        D::Error::custom("a step decision's resource is not sop_id:step_id")
                    })?;
                Shared {
                    actor: actor.clone(),
                    sop_id: SmolStr::from(sop_id),
                    policy_version: d.policy_version.clone(),
                    time: d.time,
                }
            }
        };
        let mut preflight = Preflight {
            admitted: wire.admitted,
            steps: Vec::with_capacity(wire.steps.len()),
            shared,
        };
        for s in wire.steps {
            let check = StepCheck {
                step_id: s.step_id,
                action: s.action,
                violations: s.violations,
            };
            if preflight.decision(&check) != s.decision {
                return Err(D::Error::custom(
                    "a step decision does not follow from its violations and the others",
                ));
            }
            preflight.steps.push(check);
        }
        Ok(preflight)
    }
}

/// The envelope a run starts under, and the context policy that reads it.
#[derive(Debug, Clone, Copy)]
pub struct RunContext<'a> {
    /// The run's starting envelope: an empty root, or the one delegated from
    /// the envelope the acting agent inherited.
    pub envelope: &'a Envelope,
    /// The bundle's compiled `context:` section.
    pub policy: &'a ContextPolicy,
}

/// Evaluate every step of `sop` for `actor` on static data (no envelope):
/// [`admit`] without a [`RunContext`].
pub fn preflight(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    now: Timestamp,
) -> Preflight {
    admit(ctx, actor, sop, None, now)
}

/// The complete admission of `sop` as a run of `actor`: every step's final
/// decision, in one pass.
///
/// Every step is checked on static data first (agent active, step id,
/// catalogue, effective capabilities, memory arguments, argument rules).
/// If every step passes and the run has a context (`run`), each step is
/// then decided against the run's starting envelope as the policy projects
/// it: a step a restriction already denies (`restricted_by:…`) is denied
/// with that reason and rejects the SOP, since restrictions never shrink
/// and it could never run. Other context verdicts (escalations, the floor,
/// obligations) are left to the step's own gate ([`ContextGate`]), because
/// what earlier steps produce may still change them.
///
/// An SOP rejected on static data is reported as it is, without the
/// envelope: the engine opens no envelope for it.
///
/// [`ContextGate`]: crate::envelope::ContextGate
pub fn admit(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    run: Option<RunContext<'_>>,
    now: Timestamp,
) -> Preflight {
    admit_with_bound(ctx, actor, sop, &[], run, now)
}

/// [`admit`] of an SOP some of whose argument positions are bound at call
/// time: `bound[i]` lists step `i`'s (a step past the end of `bound` has
/// none). A plan's SOP comes from
/// [`plan_preflight_sop`](crate::plan::plan_preflight_sop), with a
/// placeholder at each bound position.
///
/// What is skipped, and only that: a schema violation whose JSON pointer
/// is at or under a bound position; an argument rule whose argument is at
/// or under one (rules name object keys, so a bound array element never
/// matches one); for `memory.read` / `memory.write`, the checks of a bound
/// `namespace`, `key`, `value` or `owner_agent_id`. A violation located
/// above a bound position (the arguments object as a whole, a parent
/// object's keyword) is kept, as is a pointer the catalogue may have cut
/// (over 124 bytes): preflight cannot tell what the call will put there, so
/// it fails closed. Bound positions are checked at call time
/// ([`check_call`]).
pub fn admit_with_bound(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    sop: &Sop,
    bound: &[BoundPositions],
    run: Option<RunContext<'_>>,
    now: Timestamp,
) -> Preflight {
    let node = actor_node(ctx, actor);
    let agent_failure = agent_failure(node);
    // Step ids are short and hashed once each: foldhash, not SipHash. The
    // table holds the positions of the steps seen, not their ids.
    let state = RandomState::default();
    let id_at = |j: usize| sop.steps.get(j).map_or("", Step::step_id_str);
    let mut seen: HashTable<usize> = HashTable::with_capacity(sop.steps.len());
    let mut steps: Vec<StepCheck> = sop
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let step_id = step.step_id_str();
            let mut violations = Violations::new();
            if let Some(r) = &agent_failure {
                violations.push(r.clone());
            }
            if step_id.is_empty() {
                violations.push(reasons::EMPTY_STEP_ID);
            } else {
                let hash = state.hash_one(step_id);
                match seen.entry(
                    hash,
                    |&j| id_at(j) == step_id,
                    |&j| state.hash_one(id_at(j)),
                ) {
                    Entry::Occupied(_) => violations.push(reasons::DUPLICATE_STEP_ID),
                    Entry::Vacant(slot) => {
                        slot.insert(i);
                    }
                }
            }
            action_violations(
                ctx,
                node,
                actor,
                &step.action,
                &step.arguments,
                bound.get(i),
                &mut violations,
            );
            StepCheck {
                step_id: step
                    .step_id
                    .as_ref()
                    .map_or_else(SmolStr::default, |id| id.as_text().clone()),
                action: step.action.as_text().clone(),
                violations,
            }
        })
        .collect();
    let mut admitted = steps.iter().all(StepCheck::permits);
    if let Some(run) = run
        && admitted
    {
        for (step, check) in sop.steps.iter().zip(steps.iter_mut()) {
            let action = ActionRef {
                name: step.action.as_str(),
                tags: ctx
                    .catalogue
                    .by_name(step.action.as_str())
                    .map_or(&[], |a| a.tags()),
            };
            // Every argument of a step at admission is the plan's own (a
            // bound position is decided with its value at call time).
            let origins = crate::gate::literal_origins(&step.arguments);
            let cd = decide(
                run.envelope,
                run.policy,
                &ContextRequest::Call {
                    action,
                    arguments: &origins,
                },
            );
            if cd.is_permanent() {
                // The step had no violation: this one is its first, and
                // its reason.
                check.violations.push(cd.reason);
                admitted = false;
            }
        }
    }
    Preflight {
        admitted,
        steps,
        shared: Shared {
            actor: actor.clone(),
            sop_id: sop.sop_id.as_text().clone(),
            policy_version: SmolStr::from(ctx.policy_version),
            time: now,
        },
    }
}

/// Every static violation of one concrete call of `action` with
/// `arguments` by `actor`, in check order, as [`admit`] checks a step
/// (without the step id checks): the agent is known and active, the action
/// is in the catalogue and in its effective capabilities, memory arguments
/// are well formed and name no other owner, and the arguments pass the
/// action's schema and rules. Empty means the call passes. This is where a
/// plan's bound positions are checked, with the values the call put there.
pub fn check_call(
    ctx: &PreflightContext<'_>,
    actor: &AgentId,
    action: &ActionName,
    arguments: &Value,
) -> Vec<Reason> {
    let node = actor_node(ctx, actor);
    let mut violations: Violations = agent_failure(node).into_iter().collect();
    action_violations(ctx, node, actor, action, arguments, None, &mut violations);
    violations.into_vec()
}

fn actor_node<'h>(ctx: &PreflightContext<'h>, actor: &AgentId) -> Option<&'h AgentNode> {
    ctx.hierarchy
        .index_of(actor.as_str())
        .and_then(|i| ctx.hierarchy.node(i))
}

fn agent_failure(node: Option<&AgentNode>) -> Option<Reason> {
    match node {
        None => Some(reasons::UNKNOWN_AGENT),
        Some(n) if !n.is_active() => Some(reasons::AGENT_REVOKED),
        Some(_) => None,
    }
}

/// The catalogue, capability, memory and argument checks of one action
/// with its arguments, skipping what `bound` covers.
fn action_violations(
    ctx: &PreflightContext<'_>,
    node: Option<&AgentNode>,
    actor: &AgentId,
    action: &ActionName,
    arguments: &Value,
    bound: Option<&BoundPositions>,
    violations: &mut Violations,
) {
    let Some(idx) = ctx.catalogue.index_of(action.as_str()) else {
        violations.push(reasons::UNKNOWN_ACTION);
        return;
    };
    if let Some(n) = node
        && !n.effective().contains(idx.get())
    {
        violations.push(reasons::ACTION_NOT_IN_EFFECTIVE_CAPABILITIES);
    }
    let action = action.as_str();
    if action == MEMORY_WRITE || action == MEMORY_READ {
        let empty = serde_json::Map::new();
        let args = arguments.as_object().unwrap_or(&empty);
        check_memory_step(action, args, actor, bound, violations);
    }
    let found = ctx.catalogue.check_argument_value(idx, arguments);
    if found.is_empty() {
        return;
    }
    match bound {
        Some(b) if !b.is_empty() => violations.extend(found.into_iter().filter(|r| !b.skips(r))),
        _ => violations.extend(found),
    }
}

/// Argument positions of one step whose values are bound at call time (a
/// plan's bindings: [`Plan::bound_positions`](crate::plan::Plan::bound_positions)).
/// [`admit_with_bound`] skips the checks that fail only there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoundPositions {
    paths: Vec<ArgPath>,
    /// The JSON pointer of each path, in the same order.
    pointers: Vec<String>,
}

/// Longest schema-violation pointer that the catalogue cannot have cut
/// (it cuts at 128 bytes, at a char boundary, so a cut one is over 124).
const MAX_UNCUT_POINTER: usize = 124;

/// Argument-rule reasons: their parameter is the rule's (dotted) argument.
const RULE_REASONS: [&str; 10] = [
    arg::PATH_OUTSIDE_ALLOWED,
    arg::PATH_TRAVERSAL,
    arg::HOST_NOT_ALLOWED,
    arg::SCHEME_NOT_ALLOWED,
    arg::ARGUMENT_TOO_LARGE,
    arg::PATTERN_MISMATCH,
    arg::MIME_NOT_ALLOWED,
    arg::CLASSIFICATION_ABOVE_CEILING,
    arg::ARGUMENT_MISSING,
    arg::ARGUMENT_WRONG_TYPE,
];

impl BoundPositions {
    /// These positions.
    pub fn new(paths: Vec<ArgPath>) -> Self {
        let pointers = paths.iter().map(ArgPath::pointer).collect();
        Self { paths, pointers }
    }

    /// The positions.
    pub fn paths(&self) -> &[ArgPath] {
        &self.paths
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether `reason` (from the catalogue's argument check) is located at
    /// or under a bound position.
    fn skips(&self, reason: &Reason) -> bool {
        let Some((kind, param)) = reason.as_str().split_once(':') else {
            return false;
        };
        if kind == arg::ARGUMENT_SCHEMA_VIOLATION {
            return param.starts_with('/')
                && param.len() <= MAX_UNCUT_POINTER
                && self.pointers.iter().any(|p| {
                    param
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
                });
        }
        if RULE_REASONS.contains(&kind) {
            let argument: Vec<&str> = param.split('.').collect();
            return self.paths.iter().any(|p| {
                p.keys()
                    .is_some_and(|keys| argument.starts_with(keys.as_slice()))
            });
        }
        false
    }

    /// Whether the top-level argument `name` is bound.
    fn binds_member(&self, name: &str) -> bool {
        self.paths
            .iter()
            .any(|p| p.keys().is_some_and(|keys| keys == [name]))
    }
}

fn check_memory_step(
    action: &str,
    args: &serde_json::Map<String, Value>,
    actor: &AgentId,
    bound: Option<&BoundPositions>,
    violations: &mut Violations,
) {
    let is_bound = |field: &str| bound.is_some_and(|b| b.binds_member(field));
    for field in ["namespace", "key"] {
        if is_bound(field) {
            continue;
        }
        let ok = args
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| check_identifier(s).is_ok());
        if !ok {
            violations.push(Reason::with_param(MEMORY_ARGUMENT_INVALID, field));
        }
    }
    if action == MEMORY_WRITE {
        if !args.contains_key("value") && !is_bound("value") {
            violations.push(Reason::with_param(MEMORY_ARGUMENT_INVALID, "value"));
        }
        // The owner scope defaults to the actor; naming anyone else is the
        // lab document's cross-owner write.
        match args.get("owner_agent_id") {
            _ if is_bound("owner_agent_id") => {}
            None => {}
            Some(Value::String(owner)) if owner == actor.as_str() => {}
            Some(_) => violations.push(reasons::CROSS_OWNER_MEMORY_WRITE),
        }
    }
}

#[cfg(test)]
mod tests;
