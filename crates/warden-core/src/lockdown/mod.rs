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
//! # The self-edit flag: near-miss keys are the flag
//!
//! A framework that reads `Prompt_Block_Self_Edit`, `promptBlockSelfEdit` or
//! a copy of the flag nested under its own section would grant the surface
//! to a config that spells the key differently from [`SELF_EDIT_FIELD`]. So
//! every key, at any depth of the config (inside objects and arrays), whose
//! canonical spelling ([`canonical_name`]: case, separators, whitespace,
//! camelCase, invisible characters and look-alike letters folded) is that of
//! [`SELF_EDIT_FIELD`] *is* the flag. The config asks for the surface if any
//! of them is `true`; every one of them must be a boolean or null. A spec-built
//! child gets every such `true` set to `false`, under the key as written; a
//! pre-built child is refused, naming the key's path. Treating the near
//! misses as the flag (rather than refusing them as ambiguous) keeps the
//! check in the one direction that cannot grant the surface: whatever
//! spelling the framework reads, it reads `false`.
//!
//! # The write-surface vocabulary
//!
//! The tool-name check ([`Vocabulary::is_write_surface`], and
//! [`is_write_surface_tool_name`] for the built-in vocabulary alone) is a
//! heuristic over names. The vocabulary is data: the built-in rules below,
//! always on, plus what the bundle's `lockdown:` section
//! ([`LockdownSpec`]) adds: shipped [`Preset`]s, whole names
//! (`write_surface_names`) and patterns (`write_surface_patterns`). A bundle
//! can only add; a child can change nothing about it.
//!
//! Every name is first put in its canonical spelling ([`canonical_name`]):
//! NFKC, invisible (default-ignorable, bidi-control) characters and
//! combining marks removed, every letter replaced by its TR39 confusable
//! skeleton and lowercased, separators reduced to `_` between words and `.`
//! between namespace segments (`.`, `/`, `:`, `__` and other symbols; a
//! client prefix such as `mcp__srv__` or `srv.` is a segment), camelCase
//! humps starting words. Entries of the vocabulary are canonicalised the
//! same way, and matching compares letters and digits only, so two words
//! may be written joined or apart (`memory_block`, `memoryBlock`,
//! `memoryblock`). A name is a write surface if:
//!
//! - **Whole names.** From the start of the name or of any namespace
//!   segment to the end, it *is* a listed name: the built-in
//!   [`BUILTIN_NAMES`] (Letta's `memory`, `memory_insert`, `memory_replace`,
//!   `memory_rethink`, ...), the names of each turned-on preset and the
//!   bundle's `write_surface_names`. `mcp__srv__memory_insert` and
//!   `srv.Memory` are caught; `archival_memory_insert` (a single `_` is a
//!   word, not a prefix) and `memory_search` are not.
//! - **Patterns.** Its letters and digits match one of the bundle's
//!   `write_surface_patterns` (`*` for any run).
//! - **Reserved namespaces, [`BUILTIN_NAMESPACES`].** `memory` + `block` or
//!   `core` + `memory` occurs *anywhere* in it (`memory_block_frobnicate`,
//!   `srvMemoryBlockAppend`, `core_memory_append`), unless it is a read.
//! - **Verb families.** At the start of a word, one of
//!   [`BUILTIN_VERB_BLOCK`] followed by `block` (`edit_block`, `set_block`,
//!   `srvEditBlock`) or `block` followed by one of [`BUILTIN_BLOCK_VERB`]
//!   (`block_update`, `block_editor`), followed by anything, unless it is a
//!   read. Words that merely end in a verb are not caught
//!   (`credit_block_report`).
//!
//! **Reads stay readable.** A name matched only by a reserved namespace or
//! a verb family is a read, and allowed, when a word of its last namespace
//! segment is one of [`READ_VERBS`] (`read`, `get`, `list`, `view`,
//! `search`, ..., or that verb plus `s`) and none of [`WRITE_VERBS`] occurs
//! anywhere in its letters, even inside a word: `read_memory_block`,
//! `memory_blocks_list` and `view_core_memory` pass; `read_and_update_block`,
//! `get_block_then_set` and a bare `memory_block` do not. A whole name or a
//! pattern is never read as a read: the operator listed it as a write.
//!
//! # Presets: which frameworks, and why
//!
//! A bundle turns presets on with `lockdown: {presets: [...]}`
//! ([`Preset`]). Each one is the memory-writing tools of a framework whose
//! agents are commonly delegated to:
//!
//! - `letta` (Letta, formerly MemGPT): its core-memory blocks *are* prompt
//!   blocks, the thing this lockdown protects, so its tools
//!   (`core_memory_append`, `core_memory_replace`, `memory_insert`,
//!   `memory_replace`, `memory_rethink`, `memory_finish_edits`, `memory`,
//!   `rethink_memory`, `finish_rethinking_memory`) are **built in and always
//!   on**; naming the preset changes nothing. `memory` is also the name of
//!   Anthropic's memory tool, which writes the files a Claude agent reads
//!   back into its context, so it is caught under that name too.
//!   `archival_memory_insert` writes archival (searched, not prompt) memory
//!   and is not caught.
//! - `langgraph` (LangGraph and LangMem): `manage_memory`, LangMem's
//!   create/update/delete tool over the store that is injected into the
//!   prompt, and `upsert_memory`, the LangGraph memory-agent template's tool.
//! - `mem0` (Mem0 and its OpenMemory MCP server): `add_memories`,
//!   `add_memory`, `update_memory`, `delete_memory`, `delete_memories`,
//!   `delete_all_memories`.
//! - `mcp_memory` (the reference MCP knowledge-graph memory server):
//!   `create_entities`, `create_relations`, `add_observations` and the
//!   `delete_*` tools. Opt-in, because these names are generic.
//!
//! There is no preset for the OpenAI Agents SDK: its memory (sessions) is
//! written by the SDK around the model, not by a tool the model calls, so
//! there is no tool name to refuse. CrewAI and AutoGen are in the same case.
//! The presets other than `letta` are opt-in because their names
//! (`add_memory`, `create_entities`) are ordinary words in other toolsets;
//! a bundle that delegates to such agents turns them on.
//!
//! No name check can catch a write tool whose name lies outside the
//! vocabulary (`grant_edit`, `set_rules`), or look-alikes TR39 does not map
//! one character at a time (`rn` for `m` is mapped, since `m`'s skeleton is
//! `rn`; a letter dropped or doubled is not). The **authoritative control
//! is the capability catalogue**: every action tagged [`BLOCK_WRITE_TAG`] is
//! a block write, whatever it is called, and the engine strips those actions
//! from every delegated child's effective capabilities. The name check is
//! the second line, for tools a client registers on a child directly.
//!
//! The vocabulary is pinned by the corpus in `tests/data/lockdown-corpus.tsv`
//! (read with [`parse_corpus`]); the engine and server tests run the same
//! corpus through child registration.

mod corpus;
mod names;
mod normalise;
#[cfg(test)]
mod tests;
mod vocabulary;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::LazyLock;

use serde_json::Value;

use crate::decision::Reason;
use crate::json::{PathSeg, render_path};
use normalise::glued;

pub use corpus::parse_corpus;
pub use names::is_write_surface_tool_name;
pub use normalise::canonical_name;
pub use vocabulary::{
    BUILTIN_BLOCK_VERB, BUILTIN_NAMES, BUILTIN_NAMESPACES, BUILTIN_VERB_BLOCK, LockdownSpec,
    MAX_ENTRY_LEN, MAX_EXTRA_ENTRIES, Preset, READ_VERBS, SpecIssue, Vocabulary, WRITE_VERBS,
};

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
    /// A pre-built child's config sets the self-edit flag ([`SELF_EDIT_FIELD`]
    /// or a near-miss spelling of it, at any depth) to `true`.
    #[error(
        "child config sets {} (the self-edit flag `prompt_block_self_edit`) to true and a pre-built child cannot be sanitised: set the flag to false, or register the child from a spec so the parent builds it with the flag cleared",
        backtick(.key)
    )]
    SelfEditRequested {
        /// The path of the first key set to `true` (`agent.promptBlockSelfEdit`).
        key: String,
    },
    /// A self-edit flag key ([`SELF_EDIT_FIELD`] or a near-miss spelling of
    /// it, at any depth) holds something other than a boolean or null; it is
    /// never coerced either way.
    #[error(
        "child config field {} (the self-edit flag `prompt_block_self_edit`) must be a boolean, found a JSON {found}; it is never coerced: set it to false or leave it out",
        backtick(.key)
    )]
    SelfEditFlagNotBoolean {
        /// The path of the first such key.
        key: String,
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
            LockdownError::SelfEditRequested { .. } => CHILD_SELF_EDIT_REQUESTED,
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

/// Whether a config key is the self-edit flag: its canonical spelling is
/// that of [`SELF_EDIT_FIELD`] (see the module docs).
pub fn is_self_edit_key(key: &str) -> bool {
    static FLAG: LazyLock<String> = LazyLock::new(|| glued(&canonical_name(SELF_EDIT_FIELD)));
    // Cheap refusal first: every spelling has at least the flag's letters
    // once invisible characters are gone, and a skeleton never shrinks a
    // letter to nothing.
    key.len() >= 8 && glued(&canonical_name(key)) == *FLAG
}

/// The self-edit flag keys of `config` that are `true` (their paths, in
/// document order), or the first type error.
fn true_flags(config: &Value) -> Result<Vec<String>, LockdownError> {
    match config {
        Value::Null => return Ok(Vec::new()),
        Value::Object(_) => {}
        other => {
            return Err(LockdownError::ConfigNotObject {
                found: json_type_name(other),
            });
        }
    }
    // Iterative, so a deep config cannot exhaust the stack. A path is kept
    // as its last step and the index of its parent's, and rendered only for
    // a key that is reported, so the walk stays linear in the config's size.
    let mut steps: Vec<(usize, PathSeg<'_>)> = Vec::new();
    let path_of = |steps: &[(usize, PathSeg<'_>)], mut at: usize| {
        let mut segs = Vec::new();
        while let Some(&(parent, seg)) = steps.get(at) {
            segs.push(seg);
            at = parent;
        }
        segs.reverse();
        render_path("", segs)
    };
    let mut found = Vec::new();
    // Containers to visit with the index of their step (usize::MAX: the
    // root), pushed in reverse so they are visited in document order.
    let mut stack: Vec<(usize, &Value)> = vec![(usize::MAX, config)];
    while let Some((at, value)) = stack.pop() {
        let mut children = Vec::new();
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    let step = steps.len();
                    steps.push((at, PathSeg::Key(key)));
                    if is_self_edit_key(key) {
                        match v {
                            Value::Null | Value::Bool(false) => {}
                            Value::Bool(true) => found.push(path_of(&steps, step)),
                            other => {
                                return Err(LockdownError::SelfEditFlagNotBoolean {
                                    key: path_of(&steps, step),
                                    found: json_type_name(other),
                                });
                            }
                        }
                    }
                    if matches!(v, Value::Object(_) | Value::Array(_)) {
                        children.push((step, v));
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    if matches!(v, Value::Object(_) | Value::Array(_)) {
                        let step = steps.len();
                        steps.push((at, PathSeg::Index(i)));
                        children.push((step, v));
                    }
                }
            }
            _ => {}
        }
        stack.extend(children.into_iter().rev());
    }
    Ok(found)
}

/// Whether `config` explicitly asks for the block self-edit surface.
///
/// `Ok(true)` for a JSON object in which some self-edit flag key (see
/// [`is_self_edit_key`]: [`SELF_EDIT_FIELD`] in any near-miss spelling, at
/// any depth) is `true`. `null` (as the config or as a flag), absent flags
/// and `false` are `Ok(false)`. Any other flag value, and a config that is
/// neither an object nor null, is an error: nothing is coerced.
pub fn requests_self_edit(config: &Value) -> Result<bool, LockdownError> {
    Ok(!true_flags(config)?.is_empty())
}

/// Clear the block self-edit request from the config of a child the parent is
/// about to build from a spec.
///
/// A config that never asked (no flag key `true`, or a `null` config) comes
/// back as [`Sanitised::Unchanged`], the same reference, with nothing copied.
/// A config that asked comes back as [`Sanitised::Cleared`]: a copy with
/// every flag key that was `true` set to `false`, under the key as written.
/// Sanitising is idempotent and never leaves a flag `true`.
///
/// # Errors
///
/// [`LockdownError::SelfEditFlagNotBoolean`] if a flag key holds anything but
/// a boolean or null, [`LockdownError::ConfigNotObject`] if the config is
/// neither an object nor null.
pub fn sanitise_child_config(config: &Value) -> Result<Sanitised<'_>, LockdownError> {
    if !requests_self_edit(config)? {
        return Ok(Sanitised::Unchanged(config));
    }
    let mut cleared = config.clone();
    let mut stack: Vec<&mut Value> = vec![&mut cleared];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if *v == Value::Bool(true) && is_self_edit_key(key) {
                        *v = Value::Bool(false);
                    } else if matches!(v, Value::Object(_) | Value::Array(_)) {
                        stack.push(v);
                    }
                }
            }
            Value::Array(items) => stack.extend(
                items
                    .iter_mut()
                    .filter(|v| matches!(v, Value::Object(_) | Value::Array(_))),
            ),
            _ => {}
        }
    }
    Ok(Sanitised::Cleared(cleared))
}

/// Check a child that was handed over already built, with its `tools` and its
/// `config` (if any), against `vocabulary` (the policy's,
/// [`Policy::lockdown`](crate::bundle::Policy::lockdown)).
///
/// Such a child cannot be sanitised, so it is refused outright if it carries
/// a write-surface tool or its config asks for the surface. Tools are checked
/// first; the error names every offending tool.
///
/// # Errors
///
/// [`LockdownError::WriteSurfaceTool`] if any tool name is a write surface
/// (see [`Vocabulary::is_write_surface`]),
/// [`LockdownError::SelfEditRequested`] if a self-edit flag key is `true`,
/// and the type errors of [`requests_self_edit`].
pub fn check_prebuilt_child(
    vocabulary: &Vocabulary,
    tools: &[String],
    config: Option<&Value>,
) -> Result<(), LockdownError> {
    let offending: Vec<String> = tools
        .iter()
        .filter(|tool| vocabulary.is_write_surface(tool))
        .cloned()
        .collect();
    if !offending.is_empty() {
        return Err(LockdownError::WriteSurfaceTool { tools: offending });
    }
    match config.map(true_flags).transpose()? {
        Some(flags) => match flags.into_iter().next() {
            Some(key) => Err(LockdownError::SelfEditRequested { key }),
            None => Ok(()),
        },
        None => Ok(()),
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
