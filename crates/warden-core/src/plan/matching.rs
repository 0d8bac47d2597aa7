//! Which planned step a call uses.

use std::collections::BTreeSet;

use serde_json::{Number, Value};

use super::Plan;
use super::path::{ArgSeg, argument_path};
use super::template::{Binding, Node};
use crate::ids::{ActionName, StepId};

/// A value a call put at a bound position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundValue {
    /// The argument path, as the provenance module writes it: `recipient`,
    /// `recipients[2]`, `a.b`.
    pub path: String,
    /// The call's value there (a whole subtree, if that is what it put).
    pub value: Value,
    /// The plan's binding.
    pub binding: Binding,
}

/// The planned step a call uses, or why none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanMatch {
    /// The call uses this step.
    Step {
        /// Its index in the plan.
        index: usize,
        /// Its id.
        step_id: StepId,
        /// Every argument path whose value a literal matched (containers
        /// descended, leaves listed: `subject`, `cc[0]`), in document order:
        /// vouched for by the plan.
        literal_paths: Vec<String>,
        /// The values at bound positions, in document order; a bound key
        /// the call left out has none.
        bound: Vec<BoundValue>,
    },
    /// No unused step matches.
    Unplanned {
        /// The first unused step with the same action, and the first
        /// argument path where the call differs from it (`$` when the
        /// arguments are not an object): for the reason text.
        closest: Option<(StepId, String)>,
    },
}

/// The step of `plan` that a call of `action` with `arguments` uses: the
/// first one, in plan order, not marked in `used` (an index past its end is
/// unused) with the same action whose arguments match (see the [module
/// docs](super)).
pub fn match_call(plan: &Plan, used: &[bool], action: &ActionName, arguments: &Value) -> PlanMatch {
    let mut closest = None;
    for (index, step) in plan.steps.iter().enumerate() {
        if used.get(index).copied().unwrap_or(false) || step.action != *action {
            continue;
        }
        let mut found = Found::default();
        match matches(&step.arguments, arguments, &mut Vec::new(), &mut found) {
            Ok(()) => {
                return PlanMatch::Step {
                    index,
                    step_id: step.step_id.clone(),
                    literal_paths: found.literal_paths,
                    bound: found.bound,
                };
            }
            Err(at) => {
                if closest.is_none() {
                    closest = Some((step.step_id.clone(), argument_path(&at)));
                }
            }
        }
    }
    PlanMatch::Unplanned { closest }
}

#[derive(Default)]
struct Found {
    literal_paths: Vec<String>,
    bound: Vec<BoundValue>,
}

/// Match `call` against `plan` at `path`; `Err` with the first position
/// where they differ.
fn matches(
    plan: &Node,
    call: &Value,
    path: &mut Vec<ArgSeg>,
    found: &mut Found,
) -> Result<(), Vec<ArgSeg>> {
    match (plan, call) {
        (Node::Bind(binding), value) => {
            found.bound.push(BoundValue {
                path: argument_path(path),
                value: value.clone(),
                binding: binding.clone(),
            });
            Ok(())
        }
        (Node::Literal(expected), value) => {
            if scalar_eq(expected, value) {
                found.literal_paths.push(argument_path(path));
                Ok(())
            } else {
                Err(path.clone())
            }
        }
        (Node::Object(members), Value::Object(given)) => {
            if members.is_empty() && given.is_empty() {
                if !path.is_empty() {
                    found.literal_paths.push(argument_path(path));
                }
                return Ok(());
            }
            // Sorted, so "the first path that differs" does not depend on
            // how the call's object was built.
            let keys: BTreeSet<&str> = members
                .keys()
                .map(String::as_str)
                .chain(given.keys().map(String::as_str))
                .collect();
            for key in keys {
                path.push(ArgSeg::Key(key.to_owned()));
                let outcome = match (members.get(key), given.get(key)) {
                    (Some(n), Some(v)) => matches(n, v, path, found),
                    (Some(Node::Bind(_)), None) => Ok(()),
                    _ => Err(path.clone()),
                };
                path.pop();
                outcome?;
            }
            Ok(())
        }
        (Node::Array(items), Value::Array(given)) => {
            if items.len() != given.len() {
                return Err(path.clone());
            }
            if items.is_empty() {
                found.literal_paths.push(argument_path(path));
                return Ok(());
            }
            for (i, (n, v)) in items.iter().zip(given).enumerate() {
                path.push(ArgSeg::Index(i));
                let outcome = matches(n, v, path, found);
                path.pop();
                outcome?;
            }
            Ok(())
        }
        _ => Err(path.clone()),
    }
}

/// JSON equality of a plan scalar and a call value, numbers by value.
fn scalar_eq(expected: &Value, given: &Value) -> bool {
    match (expected, given) {
        (Value::Number(a), Value::Number(b)) => number_eq(a, b),
        _ => expected == given,
    }
}

/// Numbers equal by value: `1 == 1.0`, `-0.0 == 0`; integers compared
/// exactly (no rounding through `f64`).
pub(super) fn number_eq(a: &Number, b: &Number) -> bool {
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => x == y,
        (Some(x), None) => float_is(b.as_f64(), x),
        (None, Some(y)) => float_is(a.as_f64(), y),
        (None, None) => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// Whether the float `f` is exactly the integer `i`.
fn float_is(f: Option<f64>, i: i128) -> bool {
    let Some(f) = f else { return false };
    // Every i64 and u64 is below 2^64 in magnitude; a float beyond that (or
    // fractional, or not finite) equals none of them.
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    if !f.is_finite() || f.fract() != 0.0 || f.abs() > LIMIT {
        return false;
    }
    f as i128 == i
}
