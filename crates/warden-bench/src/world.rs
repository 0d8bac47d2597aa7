//! The benchmark workload, shared by every engine, and a tiny reference
//! model that says what every answer must be.
//!
//! One [`World`] per depth `D`: a chain `c0` (root) … `c{D-1}` (the leaf the
//! hot questions are asked for) and `fillers` agents `f0…` under `c0`, so
//! the number of agents varies independently of depth. Ten actions in four
//! families make every scenario answer both ways:
//!
//! | family | declared by | S1 (some ancestor) | S2 (whole lineage) |
//! | --- | --- | --- | --- |
//! | `common.0-3` | every chain agent | allow | allow |
//! | `gap.0-1` | every chain agent but one | allow | deny |
//! | `held.0-1` | one chain agent | allow | deny |
//! | `none.0-1` | fillers only | deny | deny |
//!
//! The levels of the gaps and holders come from a seeded SplitMix64, as do
//! the churn agents (`n{k}`, siblings of the leaf) and the 50-step SOP.

/// SplitMix64, as in `agt_envelope_bench.py` (all arithmetic mod 2^64).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next output.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `next_u64() % n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// First index whose cumulative weight exceeds `below(sum)`.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let r = self.below(weights.iter().sum());
        let mut acc = 0;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if acc > r {
                return i;
            }
        }
        weights.len().saturating_sub(1)
    }
}

/// The ten action names (valid Warden action names, Cedar ids and Rego keys).
pub const ACTIONS: [&str; 10] = [
    "common.0", "common.1", "common.2", "common.3", "gap.0", "gap.1", "held.0", "held.1", "none.0",
    "none.1",
];
const COMMON: std::ops::Range<usize> = 0..4;
const GAP: std::ops::Range<usize> = 4..6;
const HELD: std::ops::Range<usize> = 6..8;
const NONE: std::ops::Range<usize> = 8..10;

/// Steps in the S4 SOP.
pub const SOP_STEPS: usize = 50;

/// One agent.
#[derive(Debug, Clone)]
pub struct Agent {
    /// Its id.
    pub id: String,
    /// Its parent's index in [`World::agents`] (churn agents: the leaf's parent).
    pub parent: Option<usize>,
    /// Indices into [`ACTIONS`] it declares.
    pub declared: Vec<usize>,
}

impl Agent {
    /// Whether it declares action `a`.
    pub fn declares(&self, a: usize) -> bool {
        self.declared.contains(&a)
    }
}

/// Record visibility, as Warden defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vis {
    /// Owner only.
    Private,
    /// Owner and direct children.
    Children,
    /// Owner and all descendants.
    Descendants,
}

impl Vis {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Vis::Private => "private",
            Vis::Children => "children",
            Vis::Descendants => "descendants",
        }
    }
}

/// One memory record (S3): a unique key, so "which record wins" is the one
/// the question names.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its key (namespace `s3`).
    pub key: String,
    /// Its owner's index in [`World::agents`] (churn records: `usize::MAX`
    /// and an explicit owner id).
    pub owner: usize,
    /// Its owner's id.
    pub owner_id: String,
    /// Its visibility.
    pub vis: Vis,
}

/// The benchmark scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// May X perform A if X or an ancestor declares A.
    S1,
    /// May X perform A: every agent on its lineage declares A.
    S2,
    /// May X read record R (owner on the lineage, visibility).
    S3,
    /// A 50-step SOP, every step an S2 question.
    S4,
}

impl Scenario {
    /// All of them.
    pub const ALL: [Scenario; 4] = [Scenario::S1, Scenario::S2, Scenario::S3, Scenario::S4];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::S1 => "S1 inherit",
            Scenario::S2 => "S2 intersect",
            Scenario::S3 => "S3 resolve",
            Scenario::S4 => "S4 preflight",
        }
    }

    /// Key for JSON.
    pub fn key(self) -> &'static str {
        match self {
            Scenario::S1 => "s1",
            Scenario::S2 => "s2",
            Scenario::S3 => "s3",
            Scenario::S4 => "s4",
        }
    }
}

/// Hot (state loaded, decide only) or churn (register one agent, decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Decide only.
    Hot,
    /// Register one new agent, then decide for it.
    Churn,
}

impl Mode {
    /// Name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Hot => "hot",
            Mode::Churn => "churn",
        }
    }
}

/// One question: the index of an action (S1, S2) or a record (S3); S4 asks
/// the whole SOP.
pub type Query = usize;

/// The workload for one depth.
#[derive(Debug, Clone)]
pub struct World {
    /// Chain length (the leaf sits at this depth, root = 1).
    pub depth: usize,
    /// `chain ++ fillers`.
    pub agents: Vec<Agent>,
    /// Records (S3).
    pub records: Vec<Record>,
    /// S4: action indices, one per step.
    pub sop: Vec<usize>,
    seed: u64,
}

impl World {
    /// Build the workload for `depth` (≥ 2) with `fillers` extra agents.
    pub fn new(depth: usize, fillers: usize, seed: u64) -> Self {
        let depth = depth.max(2);
        let mut rng = SplitMix64(seed ^ (depth as u64).wrapping_mul(0x1000_0001));
        let gap_level: Vec<usize> = GAP.map(|_| rng.below(depth as u64) as usize).collect();
        let held_level: Vec<usize> = HELD.map(|_| rng.below(depth as u64) as usize).collect();
        let mut agents = Vec::with_capacity(depth + fillers);
        for i in 0..depth {
            let mut declared: Vec<usize> = COMMON.collect();
            for (g, a) in GAP.enumerate() {
                if gap_level.get(g) != Some(&i) {
                    declared.push(a);
                }
            }
            for (h, a) in HELD.enumerate() {
                if held_level.get(h) == Some(&i) {
                    declared.push(a);
                }
            }
            agents.push(Agent {
                id: format!("c{i}"),
                parent: i.checked_sub(1),
                declared,
            });
        }
        for i in 0..fillers {
            agents.push(Agent {
                id: format!("f{i}"),
                parent: Some(0),
                declared: (0..ACTIONS.len()).collect(),
            });
        }
        let mut records = Vec::new();
        for (i, a) in agents.iter().take(depth).enumerate() {
            for vis in [Vis::Private, Vis::Children, Vis::Descendants] {
                records.push(Record {
                    key: format!("r.{i}.{}", vis.as_str()),
                    owner: i,
                    owner_id: a.id.clone(),
                    vis,
                });
            }
        }
        for j in 0..fillers.min(8) {
            let owner = depth + j;
            records.push(Record {
                key: format!("r.f{j}"),
                owner,
                owner_id: agents.get(owner).map(|a| a.id.clone()).unwrap_or_default(),
                vis: Vis::Descendants,
            });
        }
        let sop = (0..SOP_STEPS)
            .map(|_| rng.below(ACTIONS.len() as u64) as usize)
            .collect();
        World {
            depth,
            agents,
            records,
            sop,
            seed,
        }
    }

    /// Index of the leaf (`c{D-1}`).
    pub fn leaf(&self) -> usize {
        self.depth - 1
    }

    /// Index of the churn agents' parent (the leaf's parent).
    pub fn churn_parent(&self) -> usize {
        self.depth - 2
    }

    /// The hot questions of a scenario, asked for the leaf.
    pub fn hot_queries(&self, s: Scenario) -> Vec<Query> {
        match s {
            Scenario::S1 | Scenario::S2 => (0..ACTIONS.len()).collect(),
            Scenario::S3 => (0..self.records.len()).collect(),
            Scenario::S4 => vec![0],
        }
    }

    /// The `k`-th churn agent: `n{k}`, a sibling of the leaf (so at the
    /// same depth), declaring each non-`none` action with probability 7/8.
    pub fn churn_agent(&self, k: usize) -> Agent {
        let mut rng = SplitMix64(self.seed ^ 0xC0FF_EE00 ^ (k as u64).wrapping_mul(0x9E37));
        let declared = (0..NONE.start).filter(|_| rng.below(8) != 0).collect();
        Agent {
            id: format!("n{k}"),
            parent: Some(self.churn_parent()),
            declared,
        }
    }

    /// The private record the `k`-th churn agent owns (S3 churn).
    pub fn churn_record(&self, k: usize) -> Record {
        Record {
            key: format!("n.{k}"),
            owner: usize::MAX,
            owner_id: format!("n{k}"),
            vis: Vis::Private,
        }
    }

    /// The question the `k`-th churn decision asks: an action (S1, S2), or
    /// a record (S3): `records.len()` means the agent's own new record.
    pub fn churn_query(&self, s: Scenario, k: usize) -> Query {
        match s {
            Scenario::S1 | Scenario::S2 => k % ACTIONS.len(),
            Scenario::S3 => k % (self.records.len() + 1),
            Scenario::S4 => 0,
        }
    }

    /// The record a churn query names.
    pub fn churn_query_record(&self, k: usize, q: Query) -> Record {
        match self.records.get(q) {
            Some(r) => r.clone(),
            None => self.churn_record(k),
        }
    }

    /// The hot questions of a scenario as (agent, question) pairs: the leaf
    /// asks each of [`World::hot_queries`]. A subject's `hot(p)` answers
    /// pair `p`.
    pub fn questions(&self, s: Scenario) -> Vec<(usize, Query)> {
        self.hot_queries(s)
            .into_iter()
            .map(|q| (self.leaf(), q))
            .collect()
    }

    /// `n` random (agent, question) pairs, uniform over every agent of the
    /// world and every hot question of `s` (seeded: the same world gives the
    /// same ring).
    pub fn random_ring(&self, s: Scenario, n: usize) -> Vec<(usize, Query)> {
        let mut rng = SplitMix64(self.seed ^ 0x005E_ED0F_A6E7 ^ (s as u64));
        let queries = self.hot_queries(s);
        (0..n)
            .map(|_| {
                let a = rng.below(self.agents.len() as u64) as usize;
                let q = queries
                    .get(rng.below(queries.len() as u64) as usize)
                    .copied()
                    .unwrap_or(0);
                (a, q)
            })
            .collect()
    }

    /// The lineage of agent `idx` (itself first) as indices.
    pub fn lineage(&self, idx: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut next = Some(idx);
        while let Some(i) = next {
            out.push(i);
            next = self.agents.get(i).and_then(|a| a.parent);
        }
        out
    }

    /// Ids of the lineage of a churn agent's parent (nearest first).
    pub fn parent_lineage_ids(&self) -> Vec<&str> {
        self.lineage(self.churn_parent())
            .into_iter()
            .filter_map(|i| self.agents.get(i).map(|a| a.id.as_str()))
            .collect()
    }
}

/// The reference model: what every engine must answer.
pub mod model {
    use super::*;

    /// `agent` (with `ancestors`, nearest first, not including it) asks `s`.
    fn answer(
        w: &World,
        s: Scenario,
        agent: &Agent,
        ancestors: &[usize],
        q: Query,
        record: Option<&Record>,
    ) -> u64 {
        let lineage_declares = |a: usize, all: bool| {
            let mut it = std::iter::once(agent.declares(a)).chain(
                ancestors
                    .iter()
                    .map(|i| w.agents.get(*i).is_some_and(|x| x.declares(a))),
            );
            if all { it.all(|b| b) } else { it.any(|b| b) }
        };
        match s {
            Scenario::S1 => u64::from(lineage_declares(q, false)),
            Scenario::S2 => u64::from(lineage_declares(q, true)),
            Scenario::S3 => {
                let Some(r) = record else { return 0 };
                if r.owner_id == agent.id {
                    return 1;
                }
                let parent = ancestors.first().and_then(|i| w.agents.get(*i));
                let allowed = match r.vis {
                    Vis::Private => false,
                    Vis::Children => parent.is_some_and(|p| p.id == r.owner_id),
                    Vis::Descendants => ancestors
                        .iter()
                        .any(|i| w.agents.get(*i).is_some_and(|a| a.id == r.owner_id)),
                };
                u64::from(allowed)
            }
            Scenario::S4 => w.sop.iter().enumerate().fold(0u64, |acc, (i, a)| {
                acc | (u64::from(lineage_declares(*a, true)) << i)
            }),
        }
    }

    /// The hot answer for the leaf.
    pub fn hot(w: &World, s: Scenario, q: Query) -> u64 {
        hot_for(w, s, w.leaf(), q)
    }

    /// The hot answer for agent `idx` (any agent of the world).
    pub fn hot_for(w: &World, s: Scenario, idx: usize, q: Query) -> u64 {
        let lineage = w.lineage(idx);
        let Some(agent) = w.agents.get(idx) else {
            return 0;
        };
        answer(
            w,
            s,
            agent,
            lineage.get(1..).unwrap_or(&[]),
            q,
            w.records.get(q),
        )
    }

    /// The answer of the `k`-th churn decision.
    pub fn churn(w: &World, s: Scenario, k: usize) -> u64 {
        let agent = w.churn_agent(k);
        let ancestors = w.lineage(w.churn_parent());
        let q = w.churn_query(s, k);
        let record = w.churn_query_record(k, q);
        answer(w, s, &agent, &ancestors, q, Some(&record))
    }
}
