//! Wire types: the JSON the API reads and writes, separate from the domain
//! types, with explicit conversions.
//!
//! Request structs refuse unknown fields. None of them has a field that
//! names the acting agent: identity comes from the bearer token only. The
//! fields that name an agent (`parent_id`, `owner_agent_id`) name a
//! *target*, and the engine checks it against the caller.

mod agents;
mod audit;
mod common;
mod context;
mod memory;
mod runs;
mod sessions;

pub use agents::*;
pub use audit::*;
pub use common::*;
pub use context::*;
pub use memory::*;
pub use runs::*;
pub use sessions::*;
