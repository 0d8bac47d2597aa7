//! Positions inside a step's arguments, and the three ways they are written.

use std::fmt::Write as _;

use crate::json::{PathSeg, render_path};

/// One step from an arguments object towards a value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArgSeg {
    /// An object member.
    Key(String),
    /// An array element.
    Index(usize),
}

/// A position inside a step's arguments: at least one segment, the first a
/// key (the arguments object itself is not a position).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArgPath(Vec<ArgSeg>);

impl ArgPath {
    /// A path from its segments: `None` unless the first is a key.
    pub fn new(segs: Vec<ArgSeg>) -> Option<Self> {
        matches!(segs.first(), Some(ArgSeg::Key(_))).then_some(Self(segs))
    }

    /// A path of segments known to start with a key.
    pub(super) fn from_segments(segs: Vec<ArgSeg>) -> Self {
        Self(segs)
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> &[ArgSeg] {
        &self.0
    }

    /// The path as the provenance module writes argument paths: keys as
    /// written joined by `.`, indices in brackets (`recipient`,
    /// `recipients[2]`, `a.b`).
    pub fn argument(&self) -> String {
        argument_path(&self.0)
    }

    /// The path inside the plan document, below `steps[<step>].arguments`,
    /// as JSON paths are written in errors (`steps[0].arguments.file_path`;
    /// a key that is not a plain word in brackets: `["a b"]`).
    pub fn in_plan(&self, step: usize) -> String {
        plan_path(step, &self.0)
    }

    /// The path as an RFC 6901 JSON pointer (`/recipients/2`), the form the
    /// catalogue's schema violations name.
    pub fn pointer(&self) -> String {
        let mut out = String::new();
        for seg in &self.0 {
            out.push('/');
            match seg {
                ArgSeg::Key(k) => {
                    for ch in k.chars() {
                        match ch {
                            '~' => out.push_str("~0"),
                            '/' => out.push_str("~1"),
                            c => out.push(c),
                        }
                    }
                }
                ArgSeg::Index(i) => {
                    let _ = write!(out, "{i}");
                }
            }
        }
        out
    }

    /// The keys of the path, if it holds no index (`a.b` → `["a", "b"]`).
    pub fn keys(&self) -> Option<Vec<&str>> {
        self.0
            .iter()
            .map(|s| match s {
                ArgSeg::Key(k) => Some(k.as_str()),
                ArgSeg::Index(_) => None,
            })
            .collect()
    }
}

/// [`ArgPath::argument`] of a segment list; `$` for the arguments object
/// itself.
pub(super) fn argument_path(segs: &[ArgSeg]) -> String {
    if segs.is_empty() {
        return "$".to_owned();
    }
    let mut out = String::new();
    for seg in segs {
        match seg {
            ArgSeg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            ArgSeg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

/// [`ArgPath::in_plan`] of a segment list.
pub(super) fn plan_path(step: usize, segs: &[ArgSeg]) -> String {
    render_path(
        &format!("steps[{step}].arguments"),
        segs.iter().map(|s| match s {
            ArgSeg::Key(k) => PathSeg::Key(k),
            ArgSeg::Index(i) => PathSeg::Index(*i),
        }),
    )
}
