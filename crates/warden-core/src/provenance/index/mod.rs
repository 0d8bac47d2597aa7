//! The [`SourceIndex`]: keyed fingerprints of everything a session has seen,
//! per field, in order, and the search that answers "does this value occur
//! whole in that field".

use std::borrow::Cow;

use serde_json::{Number, Value};
use smallvec::SmallVec;

use super::fingerprint::{FingerprintKey, Scheme, Stream};
use super::normalise::{
    caseless_tokens, each_skeleton_token, each_token, exact_tokens, is_invisible, nfc,
    skeleton_tokens,
};
use super::path::{Concrete, cut, render};
use super::rules::{MatchMode, OutputTrust};
use super::{IndexError, Origin, OriginHit, SourceId, SourceKind, ValueProvenance};
use crate::ids::{ActionName, AgentId};

mod codec;
pub use codec::IndexMark;

/// Values with fewer alphanumeric characters than this are *short*: they
/// are vouched for only by a whole-field match, never by occurring inside
/// a longer field.
pub const MIN_SIGNIFICANT_CHARS: usize = 3;
/// Deepest nesting of a recorded value that is indexed; anything deeper is
/// recorded as unsearchable.
pub const MAX_RECORD_DEPTH: usize = 64;
/// Most origin hits kept in one [`ValueProvenance`] (the first per origin
/// and memory owner, in recording order).
pub const MAX_HITS: usize = 8;

/// Bounds on what one index records. Over a bound, the index keeps going
/// but what does not fit is *unsearchable*: it can vouch for nothing, and
/// the index reports that it holds unsearchable content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexLimits {
    /// Most bytes of recorded leaf text (UTF-8), all sources together.
    pub max_bytes: u64,
    /// Most fields (recorded leaves), all sources together.
    pub max_fields: u32,
    /// Most sources remembered by id.
    pub max_sources: u32,
}

impl Default for IndexLimits {
    fn default() -> Self {
        Self {
            max_bytes: 1024 * 1024,
            max_fields: 65_536,
            max_sources: 4_096,
        }
    }
}

/// What one recording did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordOutcome {
    /// Fields indexed.
    pub fields_indexed: u32,
    /// Fields (or subtrees too deep to walk) recorded as unsearchable.
    pub fields_unsearchable: u32,
    /// Bytes of leaf text in the unsearchable fields.
    pub bytes_unsearchable: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Source {
    id: SourceId,
    kind: SourceKind,
    unsearchable_fields: u32,
    unsearchable_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    source: u32,
    path: Box<str>,
    origin: Origin,
    /// Empty for untrusted fields (their caseless stream is searched).
    exact: Vec<u64>,
    caseless: Vec<u64>,
    /// Empty for untrusted fields (no look-alike check against them).
    skeleton: Vec<u64>,
}

impl Field {
    fn stream(&self, stream: Stream) -> &[u64] {
        match stream {
            Stream::Exact => &self.exact,
            Stream::Skeleton => &self.skeleton,
            Stream::Caseless | Stream::KeyCheck => &self.caseless,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Posting {
    fp: u64,
    field: u32,
    pos: u32,
}

/// The recorded sources of one session, as keyed fingerprints of
/// normalised tokens per field. See the module docs of [`super`] for the
/// matching rules.
#[derive(Debug, Clone)]
pub struct SourceIndex {
    key: FingerprintKey,
    /// How its fingerprints are computed (the version it encodes as).
    scheme: Scheme,
    limits: IndexLimits,
    sources: Vec<Source>,
    fields: Vec<Field>,
    recorded_bytes: u64,
    /// Sources past `max_sources` (not remembered by id).
    forgotten_sources: u32,
    /// A bound was reached: everything recorded since is unsearchable.
    overflowed: bool,
    exact_postings: Vec<Posting>,
    caseless_postings: Vec<Posting>,
    skeleton_postings: Vec<Posting>,
}

impl PartialEq for SourceIndex {
    /// Same recorded state under the same key.
    fn eq(&self, other: &Self) -> bool {
        self.scheme == other.scheme
            && self.key.check_value(self.scheme) == other.key.check_value(other.scheme)
            && self.limits == other.limits
            && self.sources == other.sources
            && self.fields == other.fields
            && self.recorded_bytes == other.recorded_bytes
            && self.forgotten_sources == other.forgotten_sources
            && self.overflowed == other.overflowed
    }
}

/// A leaf of a recorded value, before fingerprinting.
struct Leaf {
    path: String,
    origin: Origin,
    text: String,
}

/// The text a JSON number is matched as: integers in decimal, floats in
/// their shortest round-trip decimal form without exponent (so `1e2` is
/// `100`); [`super::normalise::canonical_number`] then drops trailing zeros.
pub(crate) fn number_text(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        n.as_f64().map(|f| f.to_string()).unwrap_or_default()
    }
}

/// The matchable text of a scalar, `None` for arrays and objects.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(number_text(n)),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("null".to_owned()),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// Fingerprints of one needle's tokens: most values have few.
type Prints = SmallVec<[u64; 8]>;

/// Fields a search found: most values occur in few.
type Found = SmallVec<[u32; 8]>;

/// A value prepared for search.
pub(crate) struct Needle<'v> {
    /// The text, for the skeleton, which is computed only when needed.
    text: Cow<'v, str>,
    exact: Prints,
    caseless: Prints,
    /// Only whole-field matches count.
    short: bool,
    /// The value holds default-ignorable or bidi-control characters.
    invisible: bool,
}

impl SourceIndex {
    /// An empty index with default limits.
    pub fn new(key: FingerprintKey) -> Self {
        Self::with_limits(key, IndexLimits::default())
    }

    /// An empty index with the given limits.
    pub fn with_limits(key: FingerprintKey, limits: IndexLimits) -> Self {
        Self::with_scheme(key, limits, Scheme::SipHash)
    }

    /// An empty index fingerprinting under `scheme`.
    pub(crate) fn with_scheme(key: FingerprintKey, limits: IndexLimits, scheme: Scheme) -> Self {
        Self {
            key,
            scheme,
            limits,
            sources: Vec::new(),
            fields: Vec::new(),
            recorded_bytes: 0,
            forgotten_sources: 0,
            overflowed: false,
            exact_postings: Vec::new(),
            caseless_postings: Vec::new(),
            skeleton_postings: Vec::new(),
        }
    }

    /// The limits it was built with.
    pub fn limits(&self) -> IndexLimits {
        self.limits
    }

    /// Bytes of leaf text indexed so far.
    pub fn recorded_bytes(&self) -> u64 {
        self.recorded_bytes
    }

    /// Number of sources remembered by id.
    pub fn source_count(&self) -> usize {
        self.sources.len()
    }

    /// Number of indexed fields.
    pub fn field_count(&self) -> usize {
        self.fields.len()
    }

    /// Whether anything recorded could not be indexed (over a bound or too
    /// deep). Such content vouches for nothing.
    pub fn has_unsearchable(&self) -> bool {
        self.overflowed
            || self.forgotten_sources > 0
            || self.sources.iter().any(|s| s.unsearchable_fields > 0)
    }

    /// Record the session's trusted inputs (origin `user`).
    pub fn record_user(
        &mut self,
        id: SourceId,
        value: &Value,
    ) -> Result<RecordOutcome, IndexError> {
        self.record(id, SourceKind::User, value, |_| Origin::User)
    }

    /// Record the admitted plan's literals (origin `plan`).
    pub fn record_plan(
        &mut self,
        id: SourceId,
        value: &Value,
    ) -> Result<RecordOutcome, IndexError> {
        self.record(id, SourceKind::Plan, value, |_| Origin::Plan)
    }

    /// Record a memory value the session resolved (origin `memory`, with
    /// its owner).
    pub fn record_memory(
        &mut self,
        id: SourceId,
        owner: AgentId,
        value: &Value,
    ) -> Result<RecordOutcome, IndexError> {
        self.record(id, SourceKind::Memory { owner }, value, |_| Origin::Memory)
    }

    /// Record an action's result, each field `trusted` or `untrusted` as
    /// `trust` (the action's compiled output trust) says. For an action the
    /// catalogue does not know, pass [`OutputTrust::untrusted`]. The trust is
    /// fixed at recording: a later policy never upgrades what was recorded.
    pub fn record_result(
        &mut self,
        id: SourceId,
        action: ActionName,
        trust: &OutputTrust,
        value: &Value,
    ) -> Result<RecordOutcome, IndexError> {
        self.record(id, SourceKind::Result { action }, value, |path| {
            trust.origin_of(path)
        })
    }

    fn record(
        &mut self,
        id: SourceId,
        kind: SourceKind,
        value: &Value,
        origin_of: impl Fn(&[Concrete<'_>]) -> Origin,
    ) -> Result<RecordOutcome, IndexError> {
        if self.sources.iter().any(|s| s.id == id) {
            return Err(IndexError::DuplicateSource { id: id.to_string() });
        }
        let mut leaves = Vec::new();
        let mut too_deep = 0u32;
        walk(
            value,
            &mut Vec::new(),
            &origin_of,
            &mut leaves,
            &mut too_deep,
        );
        let mut outcome = RecordOutcome {
            fields_unsearchable: too_deep,
            ..RecordOutcome::default()
        };
        if u32::try_from(self.sources.len()).map_or(true, |n| n >= self.limits.max_sources) {
            self.forgotten_sources = self.forgotten_sources.saturating_add(1);
            self.overflowed = true;
            outcome.fields_unsearchable = outcome
                .fields_unsearchable
                .saturating_add(u32::try_from(leaves.len()).unwrap_or(u32::MAX));
            outcome.bytes_unsearchable = leaves.iter().map(|l| l.text.len() as u64).sum();
            return Ok(outcome);
        }
        let source = u32::try_from(self.sources.len()).unwrap_or(u32::MAX);
        let first_new = self.fields.len();
        for leaf in leaves {
            let bytes = leaf.text.len() as u64;
            let fits = !self.overflowed
                && self.recorded_bytes.saturating_add(bytes) <= self.limits.max_bytes
                && u32::try_from(self.fields.len()).is_ok_and(|n| n < self.limits.max_fields);
            if !fits {
                self.overflowed = true;
                outcome.fields_unsearchable = outcome.fields_unsearchable.saturating_add(1);
                outcome.bytes_unsearchable = outcome.bytes_unsearchable.saturating_add(bytes);
                continue;
            }
            self.recorded_bytes += bytes;
            outcome.fields_indexed += 1;
            let field = self.fingerprint_field(source, leaf);
            self.fields.push(field);
        }
        self.sources.push(Source {
            id,
            kind,
            unsearchable_fields: outcome.fields_unsearchable,
            unsearchable_bytes: outcome.bytes_unsearchable,
        });
        self.add_postings(first_new);
        Ok(outcome)
    }

    fn fingerprint_field(&self, source: u32, leaf: Leaf) -> Field {
        let exact = exact_tokens(&leaf.text);
        let caseless = caseless_tokens(&exact);
        let vouching = leaf.origin != Origin::Untrusted;
        let fp = |stream, tokens: &[String]| -> Vec<u64> {
            tokens
                .iter()
                .map(|t| self.key.fingerprint(self.scheme, stream, t))
                .collect()
        };
        Field {
            source,
            path: leaf.path.into_boxed_str(),
            origin: leaf.origin,
            exact: if vouching {
                fp(Stream::Exact, &exact)
            } else {
                Vec::new()
            },
            caseless: fp(Stream::Caseless, &caseless),
            skeleton: if vouching {
                fp(Stream::Skeleton, &skeleton_tokens(&leaf.text))
            } else {
                Vec::new()
            },
        }
    }

    /// Add the postings of fields `first..`, keeping each list sorted: the
    /// new postings are sorted on their own and merged in, so recording
    /// costs linear time in the index, not a full re-sort.
    fn add_postings(&mut self, first: usize) {
        for stream in [Stream::Exact, Stream::Caseless, Stream::Skeleton] {
            let mut new = Vec::new();
            for (i, field) in self.fields.iter().enumerate().skip(first) {
                let Ok(f) = u32::try_from(i) else { break };
                for (pos, fp) in field.stream(stream).iter().enumerate() {
                    new.push(Posting {
                        fp: *fp,
                        field: f,
                        pos: u32::try_from(pos).unwrap_or(u32::MAX),
                    });
                }
            }
            if new.is_empty() {
                continue;
            }
            new.sort_unstable();
            let list = match stream {
                Stream::Exact => &mut self.exact_postings,
                Stream::Skeleton => &mut self.skeleton_postings,
                Stream::Caseless | Stream::KeyCheck => &mut self.caseless_postings,
            };
            *list = merge(std::mem::take(list), new);
        }
    }

    /// Prepare a scalar value for search; `None` for arrays and objects.
    /// The exact tokens (NFC, canonical numbers) and their lowercase forms
    /// are fingerprinted as they are found, as [`exact_tokens`] and
    /// [`caseless_tokens`] would give them.
    pub(crate) fn needle<'v>(&self, value: &'v Value, mode: MatchMode) -> Option<Needle<'v>> {
        let text: Cow<'v, str> = match value {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            other => Cow::Owned(scalar_text(other)?),
        };
        let mut exact = Prints::new();
        let mut caseless = Prints::new();
        let mut significant = 0usize;
        let mut lower = String::new();
        each_token(&nfc(&text), |t| {
            significant += if t.is_ascii() {
                t.bytes().filter(u8::is_ascii_alphanumeric).count()
            } else {
                t.chars().filter(|c| c.is_alphanumeric()).count()
            };
            if mode == MatchMode::Text {
                exact.push(self.key.fingerprint(self.scheme, Stream::Exact, t));
            }
            let folded = if t.is_ascii() {
                if t.bytes().any(|b| b.is_ascii_uppercase()) {
                    lower.clear();
                    // One buffer for every token of the value.
                    lower.reserve(text.len());
                    lower.push_str(t);
                    lower.make_ascii_lowercase();
                    lower.as_str()
                } else {
                    t
                }
            } else {
                lower = t.to_lowercase();
                lower.as_str()
            };
            caseless.push(self.key.fingerprint(self.scheme, Stream::Caseless, folded));
        });
        let short =
            matches!(value, Value::Bool(_) | Value::Null) || significant < MIN_SIGNIFICANT_CHARS;
        Some(Needle {
            exact,
            caseless,
            short,
            invisible: !text.is_ascii() && text.chars().any(is_invisible),
            text,
        })
    }

    /// The needle's skeleton fingerprints.
    fn skeleton(&self, needle: &Needle<'_>) -> Prints {
        let mut out = Prints::new();
        each_skeleton_token(&needle.text, |t| {
            out.push(self.key.fingerprint(self.scheme, Stream::Skeleton, t));
        });
        out
    }

    fn postings(&self, stream: Stream) -> &[Posting] {
        match stream {
            Stream::Exact => &self.exact_postings,
            Stream::Skeleton => &self.skeleton_postings,
            Stream::Caseless | Stream::KeyCheck => &self.caseless_postings,
        }
    }

    /// Fields (sorted, unique) in which `tokens` occur as a whole run (or,
    /// for a short value, as the whole field), searching `stream`'s
    /// postings and keeping fields that `keep` accepts.
    fn find(
        &self,
        stream: Stream,
        tokens: &[u64],
        short: bool,
        keep: impl Fn(&Field) -> bool,
        out: &mut Found,
    ) {
        let Some(first) = tokens.first() else {
            return;
        };
        let postings = self.postings(stream);
        let start = postings.partition_point(|p| p.fp < *first);
        let mut last = None;
        for p in postings.get(start..).unwrap_or(&[]) {
            if p.fp != *first {
                break;
            }
            if last == Some(p.field) {
                continue;
            }
            let Some(field) = self.fields.get(p.field as usize) else {
                continue;
            };
            if !keep(field) {
                continue;
            }
            let stream_tokens = field.stream(stream);
            if short && (p.pos != 0 || stream_tokens.len() != tokens.len()) {
                continue;
            }
            let pos = p.pos as usize;
            if stream_tokens.get(pos..pos + tokens.len()) == Some(tokens) {
                out.push(p.field);
                last = Some(p.field);
            }
        }
    }

    fn hit(&self, field: u32) -> Option<(OriginHit, Option<&AgentId>)> {
        let f = self.fields.get(field as usize)?;
        let source = self.sources.get(f.source as usize)?;
        let owner = match &source.kind {
            SourceKind::Memory { owner } => Some(owner),
            _ => None,
        };
        Some((
            OriginHit {
                origin: f.origin,
                source: source.id.clone(),
                field: String::from(&*f.path),
                owner: owner.cloned(),
            },
            owner,
        ))
    }

    /// The first field of the source `source` in which the scalar `value`
    /// occurs whole, by the matching rules of [`SourceIndex::provenance`]
    /// (token runs within one field; a short value only as a whole field).
    /// Fields of a vouching origin are compared as `mode` says, untrusted
    /// fields caselessly (the only form they keep). Any origin counts: this
    /// answers "is the value in that call's result", not "is it vouched".
    /// `None` for a source never recorded or recorded past the index's
    /// bounds (what was not indexed holds nothing), and for arrays and
    /// objects.
    pub fn occurrence_in(
        &self,
        source: &SourceId,
        value: &Value,
        mode: MatchMode,
    ) -> Option<OriginHit> {
        let at = self.sources.iter().position(|s| &s.id == source)?;
        let at = u32::try_from(at).ok()?;
        let needle = self.needle(value, mode)?;
        let mut fields = Found::new();
        let vouching = |f: &Field| f.source == at && f.origin != Origin::Untrusted;
        match mode {
            MatchMode::Text => self.find(
                Stream::Exact,
                &needle.exact,
                needle.short,
                vouching,
                &mut fields,
            ),
            MatchMode::Caseless => self.find(
                Stream::Caseless,
                &needle.caseless,
                needle.short,
                vouching,
                &mut fields,
            ),
        }
        self.find(
            Stream::Caseless,
            &needle.caseless,
            needle.short,
            |f| f.source == at && f.origin == Origin::Untrusted,
            &mut fields,
        );
        let first = fields.into_iter().min()?;
        self.hit(first).map(|(h, _)| h)
    }

    /// Whether the scalar `value` occurs whole in the source `source`: see
    /// [`SourceIndex::occurrence_in`].
    pub fn occurs_in(&self, source: &SourceId, value: &Value, mode: MatchMode) -> bool {
        self.occurrence_in(source, value, mode).is_some()
    }

    /// Where a scalar value occurs: every origin, the first hit per origin
    /// (and memory owner), whether it is short, whether it carries invisible
    /// characters, and, when no vouching source holds it even caselessly,
    /// the first vouching source that holds a look-alike (same TR39
    /// skeleton). `path` is the concrete argument path, for the report.
    ///
    /// `mode` picks the comparison for vouching fields: [`MatchMode::Text`]
    /// is case-sensitive, [`MatchMode::Caseless`] folds case. Untrusted
    /// fields are always compared caselessly (a superset: it can only add
    /// the `untrusted` origin, which vouches for nothing a rule guards).
    pub fn provenance(&self, path: String, value: &Value, mode: MatchMode) -> ValueProvenance {
        let path = cut(path, super::path::MAX_CONCRETE_PATH_LEN);
        let Some(needle) = self.needle(value, mode) else {
            return ValueProvenance::nowhere(path, self.has_unsearchable());
        };
        let vouching = |f: &Field| f.origin != Origin::Untrusted;
        let mut fields = Found::new();
        match mode {
            MatchMode::Text => self.find(
                Stream::Exact,
                &needle.exact,
                needle.short,
                vouching,
                &mut fields,
            ),
            MatchMode::Caseless => self.find(
                Stream::Caseless,
                &needle.caseless,
                needle.short,
                vouching,
                &mut fields,
            ),
        }
        self.find(
            Stream::Caseless,
            &needle.caseless,
            needle.short,
            |f| f.origin == Origin::Untrusted,
            &mut fields,
        );
        fields.sort_unstable();
        fields.dedup();

        // At most one entry per origin (six of them) and `MAX_HITS` hits:
        // sized once, never grown.
        let mut origins: Vec<Origin> = Vec::with_capacity(fields.len().clamp(1, 6));
        let mut hits: Vec<OriginHit> = Vec::with_capacity(fields.len().min(MAX_HITS));
        for &f in &fields {
            let Some((hit, _)) = self.hit(f) else {
                continue;
            };
            if !origins.contains(&hit.origin) {
                origins.push(hit.origin);
            }
            let seen = hits
                .iter()
                .any(|h| h.origin == hit.origin && h.owner == hit.owner);
            if !seen && hits.len() < MAX_HITS {
                hits.push(hit);
            }
        }
        origins.sort_unstable();

        let mut confusable_with = None;
        if !origins.iter().any(|o| o.vouches()) {
            // A case variant of a vouching source is not a look-alike: it is
            // unvouched under `text`, nothing more.
            let mut caseless = Found::new();
            self.find(
                Stream::Caseless,
                &needle.caseless,
                needle.short,
                vouching,
                &mut caseless,
            );
            if caseless.is_empty() {
                let mut look_alikes = Found::new();
                self.find(
                    Stream::Skeleton,
                    &self.skeleton(&needle),
                    needle.short,
                    vouching,
                    &mut look_alikes,
                );
                look_alikes.sort_unstable();
                confusable_with = look_alikes
                    .first()
                    .and_then(|f| self.hit(*f))
                    .map(|(h, _)| h);
            }
        }
        if origins.is_empty() {
            origins.push(Origin::None);
        }
        ValueProvenance {
            path,
            origins,
            hits,
            short: needle.short,
            invisible: needle.invisible,
            confusable_with,
            unsearchable_content: self.has_unsearchable(),
            vouched: false,
            embedded: None,
        }
    }
}

/// Merge two sorted posting lists.
fn merge(a: Vec<Posting>, b: Vec<Posting>) -> Vec<Posting> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let mut a = a.into_iter().peekable();
    let mut b = b.into_iter().peekable();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => {
                if x <= y {
                    a.next()
                } else {
                    b.next()
                }
            }
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        out.extend(next);
    }
    out
}

/// Walk a recorded value: every scalar leaf becomes a field with its
/// concrete path and origin; subtrees deeper than [`MAX_RECORD_DEPTH`] are
/// counted in `too_deep` instead.
fn walk<'a>(
    value: &'a Value,
    path: &mut Vec<Concrete<'a>>,
    origin_of: &impl Fn(&[Concrete<'_>]) -> Origin,
    out: &mut Vec<Leaf>,
    too_deep: &mut u32,
) {
    if path.len() > MAX_RECORD_DEPTH {
        *too_deep = too_deep.saturating_add(1);
        return;
    }
    match value {
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(Concrete::Index(i));
                walk(v, path, origin_of, out, too_deep);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                path.push(Concrete::Key(k));
                walk(v, path, origin_of, out, too_deep);
                path.pop();
            }
        }
        scalar => {
            if let Some(text) = scalar_text(scalar) {
                out.push(Leaf {
                    path: render(path),
                    origin: origin_of(path),
                    text,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::normalise::significant_chars;
    use super::*;

    fn reference(
        index: &SourceIndex,
        value: &Value,
        mode: MatchMode,
    ) -> (Vec<u64>, Vec<u64>, bool) {
        let text = scalar_text(value).unwrap_or_default();
        let exact = exact_tokens(&text);
        let fp = |stream, tokens: &[String]| -> Vec<u64> {
            tokens
                .iter()
                .map(|t| index.key.fingerprint(index.scheme, stream, t))
                .collect()
        };
        let short = matches!(value, Value::Bool(_) | Value::Null)
            || significant_chars(&exact) < MIN_SIGNIFICANT_CHARS;
        let exact_fp = match mode {
            MatchMode::Text => fp(Stream::Exact, &exact),
            MatchMode::Caseless => Vec::new(),
        };
        (
            exact_fp,
            fp(Stream::Caseless, &caseless_tokens(&exact)),
            short,
        )
    }

    proptest! {
        /// The needle fingerprints, as it finds them, exactly the tokens
        /// the recording side keeps ([`exact_tokens`], [`caseless_tokens`]),
        /// whatever the script, case, numbers or invisible characters.
        #[test]
        fn the_needle_is_the_recorded_tokens(
            text in "([ -~]|[\\u{80}-\\u{3ff}]|[\\u{1e9e}\\u{130}\\u{1c5}\\u{200b}\\u{ff21}-\\u{ff3a}])*",
            number in any::<f64>(),
        ) {
            let index = SourceIndex::new(FingerprintKey::new(&[3; 32]).unwrap());
            for value in [json!(text), json!(number), json!(true), Value::Null] {
                for mode in [MatchMode::Text, MatchMode::Caseless] {
                    let Some(n) = index.needle(&value, mode) else { continue };
                    let (exact, caseless, short) = reference(&index, &value, mode);
                    prop_assert_eq!(n.exact.as_slice(), exact.as_slice());
                    prop_assert_eq!(n.caseless.as_slice(), caseless.as_slice());
                    prop_assert_eq!(n.short, short);
                    let text = scalar_text(&value).unwrap_or_default();
                    prop_assert_eq!(n.invisible, text.chars().any(is_invisible));
                }
            }
        }
    }
}
