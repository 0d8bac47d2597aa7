//! Interleaved, batched timing.
//!
//! Every subject of a cell (one scenario, depth and mode) is timed in the
//! same loop, a few samples each in turn, so load from other processes on
//! this shared machine hits them alike. A sample times a batch of `B`
//! decisions with one pair of `Instant::now()` calls and records the
//! per-decision time (`elapsed / B`); `B` is chosen per subject so that a
//! batch lasts at least [`Config::batch_ns`], keeping timer overhead under a
//! percent. Medians and p99s are over these per-decision samples.

use std::hint::black_box;
use std::time::Instant;

use anyhow::Result;
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
}

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
}

impl Runner<'_> {
    /// One timed batch; returns its per-decision time.
    fn sample(&mut self, mode: Mode, queries: &[Query]) -> Result<f64> {
        match mode {
            Mode::Hot => {
                let n = queries.len().max(1);
                let start = Instant::now();
                for _ in 0..self.batch {
                    let q = queries.get(self.cursor % n).copied().unwrap_or(0);
                    self.cursor += 1;
                    black_box(self.subject.hot(black_box(q))?);
                }
                Ok(start.elapsed().as_nanos() as f64 / self.batch as f64)
            }
            Mode::Churn => {
                let first = self.next_k;
                for k in first..first + self.batch {
                    self.subject.stage(k)?;
                }
                let start = Instant::now();
                for k in first..first + self.batch {
                    black_box(self.subject.churn(black_box(k))?);
                }
                let ns = start.elapsed().as_nanos() as f64 / self.batch as f64;
                self.next_k = first + self.batch;
                self.subject.reset()?;
                Ok(ns)
            }
        }
    }
}

/// Time every subject of a cell, interleaved. `first_k` is the first churn
/// index to use (churn agents must be new to each subject's state).
pub fn measure(
    subjects: &mut [Box<dyn Subject + '_>],
    mode: Mode,
    queries: &[Query],
    cfg: &Config,
    first_k: usize,
) -> Result<Vec<Stats>> {
    let mut runners: Vec<Runner<'_>> = Vec::new();
    for s in subjects.iter_mut() {
        runners.push(Runner {
            subject: s.as_mut(),
            batch: 1,
            want: 0,
            samples: Vec::new(),
            cursor: 0,
            next_k: first_k,
        });
    }
    // Warm up (a fresh state's first decisions pay page faults and cold
    // caches), then grow the batch until one lasts batch_ns, judging each
    // size by the best of three samples so one slow sample cannot stop the
    // growth early (a batch of 1 would measure the timer, not the engine).
    for r in runners.iter_mut() {
        for _ in 0..5 {
            r.sample(mode, queries)?;
        }
        let mut est;
        loop {
            est = f64::INFINITY;
            for _ in 0..3 {
                est = est.min(r.sample(mode, queries)?);
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
                let ns = r.sample(mode, queries)?;
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
            }
        })
        .collect())
}
