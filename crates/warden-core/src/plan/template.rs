//! A step's arguments as a template: literals, and bindings filled at call
//! time.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::error::{PlanError, PlanErrorKind};
use super::path::{ArgSeg, plan_path};
use crate::ids::StepId;
use crate::json::{PathSeg, render_path};
use crate::provenance::{MatchMode, Origin, Otherwise};

/// The key that makes an object a binding.
pub const BIND_KEY: &str = "$bind";

/// A position of a plan filled at call time: `{"$bind": {...}}`.
///
/// Every field is optional. `step`: the value must occur in the recorded
/// result of the call that used that (earlier) planned step. `from`: the
/// origins that must vouch for the value (default: the action's own
/// provenance rule for that path, if any; else any value). `otherwise`:
/// what happens when they do not (default: the rule's, else escalate).
/// `matching` (`match` in JSON): how the value is compared (default: the
/// rule's, else `text`). What the defaults mean is the engine's to apply;
/// the plan keeps what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The earlier planned step whose result must hold the value.
    pub step: Option<StepId>,
    /// Origins that vouch for the value: not empty, never `none`; sorted,
    /// without repeats.
    pub from: Option<Vec<Origin>>,
    /// What happens to an unvouched value.
    pub otherwise: Option<Otherwise>,
    /// How values are compared.
    pub matching: Option<MatchMode>,
}

impl Binding {
    /// The binding as a plan writes it: `{"$bind": {...}}`, absent fields
    /// left out.
    pub fn to_json(&self) -> Value {
        let mut inner = Map::new();
        if let Some(step) = &self.step {
            inner.insert("step".into(), Value::String(step.as_str().to_owned()));
        }
        if let Some(from) = &self.from {
            inner.insert(
                "from".into(),
                Value::Array(
                    from.iter()
                        .map(|o| Value::String(o.as_str().to_owned()))
                        .collect(),
                ),
            );
        }
        if let Some(otherwise) = self.otherwise {
            inner.insert(
                "otherwise".into(),
                Value::String(otherwise_str(otherwise).into()),
            );
        }
        if let Some(matching) = self.matching {
            inner.insert("match".into(), Value::String(match_str(matching).into()));
        }
        let mut outer = Map::new();
        outer.insert(BIND_KEY.into(), Value::Object(inner));
        Value::Object(outer)
    }
}

fn otherwise_str(o: Otherwise) -> &'static str {
    match o {
        Otherwise::Escalate => "escalate",
        Otherwise::Deny => "deny",
    }
}

fn match_str(m: MatchMode) -> &'static str {
    match m {
        MatchMode::Text => "text",
        MatchMode::Caseless => "caseless",
    }
}

/// One position of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    /// A scalar the call must equal.
    Literal(Value),
    /// A value filled at call time.
    Bind(Binding),
    /// An object: the call has exactly these keys (a bound one may be
    /// absent).
    Object(BTreeMap<String, Node>),
    /// An array: the call has exactly these elements.
    Array(Vec<Node>),
}

/// What a template walk meets at a leaf.
pub(super) enum Leaf<'a> {
    /// A literal: a scalar, or an empty object or array.
    Literal(Value),
    /// A binding.
    Bind(&'a Binding),
}

impl Node {
    /// The JSON the template was parsed from.
    pub(super) fn to_json(&self) -> Value {
        self.to_json_with(&mut Vec::new(), &mut |_, b| b.to_json())
    }

    /// The JSON of the template with each binding replaced by
    /// `fill(position, binding)`.
    pub(super) fn to_json_with(
        &self,
        path: &mut Vec<ArgSeg>,
        fill: &mut impl FnMut(&[ArgSeg], &Binding) -> Value,
    ) -> Value {
        match self {
            Node::Literal(v) => v.clone(),
            Node::Bind(b) => fill(path, b),
            Node::Object(members) => {
                let mut out = Map::new();
                for (k, n) in members {
                    path.push(ArgSeg::Key(k.clone()));
                    out.insert(k.clone(), n.to_json_with(path, fill));
                    path.pop();
                }
                Value::Object(out)
            }
            Node::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, n) in items.iter().enumerate() {
                    path.push(ArgSeg::Index(i));
                    out.push(n.to_json_with(path, fill));
                    path.pop();
                }
                Value::Array(out)
            }
        }
    }

    /// Visit every leaf in document order (object keys sorted), with its
    /// position. The root object itself is never a leaf.
    pub(super) fn walk<'a>(
        &'a self,
        path: &mut Vec<ArgSeg>,
        visit: &mut impl FnMut(&[ArgSeg], Leaf<'a>),
    ) {
        match self {
            Node::Literal(v) => visit(path, Leaf::Literal(v.clone())),
            Node::Bind(b) => visit(path, Leaf::Bind(b)),
            Node::Object(members) if members.is_empty() && !path.is_empty() => {
                visit(path, Leaf::Literal(Value::Object(Map::new())));
            }
            Node::Array(items) if items.is_empty() => {
                visit(path, Leaf::Literal(Value::Array(vec![])))
            }
            Node::Object(members) => {
                for (k, n) in members {
                    path.push(ArgSeg::Key(k.clone()));
                    n.walk(path, visit);
                    path.pop();
                }
            }
            Node::Array(items) => {
                for (i, n) in items.iter().enumerate() {
                    path.push(ArgSeg::Index(i));
                    n.walk(path, visit);
                    path.pop();
                }
            }
        }
    }
}

/// The steps a binding in step `index` may name, and the ones it may not.
pub(super) struct StepScope<'a> {
    /// Index of the step whose arguments are parsed.
    pub index: usize,
    /// Every step id of the plan, in order.
    pub ids: &'a [StepId],
}

/// Parse step `scope.index`'s arguments (already a well-formed SOP
/// argument object) into a template.
pub(super) fn parse_arguments(
    args: &Map<String, Value>,
    scope: &StepScope<'_>,
) -> Result<BTreeMap<String, Node>, PlanError> {
    if args.contains_key(BIND_KEY) {
        let at = format!("steps[{}].arguments", scope.index);
        return Err(match args.keys().find(|k| *k != BIND_KEY) {
            Some(other) => PlanError::at(
                render_path(&at, [PathSeg::Key(other)]),
                PlanErrorKind::BindingNotAlone,
            ),
            None => PlanError::at(
                format!("{at}.{BIND_KEY}"),
                PlanErrorKind::BindingWholeArguments,
            ),
        });
    }
    let mut path = Vec::new();
    parse_members(args, scope, &mut path)
}

fn parse_members(
    obj: &Map<String, Value>,
    scope: &StepScope<'_>,
    path: &mut Vec<ArgSeg>,
) -> Result<BTreeMap<String, Node>, PlanError> {
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort_unstable();
    let mut out = BTreeMap::new();
    for key in keys {
        let Some(v) = obj.get(key) else { continue };
        path.push(ArgSeg::Key(key.clone()));
        let node = parse_node(v, scope, path)?;
        path.pop();
        out.insert(key.clone(), node);
    }
    Ok(out)
}

fn parse_node(v: &Value, scope: &StepScope<'_>, path: &mut Vec<ArgSeg>) -> Result<Node, PlanError> {
    match v {
        Value::Object(obj) => match obj.get(BIND_KEY) {
            Some(spec) => {
                let mut others: Vec<&String> = obj.keys().filter(|k| *k != BIND_KEY).collect();
                others.sort_unstable();
                if let Some(other) = others.first() {
                    path.push(ArgSeg::Key((*other).clone()));
                    let at = plan_path(scope.index, path);
                    path.pop();
                    return Err(PlanError::at(at, PlanErrorKind::BindingNotAlone));
                }
                let at = format!("{}.{BIND_KEY}", plan_path(scope.index, path));
                parse_binding(spec, &at, scope).map(Node::Bind)
            }
            None => parse_members(obj, scope, path).map(Node::Object),
        },
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                path.push(ArgSeg::Index(i));
                out.push(parse_node(item, scope, path)?);
                path.pop();
            }
            Ok(Node::Array(out))
        }
        scalar => Ok(Node::Literal(scalar.clone())),
    }
}

const BINDING_FIELDS: [&str; 4] = ["step", "from", "otherwise", "match"];

fn parse_binding(spec: &Value, at: &str, scope: &StepScope<'_>) -> Result<Binding, PlanError> {
    let field = |name: &str| render_path(at, [PathSeg::Key(name)]);
    let Value::Object(obj) = spec else {
        return Err(wrong_type(at.to_owned(), "a binding object", spec));
    };
    let mut unknown: Vec<&String> = obj
        .keys()
        .filter(|k| !BINDING_FIELDS.contains(&k.as_str()))
        .collect();
    unknown.sort_unstable();
    if let Some(k) = unknown.first() {
        return Err(PlanError::at(field(k), PlanErrorKind::BindingUnknownField));
    }

    let step = match obj.get("step") {
        None => None,
        Some(Value::String(s)) => Some(earlier_step(s, &field("step"), scope)?),
        Some(other) => return Err(wrong_type(field("step"), "a string", other)),
    };

    let from = match obj.get("from") {
        None => None,
        Some(Value::Array(items)) => {
            let at = field("from");
            if items.is_empty() {
                return Err(PlanError::at(at, PlanErrorKind::BindingEmptyFrom));
            }
            let mut origins = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let here = render_path(&at, [PathSeg::Index(i)]);
                let Value::String(s) = item else {
                    return Err(wrong_type(here, "a string", item));
                };
                let origin = parse_origin(s).ok_or_else(|| {
                    PlanError::at(
                        here.clone(),
                        PlanErrorKind::BindingUnknownOrigin { origin: s.clone() },
                    )
                })?;
                if origin == Origin::None {
                    return Err(PlanError::at(here, PlanErrorKind::BindingOriginNone));
                }
                origins.push(origin);
            }
            origins.sort_unstable();
            origins.dedup();
            Some(origins)
        }
        Some(other) => return Err(wrong_type(field("from"), "an array", other)),
    };

    let otherwise = match obj.get("otherwise") {
        None => None,
        Some(v) => Some(keyword(
            v,
            &field("otherwise"),
            "`escalate` or `deny`",
            |s| match s {
                "escalate" => Some(Otherwise::Escalate),
                "deny" => Some(Otherwise::Deny),
                _ => None,
            },
        )?),
    };
    let matching = match obj.get("match") {
        None => None,
        Some(v) => Some(keyword(
            v,
            &field("match"),
            "`text` or `caseless`",
            |s| match s {
                "text" => Some(MatchMode::Text),
                "caseless" => Some(MatchMode::Caseless),
                _ => None,
            },
        )?),
    };
    Ok(Binding {
        step,
        from,
        otherwise,
        matching,
    })
}

fn earlier_step(s: &str, at: &str, scope: &StepScope<'_>) -> Result<StepId, PlanError> {
    let position = scope.ids.iter().position(|id| id.as_str() == s);
    match position {
        Some(p) if p < scope.index => scope
            .ids
            .get(p)
            .cloned()
            .ok_or_else(|| unknown_step(at, s, false)),
        Some(_) => Err(unknown_step(at, s, true)),
        None => Err(unknown_step(at, s, false)),
    }
}

fn unknown_step(at: &str, s: &str, not_earlier: bool) -> PlanError {
    PlanError::at(
        at,
        PlanErrorKind::BindingUnknownStep {
            step: s.to_owned(),
            not_earlier,
        },
    )
}

fn parse_origin(s: &str) -> Option<Origin> {
    [
        Origin::User,
        Origin::Trusted,
        Origin::Untrusted,
        Origin::Memory,
        Origin::Plan,
        Origin::None,
    ]
    .into_iter()
    .find(|o| o.as_str() == s)
}

fn keyword<T>(
    v: &Value,
    at: &str,
    allowed: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, PlanError> {
    let Value::String(s) = v else {
        return Err(wrong_type(at.to_owned(), "a string", v));
    };
    parse(s).ok_or_else(|| PlanError::at(at, PlanErrorKind::BindingInvalidValue { allowed }))
}

fn wrong_type(at: String, expected: &'static str, found: &Value) -> PlanError {
    PlanError::at(
        at,
        PlanErrorKind::BindingWrongType {
            expected,
            found: type_name(found),
        },
    )
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a floating-point number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
