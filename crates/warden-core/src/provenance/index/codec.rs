//! The index's binary encoding: versioned, the sources, the fields' paths
//! and origins and their fingerprints, never any text.

use super::*;

impl SourceIndex {
    /// The index as bytes: a versioned binary encoding of the sources, the
    /// fields' paths and origins and their fingerprints, never any text.
    /// Restore with [`SourceIndex::from_bytes`] and the same key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64 + self.fields.len() * 32));
        w.0.extend_from_slice(MAGIC);
        w.u64(self.key.check_value());
        w.u64(self.limits.max_bytes);
        w.u32(self.limits.max_fields);
        w.u32(self.limits.max_sources);
        w.u64(self.recorded_bytes);
        w.u32(self.forgotten_sources);
        w.u8(u8::from(self.overflowed));
        w.len(self.sources.len());
        for s in &self.sources {
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
        w.len(self.fields.len());
        for f in &self.fields {
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
        w.0
    }

    /// Restore an index from [`SourceIndex::to_bytes`]. Refused (nothing
    /// restored) if the bytes are malformed, inconsistent, over their own
    /// limits, or were made with another key.
    pub fn from_bytes(bytes: &[u8], key: FingerprintKey) -> Result<Self, IndexError> {
        let mut r = Reader(bytes);
        if r.take(MAGIC.len())? != MAGIC {
            return Err(IndexError::Corrupt { what: "header" });
        }
        if r.u64()? != key.check_value() {
            return Err(IndexError::WrongKey);
        }
        let limits = IndexLimits {
            max_bytes: r.u64()?,
            max_fields: r.u32()?,
            max_sources: r.u32()?,
        };
        let mut index = Self::with_limits(key, limits);
        index.recorded_bytes = r.u64()?;
        index.forgotten_sources = r.u32()?;
        index.overflowed = match r.u8()? {
            0 => false,
            1 => true,
            _ => {
                return Err(IndexError::Corrupt {
                    what: "overflow flag",
                });
            }
        };
        let n_sources = r.u32()?;
        if n_sources > limits.max_sources {
            return Err(IndexError::Corrupt {
                what: "source count",
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..n_sources {
            let id =
                SourceId::parse(r.str()?).map_err(|_| IndexError::Corrupt { what: "source id" })?;
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
            if !seen.insert(id.clone()) {
                return Err(IndexError::Corrupt {
                    what: "duplicate source id",
                });
            }
            index.sources.push(Source {
                id,
                kind,
                unsearchable_fields: r.u32()?,
                unsearchable_bytes: r.u64()?,
            });
        }
        let n_fields = r.u32()?;
        if n_fields > limits.max_fields {
            return Err(IndexError::Corrupt {
                what: "field count",
            });
        }
        let mut previous_source = 0;
        for _ in 0..n_fields {
            let source = r.u32()?;
            let Some(s) = index.sources.get(source as usize) else {
                return Err(IndexError::Corrupt {
                    what: "field source",
                });
            };
            if source < previous_source {
                return Err(IndexError::Corrupt {
                    what: "field order",
                });
            }
            previous_source = source;
            let path: Box<str> = r.str()?.into();
            let origin =
                Origin::from_code(r.u8()?).ok_or(IndexError::Corrupt { what: "origin" })?;
            let consistent = match &s.kind {
                SourceKind::User => origin == Origin::User,
                SourceKind::Plan => origin == Origin::Plan,
                SourceKind::Memory { .. } => origin == Origin::Memory,
                SourceKind::Result { .. } => {
                    matches!(origin, Origin::Trusted | Origin::Untrusted)
                }
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
            index.fields.push(Field {
                source,
                path,
                origin,
                exact,
                caseless,
                skeleton,
            });
        }
        if !r.0.is_empty() {
            return Err(IndexError::Corrupt {
                what: "trailing bytes",
            });
        }
        if index.recorded_bytes > limits.max_bytes {
            return Err(IndexError::Corrupt {
                what: "recorded bytes",
            });
        }
        index.add_postings(0);
        Ok(index)
    }
}

const MAGIC: &[u8] = b"WPI\x01";

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
