//! The one strict JSON reader: `serde_json`'s parser, building a [`Value`]
//! through our own visitor so that it can
//!
//! - refuse duplicate object keys (`serde_json::Value` keeps the last one
//!   silently, and two parsers disagreeing on which `action` a step has is
//!   exactly the kind of gap an attacker looks for), and
//! - stop at a nesting limit with the path of the offending container,
//!   before `serde_json`'s own recursion limit (128) is reached and before a
//!   deep value is built.
//!
//! Every refusal is a [`JsonError`] naming the JSON path it is about
//! (`steps[0].action`, `""` for the document) and, for syntax errors, the
//! line and column where the parser stopped. The SOP parser and the server's
//! body extractor both read through [`parse_str`] / [`parse_slice`], so they
//! cannot disagree on what a document says.
//!
//! The visitor recurses once per nesting level, bounded by the limit.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Deepest nesting [`parse_str`] and [`parse_slice`] ever accept, whatever
/// limit they are given: `serde_json` refuses 128 levels on its own.
pub const MAX_SUPPORTED_DEPTH: usize = 120;

/// What is wrong with a document, without the where (see [`JsonError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonErrorKind {
    /// Not one JSON value: a syntax error, invalid UTF-8, a number out of
    /// range, or trailing input after the value.
    Malformed {
        /// Line of the problem (1-based; 0 when the parser has none).
        line: usize,
        /// Column of the problem (1-based; 0 at the very start).
        column: usize,
        /// The JSON parser's message.
        message: String,
    },
    /// An object repeats a key; the path ends with that key.
    DuplicateKey {
        /// The repeated key.
        key: String,
    },
    /// A container sits deeper than the limit; the path names it.
    TooDeep {
        /// The limit that applied (the root container counting as 1).
        max: usize,
    },
}

impl JsonErrorKind {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            JsonErrorKind::Malformed { .. } => "malformed_json",
            JsonErrorKind::DuplicateKey { .. } => "duplicate_key",
            JsonErrorKind::TooDeep { .. } => "json_too_deep",
        }
    }
}

impl fmt::Display for JsonErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonErrorKind::Malformed { message, .. } => write!(f, "malformed json: {message}"),
            JsonErrorKind::DuplicateKey { .. } => f.write_str("key appears more than once"),
            JsonErrorKind::TooDeep { max } => write!(f, "nests deeper than {max} levels"),
        }
    }
}

/// Why a document was refused: a [`JsonErrorKind`] at a JSON path.
///
/// Displayed as one line: ``json at `a[0].b`: key appears more than once``,
/// or `json: ...` for the document as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    path: String,
    kind: JsonErrorKind,
}

impl std::error::Error for JsonError {}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "json: {}", self.kind)
        } else {
            write!(f, "json at `{}`: {}", self.path, self.kind)
        }
    }
}

impl JsonError {
    /// The path the error is about, rendered like `steps[0].arguments.a`
    /// (see [`render_path`] for odd keys); `""` for the document as a whole
    /// and for syntax errors, which carry a line and column instead.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong.
    pub fn kind(&self) -> &JsonErrorKind {
        &self.kind
    }

    /// The stable snake_case code of [`JsonError::kind`].
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// Line and column of a syntax error (both 1-based), if the parser had
    /// them.
    pub fn position(&self) -> Option<(usize, usize)> {
        match self.kind {
            JsonErrorKind::Malformed { line, column, .. } if line > 0 => Some((line, column)),
            _ => None,
        }
    }
}

/// One step of a JSON path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathSeg<'a> {
    /// An object member.
    Key(&'a str),
    /// An array element.
    Index(usize),
}

/// Longest key written into a path.
const MAX_KEY_IN_PATH: usize = 64;

/// Render `base` followed by `segs` as `a.b[2]["odd key"]`.
///
/// Keys that are plain words (`[A-Za-z0-9_-]`, at most 64 bytes) are written
/// bare after a `.`; other keys as JSON strings in brackets, cut to 64 bytes
/// with a `…` after the closing quote.
pub fn render_path<'a>(base: &str, segs: impl IntoIterator<Item = PathSeg<'a>>) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(base);
    for seg in segs {
        match seg {
            PathSeg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
            PathSeg::Key(key)
                if !key.is_empty()
                    && key.len() <= MAX_KEY_IN_PATH
                    && key
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
            {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            PathSeg::Key(key) => {
                let mut end = key.len().min(MAX_KEY_IN_PATH);
                while !key.is_char_boundary(end) {
                    end -= 1;
                }
                let shown = key.get(..end).unwrap_or("");
                let quoted = serde_json::to_string(shown).unwrap_or_else(|_| "\"?\"".to_owned());
                out.push('[');
                out.push_str(&quoted);
                if end < key.len() {
                    out.push('…');
                }
                out.push(']');
            }
        }
    }
    out
}

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
    max_depth: usize,
    /// The precise error behind a visitor failure.
    error: RefCell<Option<JsonError>>,
}

impl Ctx {
    fn fail<E: de::Error>(&self, path: String, kind: JsonErrorKind) -> E {
        let err = JsonError { path, kind };
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
        if self.depth > self.ctx.max_depth {
            return Err(self.ctx.fail(
                self.path.render(None),
                JsonErrorKind::TooDeep {
                    max: self.ctx.max_depth,
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

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
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
                let path = self.path.render(Some(PathSeg::Key(&key)));
                return Err(self.ctx.fail(path, JsonErrorKind::DuplicateKey { key }));
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

fn parse_with<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    max_depth: usize,
) -> Result<Value, JsonError> {
    let ctx = Ctx {
        max_depth: max_depth.min(MAX_SUPPORTED_DEPTH),
        error: RefCell::new(None),
    };
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
            return JsonError {
                path: String::new(),
                kind: JsonErrorKind::TooDeep { max: ctx.max_depth },
            };
        }
        JsonError {
            path: String::new(),
            kind: JsonErrorKind::Malformed {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            },
        }
    })
}

/// Parse `text` as exactly one JSON value, refusing duplicate keys,
/// trailing input and containers deeper than `max_depth` (the root counting
/// as 1; capped at [`MAX_SUPPORTED_DEPTH`]).
pub fn parse_str(text: &str, max_depth: usize) -> Result<Value, JsonError> {
    parse_with(serde_json::Deserializer::from_str(text), max_depth)
}

/// [`parse_str`] for bytes, which must also be valid UTF-8 (invalid UTF-8 is
/// [`JsonErrorKind::Malformed`] at its position).
pub fn parse_slice(bytes: &[u8], max_depth: usize) -> Result<Value, JsonError> {
    parse_with(serde_json::Deserializer::from_slice(bytes), max_depth)
}

#[cfg(test)]
mod tests;
