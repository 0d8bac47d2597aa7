//! A strict JSON reader: `serde_json`'s parser, building a [`Value`] through
//! our own visitor so that it can
//!
//! - refuse duplicate object keys (`serde_json::Value` keeps the last one
//!   silently, and two parsers disagreeing on which `action` a step has is
//!   exactly the kind of gap an attacker looks for), and
//! - stop at a nesting limit with the path of the offending container,
//!   before `serde_json`'s own recursion limit (128) is reached and before a
//!   deep value is built.
//!
//! The visitor recurses once per nesting level, bounded by the limit.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{PathSeg, SopError, SopErrorKind, render_path};

/// Where a value sits, as a chain of stack frames (no allocation).
#[derive(Clone, Copy)]
enum Chain<'a> {
    Root,
    Key(&'a Chain<'a>, &'a str),
    Index(&'a Chain<'a>, usize),
}

impl Chain<'_> {
    fn render(&self, last: Option<PathSeg<'_>>) -> String {
        let mut segs = Vec::new();
        let mut cur = self;
        loop {
            match cur {
                Chain::Root => break,
                Chain::Key(parent, key) => {
                    segs.push(PathSeg::Key(key));
                    cur = parent;
                }
                Chain::Index(parent, i) => {
                    segs.push(PathSeg::Index(*i));
                    cur = parent;
                }
            }
        }
        segs.reverse();
        segs.extend(last);
        render_path("", segs)
    }
}

struct Ctx {
    /// Deepest container allowed, counting the document root as 1.
    max_container_depth: usize,
    /// The limit as the user configured it (for the error).
    reported_max: usize,
    /// The precise error behind a visitor failure.
    error: RefCell<Option<SopError>>,
}

impl Ctx {
    fn fail<E: de::Error>(&self, field: String, kind: SopErrorKind) -> E {
        let err = SopError { field, kind };
        let message = err.to_string();
        *self.error.borrow_mut() = Some(err);
        E::custom(message)
    }
}

struct ValueSeed<'c, 'p> {
    ctx: &'c Ctx,
    path: &'p Chain<'p>,
    /// The depth this value has if it is a container.
    depth: usize,
}

impl ValueSeed<'_, '_> {
    fn enter<E: de::Error>(&self) -> Result<(), E> {
        if self.depth > self.ctx.max_container_depth {
            return Err(self.ctx.fail(
                self.path.render(None),
                SopErrorKind::NestingTooDeep {
                    max: self.ctx.reported_max,
                },
            ));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any json value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut items = Vec::new();
        loop {
            let path = Chain::Index(self.path, items.len());
            let seed = ValueSeed {
                ctx: self.ctx,
                path: &path,
                depth: self.depth + 1,
            };
            match seq.next_element_seed(seed)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            if map.contains_key(&key) {
                return Err(self.ctx.fail(
                    self.path.render(Some(PathSeg::Key(&key))),
                    SopErrorKind::DuplicateField,
                ));
            }
            let path = Chain::Key(self.path, &key);
            let value = access.next_value_seed(ValueSeed {
                ctx: self.ctx,
                path: &path,
                depth: self.depth + 1,
            })?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

/// Parse `json` into a value, refusing duplicate keys, trailing input and
/// containers deeper than `max_container_depth` (the root counting as 1).
/// `reported_max` is the limit named in a nesting error.
pub(super) fn parse_value(
    json: &str,
    max_container_depth: usize,
    reported_max: usize,
) -> Result<Value, SopError> {
    let ctx = Ctx {
        max_container_depth,
        reported_max,
        error: RefCell::new(None),
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let seed = ValueSeed {
        ctx: &ctx,
        path: &Chain::Root,
        depth: 1,
    };
    let result = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    result.map_err(|e| {
        if let Some(precise) = ctx.error.borrow_mut().take() {
            return precise;
        }
        // Unreachable while our limit sits below serde_json's, kept so the
        // mapping holds if either ever moves.
        if e.to_string().starts_with("recursion limit exceeded") {
            return SopError {
                field: String::new(),
                kind: SopErrorKind::NestingTooDeep { max: reported_max },
            };
        }
        SopError {
            field: String::new(),
            kind: SopErrorKind::MalformedJson {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_serde_json() {
        let text = r#"{"a": [1, -2, 3.5, "x", null, true, {"b": {}}], "c": 18446744073709551615}"#;
        let ours = parse_value(text, 10, 10).unwrap();
        let theirs: Value = serde_json::from_str(text).unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_path() {
        let err =
            parse_value(r#"{"steps": [{"action": "a", "action": "b"}]}"#, 10, 10).unwrap_err();
        assert_eq!(err.field(), "steps[0].action");
        assert_eq!(err.code(), "duplicate_field");
    }

    #[test]
    fn depth_limit_names_the_container() {
        assert!(parse_value("[[[]]]", 3, 3).is_ok());
        let err = parse_value(r#"{"a": [[{"b": []}]]}"#, 4, 7).unwrap_err();
        assert_eq!(err.code(), "nesting_too_deep");
        assert_eq!(err.field(), "a[0][0].b");
        assert!(err.to_string().contains("7"));
    }

    #[test]
    fn syntax_errors_and_trailing_input() {
        for text in ["", "{", r#"{"a": }"#, "{} x", "[1,]", "nul"] {
            let err = parse_value(text, 10, 10).unwrap_err();
            assert_eq!(err.code(), "malformed_json", "{text:?}");
            assert_eq!(err.field(), "");
        }
    }
}
