//! Plans: an SOP whose argument values may be filled at call time.
//!
//! A tool-call session may be bound to a plan, admitted whole before the
//! first call. A plan is written in the SOP format ([`crate::sop`]), and any
//! value inside a step's `arguments` may be a *binding*, an object whose
//! only key is `$bind`:
//!
//! ```json
//! {"sop_id": "pay-rent", "version": 1, "steps": [
//!   {"step_id": "read", "action": "read_file", "arguments": {"file_path": "landlord-notices.txt"}},
//!   {"step_id": "pay", "action": "send_money", "arguments": {
//!     "recipient": {"$bind": {"step": "read", "from": ["trusted"], "match": "caseless"}},
//!     "amount": {"$bind": {}}, "subject": "rent"}}]}
//! ```
//!
//! # The format
//!
//! [`parse_plan`] parses the SOP first ([`sop_from_value`], with the
//! bundle's [`SopLimits`]); its errors come back wrapped, as they are
//! ([`PlanError::Sop`]). Then, since a plan is admitted whole, an empty step
//! id (`empty_step_id`) and a repeated one (`duplicate_step_id`) are
//! errors here, not preflight findings. A binding holds, all optional:
//! `step` (an *earlier* step of the plan: the value must occur in the
//! recorded result of the call that used it), `from` (a non-empty list of
//! origins, never `none`: who must vouch for the value), `otherwise`
//! (`escalate` or `deny`) and `match` (`text` or `caseless`); anything else
//! is refused, as is a key beside `$bind` and a binding of the arguments
//! object as a whole. Every error names its JSON path
//! (`steps[1].arguments.recipient.$bind.step`) and a stable code
//! ([`PlanError::code`]).
//!
//! # Matching a call
//!
//! [`match_call`] finds the planned step a call uses: the first step not
//! used yet, in plan order, with the call's action, whose arguments match
//! the call's. They match when every literal is equal (JSON equality, with
//! numbers compared by value: `1` equals `1.0`), every bound position holds
//! any value (a whole subtree, too), the call has no key the plan lacks,
//! and a key the plan has is missing from the call only where the plan
//! binds it (the binding is then simply not filled: no value reaches the
//! tool). Arrays match element by element, with the same length.
//! Positions the plan fixes are vouched for by the plan (origin `plan`);
//! bound positions come back as [`BoundValue`]s for the engine to check.
//!
//! # Admission
//!
//! [`admit_plan`] runs the whole-SOP preflight over the plan: capabilities,
//! the catalogue and the literal arguments are checked as for a run, while
//! a bound position cannot fail a check just because it is bound. How:
//! [`plan_preflight_sop`] is the plan as an SOP with each binding replaced
//! by a placeholder string (`"$bind:<argument path>"`, unique per position),
//! and [`Plan::bound_positions`] tells [`preflight::admit_with_bound`]
//! which positions to skip: a schema violation located at or under a bound
//! position, an argument rule on one, and the memory-argument checks of a
//! bound field. Violations located above a bound position (a `oneOf` over
//! the whole arguments object, say) still count, with the placeholder in
//! place of the value, since preflight cannot know whether the value will
//! satisfy them: such a plan is refused (fail closed). Bound positions are
//! checked when the call is made, when every catalogue rule applies to the
//! call's actual arguments ([`preflight::check_call`]).
//!
//! # Checking before anything runs
//!
//! [`parse_document`] reads what `warden check` and `POST
//! /v1/sops/validate` are given: a plan when it parses as one; an SOP when
//! only its step ids (empty or repeated, which an SOP's preflight reports
//! as findings) keep it from being one and it holds no `$bind`.
//! [`PlanDocument::admit`] admits a plan with [`admit_plan`] (for a plan
//! of literals exactly what [`preflight::admit`] decides for the SOP) and
//! an SOP with [`preflight::admit`]; [`PlanDocument::explain`] says, per
//! step and guarded argument, what provenance a call using the step will
//! meet ([`explain_plan`]: literals vouched for by the plan, bindings
//! checked, bindings that can only escalate or be denied, bound positions
//! no rule guards).

mod error;
pub mod explain;
mod matching;
mod path;
mod template;

#[cfg(test)]
mod explain_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::audit::Digest;
use crate::canonical::to_canonical;
use crate::ids::{ActionName, SopId, StepId};
use crate::preflight::{self, BoundPositions, Preflight, PreflightContext, RunContext};
use crate::sop::{Sop, SopLimits, Step, sop_from_value};
use crate::time::Timestamp;

pub use error::{PlanError, PlanErrorKind};
pub use explain::{
    BindingExplanation, ConstraintBy, Fill, PlanExplanation, PositionExplanation, RuleExplanation,
    StepExplanation, Unmet, codes as explain_codes, explain_plan, explain_sop,
};
pub use matching::{BoundValue, PlanMatch, match_call};
pub use path::{ArgPath, ArgSeg};
pub use template::{BIND_KEY, Binding};
use template::{Leaf, Node, StepScope, parse_arguments};

/// An admitted-shape plan: a valid SOP whose bindings are valid. Built only
/// by [`parse_plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    sop_id: SopId,
    version: u32,
    steps: Vec<PlanStep>,
}

/// One planned step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// Its id, unique in the plan.
    pub step_id: StepId,
    /// The action it plans.
    pub action: ActionName,
    /// Always an object node.
    arguments: Node,
}

impl PlanStep {
    /// Its id.
    pub fn step_id(&self) -> &StepId {
        &self.step_id
    }

    /// Its action.
    pub fn action(&self) -> &ActionName {
        &self.action
    }

    /// Its arguments as written, bindings included.
    pub fn arguments(&self) -> Value {
        self.arguments.to_json()
    }

    /// Every binding with its position, in document order (object keys
    /// sorted).
    pub fn bindings(&self) -> Vec<(ArgPath, &Binding)> {
        let mut out = Vec::new();
        self.arguments.walk(&mut Vec::new(), &mut |path, leaf| {
            if let Leaf::Bind(b) = leaf {
                out.push((ArgPath::from_segments(path.to_vec()), b));
            }
        });
        out
    }

    /// Every literal leaf (a scalar, or an empty object or array) with its
    /// position, in document order.
    pub fn literals(&self) -> Vec<(ArgPath, Value)> {
        let mut out = Vec::new();
        self.arguments.walk(&mut Vec::new(), &mut |path, leaf| {
            if let Leaf::Literal(v) = leaf {
                out.push((ArgPath::from_segments(path.to_vec()), v));
            }
        });
        out
    }

    /// Whether any argument is bound.
    pub fn has_bindings(&self) -> bool {
        !self.bindings().is_empty()
    }

    fn to_sop_step(&self, fill: &mut impl FnMut(&[ArgSeg], &Binding) -> Value) -> Step {
        Step {
            step_id: Some(self.step_id.clone()),
            action: self.action.clone(),
            arguments: self.arguments.to_json_with(&mut Vec::new(), fill),
        }
    }
}

/// Parse a plan: the SOP format with bindings (see the [module
/// docs](self)). Nothing is kept of a refused plan.
pub fn parse_plan(json: &Value, limits: &SopLimits) -> Result<Plan, PlanError> {
    let sop = sop_from_value(json, limits)?;
    let mut ids: Vec<StepId> = Vec::with_capacity(sop.steps.len());
    for (i, step) in sop.steps.iter().enumerate() {
        let at = format!("steps[{i}].step_id");
        let Some(id) = &step.step_id else {
            return Err(PlanError::at(at, PlanErrorKind::EmptyStepId));
        };
        if ids.contains(id) {
            return Err(PlanError::at(at, PlanErrorKind::DuplicateStepId));
        }
        ids.push(id.clone());
    }
    let mut steps = Vec::with_capacity(sop.steps.len());
    for ((index, step), step_id) in sop.steps.iter().enumerate().zip(&ids) {
        let scope = StepScope { index, ids: &ids };
        let arguments = Node::Object(parse_arguments(step.arguments(), &scope)?);
        steps.push(PlanStep {
            step_id: step_id.clone(),
            action: step.action.clone(),
            arguments,
        });
    }
    Ok(Plan {
        sop_id: sop.sop_id,
        version: sop.version,
        steps,
    })
}

impl Plan {
    /// Its id.
    pub fn sop_id(&self) -> &SopId {
        &self.sop_id
    }

    /// Its version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Its steps, in order (at least one).
    pub fn steps(&self) -> &[PlanStep] {
        &self.steps
    }

    /// The step called `step_id`, with its index.
    pub fn step(&self, step_id: &str) -> Option<(usize, &PlanStep)> {
        self.steps
            .iter()
            .enumerate()
            .find(|(_, s)| s.step_id.as_str() == step_id)
    }

    /// Whether any step binds an argument.
    pub fn has_bindings(&self) -> bool {
        self.steps.iter().any(PlanStep::has_bindings)
    }

    /// Every literal leaf of every step, with its path in the plan
    /// (`steps[0].arguments.file_path`, `steps[2].arguments.cc[1]`), in
    /// step order: what a session records as the plan's source (origin
    /// `plan`).
    pub fn literals(&self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            for (path, value) in step.literals() {
                out.push((path.in_plan(i), value));
            }
        }
        out
    }

    /// The plan as JSON, bindings included: [`parse_plan`] of it gives this
    /// plan back.
    pub fn to_json(&self) -> Value {
        self.to_json_with(&mut |_, b| b.to_json())
    }

    fn to_json_with(&self, fill: &mut impl FnMut(&[ArgSeg], &Binding) -> Value) -> Value {
        let steps = self
            .steps
            .iter()
            .map(|s| {
                let mut step = Map::new();
                step.insert("step_id".into(), Value::String(s.step_id.to_string()));
                step.insert("action".into(), Value::String(s.action.to_string()));
                step.insert(
                    "arguments".into(),
                    s.arguments.to_json_with(&mut Vec::new(), fill),
                );
                Value::Object(step)
            })
            .collect();
        let mut root = Map::new();
        root.insert("sop_id".into(), Value::String(self.sop_id.to_string()));
        root.insert("version".into(), Value::from(self.version));
        root.insert("steps".into(), Value::Array(steps));
        Value::Object(root)
    }

    /// SHA-256 of the canonical JSON ([`crate::canonical`]) of
    /// [`Plan::to_json`]: the plan as parsed, whatever its layout.
    pub fn hash(&self) -> Digest {
        Digest::of(&to_canonical(&self.to_json()))
    }

    /// The plan as an SOP, when it binds nothing.
    pub fn literal_sop(&self) -> Option<Sop> {
        if self.has_bindings() {
            return None;
        }
        Some(self.to_sop(&mut |_, b| b.to_json()))
    }

    fn to_sop(&self, fill: &mut impl FnMut(&[ArgSeg], &Binding) -> Value) -> Sop {
        Sop {
            sop_id: self.sop_id.clone(),
            version: self.version,
            steps: self.steps.iter().map(|s| s.to_sop_step(fill)).collect(),
        }
    }

    /// Per step, in order, the positions its bindings occupy: what
    /// [`preflight::admit_with_bound`] skips.
    pub fn bound_positions(&self) -> Vec<BoundPositions> {
        self.steps
            .iter()
            .map(|s| BoundPositions::new(s.bindings().into_iter().map(|(p, _)| p).collect()))
            .collect()
    }
}

/// The plan as an SOP for the whole-SOP preflight: each binding replaced by
/// the placeholder string `"$bind:<argument path>"` (unique per position).
/// Use it with [`Plan::bound_positions`] and
/// [`preflight::admit_with_bound`], or call [`admit_plan`].
pub fn plan_preflight_sop(plan: &Plan) -> Sop {
    plan.to_sop(&mut |path, _| Value::String(format!("{BIND_KEY}:{}", path::argument_path(path))))
}

/// The complete admission of `plan` for `actor`: [`preflight::admit`] of
/// [`plan_preflight_sop`], skipping the bound positions (see the [module
/// docs](self)).
pub fn admit_plan(
    ctx: &PreflightContext<'_>,
    actor: &crate::ids::AgentId,
    plan: &Plan,
    run: Option<RunContext<'_>>,
    now: Timestamp,
) -> Preflight {
    preflight::admit_with_bound(
        ctx,
        actor,
        &plan_preflight_sop(plan),
        &plan.bound_positions(),
        run,
        now,
    )
}

/// A document checked before anything runs: a plan, or an SOP that is not
/// one only because of its step ids (see [`parse_document`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanDocument {
    /// A plan (possibly of literals only).
    Plan(Plan),
    /// An SOP with an empty or repeated step id and no `$bind`.
    Sop(Sop),
}

/// Read a document to check: the SOP format first (its errors as they
/// are), then a plan; an SOP whose step ids alone are not a plan's (an
/// empty or repeated one) and that holds no `$bind` object anywhere in its
/// arguments is kept as an SOP, so its preflight reports those ids as
/// findings (`empty_step_id`, `duplicate_step_id`). Any other plan error
/// is returned.
pub fn parse_document(json: &Value, limits: &SopLimits) -> Result<PlanDocument, PlanError> {
    let sop = sop_from_value(json, limits)?;
    match parse_plan(json, limits) {
        Ok(plan) => Ok(PlanDocument::Plan(plan)),
        Err(PlanError::Plan {
            kind: PlanErrorKind::EmptyStepId | PlanErrorKind::DuplicateStepId,
            ..
        }) if !sop.steps.iter().any(|s| holds_bind(&s.arguments)) => Ok(PlanDocument::Sop(sop)),
        Err(e) => Err(e),
    }
}

/// Whether any object inside `v` has a `$bind` key.
fn holds_bind(v: &Value) -> bool {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if m.contains_key(BIND_KEY) {
                    return true;
                }
                stack.extend(m.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    false
}

impl PlanDocument {
    /// Its id.
    pub fn sop_id(&self) -> &SopId {
        match self {
            PlanDocument::Plan(p) => p.sop_id(),
            PlanDocument::Sop(s) => &s.sop_id,
        }
    }

    /// Whether any argument is bound.
    pub fn has_bindings(&self) -> bool {
        matches!(self, PlanDocument::Plan(p) if p.has_bindings())
    }

    /// Its complete admission: [`admit_plan`] for a plan,
    /// [`preflight::admit`] for an SOP.
    pub fn admit(
        &self,
        ctx: &PreflightContext<'_>,
        actor: &crate::ids::AgentId,
        run: Option<RunContext<'_>>,
        now: Timestamp,
    ) -> Preflight {
        match self {
            PlanDocument::Plan(p) => admit_plan(ctx, actor, p, run, now),
            PlanDocument::Sop(s) => preflight::admit(ctx, actor, s, run, now),
        }
    }

    /// Its provenance explanation ([`explain_plan`], [`explain_sop`]).
    pub fn explain(&self, catalogue: &crate::catalogue::ActionCatalogue) -> PlanExplanation {
        match self {
            PlanDocument::Plan(p) => explain_plan(catalogue, p),
            PlanDocument::Sop(s) => explain_sop(catalogue, s),
        }
    }
}
