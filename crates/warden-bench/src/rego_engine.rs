//! Rego, through `regorus` (Microsoft's Rust interpreter for OPA's
//! language), in two encodings of the lineage:
//!
//! - `reach`: `graph.reachable(data.graph, {input.principal})` over the
//!   parent graph (`data.graph[agent] = [parent]`);
//! - `closure`: a host-precomputed `data.lineage[agent]` (agent first).
//!
//! `data.caps[agent][action] = true` for declared actions;
//! `data.records[key] = {owner, vis}`. S4 is 50 evaluations of `s2`.
//! Churn: `Engine::add_data` of the new agent's entries (and record), then
//! the evaluation (regorus re-prepares after new data).

use std::collections::VecDeque;

use anyhow::{Context, Result, anyhow};
use regorus::{Engine, Value};
use serde_json::{Map, Value as Json, json};

use crate::subject::Subject;
use crate::world::{ACTIONS, Agent, Query, Record, Scenario, World};

/// Which lineage encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `graph.reachable` at evaluation time.
    Reach,
    /// Host-precomputed closure.
    Closure,
}

impl Form {
    fn package(self) -> &'static str {
        match self {
            Form::Reach => "reach",
            Form::Closure => "closure",
        }
    }
}

/// The module of a form.
pub fn module(form: Form) -> String {
    let lineage = match form {
        Form::Reach => "graph.reachable(data.graph, {input.principal})",
        Form::Closure => "data.lineage[input.principal]",
    };
    format!(
        r#"package {pkg}
import rego.v1

lineage := {lineage}

default s1 := false
s1 if {{
    some a in lineage
    data.caps[a][input.action]
}}

default s2 := false
s2 if not lacking

lacking if {{
    some a in lineage
    not data.caps[a][input.action]
}}

default s3 := false
s3 if {{
    r := data.records[input.record]
    r.owner == input.principal
}}
s3 if {{
    r := data.records[input.record]
    r.vis == "descendants"
    r.owner in lineage
}}
s3 if {{
    r := data.records[input.record]
    r.vis == "children"
    data.graph[input.principal][0] == r.owner
}}
"#,
        pkg = form.package()
    )
}

fn agent_data(w: &World, a: &Agent, lineage: Option<Vec<String>>, out: &mut Map<String, Json>) {
    let parent: Vec<Json> = a
        .parent
        .and_then(|i| w.agents.get(i))
        .map(|p| Json::from(p.id.clone()))
        .into_iter()
        .collect();
    let caps: Map<String, Json> = a
        .declared
        .iter()
        .filter_map(|i| ACTIONS.get(*i))
        .map(|n| ((*n).to_owned(), Json::Bool(true)))
        .collect();
    put(out, "graph", &a.id, Json::Array(parent));
    put(out, "caps", &a.id, Json::Object(caps));
    if let Some(l) = lineage {
        put(out, "lineage", &a.id, Json::from(l));
    }
}

fn put(out: &mut Map<String, Json>, section: &str, id: &str, v: Json) {
    if let Json::Object(m) = out
        .entry(section.to_owned())
        .or_insert_with(|| Json::Object(Map::new()))
    {
        m.insert(id.to_owned(), v);
    }
}

fn record_data(r: &Record, out: &mut Map<String, Json>) {
    put(
        out,
        "records",
        &r.key,
        json!({"owner": r.owner_id, "vis": r.vis.as_str()}),
    );
}

fn lineage_ids(w: &World, idx: usize) -> Vec<String> {
    w.lineage(idx)
        .into_iter()
        .filter_map(|i| w.agents.get(i).map(|a| a.id.clone()))
        .collect()
}

/// The data document of a world.
pub fn data(w: &World, form: Form) -> Json {
    let mut out = Map::new();
    for (i, a) in w.agents.iter().enumerate() {
        let l = (form == Form::Closure).then(|| lineage_ids(w, i));
        agent_data(w, a, l, &mut out);
    }
    out.entry("records".to_owned())
        .or_insert_with(|| Json::Object(Map::new()));
    for r in &w.records {
        record_data(r, &mut out);
    }
    Json::Object(out)
}

/// A loaded engine for a world and form (cloned into each subject).
pub fn engine(w: &World, form: Form) -> Result<Engine> {
    let mut e = Engine::new();
    e.add_policy(format!("{}.rego", form.package()), module(form))
        .map_err(|e| anyhow!("rego policy: {e}"))?;
    let v = Value::from_json_str(&data(w, form).to_string()).map_err(|e| anyhow!("data: {e}"))?;
    e.add_data(v).map_err(|e| anyhow!("add_data: {e}"))?;
    Ok(e)
}

fn input(s: Scenario, principal: &str, q: Query, record: Option<&Record>) -> Vec<Value> {
    let one = |j: Json| Value::from(j);
    match s {
        Scenario::S1 | Scenario::S2 => vec![one(
            json!({"principal": principal, "action": ACTIONS.get(q).copied().unwrap_or("")}),
        )],
        Scenario::S3 => vec![one(
            json!({"principal": principal, "record": record.map(|r| r.key.as_str()).unwrap_or("")}),
        )],
        Scenario::S4 => Vec::new(),
    }
}

struct Staged {
    data: Value,
    inputs: Vec<Value>,
}

/// Rego for one scenario and form.
pub struct RegoSubject {
    scenario: Scenario,
    form: Form,
    engine: Engine,
    rule: String,
    hot: Vec<Vec<Value>>,
    world: std::sync::Arc<World>,
    staged: VecDeque<Staged>,
}

impl RegoSubject {
    /// Set up on a clone of `engine`.
    pub fn new(
        w: &std::sync::Arc<World>,
        engine: &Engine,
        s: Scenario,
        form: Form,
    ) -> Result<Self> {
        let leaf = w.agents.get(w.leaf()).context("leaf")?;
        let rule_name = match s {
            Scenario::S1 => "s1",
            Scenario::S2 | Scenario::S4 => "s2",
            Scenario::S3 => "s3",
        };
        let hot = w
            .hot_queries(s)
            .into_iter()
            .map(|q| inputs(w, s, &leaf.id, q, w.records.get(q)))
            .collect();
        Ok(Self {
            scenario: s,
            form,
            engine: engine.clone(),
            rule: format!("data.{}.{rule_name}", form.package()),
            hot,
            world: std::sync::Arc::clone(w),
            staged: VecDeque::new(),
        })
    }

    fn eval_all(&mut self, inputs: &[Value]) -> Result<u64> {
        let mut out = 0u64;
        for (i, v) in inputs.iter().enumerate() {
            self.engine.set_input(v.clone());
            let r = self
                .engine
                .eval_rule(self.rule.clone())
                .map_err(|e| anyhow!("eval: {e}"))?;
            if r == Value::from(true) {
                out |= 1 << i;
            }
        }
        Ok(out)
    }
}

fn inputs(
    w: &World,
    s: Scenario,
    principal: &str,
    q: Query,
    record: Option<&Record>,
) -> Vec<Value> {
    match s {
        Scenario::S4 => w
            .sop
            .iter()
            .map(|a| Value::from(json!({"principal": principal, "action": ACTIONS.get(*a).copied().unwrap_or("")})))
            .collect(),
        _ => input(s, principal, q, record),
    }
}

impl Subject for RegoSubject {
    fn label(&self) -> String {
        format!("rego-{}", self.form.package())
    }

    fn hot(&mut self, q: Query) -> Result<u64> {
        let inputs = std::mem::take(self.hot.get_mut(q).context("query")?);
        let out = self.eval_all(&inputs);
        if let Some(slot) = self.hot.get_mut(q) {
            *slot = inputs;
        }
        out
    }

    fn stage(&mut self, k: usize) -> Result<()> {
        let w = &self.world;
        let agent = w.churn_agent(k);
        let q = w.churn_query(self.scenario, k);
        let record = w.churn_query_record(k, q);
        let mut out = Map::new();
        let lineage = (self.form == Form::Closure).then(|| {
            let mut l = vec![agent.id.clone()];
            l.extend(lineage_ids(w, w.churn_parent()));
            l
        });
        agent_data(w, &agent, lineage, &mut out);
        if self.scenario == Scenario::S3 {
            record_data(&w.churn_record(k), &mut out);
        }
        let data = Value::from(Json::Object(out));
        let inputs = inputs(w, self.scenario, &agent.id, q, Some(&record));
        self.staged.push_back(Staged { data, inputs });
        Ok(())
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        let st = self.staged.pop_front().context("nothing staged")?;
        self.engine
            .add_data(st.data)
            .map_err(|e| anyhow!("add_data: {e}"))?;
        self.eval_all(&st.inputs)
    }
}
