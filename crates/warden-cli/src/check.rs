//! `warden check`: offline admission of an SOP or a plan against a bundle,
//! with the provenance each step's guarded arguments will meet.
//!
//! The file is read as a session reads a plan
//! ([`warden_core::plan::parse_document`]): an SOP whose arguments may be
//! `$bind`s, admitted as a session admits its plan (for an SOP, or a plan
//! of literals, exactly the SOP's preflight). An SOP with an empty or
//! repeated step id and no `$bind` is preflighted as an SOP, which reports
//! those ids. Exit codes: 0 admitted, 1 rejected, 2 bad input.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use serde::Serialize;
use warden::{Engine, PlanCheck, SystemClock};
use warden_core::decision::{Decision, SmolStr};
use warden_core::ids::AgentId;
use warden_core::plan::{PlanDocument, PositionExplanation, StepExplanation, parse_document};
use warden_core::preflight::Violations;
use warden_store::MemoryStore;

/// Admit `sop` (an SOP or a plan) for `agent` under `policy`.
pub fn run(policy: &Path, agent: &str, sop: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(policy)
        .with_context(|| format!("reading `{}`", policy.display()))?;
    let policy = warden_core::bundle::compile(&text).map_err(|e| {
        let list: Vec<String> = e.issues.iter().map(ToString::to_string).collect();
        anyhow!("invalid policy bundle:\n  {}", list.join("\n  "))
    })?;
    let sop_text =
        std::fs::read_to_string(sop).with_context(|| format!("reading `{}`", sop.display()))?;
    // The SOP format first, with its errors as they are.
    warden_core::sop::parse_sop(&sop_text, &policy.sop_limits)
        .map_err(|e| anyhow!("invalid sop `{}`: {e}", sop.display()))?;
    // The same text again, as a value (bindings included): the SOP parse
    // above already held it to the depth limit.
    let value = warden_core::json::parse_str(&sop_text, usize::MAX)
        .map_err(|e| anyhow!("invalid sop `{}`: {e}", sop.display()))?;
    let document = parse_document(&value, &policy.sop_limits)
        .map_err(|e| anyhow!("invalid plan `{}`: {e}", sop.display()))?;
    let agent = AgentId::parse(agent).map_err(|e| anyhow!("invalid agent id `{agent}`: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let engine = Engine::open(policy, MemoryStore::new(), Arc::new(SystemClock)).await?;
        engine.agent(&agent)?;
        engine.preflight_document(&agent, &document)
    });
    let result = result.map_err(|e| anyhow!("{e}"))?;
    if json {
        println!("{}", json_output(&result)?);
    } else {
        print_human(&document, &agent, &result);
    }
    Ok(if result.preflight.admitted {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The preflight as JSON (`{admitted, steps: [...]}`, as the preflight
/// serialises), each step with its `provenance` explanation added.
fn json_output(result: &PlanCheck) -> anyhow::Result<String> {
    #[derive(Serialize)]
    struct Step<'a> {
        step_id: &'a SmolStr,
        action: &'a SmolStr,
        decision: Decision,
        violations: &'a Violations,
        provenance: &'a StepExplanation,
    }
    #[derive(Serialize)]
    struct Output<'a> {
        admitted: bool,
        steps: Vec<Step<'a>>,
    }
    let out = Output {
        admitted: result.preflight.admitted,
        steps: result
            .preflight
            .steps
            .iter()
            .zip(&result.provenance.steps)
            .map(|(check, provenance)| Step {
                step_id: &check.step_id,
                action: &check.action,
                decision: result.preflight.decision(check),
                violations: &check.violations,
                provenance,
            })
            .collect(),
    };
    // Pretty-printed from the structs, so keys keep their order.
    Ok(serde_json::to_string_pretty(&out)?)
}

fn print_human(document: &PlanDocument, agent: &AgentId, result: &PlanCheck) {
    println!(
        "{} `{}` for agent `{agent}`: {}",
        if document.has_bindings() {
            "plan"
        } else {
            "sop"
        },
        document.sop_id(),
        if result.preflight.admitted {
            "admitted"
        } else {
            "rejected"
        }
    );
    for (step, explained) in result.preflight.steps.iter().zip(&result.provenance.steps) {
        let mark = if step.permits() { "ok  " } else { "DENY" };
        let extra = if step.violations.len() > 1 {
            let all: Vec<&str> = step.violations.iter().map(|r| r.as_str()).collect();
            format!(" ({})", all.join(", "))
        } else {
            String::new()
        };
        println!(
            "  {mark} {:<24} {:<24} {}{extra}",
            step.step_id,
            step.action,
            step.reason()
        );
        print_provenance(explained);
    }
}

/// A step's provenance lines: each rule with the positions it reaches,
/// then the bound positions no rule guards. Nothing for a step with
/// neither.
fn print_provenance(step: &StepExplanation) {
    let line = |p: &PositionExplanation| {
        println!("         {:<40} {}", p.reason.as_str(), p.explain);
    };
    for rule in &step.rules {
        println!("       rule: {}", rule.rule);
        rule.positions.iter().for_each(line);
    }
    if !step.unguarded.is_empty() {
        println!("       no rule:");
        step.unguarded.iter().for_each(line);
    }
}
