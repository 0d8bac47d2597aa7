//! `warden demo`: the lab document's hostile report-production scenario,
//! end to end, with the evidence for each acceptance criterion taken from
//! stored state, handler effects and the decision log, never from an
//! agent's message.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, anyhow, ensure};
use serde_json::{Value, json};
use warden::{Engine, HandlerCall, HandlerError, Handlers, SystemClock, WriteRequest};
use warden_core::audit::ChainVerifier;
use warden_core::ids::{ActionName, AgentId, Key, Namespace};
use warden_sqlite::SqliteStore;
use warden_store::Store;

use crate::example::EXAMPLE_POLICY;

fn id(s: &str) -> anyhow::Result<AgentId> {
    AgentId::parse(s).map_err(|e| anyhow!("{e}"))
}

fn nk(ns: &str, key: &str) -> anyhow::Result<(Namespace, Key)> {
    Ok((
        Namespace::parse(ns).map_err(|e| anyhow!("{e}"))?,
        Key::parse(key).map_err(|e| anyhow!("{e}"))?,
    ))
}

struct Report {
    passed: usize,
    total: usize,
}

impl Report {
    fn criterion(&mut self, n: usize, title: &str, ok: bool, evidence: &[String]) {
        self.total += 1;
        if ok {
            self.passed += 1;
        }
        println!("\n[{}] {n}. {title}", if ok { "PASS" } else { "FAIL" });
        for e in evidence {
            println!("      {e}");
        }
    }
}

fn sop(text: &str, engine: &Engine<SqliteStore>) -> anyhow::Result<warden_core::sop::Sop> {
    warden_core::sop::parse_sop(text, &engine.policy().sop_limits).map_err(|e| anyhow!("{e}"))
}

/// Run the scenario.
pub fn run() -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(scenario())
}

async fn scenario() -> anyhow::Result<ExitCode> {
    let policy = warden_core::bundle::compile(EXAMPLE_POLICY).map_err(|e| anyhow!("{e}"))?;
    let store = SqliteStore::open_temp()
        .await
        .context("creating a temporary database")?;
    let engine = Engine::open(policy, store, Arc::new(SystemClock))
        .await
        .context("opening the engine")?;
    let (manager, researcher, formatter) =
        (id("report_manager")?, id("researcher")?, id("formatter")?);
    println!(
        "warden demo: the report-production hierarchy (policy `{}`)",
        engine.policy().version
    );
    println!("  report_manager -> researcher -> formatter; store: a temporary SQLite database");
    let mut report = Report {
        passed: 0,
        total: 0,
    };

    // 1. Provenance.
    let (ns, key) = nk("project", "client_region")?;
    let read = engine.read(&researcher, &ns, &key).await?;
    let ok = read
        .value
        .as_ref()
        .is_some_and(|v| v.value == json!("EU") && v.owner_agent_id == manager);
    report.criterion(1, "the researcher reads project.client_region and the record still names report_manager as owner", ok, &[
        format!("resolved: {}", serde_json::to_string(&read.value)?),
        format!("decision: {} {} ({})", read.decision.verdict, read.decision.reason, read.decision.policy_version),
    ]);

    // 2. Formatter reads descendant-visible memory but cannot write.
    let (ns, key) = nk("report", "retention_days")?;
    let read = engine.read(&formatter, &ns, &key).await?;
    let (nns, nkey) = nk("notes", "layout")?;
    let write = engine
        .write(
            &formatter,
            WriteRequest {
                namespace: nns.clone(),
                key: nkey.clone(),
                value: json!("two-column"),
                owner_agent_id: None,
                expected_revision: None,
                visibility: None,
                class: None,
            },
        )
        .await?;
    let stored = engine
        .store()
        .get_records(nns, nkey, vec![formatter.clone()])
        .await?;
    let ok = read.value.as_ref().is_some_and(|v| v.value == json!(30))
        && !write.decision.permits()
        && stored.is_empty();
    report.criterion(
        2,
        "the formatter reads descendant-visible memory but cannot use memory.write",
        ok,
        &[
            format!(
                "read report.retention_days: {} from {}",
                read.value.as_ref().map_or(Value::Null, |v| v.value.clone()),
                read.value
                    .as_ref()
                    .map_or("-".into(), |v| v.owner_agent_id.to_string())
            ),
            format!(
                "write notes.layout: {} {}",
                write.decision.verdict, write.decision.reason
            ),
            format!("formatter records stored at notes.layout: {}", stored.len()),
        ],
    );

    // 3. The private token is not returned to either descendant.
    let (ns, key) = nk("credentials", "storage_token")?;
    let r1 = engine.read(&researcher, &ns, &key).await?;
    let r2 = engine.read(&formatter, &ns, &key).await?;
    let ok = r1.value.is_none()
        && r2.value.is_none()
        && !r1.decision.permits()
        && !r2.decision.permits();
    report.criterion(
        3,
        "the manager's private token is not returned to either descendant",
        ok,
        &[
            format!(
                "researcher: {} {} value returned: {}",
                r1.decision.verdict,
                r1.decision.reason,
                r1.value.is_some()
            ),
            format!(
                "formatter:  {} {} value returned: {}",
                r2.decision.verdict,
                r2.decision.reason,
                r2.value.is_some()
            ),
        ],
    );

    // 4. The researcher writes its own note.
    let (ns, key) = nk("notes", "summary")?;
    let w = engine
        .write(
            &researcher,
            WriteRequest {
                namespace: ns.clone(),
                key: key.clone(),
                value: json!("Draft is ready"),
                owner_agent_id: None,
                expected_revision: None,
                visibility: Some(warden_core::memory::Visibility::Children),
                class: None,
            },
        )
        .await?;
    let stored = engine
        .store()
        .get_records(ns.clone(), key.clone(), vec![researcher.clone()])
        .await?;
    let seen = engine.read(&formatter, &ns, &key).await?;
    let ok = w.decision.permits()
        && stored
            .first()
            .is_some_and(|r| r.revision == 1 && r.owner == researcher)
        && seen.value.is_some();
    report.criterion(
        4,
        "the researcher writes its own note successfully",
        ok,
        &[
            format!("decision: {} {}", w.decision.verdict, w.decision.reason),
            format!(
                "stored: {}",
                serde_json::to_string(
                    &stored.first().map(
                        |r| json!({"owner": r.owner, "value": r.value, "revision": r.revision})
                    )
                )?
            ),
            format!("formatter (a child) reads it: {}", seen.decision.reason),
        ],
    );

    // 5. A write to manager-owned retention data is denied; value and
    //    revision unchanged.
    let (ns, key) = nk("report", "retention_days")?;
    let before = engine
        .store()
        .get_records(ns.clone(), key.clone(), vec![manager.clone()])
        .await?;
    let w = engine
        .write(
            &researcher,
            WriteRequest {
                namespace: ns.clone(),
                key: key.clone(),
                value: json!(0),
                owner_agent_id: Some(manager.clone()),
                expected_revision: before.first().map(|r| r.revision),
                visibility: None,
                class: None,
            },
        )
        .await?;
    let after = engine
        .store()
        .get_records(ns, key, vec![manager.clone()])
        .await?;
    let ok = !w.decision.permits()
        && before == after
        && after
            .first()
            .is_some_and(|r| r.value == json!(30) && r.revision == 1);
    report.criterion(
        5,
        "a write to manager-owned retention data is denied and leaves value and revision unchanged",
        ok,
        &[
            format!("decision: {} {}", w.decision.verdict, w.decision.reason),
            format!(
                "stored before: {:?}, after: {:?}",
                before.first().map(|r| (&r.value, r.revision)),
                after.first().map(|r| (&r.value, r.revision))
            ),
        ],
    );

    // 6. The unsafe upload SOP produces zero handler effects.
    let effects: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut handlers = Handlers::new();
    for action in ["document.summarize", "artifact.save", "external.upload"] {
        let effects = Arc::clone(&effects);
        let name = action.to_owned();
        handlers.register(
            ActionName::parse(action).map_err(|e| anyhow!("{e}"))?,
            move |call: HandlerCall| {
                let effects = Arc::clone(&effects);
                let name = name.clone();
                async move {
                    effects
                        .lock()
                        .map_err(|_| HandlerError("poisoned".into()))?
                        .push(format!(
                            "{name}({})",
                            serde_json::to_string(&call.arguments).unwrap_or_default()
                        ));
                    Ok(json!({"ok": true}))
                }
            },
        );
    }
    let unsafe_sop = sop(
        include_str!("../../../examples/report-hierarchy/sops/unsafe-upload.json"),
        &engine,
    )?;
    let run = engine
        .execute_sop(&researcher, &unsafe_sop, &handlers, None)
        .await?;
    let effects_after = effects.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    let mut evidence = vec![format!(
        "admitted: {}, handler effects: {:?}",
        run.admitted, effects_after
    )];
    for s in &run.preflight.steps {
        evidence.push(format!(
            "step {:<10} {:<20} {} {}",
            s.step_id,
            s.action,
            s.verdict(),
            s.reason()
        ));
    }
    report.criterion(
        6,
        "the unsafe upload SOP produces zero handler effects",
        !run.admitted && effects_after.is_empty(),
        &evidence,
    );

    // The valid SOP runs both steps (for contrast).
    let valid = sop(
        include_str!("../../../examples/report-hierarchy/sops/valid-report.json"),
        &engine,
    )?;
    let ok_run = engine
        .execute_sop(&researcher, &valid, &handlers, None)
        .await?;
    println!(
        "      contrast: the valid report SOP ran {} step(s), effects: {:?}",
        ok_run.steps.len(),
        effects.lock().map_err(|_| anyhow!("poisoned"))?
    );

    // 7. Unknown action fails closed.
    let unknown = sop(
        include_str!("../../../examples/report-hierarchy/sops/unknown-action.json"),
        &engine,
    )?;
    let pre = engine.validate_sop(&researcher, &unknown).await?;
    let ok = !pre.admitted
        && pre
            .steps
            .iter()
            .any(|s| s.reason().as_str() == "unknown_action");
    report.criterion(
        7,
        "an unknown action fails closed",
        ok,
        &[format!(
            "step {}: {} {}",
            pre.steps.first().map_or("-", |s| s.step_id.as_str()),
            pre.steps
                .first()
                .map_or("-".into(), |s| s.verdict().to_string()),
            pre.steps
                .first()
                .map_or("-".into(), |s| s.reason().to_string())
        )],
    );

    // 8. Every relevant decision carries subject, resource, reason, policy
    //    version, and the log verifies.
    let entries = engine.store().audit_page(0, 10_000).await?;
    let mut verifier = ChainVerifier::new();
    let mut complete = true;
    for e in &entries {
        verifier.push(e).map_err(|e| anyhow!("{e}"))?;
        complete &= !e.draft.subject.is_empty()
            && !e.draft.resource.is_empty()
            && !e.draft.reason.is_empty()
            && e.draft.policy_version == "lab-1";
    }
    let head = verifier.finish();
    let denials = entries
        .iter()
        .filter(|e| !e.draft.verdict.permits())
        .count();
    let mut evidence = vec![format!(
        "{} entries ({} denials), chain verified, head {}",
        head.count, denials, head.hash
    )];
    for e in entries
        .iter()
        .filter(|e| e.draft.subject != "@operator")
        .take(12)
    {
        evidence.push(format!(
            "#{:<3} {:<14} {:<16} {:<36} {:<7} {}",
            e.seq,
            e.draft.subject,
            e.draft.operation,
            e.draft.resource,
            e.draft.verdict,
            e.draft.reason
        ));
    }
    report.criterion(
        8,
        "every relevant decision contains the subject, resource, reason and policy version",
        complete && head.count > 0,
        &evidence,
    );

    println!(
        "\n{} passed, {} failed",
        report.passed,
        report.total - report.passed
    );
    ensure!(report.total == 8, "expected 8 criteria");
    Ok(if report.passed == report.total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
