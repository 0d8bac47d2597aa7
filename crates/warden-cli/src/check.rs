//! `warden check`: offline preflight of an SOP against a bundle.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use warden::{Engine, SystemClock};
use warden_core::ids::AgentId;
use warden_store::MemoryStore;

/// Preflight `sop` for `agent` under `policy`.
pub fn run(policy: &Path, agent: &str, sop: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(policy)
        .with_context(|| format!("reading `{}`", policy.display()))?;
    let policy = warden_core::bundle::compile(&text).map_err(|e| {
        let list: Vec<String> = e.issues.iter().map(ToString::to_string).collect();
        anyhow!("invalid policy bundle:\n  {}", list.join("\n  "))
    })?;
    let sop_text =
        std::fs::read_to_string(sop).with_context(|| format!("reading `{}`", sop.display()))?;
    let parsed = warden_core::sop::parse_sop(&sop_text, &policy.sop_limits)
        .map_err(|e| anyhow!("invalid sop `{}`: {e}", sop.display()))?;
    let agent = AgentId::parse(agent).map_err(|e| anyhow!("invalid agent id `{agent}`: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let engine = Engine::open(policy, MemoryStore::new(), Arc::new(SystemClock)).await?;
        engine.agent(&agent)?;
        engine.preflight(&agent, &parsed)
    });
    let result = result.map_err(|e| anyhow!("{e}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "sop `{}` for agent `{agent}`: {}",
            parsed.sop_id,
            if result.admitted {
                "admitted"
            } else {
                "rejected"
            }
        );
        for step in &result.steps {
            let mark = if step.decision.permits() {
                "ok  "
            } else {
                "DENY"
            };
            let extra = if step.violations.len() > 1 {
                let all: Vec<&str> = step.violations.iter().map(|r| r.as_str()).collect();
                format!(" ({})", all.join(", "))
            } else {
                String::new()
            };
            println!(
                "  {mark} {:<24} {:<24} {}{extra}",
                step.step_id, step.action, step.decision.reason
            );
        }
    }
    Ok(if result.admitted {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
