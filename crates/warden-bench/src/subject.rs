//! What the harness times: one engine encoding one scenario.

use crate::world::Query;

/// One engine, set up for one scenario, answering that scenario's questions.
///
/// Answers are `u64`: 0/1 for S1-S3, one bit per step for S4, 0/1/2
/// (allow / escalate / deny) for the session calls of S5.
pub trait Subject {
    /// Row label (`warden`, `cedar`, `cedar-walk`, `rego-reach`, ...).
    fn label(&self) -> String;

    /// Hot mode, state already loaded: answer question `p`, an index into
    /// the subject's (agent, question) pairs (by default the leaf asking
    /// each of `World::hot_queries`, so `p` is the question itself).
    fn hot(&mut self, p: usize) -> anyhow::Result<u64>;

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

/// A subject that answers like `inner` except that its `at`-th answer
/// (counting from 0, hot and churn alike) has its lowest bit flipped: the
/// harness's `--inject-wrong` uses it to show that one wrong answer anywhere
/// among the timed ones fails the run.
pub struct Flip<'a> {
    inner: Box<dyn Subject + 'a>,
    at: usize,
    seen: usize,
}

impl<'a> Flip<'a> {
    /// Wrap `inner`.
    pub fn new(inner: Box<dyn Subject + 'a>, at: usize) -> Self {
        Self { inner, at, seen: 0 }
    }

    fn pass(&mut self, answer: u64) -> u64 {
        let n = self.seen;
        self.seen += 1;
        if n == self.at { answer ^ 1 } else { answer }
    }
}

impl Subject for Flip<'_> {
    fn label(&self) -> String {
        self.inner.label()
    }

    fn hot(&mut self, q: Query) -> anyhow::Result<u64> {
        let a = self.inner.hot(q)?;
        Ok(self.pass(a))
    }

    fn stage(&mut self, k: usize) -> anyhow::Result<()> {
        self.inner.stage(k)
    }

    fn churn(&mut self, k: usize) -> anyhow::Result<u64> {
        let a = self.inner.churn(k)?;
        Ok(self.pass(a))
    }

    fn reset(&mut self) -> anyhow::Result<()> {
        self.inner.reset()
    }
}

/// A subject under another label (to time the same engine on two worlds
/// in one cell).
pub struct Renamed<'a>(pub Box<dyn Subject + 'a>, pub String);

impl Subject for Renamed<'_> {
    fn label(&self) -> String {
        self.1.clone()
    }

    fn hot(&mut self, p: usize) -> anyhow::Result<u64> {
        self.0.hot(p)
    }

    fn stage(&mut self, k: usize) -> anyhow::Result<()> {
        self.0.stage(k)
    }

    fn churn(&mut self, k: usize) -> anyhow::Result<u64> {
        self.0.churn(k)
    }

    fn reset(&mut self) -> anyhow::Result<()> {
        self.0.reset()
    }
}
