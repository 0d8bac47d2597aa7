//! Delegation lockdown: no delegated child can write a prompt block.
//!
//! A prompt (memory) block is meant to have a single writer: a human for the
//! authored tiers, the consolidation process for the learned ones. Agents read
//! blocks; they do not rewrite the rules they run under. A delegated child with
//! a block-write tool would be a second writer, and one its parent cannot
//! observe, since the child drives its own loop with its own tool palette. This
//! module holds the pure checks the engine runs to keep that from happening
//! (invariant 9 of the design brief).
//!
//! # Two construction paths
//!
//! - **Built from a spec.** The parent constructs the child, so the request can
//!   be removed before the child exists: [`sanitise_child_config`] returns the
//!   config with [`SELF_EDIT_FIELD`] cleared, and the config itself when it
//!   never asked (no copy, same reference).
//! - **Handed over pre-built.** Its tools are already fixed, so there is
//!   nothing left to clear: [`check_prebuilt_child`] refuses it. Accepting it
//!   silently would let the caller believe in a lock that is not there.
//!
//! Both checks belong at construction (registration) time. A child's tools are
//! offered to its model as soon as it is built; a check made later, when work
//! is delegated, would come after the surface had already been exposed.
//!
//! Sanitisation and refusal never coerce the flag: only JSON `true` asks for
//! the surface, `false`, `null` and an absent field do not, and anything else
//! (`"true"`, `1`, an object) is a type error
//! ([`LockdownError::SelfEditFlagNotBoolean`]), because a value whose meaning
//! has to be guessed is a value the caller did not mean.
//!
//! # What the tool-name check can and cannot do
//!
//! [`is_write_surface_tool_name`] is a heuristic over names. The rules, all
//! applied to the trimmed name with case folded:
//!
//! - **Separators.** Every character that is not a letter or digit (`_`, `-`,
//!   `.`, `/`, `:`, spaces, `__`, any non-ASCII symbol) separates words. A
//!   non-ASCII character whose lowercase form is a single ASCII letter or digit
//!   (the Kelvin sign `K`) counts as that letter.
//! - **Joined words.** Between the two words of a vocabulary entry any run of
//!   separators, including none, is accepted, so `memory_block`,
//!   `memory-block`, `memory.block`, `memory block`, `memoryBlock` and
//!   `memoryblock` are all the same entry. Case folding erases camelCase
//!   boundaries, which is what makes the check indifferent to the shift key:
//!   `memoryblockappend` and `memoryBlockAppend` must get the same answer.
//! - **Reserved namespace, [`WRITE_SURFACE_NAMESPACE`].** `memory` + `block`
//!   matches *anywhere* in the name, followed by anything or nothing. The
//!   whole namespace is reserved, so a verb added under it tomorrow
//!   (`memory_block_frobnicate`) is caught today, and so are the framework's
//!   own tools behind any client prefix (`mcp__srv__memory_block_append`,
//!   `srv.memory_block_append`, `srv/memory_block_append`,
//!   `srvMemoryBlockAppend`). This is deliberately broad: `memory_blocks_list`,
//!   `memory_block_read` and `memoryblock` are write surfaces too.
//! - **Verb families, [`WRITE_SURFACE_VERB_FAMILIES`].** `edit`, `write`,
//!   `update`, `append`, `replace` or `rewrite` followed by `block`, and
//!   `block` followed by `edit`, followed by anything or nothing
//!   (`edit_blocks`, `block_editor_theme`). These must start a word (the start
//!   of the name or right after a separator), so a server prefix is stripped
//!   (`mcp__srv__edit_block`) but ordinary words that merely end in a verb are
//!   not (`credit_block_report`, `overwrite_block`).
//! - Everything else is allowed: `block`, `readonly_block`, `blocked_items`,
//!   `blocklist_read`, `edit_blog`, `memory_read`, `grant_edit`, the empty name.
//!
//! A name check cannot catch a write tool whose name lies outside the
//! vocabulary (`grant_edit`, `set_rules`), spelled with look-alike characters,
//! or glued to a prefix in camelCase (`srvEditBlock`). No name check can. The
//! **authoritative control is the capability catalogue**: every action tagged
//! [`BLOCK_WRITE_TAG`] is a block write, whatever it is called, and the engine
//! strips those actions from every delegated child's effective capabilities.
//! The name check is the second line, for tools a client registers on a child
//! directly.
//!
//! The vocabulary is pinned by the near-miss corpus in
//! `tests/data/lockdown-corpus.tsv` (read with [`parse_corpus`]); the engine
//! and server tests run the same corpus through child registration.

mod corpus;
mod names;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;

use crate::decision::Reason;

pub use corpus::parse_corpus;
pub use names::is_write_surface_tool_name;

/// The child-config field that asks for the prompt-block self-edit surface.
///
/// A delegated child never receives that surface, whatever the field says.
pub const SELF_EDIT_FIELD: &str = "prompt_block_self_edit";

/// The catalogue tag marking an action as a prompt/memory-block write.
///
/// This tag, not a tool name, is the authoritative way to say "this action
/// writes a block": the engine removes every action carrying it from the
/// effective capabilities of every delegated child, on every construction
/// path, so a block-write action reaches a child under no name at all.
pub const BLOCK_WRITE_TAG: &str = "block_write";

/// The reserved tool-name namespace, in its canonical spelling.
///
/// The whole namespace is reserved, not a list of verbs in it; see the module
/// docs for how spelling variants and client prefixes are matched.
pub const WRITE_SURFACE_NAMESPACE: &str = "memory_block_";

/// The verb families that wrap the block-write API, in canonical spelling.
///
/// Each entry matches as a prefix at the start of a word (`edit_block*`); see
/// the module docs for how spelling variants are matched.
pub const WRITE_SURFACE_VERB_FAMILIES: [&str; 7] = [
    "edit_block",
    "write_block",
    "update_block",
    "append_block",
    "replace_block",
    "rewrite_block",
    "block_edit",
];

/// Reason: a child was refused because it carries a block-write tool.
pub const CHILD_WRITE_SURFACE_TOOL: Reason = Reason::code("child_write_surface_tool");
/// Reason: a pre-built child was refused because its config asks for the
/// block self-edit surface.
pub const CHILD_SELF_EDIT_REQUESTED: Reason = Reason::code("child_self_edit_requested");
/// Reason: a child config's [`SELF_EDIT_FIELD`] is neither a boolean nor null.
pub const CHILD_SELF_EDIT_FLAG_INVALID: Reason = Reason::code("child_self_edit_flag_invalid");
/// Reason: a spec-built child's config asked for the surface and was cleared.
pub const CHILD_SELF_EDIT_SANITISED: Reason = Reason::code("child_self_edit_sanitised");
/// Reason: the child passed the lockdown checks unchanged.
pub const CHILD_LOCKDOWN_PASSED: Reason = Reason::code("child_lockdown_passed");
/// Reason: a child config is neither a JSON object nor null.
pub const CHILD_CONFIG_INVALID: Reason = Reason::code("child_config_invalid");

/// Why a child may not be registered as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockdownError {
    /// The child carries at least one tool whose name is a write surface.
    #[error(
        "child carries the prompt-block write tool(s) {}; a delegated child may not write a prompt block: remove the tool(s), or register the child from a spec so the parent builds it with the write surface cleared",
        backtick_list(.tools)
    )]
    WriteSurfaceTool {
        /// Every offending tool name, as given and in the given order.
        tools: Vec<String>,
    },
    /// A pre-built child's config sets [`SELF_EDIT_FIELD`] to `true`.
    #[error(
        "child config sets `prompt_block_self_edit` to true and a pre-built child cannot be sanitised: set the flag to false, or register the child from a spec so the parent builds it with the flag cleared"
    )]
    SelfEditRequested,
    /// The config's [`SELF_EDIT_FIELD`] holds something other than a boolean
    /// or null; it is never coerced either way.
    #[error(
        "child config field `prompt_block_self_edit` must be a boolean, found a JSON {found}; it is never coerced: set it to false or leave it out"
    )]
    SelfEditFlagNotBoolean {
        /// The JSON type found (`string`, `number`, `array`, `object`).
        found: &'static str,
    },
    /// The config is neither a JSON object nor null.
    #[error("child config must be a JSON object or null, found a JSON {found}")]
    ConfigNotObject {
        /// The JSON type found (`boolean`, `number`, `string`, `array`).
        found: &'static str,
    },
}

impl LockdownError {
    /// The reason code a decision record carries for this refusal.
    pub fn reason(&self) -> Reason {
        match self {
            LockdownError::WriteSurfaceTool { .. } => CHILD_WRITE_SURFACE_TOOL,
            LockdownError::SelfEditRequested => CHILD_SELF_EDIT_REQUESTED,
            LockdownError::SelfEditFlagNotBoolean { .. } => CHILD_SELF_EDIT_FLAG_INVALID,
            LockdownError::ConfigNotObject { .. } => CHILD_CONFIG_INVALID,
        }
    }
}

/// The outcome of [`sanitise_child_config`].
#[derive(Debug, Clone, PartialEq)]
pub enum Sanitised<'a> {
    /// The config never asked for the surface: the very same value, borrowed.
    Unchanged(&'a Value),
    /// The config asked: a copy with [`SELF_EDIT_FIELD`] set to `false`.
    Cleared(Value),
}

impl<'a> Sanitised<'a> {
    /// The config the child is to be built with.
    pub fn config(&self) -> &Value {
        match self {
            Sanitised::Unchanged(config) => config,
            Sanitised::Cleared(config) => config,
        }
    }

    /// Whether the request was cleared (the config was changed).
    pub fn was_sanitised(&self) -> bool {
        matches!(self, Sanitised::Cleared(_))
    }

    /// The reason code for the decision record: [`CHILD_SELF_EDIT_SANITISED`]
    /// when the request was cleared, [`CHILD_LOCKDOWN_PASSED`] otherwise.
    pub fn reason(&self) -> Reason {
        if self.was_sanitised() {
            CHILD_SELF_EDIT_SANITISED
        } else {
            CHILD_LOCKDOWN_PASSED
        }
    }

    /// The config as a copy-on-write value, borrowed when unchanged.
    pub fn into_cow(self) -> Cow<'a, Value> {
        match self {
            Sanitised::Unchanged(config) => Cow::Borrowed(config),
            Sanitised::Cleared(config) => Cow::Owned(config),
        }
    }
}

/// Whether `config` explicitly asks for the block self-edit surface.
///
/// `Ok(true)` only for a JSON object whose [`SELF_EDIT_FIELD`] is `true`.
/// `null` (as the config or as the field), an absent field and `false` are
/// `Ok(false)`. Any other field value, and a config that is neither an object
/// nor null, is an error: nothing is coerced.
pub fn requests_self_edit(config: &Value) -> Result<bool, LockdownError> {
    match config {
        Value::Null => Ok(false),
        Value::Object(map) => match map.get(SELF_EDIT_FIELD) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(other) => Err(LockdownError::SelfEditFlagNotBoolean {
                found: json_type_name(other),
            }),
        },
        other => Err(LockdownError::ConfigNotObject {
            found: json_type_name(other),
        }),
    }
}

/// Clear the block self-edit request from the config of a child the parent is
/// about to build from a spec.
///
/// A config that never asked (field absent, `null` or `false`, or a `null`
/// config) comes back as [`Sanitised::Unchanged`], the same reference, with
/// nothing copied. A config whose field is `true` comes back as
/// [`Sanitised::Cleared`]: a copy with the field set to `false`. Sanitising is
/// idempotent and never leaves the field `true`.
///
/// # Errors
///
/// [`LockdownError::SelfEditFlagNotBoolean`] if the field holds anything but
/// a boolean or null, [`LockdownError::ConfigNotObject`] if the config is
/// neither an object nor null.
pub fn sanitise_child_config(config: &Value) -> Result<Sanitised<'_>, LockdownError> {
    if !requests_self_edit(config)? {
        return Ok(Sanitised::Unchanged(config));
    }
    let mut cleared = config.clone();
    if let Value::Object(map) = &mut cleared {
        map.insert(SELF_EDIT_FIELD.to_owned(), Value::Bool(false));
    }
    Ok(Sanitised::Cleared(cleared))
}

/// Check a child that was handed over already built, with its `tools` and its
/// `config` (if any).
///
/// Such a child cannot be sanitised, so it is refused outright if it carries
/// a write-surface tool or its config asks for the surface. Tools are checked
/// first; the error names every offending tool.
///
/// # Errors
///
/// [`LockdownError::WriteSurfaceTool`] if any tool name is a write surface
/// (see [`is_write_surface_tool_name`]), [`LockdownError::SelfEditRequested`]
/// if the config's [`SELF_EDIT_FIELD`] is `true`, and the type errors of
/// [`requests_self_edit`].
pub fn check_prebuilt_child(tools: &[String], config: Option<&Value>) -> Result<(), LockdownError> {
    let offending: Vec<String> = tools
        .iter()
        .filter(|tool| is_write_surface_tool_name(tool))
        .cloned()
        .collect();
    if !offending.is_empty() {
        return Err(LockdownError::WriteSurfaceTool { tools: offending });
    }
    match config {
        Some(config) if requests_self_edit(config)? => Err(LockdownError::SelfEditRequested),
        _ => Ok(()),
    }
}

/// The name of a JSON value's type, for error messages.
fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `s` in backticks, with control characters escaped so that a message stays
/// on one line.
pub(super) fn backtick(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_backticked(&mut out, s);
    out
}

fn push_backticked(out: &mut String, s: &str) {
    out.push('`');
    for c in s.chars() {
        if c.is_control() {
            // Writing to a String cannot fail.
            let _ = write!(out, "{}", c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out.push('`');
}

/// `tools` in backticks, comma-separated.
fn backtick_list(tools: &[String]) -> String {
    let mut out = String::new();
    for (i, tool) in tools.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_backticked(&mut out, tool);
    }
    out
}
