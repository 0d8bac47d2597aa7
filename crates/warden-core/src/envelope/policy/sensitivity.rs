//! The sensitivity ladder.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The sensitivity ladder, lowest first: `public < internal < confidential <
/// restricted < top_secret` (ranks 0 to 4).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Sensitivity {
    /// Rank 0: anyone may see it.
    #[default]
    Public = 0,
    /// Rank 1: inside the organisation.
    Internal = 1,
    /// Rank 2: need to know.
    Confidential = 2,
    /// Rank 3: tightly controlled; the default floor for flows out.
    Restricted = 3,
    /// Rank 4: the top of the ladder.
    TopSecret = 4,
}

impl Sensitivity {
    /// Every level, lowest first.
    pub const ALL: [Sensitivity; 5] = [
        Sensitivity::Public,
        Sensitivity::Internal,
        Sensitivity::Confidential,
        Sensitivity::Restricted,
        Sensitivity::TopSecret,
    ];

    /// The level's rank, `public` = 0 to `top_secret` = 4.
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// The level of a rank, if it is one.
    pub fn from_rank(rank: u8) -> Option<Self> {
        Self::ALL.get(usize::from(rank)).copied()
    }

    /// The level's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Sensitivity::Public => "public",
            Sensitivity::Internal => "internal",
            Sensitivity::Confidential => "confidential",
            Sensitivity::Restricted => "restricted",
            Sensitivity::TopSecret => "top_secret",
        }
    }

    pub(super) fn restricted() -> Self {
        Sensitivity::Restricted
    }
}

impl fmt::Display for Sensitivity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
