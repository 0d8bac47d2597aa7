//! Interleaved, batched timing.
//!
//! Every subject of a cell (one scenario, depth and mode) is timed in the
//! same loop, a few samples each in turn, so load from other processes on
//! this shared machine hits them alike. A sample times a batch of `B`
//! decisions with one pair of `Instant::now()` calls and records the
//! per-decision time (`elapsed / B`); `B` is chosen per subject so that a
//! batch lasts at least [`Config::batch_ns`], keeping timer overhead under a
//! percent. Medians and p99s are over these per-decision samples.
//!
//! Every answer given inside a timed region (warm-up and calibration
//! batches included) is kept in a preallocated buffer and compared, after
//! the batch's clock has stopped, with the reference model's answer for the
//! same question: one wrong answer fails the run.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Result, bail};
use serde::Serialize;

use crate::subject::Subject;
use crate::world::{Mode, Query};

/// Timing parameters.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Target duration of one batch.
    pub batch_ns: f64,
    /// Samples per subject and cell (fewer when a decision is slow).
    pub samples: usize,
    /// Time budget per subject and cell, for slow subjects.
    pub budget_ns: f64,
    /// Samples per subject per turn of the interleaving loop.
    pub chunk: usize,
}

impl Config {
    /// The full run.
    pub fn full() -> Self {
        Self {
            batch_ns: 4_000.0,
            samples: 400,
            budget_ns: 250e6,
            chunk: 8,
        }
    }

    /// `--quick`.
    pub fn quick() -> Self {
        Self {
            batch_ns: 2_000.0,
            samples: 60,
            budget_ns: 20e6,
            chunk: 4,
        }
    }
}

/// Statistics of one subject in one cell, ns per decision.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Subject label.
    pub engine: String,
    /// Median.
    pub median_ns: f64,
    /// 99th percentile (nearest rank).
    pub p99_ns: f64,
    /// Mean.
    pub mean_ns: f64,
    /// Number of samples.
    pub samples: usize,
    /// Decisions per sample.
    pub batch: usize,
    /// Timed answers compared with the reference model (all of them).
    pub checked: usize,
}

/// What the reference model says: `expect(i, mode, x)` is, for subject `i`
/// of the cell, in a hot batch the answer to question position `x` (an
/// index into the subject's questions), in a churn batch the answer of
/// churn decision `x`.
pub type Expect<'e> = &'e dyn Fn(usize, Mode, usize) -> u64;

/// Nearest-rank percentile of sorted samples.
pub fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let n = sorted.len();
    let idx = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
    sorted.get(idx).copied().unwrap_or(f64::NAN)
}

/// Median of unsorted values.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    match (s.get((n - 1) / 2), s.get(n / 2)) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        _ => f64::NAN,
    }
}

struct Runner<'a> {
    subject: &'a mut dyn Subject,
    batch: usize,
    want: usize,
    samples: Vec<f64>,
    cursor: usize,
    next_k: usize,
    answers: Vec<u64>,
    checked: usize,
    index: usize,
}

impl Runner<'_> {
    /// One timed batch; returns its per-decision time. Every answer is
    /// checked against `expect` after the clock stops.
    fn sample(&mut self, mode: Mode, queries: &[Query], expect: Expect<'_>) -> Result<f64> {
        self.answers.clear();
        self.answers.reserve(self.batch);
        let ns = match mode {
            Mode::Hot => {
                let n = queries.len().max(1);
                let first = self.cursor;
                let start = Instant::now();
                for _ in 0..self.batch {
                    let q = queries.get(self.cursor % n).copied().unwrap_or(0);
                    self.cursor += 1;
                    self.answers
                        .push(black_box(self.subject.hot(black_box(q))?));
                }
                let ns = start.elapsed().as_nanos() as f64 / self.batch as f64;
                for (i, got) in self.answers.iter().enumerate() {
                    let q = queries.get((first + i) % n).copied().unwrap_or(0);
                    let want = expect(self.index, mode, q);
                    if *got != want {
                        bail!(
                            "wrong answer: {} hot question {q} (timed answer {}): answered {got:#b}, the model {want:#b}",
                            self.subject.label(),
                            self.checked + i
                        );
                    }
                }
                ns
            }
            Mode::Churn => {
                let first = self.next_k;
                for k in first..first + self.batch {
                    self.subject.stage(k)?;
                }
                let start = Instant::now();
                for k in first..first + self.batch {
                    self.answers
                        .push(black_box(self.subject.churn(black_box(k))?));
                }
                let ns = start.elapsed().as_nanos() as f64 / self.batch as f64;
                self.next_k = first + self.batch;
                self.subject.reset()?;
                for (i, got) in self.answers.iter().enumerate() {
                    let want = expect(self.index, mode, first + i);
                    if *got != want {
                        bail!(
                            "wrong answer: {} churn decision {} (timed answer {}): answered {got:#b}, the model {want:#b}",
                            self.subject.label(),
                            first + i,
                            self.checked + i
                        );
                    }
                }
                ns
            }
        };
        self.checked += self.answers.len();
        Ok(ns)
    }
}

/// Time every subject of a cell, interleaved. `first_k` is the first churn
/// index to use (churn agents must be new to each subject's state); every
/// timed answer is checked against `expect`.
pub fn measure(
    subjects: &mut [Box<dyn Subject + '_>],
    mode: Mode,
    queries: &[Query],
    cfg: &Config,
    first_k: usize,
    expect: Expect<'_>,
) -> Result<Vec<Stats>> {
    let mut runners: Vec<Runner<'_>> = Vec::new();
    for (index, s) in subjects.iter_mut().enumerate() {
        runners.push(Runner {
            index,
            subject: s.as_mut(),
            batch: 1,
            want: 0,
            samples: Vec::new(),
            cursor: 0,
            next_k: first_k,
            answers: Vec::new(),
            checked: 0,
        });
    }
    // Warm up (a fresh state's first decisions pay page faults and cold
    // caches), then grow the batch until one lasts batch_ns, judging each
    // size by the best of three samples so one slow sample cannot stop the
    // growth early (a batch of 1 would measure the timer, not the engine).
    for r in runners.iter_mut() {
        for _ in 0..5 {
            r.sample(mode, queries, expect)?;
        }
        let mut est;
        loop {
            est = f64::INFINITY;
            for _ in 0..3 {
                est = est.min(r.sample(mode, queries, expect)?);
            }
            if est * r.batch as f64 >= cfg.batch_ns || r.batch >= 1 << 16 {
                break;
            }
            r.batch *= 2;
        }
        let per_sample = est * r.batch as f64;
        r.want = cfg
            .samples
            .min(((cfg.budget_ns / per_sample.max(1.0)) as usize).max(25));
    }
    loop {
        let mut any = false;
        for r in runners.iter_mut() {
            for _ in 0..cfg.chunk {
                if r.samples.len() >= r.want {
                    break;
                }
                let ns = r.sample(mode, queries, expect)?;
                r.samples.push(ns);
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    Ok(runners
        .into_iter()
        .map(|mut r| {
            r.samples.sort_by(f64::total_cmp);
            let n = r.samples.len();
            Stats {
                engine: r.subject.label(),
                median_ns: median(&r.samples),
                p99_ns: pct(&r.samples, 0.99),
                mean_ns: r.samples.iter().sum::<f64>() / n.max(1) as f64,
                samples: n,
                batch: r.batch,
                checked: r.checked,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::Flip;
    use crate::world::{Scenario, World, model};
    use crate::{Loaded, with_big_stack};

    /// One wrong answer deep inside the timed batches (long after the
    /// agreement check's questions) fails the measurement, hot and churn.
    #[test]
    fn a_wrong_timed_answer_fails_the_run() {
        with_big_stack(wrong_timed_answer).unwrap();
    }

    fn wrong_timed_answer() {
        let l = Loaded::new(World::new(5, 10, 7)).unwrap();
        let w = std::sync::Arc::clone(&l.world);
        let cfg = Config {
            batch_ns: 2_000.0,
            // Enough samples that the 300th answer is timed even when every
            // batch is one decision (a debug build's Warden churn).
            samples: 400,
            budget_ns: 50e6,
            chunk: 4,
        };
        for mode in [Mode::Hot, Mode::Churn] {
            let s = Scenario::S2;
            let hot: Vec<u64> = w
                .hot_queries(s)
                .iter()
                .map(|q| model::hot(&w, s, *q))
                .collect();
            let expect = |_: usize, m: Mode, x: usize| match m {
                Mode::Hot => hot.get(x).copied().unwrap_or(u64::MAX),
                Mode::Churn => model::churn(&w, s, x),
            };
            let queries = w.hot_queries(s);
            // Honest subjects pass, and every timed answer was checked.
            let mut subs = l.subjects(s, mode).unwrap();
            let stats = measure(&mut subs, mode, &queries, &cfg, 0, &expect).unwrap();
            assert!(stats.iter().all(|st| st.checked >= st.samples * st.batch));
            // The same with Warden's 300th answer flipped fails.
            let mut subs = l.subjects(s, mode).unwrap();
            let warden = subs.remove(0);
            subs.insert(0, Box::new(Flip::new(warden, 300)));
            let err = measure(&mut subs, mode, &queries, &cfg, 0, &expect).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("wrong answer: warden") && msg.contains("timed answer 300"),
                "{mode:?}: {msg}"
            );
        }
    }
}
