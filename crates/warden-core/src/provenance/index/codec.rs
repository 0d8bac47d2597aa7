//! The index's binary encoding: versioned, the sources, the fields' paths
//! and origins and their fingerprints, never any text.

use super::*;

/// Where an index stood: how many sources and fields it held. Taken with
/// [`SourceIndex::mark`] before recording; [`SourceIndex::delta_since`]
/// then encodes only what was recorded after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexMark {
    sources: usize,
    fields: usize,
}

impl SourceIndex {
    /// The index as bytes: a versioned binary encoding of the sources, the
    /// fields' paths and origins and their fingerprints, never any text.
    /// Restore with [`SourceIndex::from_bytes`] and the same key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64 + self.fields.len() * 32));
        w.0.extend_from_slice(MAGIC);
        w.u8(self.scheme as u8);
        w.u64(self.key.check_value(self.scheme));
        w.u64(self.limits.max_bytes);
        w.u32(self.limits.max_fields);
        w.u32(self.limits.max_sources);
        self.write_counters(&mut w);
        w.len(self.sources.len());
        for s in &self.sources {
            write_source(&mut w, s);
        }
        w.len(self.fields.len());
        for f in &self.fields {
            write_field(&mut w, f);
        }
        w.0
    }

    /// Where the index stands now (see [`SourceIndex::delta_since`]).
    pub fn mark(&self) -> IndexMark {
        IndexMark {
            sources: self.sources.len(),
            fields: self.fields.len(),
        }
    }

    /// What was recorded since `mark` (taken from this index), as bytes
    /// that extend the encoding of the index at `mark`: the encoding of
    /// the index at `mark` followed by this delta (and the deltas of later
    /// recordings, in order) restores with [`SourceIndex::from_bytes`] to
    /// exactly this index. A delta names the key and the position it
    /// applies at, so one applied to another index, out of order or twice
    /// is refused when restoring. Its size is that of the new sources and
    /// fields, not of the index.
    pub fn delta_since(&self, mark: IndexMark) -> Vec<u8> {
        let sources = self.sources.get(mark.sources..).unwrap_or_default();
        let fields = self.fields.get(mark.fields..).unwrap_or_default();
        let mut w = Writer(Vec::with_capacity(48 + fields.len() * 32));
        w.0.extend_from_slice(DELTA_MAGIC);
        w.u8(self.scheme as u8);
        w.u64(self.key.check_value(self.scheme));
        w.len(mark.sources);
        w.len(mark.fields);
        self.write_counters(&mut w);
        w.len(sources.len());
        for s in sources {
            write_source(&mut w, s);
        }
        w.len(fields.len());
        for f in fields {
            write_field(&mut w, f);
        }
        w.0
    }

    fn write_counters(&self, w: &mut Writer) {
        w.u64(self.recorded_bytes);
        w.u32(self.forgotten_sources);
        w.u8(u8::from(self.overflowed));
    }

    /// Restore an index from [`SourceIndex::to_bytes`], optionally followed
    /// by deltas ([`SourceIndex::delta_since`]) in the order they were
    /// made. Refused (nothing restored) if the bytes are malformed,
    /// inconsistent, over their own limits, were made with another key, or
    /// a delta does not apply where it stands.
    pub fn from_bytes(bytes: &[u8], key: FingerprintKey) -> Result<Self, IndexError> {
        let mut r = Reader(bytes);
        if r.take(MAGIC.len())? != MAGIC {
            return Err(IndexError::Corrupt { what: "header" });
        }
        let scheme = Scheme::of_version(r.u8()?).ok_or(IndexError::Corrupt { what: "version" })?;
        if r.u64()? != key.check_value(scheme) {
            return Err(IndexError::WrongKey);
        }
        let limits = IndexLimits {
            max_bytes: r.u64()?,
            max_fields: r.u32()?,
            max_sources: r.u32()?,
        };
        let mut index = Self::with_scheme(key, limits, scheme);
        let mut seen = std::collections::BTreeSet::new();
        index.read_counters(&mut r)?;
        index.read_entries(&mut r, &mut seen)?;
        while !r.0.is_empty() {
            if r.0.get(..DELTA_MAGIC.len()) != Some(DELTA_MAGIC) {
                return Err(IndexError::Corrupt {
                    what: "trailing bytes",
                });
            }
            r.take(DELTA_MAGIC.len())?;
            // A delta is encoded in the version of the index it extends.
            if r.u8()? != index.scheme as u8 {
                return Err(IndexError::Corrupt {
                    what: "delta version",
                });
            }
            if r.u64()? != index.key.check_value(index.scheme) {
                return Err(IndexError::WrongKey);
            }
            let at_sources = r.u32()? as usize;
            let at_fields = r.u32()? as usize;
            if at_sources != index.sources.len() || at_fields != index.fields.len() {
                return Err(IndexError::Corrupt {
                    what: "delta position",
                });
            }
            let before = (
                index.recorded_bytes,
                index.forgotten_sources,
                index.overflowed,
            );
            index.read_counters(&mut r)?;
            // Counters only grow, and an overflow is never undone.
            if index.recorded_bytes < before.0
                || index.forgotten_sources < before.1
                || (before.2 && !index.overflowed)
            {
                return Err(IndexError::Corrupt {
                    what: "delta counters",
                });
            }
            index.read_entries(&mut r, &mut seen)?;
        }
        index.add_postings(0);
        Ok(index)
    }

    fn read_counters(&mut self, r: &mut Reader<'_>) -> Result<(), IndexError> {
        self.recorded_bytes = r.u64()?;
        self.forgotten_sources = r.u32()?;
        self.overflowed = match r.u8()? {
            0 => false,
            1 => true,
            _ => {
                return Err(IndexError::Corrupt {
                    what: "overflow flag",
                });
            }
        };
        if self.recorded_bytes > self.limits.max_bytes {
            return Err(IndexError::Corrupt {
                what: "recorded bytes",
            });
        }
        Ok(())
    }

    /// Read a count of sources, the sources, a count of fields and the
    /// fields, appended to those already read (postings are added once,
    /// at the end of [`SourceIndex::from_bytes`]).
    fn read_entries(
        &mut self,
        r: &mut Reader<'_>,
        seen: &mut std::collections::BTreeSet<SourceId>,
    ) -> Result<(), IndexError> {
        let limits = self.limits;
        let n_sources = r.u32()?;
        if u64::from(n_sources) + self.sources.len() as u64 > u64::from(limits.max_sources) {
            return Err(IndexError::Corrupt {
                what: "source count",
            });
        }
        for _ in 0..n_sources {
            let source = read_source(r)?;
            if !seen.insert(source.id.clone()) {
                return Err(IndexError::Corrupt {
                    what: "duplicate source id",
                });
            }
            self.sources.push(source);
        }
        let n_fields = r.u32()?;
        if u64::from(n_fields) + self.fields.len() as u64 > u64::from(limits.max_fields) {
            return Err(IndexError::Corrupt {
                what: "field count",
            });
        }
        let mut previous_source = self.fields.last().map_or(0, |f| f.source);
        for _ in 0..n_fields {
            let field = read_field(r, &self.sources)?;
            if field.source < previous_source {
                return Err(IndexError::Corrupt {
                    what: "field order",
                });
            }
            previous_source = field.source;
            self.fields.push(field);
        }
        Ok(())
    }
}

fn write_source(w: &mut Writer, s: &Source) {
    w.str(s.id.as_str());
    match &s.kind {
        SourceKind::User => w.u8(0),
        SourceKind::Plan => w.u8(1),
        SourceKind::Memory { owner } => {
            w.u8(2);
            w.str(owner.as_str());
        }
        SourceKind::Result { action } => {
            w.u8(3);
            w.str(action.as_str());
        }
    }
    w.u32(s.unsearchable_fields);
    w.u64(s.unsearchable_bytes);
}

fn write_field(w: &mut Writer, f: &Field) {
    w.u32(f.source);
    w.str(&f.path);
    w.u8(f.origin.code());
    for stream in [&f.exact, &f.caseless, &f.skeleton] {
        w.len(stream.len());
        for fp in stream {
            w.u64(*fp);
        }
    }
}

fn read_source(r: &mut Reader<'_>) -> Result<Source, IndexError> {
    let id = SourceId::parse(r.str()?).map_err(|_| IndexError::Corrupt { what: "source id" })?;
    let kind = match r.u8()? {
        0 => SourceKind::User,
        1 => SourceKind::Plan,
        2 => SourceKind::Memory {
            owner: AgentId::parse(r.str()?).map_err(|_| IndexError::Corrupt {
                what: "memory owner",
            })?,
        },
        3 => SourceKind::Result {
            action: ActionName::parse(r.str()?).map_err(|_| IndexError::Corrupt {
                what: "action name",
            })?,
        },
        _ => {
            return Err(IndexError::Corrupt {
                what: "source kind",
            });
        }
    };
    Ok(Source {
        id,
        kind,
        unsearchable_fields: r.u32()?,
        unsearchable_bytes: r.u64()?,
    })
}

fn read_field(r: &mut Reader<'_>, sources: &[Source]) -> Result<Field, IndexError> {
    let source = r.u32()?;
    let Some(s) = sources.get(source as usize) else {
        return Err(IndexError::Corrupt {
            what: "field source",
        });
    };
    let path: Box<str> = r.str()?.into();
    let origin = Origin::from_code(r.u8()?).ok_or(IndexError::Corrupt { what: "origin" })?;
    let consistent = match &s.kind {
        SourceKind::User => origin == Origin::User,
        SourceKind::Plan => origin == Origin::Plan,
        SourceKind::Memory { .. } => origin == Origin::Memory,
        SourceKind::Result { .. } => matches!(origin, Origin::Trusted | Origin::Untrusted),
    };
    if !consistent {
        return Err(IndexError::Corrupt { what: "origin" });
    }
    let mut streams: [Vec<u64>; 3] = Default::default();
    for stream in &mut streams {
        let n = r.u32()? as usize;
        if n > r.0.len() / 8 {
            return Err(IndexError::Corrupt {
                what: "stream length",
            });
        }
        stream.reserve(n);
        for _ in 0..n {
            stream.push(r.u64()?);
        }
    }
    let [exact, caseless, skeleton] = streams;
    let vouching = origin != Origin::Untrusted;
    let consistent = if vouching {
        exact.len() == caseless.len()
    } else {
        exact.is_empty() && skeleton.is_empty()
    };
    if !consistent {
        return Err(IndexError::Corrupt { what: "streams" });
    }
    Ok(Field {
        source,
        path,
        origin,
        exact,
        caseless,
        skeleton,
    })
}

/// Starts every encoding, followed by its version (the fingerprint
/// scheme: 1 HMAC-SHA-256, 2 SipHash-2-4).
const MAGIC: &[u8] = b"WPI";
/// Starts every delta ([`SourceIndex::delta_since`]), followed by the
/// version of the index it extends.
const DELTA_MAGIC: &[u8] = b"WPD";

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], IndexError> {
        if self.0.len() < n {
            return Err(IndexError::Corrupt { what: "truncated" });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, IndexError> {
        self.take(1)?
            .first()
            .copied()
            .ok_or(IndexError::Corrupt { what: "truncated" })
    }
    fn u32(&mut self) -> Result<u32, IndexError> {
        let b = self.take(4)?;
        b.try_into()
            .map(u32::from_le_bytes)
            .map_err(|_| IndexError::Corrupt { what: "truncated" })
    }
    fn u64(&mut self) -> Result<u64, IndexError> {
        let b = self.take(8)?;
        b.try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| IndexError::Corrupt { what: "truncated" })
    }
    fn str(&mut self) -> Result<&'a str, IndexError> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| IndexError::Corrupt { what: "string" })
    }
}
