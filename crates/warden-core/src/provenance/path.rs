//! Paths into arguments and results: `recipient`, `recipients[*]`,
//! `a.b[*].c`, and for results also a leading `[*]` (`[*].subject`).
//!
//! A path is a sequence of segments separated by `.`; a segment is a key
//! (1 or more of `A-Z a-z 0-9 _ : -`) followed by any number of `[*]`
//! ("every element of the array"). Result patterns may also start with
//! `[*]`. At most 128 bytes.

use std::fmt;

use serde_json::Value;

/// Longest path accepted, in bytes.
pub const MAX_PATH_LEN: usize = 128;
/// Longest concrete path (with indices) put into a report or a reason.
pub const MAX_CONCRETE_PATH_LEN: usize = 256;

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// An object key.
    Key(Box<str>),
    /// Every element of an array.
    Each,
}

/// A parsed path (argument path or result-field pattern).
#[derive(Clone, PartialEq, Eq)]
pub struct ValuePath {
    text: Box<str>,
    steps: Box<[Step]>,
}

impl fmt::Debug for ValuePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValuePath({})", self.text)
    }
}

impl fmt::Display for ValuePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-')
}

impl ValuePath {
    /// Parse an argument path: it must start with a key.
    pub fn argument(text: &str) -> Result<Self, &'static str> {
        let path = Self::parse(text)?;
        match path.steps.first() {
            Some(Step::Key(_)) => Ok(path),
            _ => Err("an argument path starts with an argument name"),
        }
    }

    /// Parse a result-field pattern: it may start with `[*]`.
    pub fn result_field(text: &str) -> Result<Self, &'static str> {
        Self::parse(text)
    }

    fn parse(text: &str) -> Result<Self, &'static str> {
        if text.is_empty() {
            return Err("a path is not empty");
        }
        if text.len() > MAX_PATH_LEN {
            return Err("a path is at most 128 bytes");
        }
        let mut steps = Vec::new();
        let mut rest = text;
        let mut first = true;
        while !rest.is_empty() {
            if !first {
                rest = rest
                    .strip_prefix('.')
                    .ok_or("segments are separated by `.`")?;
            }
            let key_len = rest.find(|c: char| !key_char(c)).unwrap_or(rest.len());
            let (key, tail) = rest.split_at(key_len);
            if key.is_empty() && !(first && tail.starts_with("[*]")) {
                return Err("a segment is a name of `A-Z a-z 0-9 _ : -`, then any `[*]`");
            }
            if !key.is_empty() {
                steps.push(Step::Key(key.into()));
            }
            rest = tail;
            while let Some(t) = rest.strip_prefix("[*]") {
                steps.push(Step::Each);
                rest = t;
            }
            if !rest.is_empty() && !rest.starts_with('.') {
                return Err("only `[*]` may follow a name (no indices or other brackets)");
            }
            first = false;
        }
        Ok(Self {
            text: text.into(),
            steps: steps.into_boxed_slice(),
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the path holds a `[*]`.
    pub fn has_each(&self) -> bool {
        self.steps.contains(&Step::Each)
    }

    /// Whether this pattern covers the concrete result path `concrete`
    /// (itself or anything below it).
    pub(crate) fn covers(&self, concrete: &[Concrete<'_>]) -> bool {
        if self.steps.len() > concrete.len() {
            return false;
        }
        self.steps.iter().zip(concrete).all(|(s, c)| match (s, c) {
            (Step::Key(k), Concrete::Key(c)) => **k == **c,
            (Step::Each, Concrete::Index(_)) => true,
            _ => false,
        })
    }

    /// Every value the path selects in `root`, in document order, with its
    /// concrete path. `Err(concrete)` if the structure does not fit (a key
    /// on a non-object, `[*]` on a non-array): the concrete path where it
    /// broke. An absent key selects nothing.
    pub(crate) fn select<'a>(&self, root: &'a Value) -> Result<Vec<(String, &'a Value)>, String> {
        // The common rule, one key of the arguments object: no path to
        // build step by step.
        if let [Step::Key(k)] = &*self.steps {
            return match root {
                Value::Object(map) => Ok(map
                    .get(&**k)
                    .map(|v| vec![(String::from(&**k), v)])
                    .unwrap_or_default()),
                _ => Err(String::from(&**k)),
            };
        }
        let mut current: Vec<(String, &'a Value)> = vec![(String::new(), root)];
        for step in self.steps.iter() {
            let mut next = Vec::with_capacity(current.len());
            for (path, value) in current {
                match (step, value) {
                    (Step::Key(k), Value::Object(map)) => {
                        if let Some(v) = map.get(&**k) {
                            let p = if path.is_empty() {
                                String::from(&**k)
                            } else {
                                let mut p = path;
                                p.reserve_exact(1 + k.len());
                                p.push('.');
                                p.push_str(k);
                                p
                            };
                            next.push((p, v));
                        }
                    }
                    (Step::Each, Value::Array(items)) => {
                        next.reserve(items.len());
                        for (i, v) in items.iter().enumerate() {
                            next.push((indexed(&path, i), v));
                        }
                    }
                    (Step::Key(k), _) => {
                        return Err(if path.is_empty() {
                            k.to_string()
                        } else {
                            format!("{path}.{k}")
                        });
                    }
                    (Step::Each, _) => return Err(format!("{path}[*]")),
                }
            }
            current = next;
        }
        Ok(current)
    }
}

/// `path[i]`.
pub(crate) fn indexed(path: &str, i: usize) -> String {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(i);
    let mut p = String::with_capacity(path.len() + digits.len() + 2);
    p.push_str(path);
    p.push('[');
    p.push_str(digits);
    p.push(']');
    p
}

/// One step of a concrete path inside a recorded value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Concrete<'a> {
    Key(&'a str),
    Index(usize),
}

/// Longest object key kept in a rendered path.
const MAX_KEPT_KEY_LEN: usize = 64;

/// Render a concrete path: `a.b[0].c`, `[2].subject`, `$` for the root.
/// Object keys are tool output too: a key of more than 64 bytes or with a
/// character outside `A-Z a-z 0-9 _ : -` (an email address used as a key,
/// say) is written `[?]`, so a path never carries such text. Cut at
/// [`MAX_CONCRETE_PATH_LEN`] bytes (at a char boundary).
pub(crate) fn render(concrete: &[Concrete<'_>]) -> String {
    if concrete.is_empty() {
        return "$".to_owned();
    }
    let mut s = String::new();
    for (i, c) in concrete.iter().enumerate() {
        match c {
            Concrete::Key(k)
                if !k.is_empty() && k.len() <= MAX_KEPT_KEY_LEN && k.chars().all(key_char) =>
            {
                if i > 0 {
                    s.push('.');
                }
                s.push_str(k);
            }
            Concrete::Key(_) => s.push_str("[?]"),
            Concrete::Index(n) => {
                s.push('[');
                s.push_str(itoa::Buffer::new().format(*n));
                s.push(']');
            }
        }
        if s.len() > MAX_CONCRETE_PATH_LEN {
            break;
        }
    }
    cut(s, MAX_CONCRETE_PATH_LEN)
}

/// `s` cut to at most `max` bytes at a char boundary.
pub(crate) fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths_parse_strictly() {
        for ok in [
            "recipient",
            "recipients[*]",
            "a.b[*].c",
            "m[*][*]",
            "x:y-z_1",
        ] {
            assert!(ValuePath::argument(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "[*]", "a..b", "a.", ".a", "a[0]", "a[*", "a b", "a.b[*]c", "é",
        ] {
            assert!(ValuePath::argument(bad).is_err(), "{bad}");
        }
        assert!(ValuePath::result_field("[*].subject").is_ok());
        assert!(ValuePath::result_field("[*]").is_ok());
        assert!(ValuePath::result_field(&"a".repeat(129)).is_err());
    }

    #[test]
    fn select_walks_arrays_and_reports_misfits() {
        let args = json!({"to": ["a", "b"], "m": {"x": [{"c": 1}, {"d": 2}]}, "s": "str"});
        let p = ValuePath::argument("to[*]").unwrap();
        let got = p.select(&args).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, "to[1]");
        let p = ValuePath::argument("m.x[*].c").unwrap();
        let got = p.select(&args).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "m.x[0].c");
        assert!(
            ValuePath::argument("absent")
                .unwrap()
                .select(&args)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            ValuePath::argument("s[*]").unwrap().select(&args),
            Err("s[*]".to_owned())
        );
        assert_eq!(
            ValuePath::argument("s.k").unwrap().select(&args),
            Err("s.k".to_owned())
        );
    }

    #[test]
    fn patterns_cover_subtrees() {
        let p = ValuePath::result_field("[*].subject").unwrap();
        assert!(p.covers(&[Concrete::Index(3), Concrete::Key("subject")]));
        assert!(p.covers(&[
            Concrete::Index(3),
            Concrete::Key("subject"),
            Concrete::Index(0)
        ]));
        assert!(!p.covers(&[Concrete::Index(3), Concrete::Key("recipient")]));
        assert!(!p.covers(&[Concrete::Index(3)]));
        assert!(!p.covers(&[Concrete::Key("x"), Concrete::Key("subject")]));
    }

    #[test]
    fn concrete_paths_render() {
        assert_eq!(render(&[]), "$");
        assert_eq!(
            render(&[Concrete::Index(2), Concrete::Key("subject")]),
            "[2].subject"
        );
        assert_eq!(
            render(&[Concrete::Key("a@b.example"), Concrete::Key("c")]),
            "[?].c"
        );
        assert!(render(&[Concrete::Key(&"k".repeat(400))]).len() <= MAX_CONCRETE_PATH_LEN);
    }
}
