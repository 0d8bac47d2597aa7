//! Value provenance: where an argument value came from, decided from values
//! alone.
//!
//! Warden sits outside the model and sees values: the session's trusted
//! inputs, every tool result it recorded, memory it resolved, the admitted
//! plan, and each proposed call's arguments. An attacker who steers the
//! model through text inside a tool result must get their value (an
//! account, an address, a URL) from somewhere: it occurs in their text.
//! This module answers "does this value occur, whole, in a source the rule
//! accepts", deterministically and without keeping the text.
//!
//! # Origins
//!
//! [`Origin`]: `user` (the session's trusted inputs), `trusted` /
//! `untrusted` (an action's result fields, by the trust the catalogue
//! declares under `output:`; an action without a declaration, or unknown to
//! the catalogue, is `untrusted`: unknown fails closed), `memory` (records
//! the session resolved, with their owner), `plan` (literals of the admitted
//! plan), `none` (occurs nowhere: composed by the model). The trust of a
//! result field is fixed when it is recorded, so a later policy cannot
//! upgrade content recorded under an earlier one.
//!
//! # Sources and fields
//!
//! A recorded value is walked; every scalar leaf (string, number, boolean,
//! null) is a *field* of its own with its JSON path (`[3].recipient`, `$`
//! for a bare string), so trust can be per field and a match can never
//! span two fields. Each field keeps, in order, keyed 64-bit fingerprints
//! (SipHash-2-4 under 128 bits derived from a key the caller passes in:
//! [`FingerprintKey`]; an index encoded by version 1 keeps HMAC-SHA-256)
//! of its normalised tokens, never the text. The
//! [`SourceIndex`] serialises to bytes ([`SourceIndex::to_bytes`]) so a
//! store can persist it; restoring needs the same key, and a restored index
//! answers exactly as the original did. What one recording added encodes on
//! its own ([`SourceIndex::delta_since`]): the encoding followed by its
//! deltas, in order, restores the same index, so a store appends a delta
//! per recorded result instead of rewriting the whole index.
//!
//! # Normalisation
//!
//! Both sides (recorded text and argument value) go through the same steps
//! and are compared as token sequences:
//!
//! 1. Unicode NFC (canonically equivalent text is the same text).
//! 2. Tokens: a maximal run of word characters (letters, digits and
//!    combining marks, so no script is cut inside a word), a decimal number
//!    (`98.70`), or any other single non-whitespace character (`@`, `.`,
//!    `-`, `/`, `(`). Whitespace only separates, so runs of whitespace
//!    collapse and spacing next to punctuation does not matter
//!    (`(www.example.com).` holds the run `www . example . com`). A word is
//!    never cut: `evil.com` does not occur in `notevil.com`, `US1330000`
//!    does not occur in `US13300000012`; but a run of whole tokens inside a
//!    longer word does (`gmail.com` occurs in `dora@gmail.com`).
//! 3. Numbers: a token of the form `[0-9]+(.[0-9]+)?` is put in canonical
//!    decimal form (no trailing fractional zeros; a sign is a token of its
//!    own): `100`, `100.0` and `100.00` are one value; `98.70` matches the
//!    JSON number `98.7`. Leading zeros are kept (`007` is an identifier).
//!    A JSON number argument is written in its shortest decimal form without
//!    exponent, so the JSON `1e2` is `100`; the text `1e2` and `1,000` are
//!    not numbers and only match themselves.
//! 4. Case: per rule (`match:`). `text`, the default, is case-sensitive
//!    (paths, passwords, case-sensitive identifiers). `caseless` folds case
//!    (Unicode lowercase mapping) on both sides: for emails (providers treat
//!    the local part without case; an attacker would need to own a case
//!    variant at the same provider), host names and URLs, IBANs, and
//!    identifiers the target system compares without case. Untrusted fields
//!    are always compared caselessly: that can only add the `untrusted`
//!    origin, which vouches for nothing a rule guards.
//!
//! Invisible characters (Unicode Default_Ignorable_Code_Point, which
//! includes every bidi control, zero-width characters, the soft hyphen,
//! variation selectors and tags) are *kept* (each is a token of its own): a
//! value with an inserted zero-width space is a different value, and the
//! tool would receive bytes no vouching source displayed. Compatibility forms
//! (fullwidth letters, ligatures) are likewise not folded for vouching.
//!
//! # Look-alikes
//!
//! A second, lossy comparison detects look-alikes: NFKC, invisible
//! characters removed, the IDNA full stop `。` read as `.`, lowercased, then
//! the Unicode TR39 confusable skeleton. It never vouches for anything. When a value is not vouched for
//! by any `user`, `trusted`, `memory` or `plan` field (not even caselessly)
//! but its skeleton occurs in one, it is a look-alike of a vouched value
//! (Cyrillic `а` for Latin `a`, fullwidth letters, an inserted zero-width
//! or bidi character): the report names the source it imitates
//! ([`ValueProvenance::confusable_with`]) and a rule accepting that origin
//! denies the call (`argument_confusable:<path>`) instead of escalating.
//! The direction matters: vouching needs the exact form, so an attacker's
//! look-alike is never vouched for by the genuine value; and the genuine
//! value is vouched for only by a source that holds it exactly.
//!
//! # Occurrence
//!
//! A value occurs in a field when its token sequence is a contiguous run of
//! that field's tokens. It must occur whole in one field of one source:
//! parts found in two fields or two sources vouch for nothing.
//!
//! *Short values* — fewer than [`MIN_SIGNIFICANT_CHARS`] (3) alphanumeric
//! characters (`7`, `42`, `ok`, `4.0`), and every boolean and null — occur
//! everywhere in free text. They are vouched for only by a *whole-field*
//! match: a structured field (or a trusted input or plan literal) whose
//! entire content is that value, like `{"id": 7}` in a trusted result.
//! Never by occurring inside a longer text.
//!
//! # Embedded targets
//!
//! A rule with `within: urls | emails | hosts` checks, instead of the whole
//! value, each URL, email address or host name found inside the value's
//! text (a message body that carries a link names a target too): each one
//! whole, by the rules above, as a value of its own at the argument's path
//! ([`ValueProvenance::embedded`] says where it lies). Host names and
//! addresses are compared caselessly whatever `match:` says. Targets are
//! found through a folded view (NFKC, lowercase, IDNA dots, invisible
//! characters skipped) but checked in their original form, so a disguised
//! or zero-width-split link is found whole and is then a look-alike, never
//! the genuine link; and a link is never cut into a vouched prefix. A value
//! with no target passes the rule. What exactly is found:
//! [`embedded_targets`].
//!
//! # Bounds
//!
//! [`IndexLimits`] bounds the recorded bytes, fields and sources. Past a
//! bound the recording is accepted but what does not fit (and everything
//! recorded after it) is *unsearchable*: it vouches for nothing, and every
//! report says the index holds unsearchable content. A value from it is
//! then `none` (or `untrusted` if it also occurs elsewhere), so a rule
//! escalates or denies: overflowing the index never vouches for anything.
//!
//! # The gate
//!
//! [`ActionProvenance::decide`] checks an action's rules against a call's
//! arguments and the session's [`SourceIndex`] and returns a
//! [`ProvenanceDecision`]: `allow`, `escalate` or `deny`, stable reasons
//! (`argument_not_vouched:<path>`, `argument_confusable:<path>`,
//! `argument_wrong_type:<path>`, `argument_too_many_values:<argument>`,
//! `arguments_vouched`) and per argument the provenance found (per value:
//! its path, origins, the first source field per origin, whether the rule
//! vouched for it, the look-alike it imitates). An absent argument passes:
//! the schema decides whether it may be absent, and no value of it reaches
//! the tool. [`ActionProvenance::decide_except`] exempts given paths (the
//! literal positions of an admitted plan, which the plan vouches for);
//! [`SourceIndex::occurs_in`] answers whether a value occurs in one given
//! source (the result of one particular call).

mod embedded;
mod fingerprint;
mod index;
pub(crate) mod normalise;
mod path;
mod rules;

#[cfg(test)]
mod agentdojo;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod within_tests;

use std::fmt;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{ActionName, AgentId, IdentifierError, check_identifier};

pub use embedded::{EmbeddedTarget, Within, embedded_targets};
pub use fingerprint::{FingerprintKey, MAX_KEY_LEN, MIN_KEY_LEN};
pub use index::{
    IndexLimits, IndexMark, MAX_HITS, MAX_RECORD_DEPTH, MIN_SIGNIFICANT_CHARS, RecordOutcome,
    SourceIndex,
};
pub use normalise::canonical_number;
pub use path::{MAX_CONCRETE_PATH_LEN, MAX_PATH_LEN, ValuePath};
pub use rules::{
    ActionProvenance, ArgumentProvenance, MAX_VALUES_PER_CALL, MatchMode, Otherwise, OutputSpec,
    OutputTrust, ProvenanceDecision, ProvenanceRule, ProvenanceRuleSpec, ProvenanceSpecError,
    Trust,
};

/// Reason codes of the provenance gate; parameters are argument paths,
/// never values.
pub mod reasons {
    use crate::decision::Reason;

    /// Prefix: no accepted origin vouches for the value at this path.
    pub const ARGUMENT_NOT_VOUCHED: &str = "argument_not_vouched";
    /// Prefix: the value at this path is a look-alike of a vouched value.
    pub const ARGUMENT_CONFUSABLE: &str = "argument_confusable";
    /// Prefix: the arguments' structure does not fit the rule's path here.
    pub const ARGUMENT_WRONG_TYPE: &str = "argument_wrong_type";
    /// Prefix: more values than [`super::MAX_VALUES_PER_CALL`].
    pub const ARGUMENT_TOO_MANY_VALUES: &str = "argument_too_many_values";
    /// Every value under every rule is vouched for.
    pub const ARGUMENTS_VOUCHED: Reason = Reason::code("arguments_vouched");
}

/// Where a value occurs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The session's trusted inputs (the user's request, values the
    /// runtime vouches for).
    User,
    /// A result field of an action declared trusted.
    Trusted,
    /// A result field of an action not declared trusted (or unknown).
    Untrusted,
    /// A memory record the session resolved.
    Memory,
    /// A literal of the admitted plan.
    Plan,
    /// Nowhere: composed by the model.
    None,
}

impl Origin {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::User => "user",
            Origin::Trusted => "trusted",
            Origin::Untrusted => "untrusted",
            Origin::Memory => "memory",
            Origin::Plan => "plan",
            Origin::None => "none",
        }
    }

    /// Whether a source of this origin can vouch for a value under some
    /// rule (everything but `untrusted` and `none`).
    pub fn vouches(self) -> bool {
        matches!(
            self,
            Origin::User | Origin::Trusted | Origin::Memory | Origin::Plan
        )
    }

    fn describe(self) -> &'static str {
        match self {
            Origin::User => "the user's trusted inputs",
            Origin::Trusted => "a trusted result",
            Origin::Untrusted => "an untrusted result",
            Origin::Memory => "resolved memory",
            Origin::Plan => "a plan literal",
            Origin::None => "nowhere",
        }
    }

    fn code(self) -> u8 {
        match self {
            Origin::User => 0,
            Origin::Trusted => 1,
            Origin::Untrusted => 2,
            Origin::Memory => 3,
            Origin::Plan => 4,
            Origin::None => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        [
            Origin::User,
            Origin::Trusted,
            Origin::Untrusted,
            Origin::Memory,
            Origin::Plan,
        ]
        .into_iter()
        .find(|o| o.code() == code)
    }
}

/// A set of origins (a value's, or the origins a restriction names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OriginSet(u8);

impl OriginSet {
    /// No origin.
    pub const EMPTY: OriginSet = OriginSet(0);

    /// The set of `origins`.
    pub fn of(origins: &[Origin]) -> Self {
        let mut s = Self::EMPTY;
        for o in origins {
            s.insert(*o);
        }
        s
    }

    /// Add `o`.
    pub fn insert(&mut self, o: Origin) {
        self.0 |= 1 << o.code();
    }

    /// Whether `o` is in the set.
    pub fn contains(self, o: Origin) -> bool {
        self.0 & (1 << o.code()) != 0
    }

    /// Whether every origin of `self` is in `other`.
    pub fn is_subset(self, other: OriginSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The id of a recorded source: a call id, `prompt`, `plan`,
/// `memory:ns.key`; an identifier (1-128 bytes of `[A-Za-z0-9._:-]`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(Arc<str>);

impl SourceId {
    /// Parse `s`, rejecting anything that is not a valid identifier.
    pub fn parse(s: &str) -> Result<Self, IdentifierError> {
        check_identifier(s)?;
        Ok(Self(Arc::from(s)))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceId({})", self.0)
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for SourceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SourceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What a recorded source is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// The session's trusted inputs.
    User,
    /// The admitted plan's literals.
    Plan,
    /// A resolved memory record.
    Memory {
        /// Its owner.
        owner: AgentId,
    },
    /// An action's result.
    Result {
        /// The action that produced it.
        action: ActionName,
    },
}

/// Why an index operation was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The fingerprint key is too short or too long.
    #[error("fingerprint key is {len} bytes, expected {MIN_KEY_LEN} to {MAX_KEY_LEN}")]
    KeyLength {
        /// Its length.
        len: usize,
    },
    /// A source with this id is already recorded.
    #[error("source `{id}` is already recorded")]
    DuplicateSource {
        /// The id.
        id: String,
    },
    /// Serialised bytes made with another key.
    #[error("the index was built with another fingerprint key")]
    WrongKey,
    /// Serialised bytes that are malformed or inconsistent.
    #[error("serialised index is corrupt: {what}")]
    Corrupt {
        /// What was wrong.
        what: &'static str,
    },
}

/// A source field that holds a value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginHit {
    /// The field's origin.
    pub origin: Origin,
    /// The source (call id, `prompt`, ...).
    pub source: SourceId,
    /// The field's path in the source (`[3].recipient`, `$`).
    pub field: String,
    /// For memory, the record's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<AgentId>,
}

/// Where one argument value occurs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValueProvenance {
    /// The concrete argument path (`recipients[1]`).
    pub path: String,
    /// Every origin that holds the value, sorted; `[none]` if none does.
    pub origins: Vec<Origin>,
    /// The first field per origin (and memory owner) that holds it, in
    /// recording order, at most [`MAX_HITS`].
    pub hits: Vec<OriginHit>,
    /// Short value: only whole-field matches were counted.
    pub short: bool,
    /// The value holds invisible (default-ignorable or bidi-control)
    /// characters.
    pub invisible: bool,
    /// Set when no vouching source holds the value but one holds a
    /// look-alike (same TR39 skeleton): that source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confusable_with: Option<OriginHit>,
    /// The index holds unsearchable content (over its bounds), so `none`
    /// may mean "somewhere unsearchable"; either way nothing there vouches.
    pub unsearchable_content: bool,
    /// Whether an origin the checking rule accepts holds the value. Set by
    /// the gate ([`ActionProvenance::decide`]); always `false` from
    /// [`SourceIndex::provenance`], which knows no rule.
    #[serde(default)]
    pub vouched: bool,
    /// For a target found inside the argument's text (a rule with
    /// `within:`): its kind and where it lies in the argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedded: Option<EmbeddedAt>,
}

/// Where a target checked by a `within:` rule lies inside its argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddedAt {
    /// What kind of target it is.
    pub within: Within,
    /// Byte offset of its first character in the argument's string.
    pub start: usize,
    /// Byte offset just past its last character.
    pub end: usize,
}

impl ValueProvenance {
    fn nowhere(path: String, unsearchable_content: bool) -> Self {
        Self {
            path,
            origins: vec![Origin::None],
            hits: Vec::new(),
            short: false,
            invisible: false,
            confusable_with: None,
            unsearchable_content,
            vouched: false,
            embedded: None,
        }
    }

    /// A value at a literal position of the admitted plan: vouched for by
    /// the plan, not searched.
    fn plan_literal(path: String) -> Self {
        Self {
            path,
            origins: vec![Origin::Plan],
            hits: Vec::new(),
            short: false,
            invisible: false,
            confusable_with: None,
            unsearchable_content: false,
            vouched: true,
            embedded: None,
        }
    }
}
