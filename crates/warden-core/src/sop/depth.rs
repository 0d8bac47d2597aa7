//! The iterative depth walk over a step's arguments.

use serde_json::{Map, Value};

use super::{SopError, SopErrorKind};
use crate::json::{PathSeg, render_path};

/// The children of a container, for the iterative depth walk.
enum Children<'a> {
    Object(serde_json::map::Iter<'a>),
    Array(std::iter::Enumerate<std::slice::Iter<'a, Value>>),
}

impl<'a> Children<'a> {
    fn of(v: &'a Value) -> Option<Self> {
        match v {
            Value::Object(map) => Some(Children::Object(map.iter())),
            Value::Array(items) => Some(Children::Array(items.iter().enumerate())),
            _ => None,
        }
    }

    fn next(&mut self) -> Option<(PathSeg<'a>, &'a Value)> {
        match self {
            Children::Object(it) => it.next().map(|(k, v)| (PathSeg::Key(k), v)),
            Children::Array(it) => it.next().map(|(i, v)| (PathSeg::Index(i), v)),
        }
    }
}

/// Refuse `args` if any container in it sits deeper than `max` (`args`
/// itself being at depth 1). An explicit stack, at most `max` frames, so
/// the walk cannot overflow the call stack however deep the value is.
pub(super) fn check_depth(args: &Map<String, Value>, max: usize, at: &str) -> Result<(), SopError> {
    let too_deep = |path: String| SopError::new(path, SopErrorKind::NestingTooDeep { max });
    if max == 0 {
        return Err(too_deep(at.to_owned()));
    }
    struct Frame<'a> {
        via: Option<PathSeg<'a>>,
        children: Children<'a>,
    }
    let mut stack = vec![Frame {
        via: None,
        children: Children::Object(args.iter()),
    }];
    while let Some(top) = stack.last_mut() {
        let Some((seg, child)) = top.children.next() else {
            stack.pop();
            continue;
        };
        let Some(children) = Children::of(child) else {
            continue;
        };
        if stack.len() >= max {
            let path = stack.iter().filter_map(|f| f.via).chain([seg]);
            return Err(too_deep(render_path(at, path)));
        }
        stack.push(Frame {
            via: Some(seg),
            children,
        });
    }
    Ok(())
}
