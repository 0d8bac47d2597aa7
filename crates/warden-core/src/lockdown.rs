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

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::decision::Reason;

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

/// The two words of [`WRITE_SURFACE_NAMESPACE`].
const NAMESPACE_WORDS: (&str, &str) = ("memory", "block");

/// The two words of each entry of [`WRITE_SURFACE_VERB_FAMILIES`], same order.
const VERB_FAMILY_WORDS: [(&str, &str); 7] = [
    ("edit", "block"),
    ("write", "block"),
    ("update", "block"),
    ("append", "block"),
    ("replace", "block"),
    ("rewrite", "block"),
    ("block", "edit"),
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

/// Whether a tool called `name` may write a prompt block.
///
/// Case-insensitive, indifferent to surrounding whitespace, to the separator
/// style (`_ - . / :`, spaces, camelCase) and to a client's server prefix. The
/// exact rules, and what no name check can catch, are in the module docs. Does
/// not allocate.
pub fn is_write_surface_tool_name(name: &str) -> bool {
    let mut rest = name.trim();
    let mut at_word_start = true;
    loop {
        if starts_with_words(rest, NAMESPACE_WORDS) {
            return true;
        }
        if at_word_start
            && VERB_FAMILY_WORDS
                .iter()
                .any(|&words| starts_with_words(rest, words))
        {
            return true;
        }
        let mut chars = rest.chars();
        match chars.next() {
            None => return false,
            Some(c) => at_word_start = fold(c).is_none(),
        }
        rest = chars.as_str();
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

/// Parse the near-miss corpus: one case per line, `name<TAB>expected`.
///
/// - `expected` is `write` (a write surface) or `allowed`; the result pairs
///   each name with `true` for `write`.
/// - A name starting with `"` is a JSON string, which is how padding, control
///   characters, non-ASCII look-alikes, the empty name and a leading `#` are
///   written (`"  MEMORY_BLOCK_APPEND "`, `""`). Any other name is taken
///   verbatim and may not be empty or have surrounding whitespace, so that no
///   case depends on invisible characters.
/// - Blank lines and lines whose first non-blank character is `#` are
///   ignored. A name may appear only once.
///
/// # Errors
///
/// Every malformed line, each with its line number, in one message.
pub fn parse_corpus(text: &str) -> Result<Vec<(String, bool)>, String> {
    let mut cases = Vec::new();
    let mut first_seen: HashMap<String, usize> = HashMap::new();
    let mut errors = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match parse_corpus_line(line) {
            Ok((name, expected)) => {
                if let Some(first) = first_seen.get(&name) {
                    errors.push(format!(
                        "line {line_no}: duplicate name {} (first on line {first})",
                        backtick(&name)
                    ));
                } else {
                    first_seen.insert(name.clone(), line_no);
                    cases.push((name, expected));
                }
            }
            Err(message) => errors.push(format!("line {line_no}: {message}")),
        }
    }
    if errors.is_empty() {
        Ok(cases)
    } else {
        Err(errors.join("; "))
    }
}

/// One non-comment corpus line.
fn parse_corpus_line(line: &str) -> Result<(String, bool), String> {
    let mut fields = line.split('\t');
    let (Some(name_field), Some(expected_field), None) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err("expected exactly two tab-separated fields: name and expectation".to_owned());
    };
    let name = if name_field.starts_with('"') {
        serde_json::from_str::<String>(name_field).map_err(|e| {
            format!(
                "name {} is not a valid JSON string: {e}",
                backtick(name_field)
            )
        })?
    } else if name_field.is_empty() {
        return Err("empty name field: write the empty name as `\"\"`".to_owned());
    } else if name_field.trim() != name_field {
        return Err(format!(
            "name {} has surrounding whitespace: write padded names as JSON strings",
            backtick(name_field)
        ));
    } else {
        name_field.to_owned()
    };
    let expected = match expected_field.trim() {
        "write" => true,
        "allowed" => false,
        other => {
            return Err(format!(
                "expectation must be `write` or `allowed`, found {}",
                backtick(other)
            ));
        }
    };
    Ok((name, expected))
}

/// Whether `s` starts with the two `words`, with any run of separators
/// (possibly none) between them.
fn starts_with_words(s: &str, (first, second): (&str, &str)) -> bool {
    strip_word(s, first)
        .map(|rest| rest.trim_start_matches(|c| fold(c).is_none()))
        .and_then(|rest| strip_word(rest, second))
        .is_some()
}

/// `s` after `word` (lowercase ASCII), if `s` starts with it once folded.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let mut chars = s.chars();
    for expected in word.chars() {
        if chars.next().and_then(fold) != Some(expected) {
            return None;
        }
    }
    Some(chars.as_str())
}

/// The lowercase ASCII letter or digit `c` stands for, or `None` if `c` is a
/// separator.
fn fold(c: char) -> Option<char> {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric().then(|| c.to_ascii_lowercase());
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) if l.is_ascii_alphanumeric() => Some(l),
        _ => None,
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
fn backtick(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const CORPUS: &str = include_str!("../tests/data/lockdown-corpus.tsv");

    fn owned(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn corpus_matches_the_predicate() {
        let cases = parse_corpus(CORPUS).unwrap_or_else(|e| panic!("bad corpus: {e}"));
        assert!(cases.len() >= 70, "corpus has only {} cases", cases.len());
        assert!(cases.iter().any(|(_, w)| *w) && cases.iter().any(|(_, w)| !*w));
        let mismatches: Vec<String> = cases
            .iter()
            .filter(|(name, write)| is_write_surface_tool_name(name) != *write)
            .map(|(name, write)| {
                let want = if *write { "write" } else { "allowed" };
                format!("{name:?}: expected {want}")
            })
            .collect();
        assert!(
            mismatches.is_empty(),
            "{} corpus mismatch(es):\n{}",
            mismatches.len(),
            mismatches.join("\n")
        );
    }

    #[test]
    fn canonical_vocabulary_is_what_the_matcher_uses() {
        let (a, b) = NAMESPACE_WORDS;
        assert_eq!(format!("{a}_{b}_"), WRITE_SURFACE_NAMESPACE);
        for (family, (a, b)) in WRITE_SURFACE_VERB_FAMILIES.iter().zip(VERB_FAMILY_WORDS) {
            assert_eq!(format!("{a}_{b}"), *family);
            assert!(is_write_surface_tool_name(family));
        }
        assert!(is_write_surface_tool_name(WRITE_SURFACE_NAMESPACE));
    }

    #[test]
    fn the_documented_examples_hold() {
        for name in [
            "memory_block_append",
            "MEMORY_BLOCK_APPEND",
            "  memory_block_replace\t",
            "memory_block_frobnicate",
            "memory_blocks_list",
            "memoryblock",
            "memory_block",
            "mcp__server__memory_block_append",
            "server.memory_block_append",
            "server/memory_block_append",
            "srvMemoryBlockAppend",
            "memory-block-append",
            "memoryBlockAppend",
            "memory block append",
            "mcp__srv__edit_block",
            "edit_blocks",
            "block_editor_theme",
            "MEMORY_BLOC\u{212a}_APPEND",
        ] {
            assert!(is_write_surface_tool_name(name), "{name:?} should be write");
        }
        for name in [
            "",
            "   ",
            "block",
            "readonly_block",
            "blocked_items",
            "blocked_user_list",
            "blocklist_read",
            "edit_blog",
            "memory_read",
            "grant_edit",
            "credit_block_report",
            "overwrite_block",
            "srvEditBlock",
        ] {
            assert!(
                !is_write_surface_tool_name(name),
                "{name:?} should be allowed"
            );
        }
    }

    #[test]
    fn unchanged_configs_are_borrowed_not_copied() {
        for config in [
            json!(null),
            json!({}),
            json!({"model": "small"}),
            json!({SELF_EDIT_FIELD: null, "x": 1}),
            json!({SELF_EDIT_FIELD: false}),
        ] {
            let out = sanitise_child_config(&config).unwrap();
            assert!(!out.was_sanitised());
            assert_eq!(out.reason(), CHILD_LOCKDOWN_PASSED);
            let Sanitised::Unchanged(same) = out else {
                panic!("{config} should be unchanged");
            };
            assert!(std::ptr::eq(same, &config));
        }
    }

    #[test]
    fn a_true_flag_is_cleared_on_a_copy() {
        let config = json!({SELF_EDIT_FIELD: true, "model": "small", "tools": ["a"]});
        let out = sanitise_child_config(&config).unwrap();
        assert!(out.was_sanitised());
        assert_eq!(out.reason(), CHILD_SELF_EDIT_SANITISED);
        assert_eq!(
            out.config(),
            &json!({SELF_EDIT_FIELD: false, "model": "small", "tools": ["a"]})
        );
        assert_eq!(config[SELF_EDIT_FIELD], json!(true), "input untouched");
        let again = sanitise_child_config(out.config()).unwrap();
        assert!(!again.was_sanitised());
    }

    #[test]
    fn non_boolean_flags_are_type_errors_never_coerced() {
        for (flag, found) in [
            (json!("true"), "string"),
            (json!("false"), "string"),
            (json!(1), "number"),
            (json!(0), "number"),
            (json!({}), "object"),
            (json!([true]), "array"),
        ] {
            let config = json!({ SELF_EDIT_FIELD: flag });
            let want = LockdownError::SelfEditFlagNotBoolean { found };
            assert_eq!(sanitise_child_config(&config), Err(want.clone()));
            assert_eq!(check_prebuilt_child(&[], Some(&config)), Err(want.clone()));
            assert_eq!(want.reason(), CHILD_SELF_EDIT_FLAG_INVALID);
        }
        let err = LockdownError::SelfEditFlagNotBoolean { found: "string" };
        assert_eq!(
            err.to_string(),
            "child config field `prompt_block_self_edit` must be a boolean, found a JSON string; it is never coerced: set it to false or leave it out"
        );
    }

    #[test]
    fn non_object_configs_are_errors() {
        for (config, found) in [
            (json!("x"), "string"),
            (json!([]), "array"),
            (json!(true), "boolean"),
            (json!(3), "number"),
        ] {
            let want = LockdownError::ConfigNotObject { found };
            assert_eq!(sanitise_child_config(&config), Err(want.clone()));
            assert_eq!(check_prebuilt_child(&[], Some(&config)), Err(want.clone()));
            assert_eq!(want.reason(), CHILD_CONFIG_INVALID);
        }
    }

    #[test]
    fn prebuilt_child_with_write_tools_is_refused_naming_each() {
        let tools = owned(&[
            "search",
            "mcp__srv__memory_block_append",
            "summarise",
            "  EDIT_BLOCK ",
        ]);
        let err = check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: true}))).unwrap_err();
        assert_eq!(
            err,
            LockdownError::WriteSurfaceTool {
                tools: owned(&["mcp__srv__memory_block_append", "  EDIT_BLOCK "])
            }
        );
        assert_eq!(err.reason(), CHILD_WRITE_SURFACE_TOOL);
        let message = err.to_string();
        assert_eq!(
            message,
            "child carries the prompt-block write tool(s) `mcp__srv__memory_block_append`, `  EDIT_BLOCK `; a delegated child may not write a prompt block: remove the tool(s), or register the child from a spec so the parent builds it with the write surface cleared"
        );
    }

    #[test]
    fn prebuilt_child_requesting_self_edit_is_refused() {
        let tools = owned(&["search", "grant_edit"]);
        let err = check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: true}))).unwrap_err();
        assert_eq!(err, LockdownError::SelfEditRequested);
        assert_eq!(err.reason(), CHILD_SELF_EDIT_REQUESTED);
        let message = err.to_string();
        assert!(message.contains("set the flag to false"));
        assert!(message.contains("from a spec"));
    }

    #[test]
    fn clean_prebuilt_children_pass() {
        let tools = owned(&["search", "memory_read", "block_user"]);
        assert_eq!(check_prebuilt_child(&tools, None), Ok(()));
        assert_eq!(check_prebuilt_child(&[], Some(&json!(null))), Ok(()));
        assert_eq!(
            check_prebuilt_child(&tools, Some(&json!({SELF_EDIT_FIELD: false}))),
            Ok(())
        );
    }

    #[test]
    fn every_error_message_is_one_lowercase_line_without_final_period() {
        let errors = [
            LockdownError::WriteSurfaceTool {
                tools: owned(&["memory_block_append\nsecond line", "x"]),
            },
            LockdownError::SelfEditRequested,
            LockdownError::SelfEditFlagNotBoolean { found: "string" },
            LockdownError::ConfigNotObject { found: "array" },
        ];
        for err in errors {
            let m = err.to_string();
            assert!(!m.contains('\n'), "{m}");
            assert!(m.starts_with(|c: char| c.is_ascii_lowercase()), "{m}");
            assert!(!m.ends_with('.'), "{m}");
        }
    }

    #[test]
    fn corpus_parser_decodes_json_names_and_reports_every_bad_line() {
        let text = "# comment\n\nplain\twrite\n\"  padded \"\tallowed\n\"\"\tallowed\r\n   # indented comment\n";
        assert_eq!(
            parse_corpus(text),
            Ok(vec![
                ("plain".to_owned(), true),
                ("  padded ".to_owned(), false),
                (String::new(), false),
            ])
        );
        let bad = "no_tab\n a \twrite\n\"unterminated\twrite\nx\tmaybe\nx\twrite\nx\tallowed\n\twrite\na\twrite\textra\n";
        let err = parse_corpus(bad).unwrap_err();
        for line in 1..=8 {
            if line == 5 {
                continue;
            }
            assert!(
                err.contains(&format!("line {line}:")),
                "line {line} in {err}"
            );
        }
        assert!(
            err.contains("duplicate name `x` (first on line 5)"),
            "{err}"
        );
    }

    /// Reference model: fold to a string in which every separator is `_`,
    /// then test with a regex.
    fn model(name: &str) -> bool {
        let folded: String = name
            .trim()
            .chars()
            .map(|c| fold(c).unwrap_or('_'))
            .collect();
        let namespace = regex::Regex::new("memory_*block").unwrap();
        let family = regex::Regex::new(
            "(^|_)((edit|write|update|append|replace|rewrite)_*block|block_*edit)",
        )
        .unwrap();
        namespace.is_match(&folded) || family.is_match(&folded)
    }

    /// Names built from vocabulary fragments, separators and noise.
    fn arb_name() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("memory".to_owned()),
            Just("Memory".to_owned()),
            Just("block".to_owned()),
            Just("BLOCK".to_owned()),
            Just("edit".to_owned()),
            Just("ed".to_owned()),
            Just("it".to_owned()),
            Just("write".to_owned()),
            Just("update".to_owned()),
            Just("append".to_owned()),
            Just("replace".to_owned()),
            Just("rewrite".to_owned()),
            Just("over".to_owned()),
            Just("_".to_owned()),
            Just("__".to_owned()),
            Just("-".to_owned()),
            Just(".".to_owned()),
            Just("/".to_owned()),
            Just(" ".to_owned()),
            Just("\u{212a}".to_owned()),
            "[a-zA-Z0-9_. /:-]{0,3}",
            any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
    }

    fn flip_case(s: &str, mask: &[bool]) -> String {
        s.chars()
            .zip(mask.iter().cycle())
            .map(|(c, &flip)| {
                if !flip {
                    c
                } else if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    }

    /// Configs with the flag absent, null, true or false among other fields.
    fn arb_config() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z]{0,6}".prop_map(Value::String),
        ];
        let json = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        let flag = prop_oneof![
            Just(None),
            Just(Some(Value::Null)),
            Just(Some(Value::Bool(true))),
            Just(Some(Value::Bool(false))),
        ];
        (prop::collection::btree_map("[a-z_]{1,8}", json, 0..5), flag).prop_map(|(fields, flag)| {
            let mut map: serde_json::Map<String, Value> = fields.into_iter().collect();
            match flag {
                Some(v) => {
                    map.insert(SELF_EDIT_FIELD.to_owned(), v);
                }
                None => {
                    map.remove(SELF_EDIT_FIELD);
                }
            }
            Value::Object(map)
        })
    }

    proptest! {
        #[test]
        fn predicate_ignores_surrounding_whitespace_and_ascii_case(
            name in arb_name(),
            mask in prop::collection::vec(any::<bool>(), 1..16),
            left in "[ \t\r\n\u{a0}\u{3000}]{0,3}",
            right in "[ \t\r\n\u{a0}\u{3000}]{0,3}",
        ) {
            let expected = is_write_surface_tool_name(&name);
            let variant = format!("{left}{}{right}", flip_case(&name, &mask));
            prop_assert_eq!(is_write_surface_tool_name(&variant), expected);
            prop_assert_eq!(is_write_surface_tool_name(&name.to_ascii_uppercase()), expected);
            prop_assert_eq!(is_write_surface_tool_name(&name.to_ascii_lowercase()), expected);
        }

        #[test]
        fn predicate_agrees_with_the_reference_model(name in arb_name()) {
            prop_assert_eq!(is_write_surface_tool_name(&name), model(&name));
        }

        #[test]
        fn reserved_namespace_plus_any_suffix_is_a_write_surface(
            suffix in any::<String>(),
            prefix in prop_oneof![
                Just(String::new()),
                Just("mcp__server__".to_owned()),
                "[a-zA-Z0-9]{0,6}[_./:-]",
                any::<String>(),
            ],
            mask in prop::collection::vec(any::<bool>(), 1..16),
        ) {
            let name = format!("{}{suffix}", flip_case(WRITE_SURFACE_NAMESPACE, &mask));
            prop_assert!(is_write_surface_tool_name(&name));
            let prefixed = format!("{prefix}{name}");
            prop_assert!(is_write_surface_tool_name(&prefixed));
        }

        #[test]
        fn verb_families_after_a_separator_plus_any_suffix_are_write_surfaces(
            family in prop::sample::select(WRITE_SURFACE_VERB_FAMILIES.to_vec()),
            prefix in prop_oneof![Just(String::new()), "[a-zA-Z0-9]{0,6}[_./: -]{1,2}"],
            suffix in any::<String>(),
        ) {
            let name = format!("{prefix}{family}{suffix}");
            prop_assert!(is_write_surface_tool_name(&name));
        }

        #[test]
        fn sanitising_is_idempotent_and_never_leaves_the_flag_true(config in arb_config()) {
            let once = sanitise_child_config(&config).unwrap();
            prop_assert_ne!(once.config().get(SELF_EDIT_FIELD), Some(&Value::Bool(true)));
            prop_assert_eq!(once.was_sanitised(), config[SELF_EDIT_FIELD] == json!(true));
            let twice = sanitise_child_config(once.config()).unwrap();
            prop_assert!(!twice.was_sanitised());
            prop_assert!(std::ptr::eq(twice.config(), once.config()));
            // Only the flag may differ.
            let (mut a, mut b) = (config.clone(), once.config().clone());
            if let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object_mut()) {
                a.remove(SELF_EDIT_FIELD);
                b.remove(SELF_EDIT_FIELD);
            }
            prop_assert_eq!(a, b);
        }

        #[test]
        fn string_flags_are_type_errors_whatever_they_say(config in arb_config(), junk in "(true|false|yes|1|)") {
            let mut bad = config;
            if let Some(map) = bad.as_object_mut() {
                map.insert(SELF_EDIT_FIELD.to_owned(), Value::String(junk));
            }
            prop_assert_eq!(
                sanitise_child_config(&bad),
                Err(LockdownError::SelfEditFlagNotBoolean { found: "string" })
            );
        }
    }
}
