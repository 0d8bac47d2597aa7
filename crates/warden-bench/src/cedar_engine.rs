//! Cedar (`cedar-policy`), with the encodings a Cedar user would write.
//!
//! One entity store serves every scenario. Each agent is an `Agent` entity
//! whose parents are its parent agent plus host-computed groups: `Holds::"A"`
//! for each action it declares, `Lacks::"A"` for each it does not. Cedar's
//! transitive closure then makes `principal in Holds::"A"` mean "some agent
//! on the lineage declares A" and `principal in Lacks::"A"` mean "some agent
//! on the lineage lacks A". Attributes: `caps` (declared action names) and
//! `parent` (for the naive walk and `children` visibility). Records are
//! `Record` entities with `owner` and `vis`.
//!
//! - S1 `groups`: `permit(principal in Holds::"A", action == Action::"A", resource);`
//! - S2 `groups`: `permit(principal, action, resource);` plus
//!   `forbid(principal in Lacks::"A", action == Action::"A", resource);`
//! - S2 `walk`: the naive form without host help, one policy walking
//!   `principal.parent.parent…` unrolled to the world's depth (Cedar has no
//!   recursion).
//! - S3: owner, `principal in resource.owner` for `descendants`,
//!   `principal.parent == resource.owner` for `children`.
//! - S4: 50 S2 `groups` requests.
//!
//! Churn: `add` is `Entities::add_entities` of the new agent on the full
//! store (Cedar re-computes the transitive closure; the store is reset,
//! untimed, after each decision); `slice` builds a fresh store holding only
//! the request's slice (the new agent, its ancestors, the record) with
//! `Entities::from_entities`, the way Cedar's docs suggest passing entities
//! per request. Hot mode uses the full, preloaded store.
//!
//! The fairest form, `cedar-1p` ([`Form::PerAction`]): Cedar 4.14 evaluates
//! every policy of the set on every request (it has no policy index), so a
//! host that knows the action passes only that action's policy, one per
//! request:
//!
//! - S1 `permit(principal in Holds::"A", action == Action::"A", resource);`
//! - S2, S4 `permit(principal, action == Action::"A", resource) unless { principal in Lacks::"A" };`
//! - S3 the three permits merged into one with `||`.
//!
//! Its entities carry only what the scenario's policy reads (S1: the parent
//! and `Holds` groups, S2/S4: the parent and `Lacks` groups, S3: the parent
//! and the `parent` attribute), and its churn slice holds only what the
//! request reads: the new agent and its ancestors with the groups of the
//! actions asked, and for S3 the records.

use std::collections::{HashMap, HashSet, VecDeque};
use std::str::FromStr;

use anyhow::{Context as _, Result, anyhow, bail};
use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityUid, PolicySet, Request,
    RestrictedExpression,
};

use crate::subject::Subject;
use crate::world::{ACTIONS, Agent, Query, Record, Scenario, World};

/// Which policy encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Host-computed groups + Cedar's entity hierarchy (`in`).
    Groups,
    /// S2 only: a naive unrolled parent walk.
    Walk,
    /// One policy per request (the action's own), scenario-specific
    /// entities and request-specific churn slices.
    PerAction,
}

/// How a churn decision gets the new agent into the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Churn {
    /// `add_entities` on the full store.
    Add,
    /// A per-request store of the request's slice.
    Slice,
}

fn uid(ty: &str, id: &str) -> Result<EntityUid> {
    EntityUid::from_str(&format!("{ty}::\"{id}\"")).map_err(|e| anyhow!("uid {ty} {id}: {e}"))
}

fn agent_entity(a: &Agent, parent: Option<&str>) -> Result<Entity> {
    let mut parents = HashSet::new();
    let mut attrs = HashMap::new();
    if let Some(p) = parent {
        let p = uid("Agent", p)?;
        parents.insert(p.clone());
        attrs.insert("parent".to_owned(), RestrictedExpression::new_entity_uid(p));
    }
    for (i, name) in ACTIONS.iter().enumerate() {
        let group = if a.declares(i) { "Holds" } else { "Lacks" };
        parents.insert(uid(group, name)?);
    }
    attrs.insert(
        "caps".to_owned(),
        RestrictedExpression::new_set(
            a.declared
                .iter()
                .filter_map(|i| ACTIONS.get(*i))
                .map(|n| RestrictedExpression::new_string((*n).to_owned())),
        ),
    );
    Entity::new(uid("Agent", &a.id)?, attrs, parents).map_err(|e| anyhow!("entity {}: {e}", a.id))
}

/// An agent entity holding only what scenario `s`'s per-action policy
/// reads; with `only`, only the groups of those actions.
fn fair_entity(
    s: Scenario,
    a: &Agent,
    parent: Option<&str>,
    only: Option<&[usize]>,
) -> Result<Entity> {
    let mut parents = HashSet::new();
    let mut attrs = HashMap::new();
    if let Some(p) = parent {
        let p = uid("Agent", p)?;
        parents.insert(p.clone());
        if s == Scenario::S3 {
            attrs.insert("parent".to_owned(), RestrictedExpression::new_entity_uid(p));
        }
    }
    for (i, name) in ACTIONS.iter().enumerate() {
        if only.is_some_and(|o| !o.contains(&i)) {
            continue;
        }
        match s {
            Scenario::S1 if a.declares(i) => {
                parents.insert(uid("Holds", name)?);
            }
            Scenario::S2 | Scenario::S4 if !a.declares(i) => {
                parents.insert(uid("Lacks", name)?);
            }
            _ => {}
        }
    }
    Entity::new(uid("Agent", &a.id)?, attrs, parents).map_err(|e| anyhow!("entity {}: {e}", a.id))
}

/// The scenario-specific store of a world (for [`Form::PerAction`]).
pub fn fair_store(w: &World, s: Scenario) -> Result<Entities> {
    let mut entities = Vec::with_capacity(w.agents.len() + w.records.len());
    for a in &w.agents {
        entities.push(fair_entity(s, a, parent_id(w, a).as_deref(), None)?);
    }
    if s == Scenario::S3 {
        for r in &w.records {
            entities.push(record_entity(r)?);
        }
    }
    Entities::from_entities(entities, None).map_err(|e| anyhow!("entities: {e}"))
}

fn record_entity(r: &Record) -> Result<Entity> {
    let attrs = HashMap::from([
        (
            "owner".to_owned(),
            RestrictedExpression::new_entity_uid(uid("Agent", &r.owner_id)?),
        ),
        (
            "vis".to_owned(),
            RestrictedExpression::new_string(r.vis.as_str().to_owned()),
        ),
    ]);
    Entity::new(uid("Record", &r.key)?, attrs, HashSet::new())
        .map_err(|e| anyhow!("record {}: {e}", r.key))
}

fn parent_id(w: &World, a: &Agent) -> Option<String> {
    a.parent.and_then(|i| w.agents.get(i)).map(|p| p.id.clone())
}

/// The policy text of a scenario and form.
pub fn policy_text(s: Scenario, form: Form, depth: usize) -> String {
    let mut out = String::new();
    match (s, form) {
        (Scenario::S1, _) => {
            for a in ACTIONS {
                out.push_str(&format!(
                    "permit(principal in Holds::\"{a}\", action == Action::\"{a}\", resource);\n"
                ));
            }
        }
        (Scenario::S2 | Scenario::S4, Form::PerAction) => {
            for a in 0..ACTIONS.len() {
                out.push_str(&action_policy(s, a));
            }
        }
        (Scenario::S2 | Scenario::S4, Form::Groups) => {
            out.push_str("permit(principal, action, resource);\n");
            for a in ACTIONS {
                out.push_str(&format!(
                    "forbid(principal in Lacks::\"{a}\", action == Action::\"{a}\", resource);\n"
                ));
            }
        }
        (Scenario::S2 | Scenario::S4, Form::Walk) => {
            // E_k = P_k.caps.contains(a) && (!(P_k has parent) || E_{k+1}),
            // P_k = principal.parent…(k times); the last level must be a root.
            let p = |k: usize| {
                let mut s = String::from("principal");
                for _ in 0..k {
                    s.push_str(".parent");
                }
                s
            };
            let mut expr = format!(
                "({0}.caps.contains(context.a) && !({0} has parent))",
                p(depth.saturating_sub(1))
            );
            for k in (0..depth.saturating_sub(1)).rev() {
                expr = format!(
                    "({0}.caps.contains(context.a) && (!({0} has parent) || {expr}))",
                    p(k)
                );
            }
            out.push_str(&format!(
                "permit(principal, action, resource) when {{ {expr} }};\n"
            ));
        }
        (Scenario::S3, Form::PerAction) => {
            out.push_str(concat!(
                "permit(principal, action == Action::\"read\", resource is Record) when { resource.owner == principal || ",
                "(resource.vis == \"descendants\" && principal in resource.owner) || ",
                "(resource.vis == \"children\" && principal has parent && principal.parent == resource.owner) };\n",
            ));
        }
        (Scenario::S3, _) => {
            out.push_str(concat!(
                "permit(principal, action == Action::\"read\", resource is Record) when { resource.owner == principal };\n",
                "permit(principal, action == Action::\"read\", resource is Record) when { resource.vis == \"descendants\" && principal in resource.owner };\n",
                "permit(principal, action == Action::\"read\", resource is Record) when { resource.vis == \"children\" && principal has parent && principal.parent == resource.owner };\n",
            ));
        }
    }
    out
}

/// [`Form::PerAction`]: the one policy of action `a` (S1, S2, S4).
pub fn action_policy(s: Scenario, a: usize) -> String {
    let name = ACTIONS.get(a).copied().unwrap_or("");
    match s {
        Scenario::S1 => format!(
            "permit(principal in Holds::\"{name}\", action == Action::\"{name}\", resource);\n"
        ),
        _ => format!(
            "permit(principal, action == Action::\"{name}\", resource) unless {{ principal in Lacks::\"{name}\" }};\n"
        ),
    }
}

/// `n` policies that never apply to a benchmarked request (for the
/// policy-count sweep: Cedar evaluates each of them anyway).
pub fn padding(n: usize) -> String {
    (0..n)
        .map(|i| format!("permit(principal in Holds::\"pad.{i}\", action == Action::\"pad.{i}\", resource);\n"))
        .collect()
}

/// The full store of a world.
pub fn store(w: &World) -> Result<Entities> {
    let mut entities = Vec::with_capacity(w.agents.len() + w.records.len());
    for a in &w.agents {
        entities.push(agent_entity(a, parent_id(w, a).as_deref())?);
    }
    for r in &w.records {
        entities.push(record_entity(r)?);
    }
    Entities::from_entities(entities, None).map_err(|e| anyhow!("entities: {e}"))
}

struct Staged {
    new: Vec<Entity>,
    requests: Vec<(Request, usize)>,
}

/// Cedar for one scenario, form and churn method.
pub struct CedarSubject {
    scenario: Scenario,
    form: Form,
    churn: Churn,
    /// One set ([`Form::Groups`], [`Form::Walk`], S3), or one per action.
    sets: Vec<PolicySet>,
    authorizer: Authorizer,
    base: Entities,
    entities: Option<Entities>,
    /// Hot requests, by question, each with the index of its policy set.
    hot: Vec<Vec<(Request, usize)>>,
    /// The churn parent's lineage as entities (the slice all churn agents share).
    slice: Vec<Entity>,
    world: std::sync::Arc<World>,
    staged: VecDeque<Staged>,
    label: String,
}

impl CedarSubject {
    /// Set up with a copy of `base` (the world's full store for
    /// [`Form::Groups`] and [`Form::Walk`], [`fair_store`] for
    /// [`Form::PerAction`]), for the leaf's hot questions.
    pub fn new(
        w: &std::sync::Arc<World>,
        base: &Entities,
        s: Scenario,
        form: Form,
        churn: Churn,
        label: &str,
    ) -> Result<Self> {
        Self::asking(w, base, s, form, churn, label, &w.questions(s), 0)
    }

    /// Set up with a copy of `base`; `hot(p)` answers `questions[p]`, and
    /// every policy set also holds `pad` policies that never apply.
    #[allow(clippy::too_many_arguments)]
    pub fn asking(
        w: &std::sync::Arc<World>,
        base: &Entities,
        s: Scenario,
        form: Form,
        churn: Churn,
        label: &str,
        questions: &[(usize, Query)],
        pad: usize,
    ) -> Result<Self> {
        let pad = padding(pad);
        let parse = |text: String| {
            PolicySet::from_str(&(text + &pad)).map_err(|e| anyhow!("cedar policies: {e}"))
        };
        let sets = match (form, s) {
            (Form::PerAction, Scenario::S1 | Scenario::S2 | Scenario::S4) => (0..ACTIONS.len())
                .map(|a| parse(action_policy(s, a)))
                .collect::<Result<_>>()?,
            _ => vec![parse(policy_text(s, form, w.depth))?],
        };
        let hot = questions
            .iter()
            .map(|(a, q)| {
                let id = &w.agents.get(*a).context("agent")?.id;
                requests(w, s, form, id, *q, w.records.get(*q))
            })
            .collect::<Result<_>>()?;
        let slice = w
            .lineage(w.churn_parent())
            .into_iter()
            .filter_map(|i| w.agents.get(i))
            .map(|a| agent_entity(a, parent_id(w, a).as_deref()))
            .collect::<Result<_>>()?;
        Ok(Self {
            scenario: s,
            form,
            churn,
            sets,
            authorizer: Authorizer::new(),
            base: base.clone(),
            entities: Some(base.clone()),
            hot,
            slice,
            world: std::sync::Arc::clone(w),
            staged: VecDeque::new(),
            label: label.to_owned(),
        })
    }

    fn decide_all(&self, requests: &[(Request, usize)], entities: &Entities) -> Result<u64> {
        let mut acc = 0u64;
        for (i, (r, set)) in requests.iter().enumerate() {
            let policies = self.sets.get(*set).context("policy set")?;
            let resp = self.authorizer.is_authorized(r, policies, entities);
            acc |= u64::from(resp.decision() == Decision::Allow) << i;
        }
        Ok(acc)
    }

    /// Whether any request of hot question `p` produced an evaluation error
    /// (Cedar turns errors into denials; the agreement check rejects them).
    pub fn hot_errors(&self, p: usize) -> Vec<String> {
        let Some(entities) = self.entities.as_ref() else {
            return vec!["no store".into()];
        };
        let mut out = Vec::new();
        for (r, set) in self.hot.get(p).into_iter().flatten() {
            let Some(policies) = self.sets.get(*set) else {
                out.push("no policy set".into());
                continue;
            };
            let resp = self.authorizer.is_authorized(r, policies, entities);
            out.extend(resp.diagnostics().errors().map(|e| e.to_string()));
        }
        out
    }
}

/// The requests of one question, each with the index of its policy set
/// (for [`Form::PerAction`], the action's; otherwise 0).
fn requests(
    w: &World,
    s: Scenario,
    form: Form,
    principal: &str,
    q: Query,
    record: Option<&Record>,
) -> Result<Vec<(Request, usize)>> {
    let p = uid("Agent", principal)?;
    let one = |a: usize, action: &str, resource: EntityUid| -> Result<(Request, usize)> {
        let context = match form {
            Form::Walk => Context::from_pairs([(
                "a".to_owned(),
                RestrictedExpression::new_string(action.to_owned()),
            )])
            .map_err(|e| anyhow!("context: {e}"))?,
            Form::Groups | Form::PerAction => Context::empty(),
        };
        let set = if form == Form::PerAction && s != Scenario::S3 {
            a
        } else {
            0
        };
        let r = Request::new(p.clone(), uid("Action", action)?, resource, context, None)
            .map_err(|e| anyhow!("request: {e}"))?;
        Ok((r, set))
    };
    let tool = uid("Tool", "t")?;
    match s {
        Scenario::S1 | Scenario::S2 => Ok(vec![one(
            q,
            ACTIONS.get(q).copied().context("action")?,
            tool,
        )?]),
        Scenario::S3 => {
            let r = record.context("record")?;
            Ok(vec![one(0, "read", uid("Record", &r.key)?)?])
        }
        Scenario::S4 => w
            .sop
            .iter()
            .map(|a| one(*a, ACTIONS.get(*a).copied().unwrap_or(""), tool.clone()))
            .collect(),
    }
}

impl Subject for CedarSubject {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let entities = self.entities.as_ref().context("no store")?;
        let reqs = self.hot.get(p).context("question")?;
        self.decide_all(reqs, entities)
    }

    fn stage(&mut self, k: usize) -> Result<()> {
        let w = &self.world;
        let agent = w.churn_agent(k);
        let parent = w.agents.get(w.churn_parent()).map(|a| a.id.as_str());
        let q = w.churn_query(self.scenario, k);
        let record = w.churn_query_record(k, q);
        let mut new = Vec::new();
        if self.form == Form::PerAction {
            // Only what this request reads: the actions it asks about, the
            // new agent and its ancestors, the records.
            let only: Vec<usize> = match self.scenario {
                Scenario::S1 | Scenario::S2 => vec![q],
                Scenario::S3 => Vec::new(),
                Scenario::S4 => w.sop.clone(),
            };
            new.push(fair_entity(self.scenario, &agent, parent, Some(&only))?);
            for i in w.lineage(w.churn_parent()) {
                let a = w.agents.get(i).context("ancestor")?;
                new.push(fair_entity(
                    self.scenario,
                    a,
                    parent_id(w, a).as_deref(),
                    Some(&only),
                )?);
            }
        } else {
            new.push(agent_entity(&agent, parent)?);
        }
        if self.scenario == Scenario::S3 {
            new.push(record_entity(&w.churn_record(k))?);
            if (self.churn == Churn::Slice || self.form == Form::PerAction) && q < w.records.len() {
                // The slice must hold the record being read.
                new.push(record_entity(&record)?);
            }
        }
        let requests = requests(w, self.scenario, self.form, &agent.id, q, Some(&record))?;
        self.staged.push_back(Staged { new, requests });
        Ok(())
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        let st = self.staged.pop_front().context("nothing staged")?;
        if self.form == Form::PerAction {
            let store =
                Entities::from_entities(st.new, None).map_err(|e| anyhow!("from_entities: {e}"))?;
            return self.decide_all(&st.requests, &store);
        }
        match self.churn {
            Churn::Add => {
                let store = self.entities.take().context("no store")?;
                let store = store
                    .add_entities(st.new, None)
                    .map_err(|e| anyhow!("add_entities: {e}"))?;
                let out = self.decide_all(&st.requests, &store);
                self.entities = Some(store);
                out
            }
            Churn::Slice => {
                let store = Entities::from_entities(self.slice.iter().cloned().chain(st.new), None)
                    .map_err(|e| anyhow!("from_entities: {e}"))?;
                self.decide_all(&st.requests, &store)
            }
        }
    }

    fn reset(&mut self) -> Result<()> {
        if self.churn == Churn::Add && self.form != Form::PerAction {
            self.entities = Some(self.base.clone());
        }
        Ok(())
    }
}

/// Check a policy text parses (used by tests).
pub fn parses(s: Scenario, form: Form, depth: usize) -> Result<()> {
    match PolicySet::from_str(&policy_text(s, form, depth)) {
        Ok(_) => Ok(()),
        Err(e) => bail!("{e}"),
    }
}
