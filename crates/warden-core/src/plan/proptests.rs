//! Generated plans: they round-trip, a call built from a step matches it,
//! and a changed literal never does.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

/// A generated template value: literal scalars, bindings, containers.
#[derive(Debug, Clone)]
enum Gen {
    Lit(Value),
    Bind {
        step: Option<usize>,
        from: Option<Vec<&'static str>>,
        otherwise: Option<&'static str>,
        matching: Option<&'static str>,
    },
    Obj(Vec<(String, Gen)>),
    Arr(Vec<Gen>),
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[a-z0-9 @.]{0,8}".prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        prop_oneof![Just(2.5f64), Just(-0.25), Just(3.0), Just(1e-3)].prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-e]{1,2}",
        Just("a b".to_owned()),
        Just("x/y".to_owned()),
        Just("t~".to_owned()),
        Just("$ref".to_owned()),
    ]
}

fn binding() -> impl Strategy<Value = Gen> {
    (
        proptest::option::of(0usize..8),
        proptest::option::of(proptest::sample::subsequence(
            vec!["user", "trusted", "untrusted", "memory", "plan"],
            1..=3,
        )),
        proptest::option::of(prop_oneof![Just("escalate"), Just("deny")]),
        proptest::option::of(prop_oneof![Just("text"), Just("caseless")]),
    )
        .prop_map(|(step, from, otherwise, matching)| Gen::Bind {
            step,
            from,
            otherwise,
            matching,
        })
}

fn value() -> impl Strategy<Value = Gen> {
    let leaf = prop_oneof![3 => scalar().prop_map(Gen::Lit), 2 => binding()];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec((key(), inner.clone()), 0..4).prop_map(Gen::Obj),
            proptest::collection::vec(inner, 0..4).prop_map(Gen::Arr),
        ]
    })
}

fn to_json(g: &Gen, step: usize) -> Value {
    match g {
        Gen::Lit(v) => v.clone(),
        Gen::Bind {
            step: s,
            from,
            otherwise,
            matching,
        } => {
            let mut b = Map::new();
            if let (Some(s), true) = (s, step > 0) {
                b.insert("step".into(), json!(format!("s{}", s % step)));
            }
            if let Some(from) = from {
                b.insert("from".into(), json!(from));
            }
            if let Some(o) = otherwise {
                b.insert("otherwise".into(), json!(o));
            }
            if let Some(m) = matching {
                b.insert("match".into(), json!(m));
            }
            json!({"$bind": b})
        }
        Gen::Obj(members) => Value::Object(
            members
                .iter()
                .map(|(k, v)| (k.clone(), to_json(v, step)))
                .collect(),
        ),
        Gen::Arr(items) => Value::Array(items.iter().map(|v| to_json(v, step)).collect()),
    }
}

/// A plan document of 1 to 4 steps over two actions.
fn plan_doc() -> impl Strategy<Value = Value> {
    proptest::collection::vec(
        (
            prop_oneof![Just("act.x"), Just("act.y")],
            proptest::collection::vec((key(), value()), 0..5),
        ),
        1..5,
    )
    .prop_map(|steps| {
        let steps: Vec<Value> = steps
            .iter()
            .enumerate()
            .map(|(i, (action, args))| {
                let args: Map<String, Value> = args
                    .iter()
                    .map(|(k, v)| (k.clone(), to_json(v, i)))
                    .collect();
                json!({"step_id": format!("s{i}"), "action": action, "arguments": args})
            })
            .collect();
        json!({"sop_id": "generated", "version": 1, "steps": steps})
    })
}

fn parse(doc: &Value) -> Plan {
    parse_plan(doc, &SopLimits::default()).unwrap()
}

/// The call step `i` of `plan` gets when each bound position receives the
/// next of `fills` (cycling).
fn call_for(step: &PlanStep, fills: &[Value]) -> Value {
    let mut n = 0usize;
    step.arguments.to_json_with(&mut Vec::new(), &mut |_, _| {
        let v = fills[n % fills.len()].clone();
        n += 1;
        v
    })
}

fn only(i: usize, len: usize) -> Vec<bool> {
    (0..len).map(|j| j != i).collect()
}

/// `v` changed so that it no longer equals itself by the plan's rules.
fn changed(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(format!("{s}!")),
        Value::Number(n) => match n.as_i64() {
            Some(i) => json!(i + 1),
            None => json!(n.as_f64().unwrap() + 1.0),
        },
        Value::Bool(b) => Value::Bool(!b),
        Value::Null => json!(0),
        Value::Object(_) => json!({"added": 1}),
        Value::Array(_) => json!([null]),
    }
}

/// Integers written as floats (`3` → `3.0`): equal by value.
fn floated(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_i64() => json!(n.as_i64().unwrap() as f64),
        other => other.clone(),
    }
}

fn fill_values() -> impl Strategy<Value = Vec<Value>> {
    proptest::collection::vec(
        prop_oneof![
            scalar(),
            Just(json!({"nested": [1, "two", {"$bind": {}}]})),
            Just(json!([])),
        ],
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn parse_of_to_json_is_the_plan(doc in plan_doc()) {
        let plan = parse(&doc);
        let again = parse(&plan.to_json());
        prop_assert_eq!(&again, &plan);
        prop_assert_eq!(again.hash(), plan.hash());
        prop_assert_eq!(again.to_json(), plan.to_json());
    }

    #[test]
    fn a_call_from_a_step_matches_that_step(doc in plan_doc(), fills in fill_values(), float in any::<bool>()) {
        let plan = parse(&doc);
        let len = plan.steps().len();
        for (i, step) in plan.steps().iter().enumerate() {
            let mut call = call_for(step, &fills);
            let literals = step.literals();
            if float {
                for (path, v) in &literals {
                    *call.pointer_mut(&path.pointer()).unwrap() = floated(v);
                }
            }
            let m = match_call(&plan, &only(i, len), &step.action, &call);
            let PlanMatch::Step { index, step_id, literal_paths, bound } = m else {
                return Err(TestCaseError::fail(format!("step {i} did not match: {m:?}")));
            };
            prop_assert_eq!(index, i);
            prop_assert_eq!(&step_id, &step.step_id);
            let expected: Vec<String> = literals.iter().map(|(p, _)| p.argument()).collect();
            prop_assert_eq!(literal_paths, expected);
            let bindings = step.bindings();
            prop_assert_eq!(bound.len(), bindings.len());
            for (b, (path, binding)) in bound.iter().zip(&bindings) {
                prop_assert_eq!(&b.path, &path.argument());
                prop_assert_eq!(&b.binding, *binding);
                prop_assert_eq!(Some(&b.value), call.pointer(&path.pointer()));
            }
            // Used, it is not a candidate any more.
            let all = vec![true; len];
            prop_assert_eq!(
                match_call(&plan, &all, &step.action, &call),
                PlanMatch::Unplanned { closest: None }
            );
        }
    }

    #[test]
    fn a_changed_literal_never_matches(doc in plan_doc(), fills in fill_values(), pick in any::<usize>()) {
        let plan = parse(&doc);
        let len = plan.steps().len();
        for (i, step) in plan.steps().iter().enumerate() {
            let literals = step.literals();
            if literals.is_empty() {
                continue;
            }
            let (path, v) = &literals[pick % literals.len()];
            let mut call = call_for(step, &fills);
            *call.pointer_mut(&path.pointer()).unwrap() = changed(v);
            match match_call(&plan, &only(i, len), &step.action, &call) {
                PlanMatch::Unplanned { closest: Some((id, at)) } => {
                    prop_assert_eq!(&id, &step.step_id);
                    prop_assert!(at.starts_with(&path.argument()), "{} is not under {}", at, path.argument());
                }
                m => return Err(TestCaseError::fail(format!("changed {} of step {i} still matched: {m:?}", path.argument()))),
            }
        }
    }
}
