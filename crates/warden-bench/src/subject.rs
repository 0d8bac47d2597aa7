//! What the harness times: one engine encoding one scenario.

use crate::world::Query;

/// One engine, set up for one scenario, answering that scenario's questions.
///
/// Answers are `u64`: 0/1 for S1-S3, one bit per step for S4.
pub trait Subject {
    /// Row label (`warden`, `cedar`, `cedar-walk`, `rego-reach`, ...).
    fn label(&self) -> String;

    /// Hot mode: answer question `q` for the leaf, state already loaded.
    fn hot(&mut self, q: Query) -> anyhow::Result<u64>;

    /// Churn mode, untimed: prepare the inputs of the `k`-th churn decision
    /// (the new agent as the host would hand it over).
    fn stage(&mut self, k: usize) -> anyhow::Result<()>;

    /// Churn mode, timed: register the `k`-th new agent (staged earlier, in
    /// order) and answer its question.
    fn churn(&mut self, k: usize) -> anyhow::Result<u64>;

    /// Untimed, after each timed churn batch (engines whose store must not
    /// grow without bound reset it here).
    fn reset(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}
