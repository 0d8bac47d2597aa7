//! S5: a session's tool call decided with provenance, per call.
//!
//! One session of one agent (`a1`, a child of `a0`, holding `send_money`)
//! has recorded, in its source index, the user's trusted input (two payee
//! IBANs and three e-mail addresses) and four `get_transactions` results of
//! five transactions each: a `recipient` field the catalogue declares
//! `trusted` and a `subject` field it declares `untrusted`, holding an
//! attacker's IBAN or e-mail address. Each call is
//! `send_money {recipient, cc: [a, b]}` under the rules
//!
//! - `recipient` from `[user, trusted]`, caseless, otherwise escalate;
//! - `cc[*]` from `[user]`, case-sensitive, otherwise deny;
//!
//! so the answer is 0 (allow), 1 (escalate) or 2 (deny: deny wins). The
//! calls mix the user's values, trusted results (half of them in another
//! case), the attacker's values from the untrusted fields and fresh values.
//!
//! - Warden: [`warden_core::gate::assess`] of the call, without a plan, on
//!   the session's [`SourceIndex`] (normalisation, keyed fingerprints,
//!   token-run search in every field, the look-alike check, the capability
//!   and argument checks; every checked value's provenance is returned).
//! - Cedar (the closest it can express): an entity per recorded value,
//!   whose parents are its origins (`Origin::"user"`, `"trusted"`,
//!   `"untrusted"`), under two spellings (`Val::"exact"`, and
//!   `Ci::"lowercased"` for the caseless rule); each argument is looked up
//!   as an entity reference in the request's context, against the action's
//!   three policies (a permit, a forbid per rule; which forbid decided gives
//!   escalate or deny). Cedar can only match a value exactly as the host
//!   recorded it, with the host lowercasing it; the requests are built before
//!   timing.
//! - Rego (interpreter and bytecode VM): `data.vals[v]` / `data.ci[v]` hold
//!   each recorded value's origins; the rules look each argument up.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityUid, PolicyId, PolicySet, Request,
    RestrictedExpression,
};
use regorus::languages::rego::compiler::Compiler;
use regorus::rvm::RegoVM;
use regorus::{Engine, Rc, Value};
use serde_json::{Value as Json, json};
use warden_core::bundle::{Policy, compile};
use warden_core::decision::Verdict;
use warden_core::gate::{GateCall, GateContext, PlanUse, Verdicts, assess};
use warden_core::hierarchy::{AgentSpec, Hierarchy};
use warden_core::ids::{ActionName, AgentId};
use warden_core::provenance::{FingerprintKey, SourceId, SourceIndex};

use crate::subject::Subject;
use crate::world::SplitMix64;

/// The bundle: the two actions, the rules, the output trust.
pub const BUNDLE: &str = r#"
policy_version: bench-s5
environment_capabilities: [send_money, get_transactions]
actions:
  send_money:
    tags: [state_changing]
    provenance:
      - {argument: recipient, from: [user, trusted], otherwise: escalate, match: caseless}
      - {argument: "cc[*]", from: [user], otherwise: deny}
  get_transactions:
    output:
      trust: trusted
      fields: {"[*].subject": untrusted}
"#;

/// Calls per session (the hot questions).
pub const CALLS: usize = 64;

/// Where a recorded value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// The user's trusted input.
    User,
    /// A trusted result field.
    Trusted,
    /// An untrusted result field.
    Untrusted,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::User => "user",
            Origin::Trusted => "trusted",
            Origin::Untrusted => "untrusted",
        }
    }
}

/// One proposed call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The payee.
    pub recipient: String,
    /// Two copies to.
    pub cc: [String; 2],
}

/// The session's recorded values and its calls.
#[derive(Debug, Clone)]
pub struct SessionWorld {
    /// The user's input.
    pub user: Json,
    /// The four results.
    pub results: Vec<Json>,
    /// Every recorded value with its origin.
    pub values: Vec<(String, Origin)>,
    /// The calls.
    pub calls: Vec<Call>,
}

fn iban(rng: &mut SplitMix64, country: &str) -> String {
    let mut s = String::from(country);
    for _ in 0..20 {
        s.push(char::from(b'0' + rng.below(10) as u8));
    }
    s
}

fn email(rng: &mut SplitMix64, who: &str, domain: &str) -> String {
    format!("{who}{}@{domain}.com", rng.below(1_000_000))
}

impl SessionWorld {
    /// The seeded session.
    pub fn new(seed: u64) -> Self {
        let mut rng = SplitMix64(seed ^ 0x5E55_1011);
        let user_ibans: Vec<String> = (0..2).map(|_| iban(&mut rng, "CH")).collect();
        let user_emails: Vec<String> = ["alice", "bob", "carol"]
            .iter()
            .map(|w| email(&mut rng, w, "example"))
            .collect();
        let user = json!({"payees": user_ibans, "cc": user_emails, "note": "monthly payments"});
        let mut values: Vec<(String, Origin)> = Vec::new();
        values.extend(user_ibans.iter().map(|v| (v.clone(), Origin::User)));
        values.extend(user_emails.iter().map(|v| (v.clone(), Origin::User)));
        let mut trusted = Vec::new();
        let mut bad_ibans = Vec::new();
        let mut bad_emails = Vec::new();
        let mut results = Vec::new();
        for _ in 0..4 {
            let mut txs = Vec::new();
            for j in 0..5 {
                let r = iban(&mut rng, "DE");
                let subject = if j % 2 == 0 {
                    let v = iban(&mut rng, "US");
                    bad_ibans.push(v.clone());
                    v
                } else {
                    let v = email(&mut rng, "mallory", "evil");
                    bad_emails.push(v.clone());
                    v
                };
                values.push((r.clone(), Origin::Trusted));
                values.push((subject.clone(), Origin::Untrusted));
                trusted.push(r.clone());
                txs.push(json!({"recipient": r, "subject": subject}));
            }
            results.push(Json::Array(txs));
        }
        let pick = |rng: &mut SplitMix64, v: &[String]| -> String {
            v.get(rng.below(v.len() as u64) as usize)
                .cloned()
                .unwrap_or_default()
        };
        let mut calls = Vec::with_capacity(CALLS);
        for _ in 0..CALLS {
            let recipient = match rng.weighted(&[30, 30, 25, 15]) {
                0 => pick(&mut rng, &user_ibans),
                1 => {
                    let v = pick(&mut rng, &trusted);
                    if rng.below(2) == 0 {
                        v.to_lowercase()
                    } else {
                        v
                    }
                }
                2 => pick(&mut rng, &bad_ibans),
                _ => iban(&mut rng, "FR"),
            };
            let mut cc = || match rng.weighted(&[85, 10, 5]) {
                0 => pick(&mut rng, &user_emails),
                1 => pick(&mut rng, &bad_emails),
                _ => email(&mut rng, "dave", "mail"),
            };
            let cc = [cc(), cc()];
            calls.push(Call { recipient, cc });
        }
        Self {
            user,
            results,
            values,
            calls,
        }
    }

    /// The reference answer of call `i`: 2 if a `cc` value is not exactly a
    /// user value, else 1 if the recipient is not (caselessly) a user or
    /// trusted value, else 0.
    pub fn expected(&self, i: usize) -> u64 {
        let Some(c) = self.calls.get(i) else {
            return u64::MAX;
        };
        let user_exact: BTreeSet<&str> = self
            .values
            .iter()
            .filter(|(_, o)| *o == Origin::User)
            .map(|(v, _)| v.as_str())
            .collect();
        let vouched_ci: BTreeSet<String> = self
            .values
            .iter()
            .filter(|(_, o)| *o != Origin::Untrusted)
            .map(|(v, _)| v.to_lowercase())
            .collect();
        if c.cc.iter().any(|v| !user_exact.contains(v.as_str())) {
            2
        } else if !vouched_ci.contains(&c.recipient.to_lowercase()) {
            1
        } else {
            0
        }
    }
}

fn verdict_code(v: Verdict) -> u64 {
    match v {
        Verdict::Allow | Verdict::Constrain => 0,
        Verdict::Escalate => 1,
        Verdict::Deny => 2,
    }
}

/// Warden's gate.
pub struct WardenSession {
    policy: Policy,
    hierarchy: Hierarchy,
    index: SourceIndex,
    actor: AgentId,
    calls: Vec<Json>,
}

impl WardenSession {
    /// The session, its index recorded.
    pub fn new(w: &SessionWorld) -> Result<Self> {
        let policy = compile(BUNDLE).map_err(|e| anyhow!("s5 bundle: {e}"))?;
        let mut hierarchy = policy.empty_hierarchy();
        let index_of = |a: &ActionName| policy.action_index(a);
        let caps: BTreeSet<ActionName> = ["send_money", "get_transactions"]
            .iter()
            .map(|n| ActionName::parse(n))
            .collect::<Result<_, _>>()?;
        for (id, parent) in [("a0", None), ("a1", Some("a0"))] {
            hierarchy
                .register(
                    &AgentSpec {
                        id: AgentId::parse(id)?,
                        parent: parent.map(AgentId::parse).transpose()?,
                        capabilities: caps.clone(),
                    },
                    &index_of,
                )
                .map_err(|e| anyhow!("register {id}: {e:?}"))?;
        }
        let mut index = SourceIndex::new(FingerprintKey::new(&[7; 32])?);
        index.record_user(SourceId::parse("user")?, &w.user)?;
        let tx = policy
            .catalogue
            .by_name("get_transactions")
            .context("get_transactions")?;
        for (i, r) in w.results.iter().enumerate() {
            index.record_result(
                SourceId::parse(&format!("call-{i}"))?,
                ActionName::parse("get_transactions")?,
                tx.provenance().output(),
                r,
            )?;
        }
        let calls = w
            .calls
            .iter()
            .map(|c| json!({"recipient": c.recipient, "cc": c.cc}))
            .collect();
        Ok(Self {
            policy,
            hierarchy,
            index,
            actor: AgentId::parse("a1")?,
            calls,
        })
    }
}

impl Subject for WardenSession {
    fn label(&self) -> String {
        "warden".into()
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let arguments = self.calls.get(p).context("call")?;
        let ctx = GateContext {
            hierarchy: &self.hierarchy,
            policy: &self.policy,
        };
        let call = GateCall {
            actor: &self.actor,
            action: "send_money",
            arguments,
            plan: PlanUse::None,
            index: &self.index,
            envelope: None,
        };
        let a = assess(&ctx, &call, Verdicts::default());
        let code = verdict_code(a.verdict);
        std::hint::black_box(a);
        Ok(code)
    }

    fn stage(&mut self, _k: usize) -> Result<()> {
        bail!("S5 has no churn mode")
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        bail!("S5 has no churn mode")
    }
}

fn uid(ty: &str, id: &str) -> Result<EntityUid> {
    EntityUid::from_str(&format!("{ty}::{}", Json::from(id)))
        .map_err(|e| anyhow!("uid {ty} {id}: {e}"))
}

/// Cedar: an entity per recorded value, looked up per argument.
pub struct CedarSession {
    policies: PolicySet,
    deny_cc: PolicyId,
    authorizer: Authorizer,
    entities: Entities,
    requests: Vec<Request>,
}

impl CedarSession {
    /// The store and the prebuilt requests.
    pub fn new(w: &SessionWorld) -> Result<Self> {
        let text = r#"
@id("allow")
permit(principal, action == Action::"send_money", resource);
@id("escalate_recipient")
forbid(principal, action == Action::"send_money", resource)
  unless { context.recipient in Origin::"user" || context.recipient in Origin::"trusted" };
@id("deny_cc")
forbid(principal, action == Action::"send_money", resource)
  unless { context.cc0 in Origin::"user" && context.cc1 in Origin::"user" };
"#;
        let policies = PolicySet::from_str(text).map_err(|e| anyhow!("s5 cedar: {e}"))?;
        let deny_cc = policies
            .policies()
            .find(|p| p.annotation("id") == Some("deny_cc"))
            .map(|p| p.id().clone())
            .context("deny_cc policy")?;
        // One entity per spelling, its origins as parents.
        let mut by_uid: BTreeMap<(String, String), BTreeSet<Origin>> = BTreeMap::new();
        for (v, o) in &w.values {
            by_uid
                .entry(("Val".into(), v.clone()))
                .or_default()
                .insert(*o);
            by_uid
                .entry(("Ci".into(), v.to_lowercase()))
                .or_default()
                .insert(*o);
        }
        let mut entities = Vec::new();
        for ((ty, id), origins) in by_uid {
            let parents = origins
                .iter()
                .map(|o| uid("Origin", o.as_str()))
                .collect::<Result<_>>()?;
            entities.push(Entity::new_no_attrs(uid(&ty, &id)?, parents));
        }
        let entities =
            Entities::from_entities(entities, None).map_err(|e| anyhow!("s5 entities: {e}"))?;
        let requests = w
            .calls
            .iter()
            .map(|c| {
                let [c0, c1] = &c.cc;
                let context = Context::from_pairs([
                    (
                        "recipient".to_owned(),
                        RestrictedExpression::new_entity_uid(uid(
                            "Ci",
                            &c.recipient.to_lowercase(),
                        )?),
                    ),
                    (
                        "cc0".to_owned(),
                        RestrictedExpression::new_entity_uid(uid("Val", c0)?),
                    ),
                    (
                        "cc1".to_owned(),
                        RestrictedExpression::new_entity_uid(uid("Val", c1)?),
                    ),
                ])
                .map_err(|e| anyhow!("context: {e}"))?;
                Request::new(
                    uid("Agent", "a1")?,
                    uid("Action", "send_money")?,
                    uid("Tool", "bank")?,
                    context,
                    None,
                )
                .map_err(|e| anyhow!("request: {e}"))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            policies,
            deny_cc,
            authorizer: Authorizer::new(),
            entities,
            requests,
        })
    }

    /// Evaluation errors of call `p` (must be none).
    pub fn errors(&self, p: usize) -> Vec<String> {
        self.requests
            .get(p)
            .map(|r| {
                self.authorizer
                    .is_authorized(r, &self.policies, &self.entities)
                    .diagnostics()
                    .errors()
                    .map(|e| e.to_string())
                    .collect()
            })
            .unwrap_or_else(|| vec!["no request".into()])
    }
}

impl Subject for CedarSession {
    fn label(&self) -> String {
        "cedar".into()
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let r = self.requests.get(p).context("call")?;
        let resp = self
            .authorizer
            .is_authorized(r, &self.policies, &self.entities);
        Ok(match resp.decision() {
            Decision::Allow => 0,
            Decision::Deny if resp.diagnostics().reason().any(|id| *id == self.deny_cc) => 2,
            Decision::Deny => 1,
        })
    }

    fn stage(&mut self, _k: usize) -> Result<()> {
        bail!("S5 has no churn mode")
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        bail!("S5 has no churn mode")
    }
}

/// The Rego module.
pub const REGO: &str = r#"package s5
import rego.v1

deny_cc if {
    some c in input.cc
    not data.vals[c].user
}

recipient_ok if data.ci[input.recipient].user
recipient_ok if data.ci[input.recipient].trusted

default verdict := 0
verdict := 2 if deny_cc
verdict := 1 if {
    not deny_cc
    not recipient_ok
}
"#;

fn rego_data(w: &SessionWorld) -> Json {
    let mut vals = serde_json::Map::new();
    let mut ci = serde_json::Map::new();
    for (v, o) in &w.values {
        for (m, k) in [(&mut vals, v.clone()), (&mut ci, v.to_lowercase())] {
            if let Json::Object(e) = m.entry(k).or_insert_with(|| json!({})) {
                e.insert(o.as_str().to_owned(), Json::Bool(true));
            }
        }
    }
    json!({"vals": vals, "ci": ci})
}

fn rego_inputs(w: &SessionWorld) -> Vec<Value> {
    w.calls
        .iter()
        .map(|c| Value::from(json!({"recipient": c.recipient.to_lowercase(), "cc": c.cc})))
        .collect()
}

fn code(v: &Value) -> Result<u64> {
    for (n, c) in [(0u64, 0), (1, 1), (2, 2)] {
        if *v == Value::from(c) {
            return Ok(n);
        }
    }
    bail!("rego answered {v}")
}

/// Rego: the interpreter, or the bytecode VM.
pub struct RegoSession {
    vm: Option<RegoVM>,
    engine: Engine,
    inputs: Vec<Value>,
}

impl RegoSession {
    /// `vm`: compile to RVM bytecode and run on a reused VM.
    pub fn new(w: &SessionWorld, vm: bool) -> Result<Self> {
        let mut engine = Engine::new();
        engine
            .add_policy("s5.rego".to_owned(), REGO.to_owned())
            .map_err(|e| anyhow!("s5 rego: {e}"))?;
        let data =
            Value::from_json_str(&rego_data(w).to_string()).map_err(|e| anyhow!("s5 data: {e}"))?;
        let vm = if vm {
            let entry: Rc<str> = "data.s5.verdict".into();
            let compiled = engine
                .compile_with_entrypoint(&entry)
                .map_err(|e| anyhow!("s5 compile: {e}"))?;
            let program = Compiler::compile_from_policy(&compiled, &["data.s5.verdict"])
                .map_err(|e| anyhow!("s5 rvm: {e}"))?;
            let mut m = RegoVM::new();
            m.load_program(Arc::clone(&program));
            m.set_data(data).map_err(|e| anyhow!("s5 rvm data: {e}"))?;
            Some(m)
        } else {
            engine
                .add_data(data)
                .map_err(|e| anyhow!("s5 add_data: {e}"))?;
            None
        };
        Ok(Self {
            vm,
            engine,
            inputs: rego_inputs(w),
        })
    }
}

impl Subject for RegoSession {
    fn label(&self) -> String {
        if self.vm.is_some() {
            "rego-vm".into()
        } else {
            "rego".into()
        }
    }

    fn hot(&mut self, p: usize) -> Result<u64> {
        let input = self.inputs.get(p).context("call")?.clone();
        match &mut self.vm {
            Some(vm) => {
                vm.set_input(input);
                let v = vm.execute().map_err(|e| anyhow!("rvm: {e}"))?;
                code(&v)
            }
            None => {
                self.engine.set_input(input);
                let v = self
                    .engine
                    .eval_rule("data.s5.verdict".to_owned())
                    .map_err(|e| anyhow!("eval: {e}"))?;
                code(&v)
            }
        }
    }

    fn stage(&mut self, _k: usize) -> Result<()> {
        bail!("S5 has no churn mode")
    }

    fn churn(&mut self, _k: usize) -> Result<u64> {
        bail!("S5 has no churn mode")
    }
}

/// Every S5 subject: Warden, Cedar, Rego, Rego on the VM.
pub fn subjects(w: &SessionWorld) -> Result<Vec<Box<dyn Subject>>> {
    Ok(vec![
        Box::new(WardenSession::new(w)?),
        Box::new(CedarSession::new(w)?),
        Box::new(RegoSession::new(w, false)?),
        Box::new(RegoSession::new(w, true)?),
    ])
}

/// Ask every subject every call and compare with [`SessionWorld::expected`];
/// Cedar must answer without evaluation errors. Returns the number of
/// (allow, escalate, deny) answers of the model.
pub fn check(w: &SessionWorld, subjects: &mut [Box<dyn Subject>]) -> Result<[usize; 3]> {
    let c = CedarSession::new(w)?;
    let mut counts = [0usize; 3];
    for p in 0..w.calls.len() {
        let errors = c.errors(p);
        if !errors.is_empty() {
            bail!("cedar S5 call {p}: {errors:?}");
        }
        let want = w.expected(p);
        if let Some(n) = counts.get_mut(want as usize) {
            *n += 1;
        }
        for s in subjects.iter_mut() {
            let got = s.hot(p)?;
            if got != want {
                bail!(
                    "disagreement: S5 call {p} {:?}: {} answered {got}, the model {want}",
                    w.calls.get(p),
                    s.label()
                );
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Warden's gate, Cedar and both Rego forms give the model's answer on
    /// every call, and the calls cover allow, escalate and deny.
    #[test]
    fn s5_engines_agree_with_the_model() {
        let w = SessionWorld::new(42);
        let mut subs = subjects(&w).unwrap();
        let counts = check(&w, &mut subs).unwrap();
        assert!(counts.iter().all(|n| *n > 0), "{counts:?}");
        assert_eq!(counts.iter().sum::<usize>(), CALLS);
    }
}
