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
//!
//! The fairest form, `rego-vm` ([`RegoVmSubject`]): the `closure` module
//! compiled once per rule to regorus' bytecode (`rvm` feature:
//! `Engine::compile_with_entrypoint`, then `Compiler::compile_from_policy`)
//! and run on a reused `RegoVM` with the data document set once. Churn puts
//! the new agent's entries (and record) into the VM's data document in
//! place (`RegoVM::set_data` of the updated document; the VM's copy is
//! released first so nothing of the document is copied), then executes.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use regorus::languages::rego::compiler::Compiler;
use regorus::rvm::RegoVM;
use regorus::rvm::program::Program;
use regorus::{Engine, Rc, Value};
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
        let _ = leaf;
        let hot = questions(w, s, &w.questions(s))?;
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

/// The inputs of each (agent, question) pair.
fn questions(w: &World, s: Scenario, qs: &[(usize, Query)]) -> Result<Vec<Vec<Value>>> {
    qs.iter()
        .map(|(a, q)| {
            let id = &w.agents.get(*a).context("agent")?.id;
            Ok(inputs(w, s, id, *q, w.records.get(*q)))
        })
        .collect()
}

fn rule_name(s: Scenario) -> &'static str {
    match s {
        Scenario::S1 => "s1",
        Scenario::S2 | Scenario::S4 => "s2",
        Scenario::S3 => "s3",
    }
}

/// The `closure` module compiled to RVM bytecode, one program per rule.
pub fn programs() -> Result<Vec<(Scenario, Arc<Program>)>> {
    let mut out = Vec::new();
    for s in [Scenario::S1, Scenario::S2, Scenario::S3] {
        let mut e = Engine::new();
        e.add_policy("closure.rego".to_owned(), module(Form::Closure))
            .map_err(|e| anyhow!("rego policy: {e}"))?;
        let entry = format!("data.closure.{}", rule_name(s));
        let entry_rc: Rc<str> = entry.as_str().into();
        let compiled = e
            .compile_with_entrypoint(&entry_rc)
            .map_err(|e| anyhow!("rego compile {entry}: {e}"))?;
        let program = Compiler::compile_from_policy(&compiled, &[entry.as_str()])
            .map_err(|e| anyhow!("rvm compile {entry}: {e}"))?;
        out.push((s, program));
    }
    Ok(out)
}

/// The closure data document as a regorus value (shared by the VM subjects).
pub fn vm_data(w: &World) -> Result<Value> {
    Value::from_json_str(&data(w, Form::Closure).to_string()).map_err(|e| anyhow!("data: {e}"))
}

struct VmStaged {
    /// (section, key, value) entries to put into the data document.
    entries: Vec<(Value, Value, Value)>,
    inputs: Vec<Value>,
}

/// Rego on regorus' bytecode VM, with the precomputed closure.
pub struct RegoVmSubject {
    scenario: Scenario,
    vm: RegoVM,
    base: Value,
    data: Value,
    hot: Vec<Vec<Value>>,
    world: std::sync::Arc<World>,
    staged: VecDeque<VmStaged>,
}

impl RegoVmSubject {
    /// Set up a VM on `programs` (from [`programs`]) and `data` (from
    /// [`vm_data`]); `hot(p)` answers `questions[p]`.
    pub fn new(
        w: &std::sync::Arc<World>,
        programs: &[(Scenario, Arc<Program>)],
        data: &Value,
        s: Scenario,
        questions_: &[(usize, Query)],
    ) -> Result<Self> {
        let rule_s = if s == Scenario::S4 { Scenario::S2 } else { s };
        let program = programs
            .iter()
            .find(|(x, _)| *x == rule_s)
            .map(|(_, p)| Arc::clone(p))
            .context("program")?;
        let mut vm = RegoVM::new();
        vm.load_program(program);
        vm.set_data(data.clone())
            .map_err(|e| anyhow!("rvm data: {e}"))?;
        Ok(Self {
            scenario: s,
            vm,
            base: data.clone(),
            data: unshared(data),
            hot: questions(w, s, questions_)?,
            world: std::sync::Arc::clone(w),
            staged: VecDeque::new(),
        })
    }

    fn exec_all(vm: &mut RegoVM, inputs: &[Value]) -> Result<u64> {
        let mut out = 0u64;
        for (i, v) in inputs.iter().enumerate() {
            vm.set_input(v.clone());
            let r = vm.execute().map_err(|e| anyhow!("rvm: {e}"))?;
            match r {
                Value::Bool(true) => out |= 1 << i,
                Value::Bool(false) => {}
                other => bail!("rvm answered {other}"),
            }
        }
        Ok(out)
    }
}

impl Subject for RegoVmSubject {
    fn label(&self) -> String {
        "rego-vm".into()
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let inputs = self.hot.get(p).context("question")?;
        Self::exec_all(&mut self.vm, inputs)
    }

    fn stage(&mut self, k: usize) -> Result<()> {
        let w = &self.world;
        let agent = w.churn_agent(k);
        let q = w.churn_query(self.scenario, k);
        let record = w.churn_query_record(k, q);
        let mut l = vec![agent.id.clone()];
        l.extend(lineage_ids(w, w.churn_parent()));
        let mut out = Map::new();
        agent_data(w, &agent, Some(l), &mut out);
        if self.scenario == Scenario::S3 {
            record_data(&w.churn_record(k), &mut out);
        }
        let mut entries = Vec::new();
        for (section, m) in out {
            if let Json::Object(m) = m {
                for (key, v) in m {
                    entries.push((
                        Value::from(section.as_str()),
                        Value::from(key.as_str()),
                        Value::from(v),
                    ));
                }
            }
        }
        let inputs = inputs(w, self.scenario, &agent.id, q, Some(&record));
        self.staged.push_back(VmStaged { entries, inputs });
        Ok(())
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        let st = self.staged.pop_front().context("nothing staged")?;
        // Release the VM's reference so the document is updated in place.
        self.vm
            .set_data(Value::new_object())
            .map_err(|e| anyhow!("rvm data: {e}"))?;
        let root = self.data.as_object_mut()?;
        for (section, key, v) in st.entries {
            let m = root.get_mut(&section).context("data section")?;
            m.as_object_mut()?.insert(key, v);
        }
        self.vm
            .set_data(self.data.clone())
            .map_err(|e| anyhow!("rvm data: {e}"))?;
        Self::exec_all(&mut self.vm, &st.inputs)
    }

    fn reset(&mut self) -> Result<()> {
        self.vm
            .set_data(self.base.clone())
            .map_err(|e| anyhow!("rvm data: {e}"))?;
        self.data = unshared(&self.base);
        Ok(())
    }
}

/// A copy of a data document whose root and sections share nothing (so a
/// churn decision's in-place update never copies a section; done untimed).
fn unshared(v: &Value) -> Value {
    match v {
        Value::Object(root) => Value::Object(Rc::new(
            root.iter()
                .map(|(k, x)| {
                    let x = match x {
                        Value::Object(m) => Value::Object(Rc::new((**m).clone())),
                        other => other.clone(),
                    };
                    (k.clone(), x)
                })
                .collect(),
        )),
        other => other.clone(),
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
