//! Recording a tool listing: what a gateway (the MCP gateway's
//! `tools/list`) showed an agent is a decision like any other, in the
//! audit log with the listed actions and how many were withheld.

use serde_json::json;
use warden_core::decision::{Decision, Reason, Verdict};
use warden_core::ids::ActionName;
use warden_store::Store;

use crate::engine::{Caller, Engine};
use crate::error::EngineError;

/// The operation a tool listing is recorded under.
pub const TOOLS_LIST: &str = "tools.list";

/// The reason of a recorded tool listing.
pub const TOOLS_LISTED: Reason = Reason::code("tools_listed");

impl<S: Store> Engine<S> {
    /// Record that `caller` was shown `listed` (and not `withheld` other
    /// tools) by the gateway `resource` names (`mcp`). Allowed and
    /// recorded; nothing else changes.
    pub async fn record_tool_listing(
        &self,
        caller: &Caller,
        resource: &str,
        listed: &[ActionName],
        withheld: usize,
    ) -> Result<Decision, EngineError> {
        let decision = self.decision(
            caller,
            Verdict::Allow,
            TOOLS_LISTED,
            TOOLS_LIST,
            resource.to_owned(),
            self.now(),
        );
        let draft = self
            .draft(&decision)
            .with_details(json!({"listed": listed, "withheld": withheld}));
        self.inner.store.append_audit(vec![draft]).await?;
        Ok(decision)
    }
}
