//! The write-surface vocabulary: the built-in rules, the shipped presets and
//! the bundle's `lockdown:` section, compiled into one matcher.

use std::sync::LazyLock;

use globset::{Glob, GlobSet, GlobSetBuilder};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::normalise::{SOFT, canonical_name, glued, is_separator, matching_form};

/// Most entries in `write_surface_names` (and in `write_surface_patterns`).
pub const MAX_EXTRA_ENTRIES: usize = 256;
/// Longest entry of `write_surface_names` or `write_surface_patterns`, in
/// bytes.
pub const MAX_ENTRY_LEN: usize = 128;

/// Reserved namespaces: the two words, joined or apart, *anywhere* in a
/// name make it a write surface (unless it is a read).
pub const BUILTIN_NAMESPACES: [&str; 2] = ["memory_block", "core_memory"];

/// Verbs that, followed by `block` at the start of a word, make a write
/// surface (`edit_block`, `set_block`, `update_blocks`).
pub const BUILTIN_VERB_BLOCK: [&str; 11] = [
    "edit",
    "write",
    "update",
    "append",
    "replace",
    "rewrite",
    "overwrite",
    "insert",
    "set",
    "modify",
    "patch",
];

/// Verbs that, after `block` at the start of a word, make a write surface
/// (`block_edit`, `block_update`). `set` is not among them, so that
/// `block_settings` stays a read.
pub const BUILTIN_BLOCK_VERB: [&str; 7] = [
    "edit", "write", "update", "append", "replace", "rewrite", "insert",
];

/// Whole tool names that are write surfaces however they are spelled and
/// behind any client prefix: the Letta/MemGPT memory tools (including
/// `memory`, the omnibus memory tool Letta shares with Anthropic's memory
/// tool). Always on.
pub const BUILTIN_NAMES: [&str; 7] = [
    "memory",
    "memory_insert",
    "memory_replace",
    "memory_rethink",
    "memory_finish_edits",
    "rethink_memory",
    "finish_rethinking_memory",
];

/// Read verbs: a name matched only by a namespace or a verb family is a
/// read, and allowed, when one of the words of its last namespace segment is
/// one of these (or one of these plus `s`) and no [`WRITE_VERBS`] occurs in
/// it at all.
pub const READ_VERBS: [&str; 18] = [
    "read", "get", "list", "view", "show", "search", "find", "fetch", "query", "lookup",
    "describe", "inspect", "count", "browse", "retrieve", "peek", "dump", "export",
];

/// Write verbs: any of these anywhere in a name (even inside a word) keeps
/// it from being a read.
pub const WRITE_VERBS: [&str; 33] = [
    "edit", "write", "update", "append", "replace", "insert", "rethink", "set", "put", "patch",
    "modify", "delete", "remove", "create", "add", "clear", "reset", "change", "save", "store",
    "upsert", "manage", "erase", "drop", "move", "rename", "commit", "apply", "push", "assign",
    "truncate", "purge", "wipe",
];

/// A shipped preset: the tool names of one framework's memory tools.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// Letta (MemGPT): `core_memory_append`, `core_memory_replace`,
    /// `memory_insert`, `memory_replace`, `memory_rethink`, `memory`, ...
    /// Built in and always on; naming it changes nothing.
    Letta,
    /// LangGraph and LangMem: `manage_memory` (LangMem's memory tool) and
    /// `upsert_memory` (LangGraph's memory-agent template).
    Langgraph,
    /// Mem0 and its OpenMemory MCP server: `add_memories`, `add_memory`,
    /// `update_memory`, `delete_memory`, `delete_memories`,
    /// `delete_all_memories`.
    Mem0,
    /// The reference MCP knowledge-graph memory server: `create_entities`,
    /// `create_relations`, `add_observations`, `delete_entities`,
    /// `delete_observations`, `delete_relations`.
    McpMemory,
}

impl Preset {
    /// Every preset, in order.
    pub const ALL: [Preset; 4] = [
        Preset::Letta,
        Preset::Langgraph,
        Preset::Mem0,
        Preset::McpMemory,
    ];

    /// Its name in a bundle.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Letta => "letta",
            Preset::Langgraph => "langgraph",
            Preset::Mem0 => "mem0",
            Preset::McpMemory => "mcp_memory",
        }
    }

    /// Whether it is part of the built-in vocabulary (always on).
    pub fn is_builtin(self) -> bool {
        self == Preset::Letta
    }

    /// The whole tool names it adds (for the built-in preset, the names that
    /// the built-in rules catch: [`BUILTIN_NAMES`] and the `core_memory`
    /// tools of [`BUILTIN_NAMESPACES`]).
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Preset::Letta => &[
                "core_memory_append",
                "core_memory_replace",
                "memory_insert",
                "memory_replace",
                "memory_rethink",
                "memory_finish_edits",
                "memory",
                "rethink_memory",
                "finish_rethinking_memory",
            ],
            Preset::Langgraph => &["manage_memory", "upsert_memory"],
            Preset::Mem0 => &[
                "add_memories",
                "add_memory",
                "update_memory",
                "delete_memory",
                "delete_memories",
                "delete_all_memories",
            ],
            Preset::McpMemory => &[
                "create_entities",
                "create_relations",
                "add_observations",
                "delete_entities",
                "delete_observations",
                "delete_relations",
            ],
        }
    }
}

/// The bundle's `lockdown:` section: what it adds to the built-in
/// write-surface vocabulary. It can only add: the built-in rules are always
/// on, and nothing here (or anywhere a child can reach) removes one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LockdownSpec {
    /// Shipped presets to turn on (`letta` is always on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presets: Vec<Preset>,
    /// Further whole tool names that write a prompt block, matched like the
    /// preset names: in any spelling (case, separators, camelCase,
    /// look-alike characters) and behind any client prefix (`mcp__srv__`,
    /// `srv.`). At most 256, each at most 128 bytes with a letter or digit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_surface_names: Vec<String>,
    /// Patterns over a name's letters and digits (separators ignored,
    /// look-alikes folded as for names): `*` matches any run, everything
    /// else is literal, and the whole name must match (`*persona*` catches
    /// `update_persona` and `PersonaEdit`). At most 256, each at most 128
    /// bytes with a letter or digit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_surface_patterns: Vec<String>,
}

/// One problem in a `lockdown:` section: where (`lockdown.presets[1]`) and
/// what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecIssue {
    /// The location inside the bundle.
    pub location: String,
    /// What is wrong.
    pub message: String,
}

/// An entry of the vocabulary: the words of its canonical spelling. A name
/// matches it where the words follow one another, each unbroken, with any
/// run of separators (or none) between them.
type Entry = Vec<String>;

/// The built-in terms and the presets' names, canonicalised once per
/// process (a bundle's compile then only canonicalises its own entries).
struct Terms {
    namespaces: Vec<Entry>,
    families: Vec<Entry>,
    names: Vec<Entry>,
    /// The names of each preset, in [`Preset::ALL`] order.
    presets: [Vec<Entry>; Preset::ALL.len()],
    read_verbs: Vec<String>,
    write_verbs: Vec<String>,
}

fn glued_of(s: &str) -> String {
    glued(&canonical_name(s))
}

fn entry_of(s: &str) -> Entry {
    canonical_name(s)
        .split(is_separator)
        .map(str::to_owned)
        .collect()
}

/// Where `words` end if they match the matching form `form` from byte `at`
/// on: each word unbroken (soft boundaries inside it are skipped), any
/// separators between words.
fn match_at(form: &str, at: usize, words: &[String]) -> Option<usize> {
    let mut rest = form.get(at..)?;
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            rest = rest.trim_start_matches(is_separator);
        }
        for w in word.chars() {
            rest = rest.trim_start_matches(SOFT);
            let mut chars = rest.chars();
            if chars.next()? != w {
                return None;
            }
            rest = chars.as_str();
        }
    }
    Some(form.len() - rest.len())
}

static TERMS: LazyLock<Terms> = LazyLock::new(|| {
    let mut families: Vec<Entry> = BUILTIN_VERB_BLOCK
        .iter()
        .map(|v| entry_of(&format!("{v}_block")))
        .chain(
            BUILTIN_BLOCK_VERB
                .iter()
                .map(|v| entry_of(&format!("block_{v}"))),
        )
        .collect();
    families.sort();
    families.dedup();
    Terms {
        namespaces: BUILTIN_NAMESPACES.iter().map(|t| entry_of(t)).collect(),
        families,
        names: BUILTIN_NAMES.iter().map(|t| entry_of(t)).collect(),
        presets: Preset::ALL.map(|p| p.names().iter().map(|n| entry_of(n)).collect()),
        read_verbs: READ_VERBS.iter().map(|t| glued_of(t)).collect(),
        write_verbs: WRITE_VERBS.iter().map(|t| glued_of(t)).collect(),
    }
});

static BUILTIN: LazyLock<Vocabulary> = LazyLock::new(|| Vocabulary::with(Vec::new(), &[], None));

/// The compiled write-surface vocabulary: the built-in rules plus whatever a
/// bundle's `lockdown:` section adds. See the module docs of
/// [`crate::lockdown`] for the rules.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    /// Turned-on presets, sorted, for explanations.
    presets: Vec<Preset>,
    /// Whole names, sorted and unique.
    names: Vec<Entry>,
    /// The bundle's extra names and patterns, as written.
    extra_names: Vec<String>,
    extra_patterns: Vec<String>,
    patterns: Option<GlobSet>,
}

impl Default for Vocabulary {
    fn default() -> Self {
        Vocabulary::builtin().clone()
    }
}

impl PartialEq for Vocabulary {
    fn eq(&self, other: &Self) -> bool {
        self.presets == other.presets
            && self.names == other.names
            && self.extra_names == other.extra_names
            && self.extra_patterns == other.extra_patterns
    }
}

impl Vocabulary {
    /// The built-in vocabulary alone (what a bundle without a `lockdown:`
    /// section gets).
    pub fn builtin() -> &'static Vocabulary {
        &BUILTIN
    }

    /// Compile a `lockdown:` section. Every problem is reported, located
    /// under `lockdown.`.
    ///
    /// # Errors
    ///
    /// A name or pattern with no letter or digit or longer than
    /// [`MAX_ENTRY_LEN`], a pattern with a character other than letters,
    /// digits, separators and `*`, and more than [`MAX_EXTRA_ENTRIES`]
    /// names or patterns.
    pub fn compile(spec: &LockdownSpec) -> Result<Vocabulary, Vec<SpecIssue>> {
        let mut issues = Vec::new();
        let mut push = |location: String, message: String| {
            issues.push(SpecIssue { location, message });
        };
        for (field, list) in [
            ("write_surface_names", &spec.write_surface_names),
            ("write_surface_patterns", &spec.write_surface_patterns),
        ] {
            if list.len() > MAX_EXTRA_ENTRIES {
                push(
                    format!("lockdown.{field}"),
                    format!("at most {MAX_EXTRA_ENTRIES} entries, found {}", list.len()),
                );
            }
        }
        let mut names = Vec::new();
        for (i, name) in spec.write_surface_names.iter().enumerate() {
            let location = format!("lockdown.write_surface_names[{i}]");
            if name.len() > MAX_ENTRY_LEN {
                push(location, format!("longer than {MAX_ENTRY_LEN} bytes"));
                continue;
            }
            let entry = entry_of(name);
            if entry.iter().all(String::is_empty) {
                push(location, "has no letter or digit".to_owned());
                continue;
            }
            names.push(entry);
        }
        let mut globs = Vec::new();
        for (i, pattern) in spec.write_surface_patterns.iter().enumerate() {
            let location = format!("lockdown.write_surface_patterns[{i}]");
            match pattern_glob(pattern) {
                Ok(glob) => globs.push(glob),
                Err(message) => push(location, message),
            }
        }
        if !issues.is_empty() {
            return Err(issues);
        }
        let mut vocabulary = Vocabulary::with(names, &spec.presets, Some(globs.as_slice()));
        vocabulary.extra_names = spec.write_surface_names.clone();
        vocabulary.extra_patterns = spec.write_surface_patterns.clone();
        if vocabulary.patterns.is_none() && !globs.is_empty() {
            return Err(vec![SpecIssue {
                location: "lockdown.write_surface_patterns".to_owned(),
                message: "the patterns could not be compiled together".to_owned(),
            }]);
        }
        Ok(vocabulary)
    }

    fn with(mut names: Vec<Entry>, presets: &[Preset], globs: Option<&[Glob]>) -> Vocabulary {
        names.extend(TERMS.names.iter().cloned());
        let mut presets: Vec<Preset> = presets.to_vec();
        presets.sort();
        presets.dedup();
        for (preset, entries) in Preset::ALL.iter().zip(&TERMS.presets) {
            if presets.contains(preset) {
                names.extend(entries.iter().cloned());
            }
        }
        names.sort();
        names.dedup();
        let patterns = match globs {
            Some(globs) if !globs.is_empty() => {
                let mut builder = GlobSetBuilder::new();
                for g in globs {
                    builder.add(g.clone());
                }
                builder.build().ok()
            }
            _ => None,
        };
        Vocabulary {
            presets,
            names,
            extra_names: Vec::new(),
            extra_patterns: Vec::new(),
            patterns,
        }
    }

    /// Whether a tool called `name` may write a prompt block, by this
    /// vocabulary (the rules are in the module docs of [`crate::lockdown`]).
    pub fn is_write_surface(&self, name: &str) -> bool {
        let canonical = matching_form(name);
        if canonical.is_empty() {
            return false;
        }
        let name = Name::of(&canonical);
        let whole = |entry: &Entry| {
            name.segment_starts
                .iter()
                .any(|&at| match_at(&canonical, at, entry) == Some(canonical.len()))
        };
        if self.names.iter().any(whole) {
            return true;
        }
        if self
            .patterns
            .as_ref()
            .is_some_and(|set| set.is_match(&name.glued))
        {
            return true;
        }
        let terms = &*TERMS;
        let in_namespace = || {
            canonical.char_indices().any(|(at, _)| {
                terms
                    .namespaces
                    .iter()
                    .any(|e| match_at(&canonical, at, e).is_some())
            })
        };
        let in_family = || {
            name.word_starts.iter().any(|&at| {
                terms
                    .families
                    .iter()
                    .any(|e| match_at(&canonical, at, e).is_some())
            })
        };
        (in_namespace() || in_family()) && !name.is_read(terms)
    }

    /// The presets turned on (sorted; the built-in one only if named).
    pub fn presets(&self) -> &[Preset] {
        &self.presets
    }

    /// One line per part of the vocabulary, for `warden policy lint`.
    pub fn explain(&self) -> Vec<String> {
        let mut out = vec![format!(
            "lockdown: built-in write surfaces: namespaces {} anywhere; {} + block and block + {} at a word start; whole names {} (letta); reads allowed when a read verb ({}) and no write verb is in the name",
            BUILTIN_NAMESPACES.join(", "),
            BUILTIN_VERB_BLOCK.join("|"),
            BUILTIN_BLOCK_VERB.join("|"),
            BUILTIN_NAMES.join(", "),
            READ_VERBS.join(", "),
        )];
        for preset in &self.presets {
            if preset.is_builtin() {
                out.push(format!(
                    "lockdown.presets: {} is built in and always on",
                    preset.as_str()
                ));
            } else {
                out.push(format!(
                    "lockdown.presets: {} adds whole names {}",
                    preset.as_str(),
                    preset.names().join(", ")
                ));
            }
        }
        if !self.extra_names.is_empty() {
            out.push(format!(
                "lockdown.write_surface_names: whole names {}",
                self.extra_names.join(", ")
            ));
        }
        if !self.extra_patterns.is_empty() {
            out.push(format!(
                "lockdown.write_surface_patterns: names whose letters and digits match {}",
                self.extra_patterns.join(", ")
            ));
        }
        out
    }
}

/// A pattern as a glob over glued names.
fn pattern_glob(pattern: &str) -> Result<Glob, String> {
    if pattern.len() > MAX_ENTRY_LEN {
        return Err(format!("longer than {MAX_ENTRY_LEN} bytes"));
    }
    if let Some(bad) = pattern
        .chars()
        .find(|&c| !(c == '*' || c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
    {
        return Err(format!(
            "`{}` is not allowed in a pattern: write letters, digits, `_`, `-`, `.` and `*`",
            bad.escape_debug()
        ));
    }
    let mut glob = String::new();
    let mut literal = false;
    for (i, part) in pattern.split('*').enumerate() {
        if i > 0 && !glob.ends_with('*') {
            glob.push('*');
        }
        let g = glued_of(part);
        literal |= !g.is_empty();
        glob.push_str(&g);
    }
    if !literal {
        return Err("has no letter or digit: it would match every name".to_owned());
    }
    Glob::new(&glob).map_err(|e| format!("not a valid pattern: {e}"))
}

/// A canonical name, split for matching.
struct Name<'a> {
    canonical: &'a str,
    /// The letters and digits.
    glued: String,
    /// Byte offsets into `canonical` where a word starts.
    word_starts: Vec<usize>,
    /// Byte offsets into `canonical` where a namespace segment starts.
    segment_starts: Vec<usize>,
}

impl<'a> Name<'a> {
    fn of(canonical: &'a str) -> Name<'a> {
        let mut word_starts = vec![0];
        let mut segment_starts = vec![0];
        for (at, c) in canonical.char_indices() {
            match c {
                '_' | SOFT => word_starts.push(at + 1),
                '.' => {
                    word_starts.push(at + 1);
                    segment_starts.push(at + 1);
                }
                _ => {}
            }
        }
        Name {
            canonical,
            glued: glued(canonical),
            word_starts,
            segment_starts,
        }
    }
    /// A read: a read verb among the words of the last segment, no write
    /// verb anywhere.
    fn is_read(&self, terms: &Terms) -> bool {
        let last = self.canonical.rsplit('.').next().unwrap_or("");
        let has_read_verb = last.split(is_separator).any(|word| {
            terms
                .read_verbs
                .iter()
                .any(|v| word == v || word.strip_suffix('s').is_some_and(|stem| stem == v))
        });
        has_read_verb
            && !terms
                .write_verbs
                .iter()
                .any(|v| self.glued.contains(v.as_str()))
    }
}
