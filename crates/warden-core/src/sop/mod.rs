//! Strict parsing of standard operating procedures (SOPs).
//!
//! An SOP arrives as model-generated JSON:
//!
//! ```json
//! {"sop_id": "prepare-report", "version": 1,
//!  "steps": [{"step_id": "save", "action": "artifact.save",
//!             "arguments": {"path": "internal/report.txt"}}]}
//! ```
//!
//! Parsing is about shape only, and it is strict: unknown and duplicate
//! fields are refused, types are exact (`version` is an integer, not `"1"`
//! nor `1.0`), and limits bound the step count, each step's argument size
//! and nesting depth, and identifier length. Every error names the field it
//! is about (`steps[3].step_id`) and has a stable [`SopError::code`].
//!
//! Two things are deliberately *not* parse errors, because the lab document
//! makes them preflight decisions: an empty step id (`empty_step_id`) and a
//! repeated one (`duplicate_step_id`). [`Step::step_id`] is therefore an
//! `Option<StepId>`: `None` is the empty string, and duplicates are kept as
//! they are. A non-empty step id with a bad character or over the length
//! limit is still a parse error.
//!
//! Whether a step may run is not decided here. In particular an `actor`,
//! `owner` or `owner_agent_id` inside `arguments` is only data: identity
//! comes from the runtime, never from the SOP.

mod depth;
mod error;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::catalogue::encoded_json_len_exceeds;
use crate::ids::{ActionName, IdentifierError, MAX_IDENTIFIER_LEN, SopId, StepId};
use crate::json::{self, JsonErrorKind, PathSeg, render_path};
use depth::check_depth;
pub use error::{IdentifierProblem, SopError, SopErrorKind};

/// Deepest argument nesting supported, whatever [`SopLimits::max_depth`]
/// says: `serde_json` refuses documents nested 128 levels deep, and the
/// steps' own structure takes three of those.
pub const MAX_SUPPORTED_DEPTH: usize = 100;

/// Bounds on what [`parse_sop`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SopLimits {
    /// Most steps in one SOP.
    pub max_steps: usize,
    /// Largest compact JSON encoding of one step's `arguments`, in bytes.
    pub max_argument_bytes: usize,
    /// Deepest nesting of one step's `arguments`, the object itself counting
    /// as 1 (`{"a": {"b": 1}}` is 2). Capped at [`MAX_SUPPORTED_DEPTH`].
    pub max_depth: usize,
    /// Longest `sop_id`, `step_id` or `action`, in bytes. Capped at
    /// [`MAX_IDENTIFIER_LEN`].
    pub max_identifier_len: usize,
}

impl Default for SopLimits {
    /// 50 steps, 64 KiB of arguments per step, depth 32, identifiers of 128
    /// bytes.
    fn default() -> Self {
        Self {
            max_steps: 50,
            max_argument_bytes: 64 * 1024,
            max_depth: 32,
            max_identifier_len: MAX_IDENTIFIER_LEN,
        }
    }
}

impl SopLimits {
    fn depth(&self) -> usize {
        self.max_depth.min(MAX_SUPPORTED_DEPTH)
    }

    fn identifier_len(&self) -> usize {
        self.max_identifier_len.min(MAX_IDENTIFIER_LEN)
    }
}

/// A parsed SOP: well-formed, within limits, not yet authorised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sop {
    /// Its id.
    pub sop_id: SopId,
    /// Its version, at least 1.
    pub version: u32,
    /// Its steps, in order; at least one.
    pub steps: Vec<Step>,
}

/// One step of an SOP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The step id; `None` when the SOP gave an empty string, which the
    /// preflight denies as `empty_step_id`. Serialised back as `""`.
    #[serde(serialize_with = "serialize_step_id")]
    pub step_id: Option<StepId>,
    /// The action it asks for (not yet checked against the catalogue).
    pub action: ActionName,
    /// Its arguments: always a JSON object (`{}` when the SOP omitted
    /// them). Kept as a `Value` so argument checks validate it in place.
    pub arguments: Value,
}

impl Step {
    /// The arguments as a map.
    pub fn arguments(&self) -> &Map<String, Value> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        match &self.arguments {
            Value::Object(m) => m,
            _ => EMPTY.get_or_init(Map::new),
        }
    }

    /// The step id as written (`""` when empty).
    pub fn step_id_str(&self) -> &str {
        self.step_id.as_ref().map_or("", StepId::as_str)
    }
}

fn serialize_step_id<S: Serializer>(id: &Option<StepId>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(id.as_ref().map_or("", StepId::as_str))
}

/// Parse an SOP from JSON text.
///
/// Duplicate keys anywhere in the document are refused
/// (`duplicate_field`), and nesting is bounded while parsing, so an
/// over-deep document fails with `nesting_too_deep` naming the container
/// instead of building it.
pub fn parse_sop(text: &str, limits: &SopLimits) -> Result<Sop, SopError> {
    // Root object, `steps` array and step object come before `arguments`.
    let value = json::parse_str(text, limits.depth() + 3).map_err(|e| {
        let kind = match e.kind() {
            JsonErrorKind::Malformed {
                line,
                column,
                message,
            } => SopErrorKind::MalformedJson {
                line: *line,
                column: *column,
                message: message.clone(),
            },
            JsonErrorKind::DuplicateKey { .. } => SopErrorKind::DuplicateField,
            JsonErrorKind::TooDeep { .. } => SopErrorKind::NestingTooDeep {
                max: limits.depth(),
            },
        };
        SopError::new(e.path(), kind)
    })?;
    sop_from_value(&value, limits)
}

/// Parse an SOP from an already-decoded JSON value (which cannot hold
/// duplicate keys any more). The depth of `arguments` is measured
/// iteratively, so an arbitrarily deep value is refused without recursion.
pub fn sop_from_value(v: &Value, limits: &SopLimits) -> Result<Sop, SopError> {
    let root = as_object(v, "", "an sop object")?;
    reject_unknown(root, "", &["sop_id", "version", "steps"])?;

    let sop_id = identifier(
        required(root, "", "sop_id")?,
        "sop_id",
        limits,
        SopId::parse,
    )?;
    let version = version(required(root, "", "version")?)?;

    let raw_steps = required(root, "", "steps")?;
    let Value::Array(items) = raw_steps else {
        return Err(wrong_type("steps", "an array", raw_steps));
    };
    if items.is_empty() {
        return Err(SopError::new("steps", SopErrorKind::EmptySop));
    }
    if items.len() > limits.max_steps {
        return Err(SopError::new(
            "steps",
            SopErrorKind::TooManySteps {
                count: items.len(),
                max: limits.max_steps,
            },
        ));
    }
    let steps = items
        .iter()
        .enumerate()
        .map(|(i, item)| step(i, item, limits))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Sop {
        sop_id,
        version,
        steps,
    })
}

fn step(i: usize, item: &Value, limits: &SopLimits) -> Result<Step, SopError> {
    let here = format!("steps[{i}]");
    let field = |name: &str| format!("{here}.{name}");
    let obj = as_object(item, &here, "a step object")?;
    reject_unknown(obj, &here, &["step_id", "action", "arguments"])?;

    let raw_id = required(obj, &here, "step_id")?;
    let step_id = match raw_id {
        Value::String(s) if s.is_empty() => None,
        _ => Some(identifier(
            raw_id,
            &field("step_id"),
            limits,
            StepId::parse,
        )?),
    };
    let action = identifier(
        required(obj, &here, "action")?,
        &field("action"),
        limits,
        ActionName::parse,
    )?;
    let arguments = match obj.get("arguments") {
        None => Value::Object(Map::new()),
        Some(Value::Object(args)) => {
            let at = field("arguments");
            check_depth(args, limits.depth(), &at)?;
            if encoded_json_len_exceeds(args, limits.max_argument_bytes as u64) {
                return Err(SopError::new(
                    at,
                    SopErrorKind::ArgumentsTooLarge {
                        max: limits.max_argument_bytes,
                    },
                ));
            }
            Value::Object(args.clone())
        }
        Some(other) => return Err(wrong_type(field("arguments"), "an object", other)),
    };
    Ok(Step {
        step_id,
        action,
        arguments,
    })
}

fn as_object<'v>(
    v: &'v Value,
    at: &str,
    expected: &'static str,
) -> Result<&'v Map<String, Value>, SopError> {
    match v {
        Value::Object(map) => Ok(map),
        other => Err(wrong_type(at, expected, other)),
    }
}

fn reject_unknown(obj: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), SopError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(key) => Err(SopError::new(
            render_path(at, [PathSeg::Key(key)]),
            SopErrorKind::UnknownField,
        )),
        None => Ok(()),
    }
}

fn required<'v>(obj: &'v Map<String, Value>, at: &str, name: &str) -> Result<&'v Value, SopError> {
    obj.get(name).ok_or_else(|| {
        SopError::new(
            render_path(at, [PathSeg::Key(name)]),
            SopErrorKind::MissingField,
        )
    })
}

fn wrong_type(at: impl Into<String>, expected: &'static str, found: &Value) -> SopError {
    SopError::new(
        at,
        SopErrorKind::WrongType {
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

fn identifier<T>(
    v: &Value,
    at: &str,
    limits: &SopLimits,
    parse: fn(&str) -> Result<T, IdentifierError>,
) -> Result<T, SopError> {
    let Value::String(s) = v else {
        return Err(wrong_type(at, "a string", v));
    };
    let problem = |p| SopError::new(at, SopErrorKind::InvalidIdentifier(p));
    let max = limits.identifier_len();
    if s.len() > max {
        return Err(problem(IdentifierProblem::TooLong { len: s.len(), max }));
    }
    parse(s).map_err(|e| {
        problem(match e {
            IdentifierError::Empty => IdentifierProblem::Empty,
            IdentifierError::TooLong { len } => IdentifierProblem::TooLong { len, max },
            IdentifierError::BadChar { ch, at } => IdentifierProblem::BadChar { ch, at },
        })
    })
}

fn version(v: &Value) -> Result<u32, SopError> {
    let invalid = || SopError::new("version", SopErrorKind::InvalidVersion);
    match v {
        Value::Number(n) if n.is_f64() => Err(wrong_type("version", "an integer", v)),
        Value::Number(n) => match n.as_u64() {
            Some(0) | None => Err(invalid()),
            Some(big) => u32::try_from(big).map_err(|_| invalid()),
        },
        other => Err(wrong_type("version", "an integer", other)),
    }
}

#[cfg(test)]
mod tests;
