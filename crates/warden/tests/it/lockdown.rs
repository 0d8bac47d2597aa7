//! Delegation lockdown through the engine: the near-miss corpus run through
//! child registration, refusals leave no trace, sanitisation is recorded,
//! and no delegated agent ever holds a block-write capability.

use std::collections::BTreeSet;
use warden::{Registration, RegistrationRefusal};

use proptest::prelude::*;
use serde_json::json;
use warden::{Caller, RegisterAgent};
use warden_core::ids::ActionName;
use warden_core::lockdown::parse_corpus;
use warden_store::Store;

use crate::support::*;

const CORPUS: &str = include_str!("../../../warden-core/tests/data/lockdown-corpus.tsv");

fn prebuilt(name: &str, tools: Vec<String>, config: Option<serde_json::Value>) -> RegisterAgent {
    RegisterAgent {
        id: id(name),
        parent: None,
        capabilities: ["memory.read"]
            .iter()
            .map(|a| ActionName::parse(a).unwrap())
            .collect(),
        tools: Some(tools),
        config,
    }
}

#[tokio::test]
async fn corpus_through_child_registration() {
    let e = lab().await;
    let corpus = parse_corpus(CORPUS).unwrap();
    assert!(corpus.len() >= 60);
    let mut mismatches = Vec::new();
    for (i, (tool, is_write)) in corpus.iter().enumerate() {
        let child = format!("corpus-{i}");
        let before = e.store().load_agents().await.unwrap().len();
        let out = e
            .delegate(
                &id("researcher"),
                prebuilt(&child, vec![tool.clone()], None),
            )
            .await;
        let refused = matches!(
            out,
            Ok(Registration::Refused {
                refusal: RegistrationRefusal::Lockdown(_),
                ..
            })
        );
        if refused != *is_write {
            mismatches.push(format!(
                "{tool:?}: expected write={is_write}, refused={refused}"
            ));
        }
        if refused {
            // No trace in the hierarchy or the store; the refusal is recorded.
            assert!(e.agent(&id(&child)).is_err());
            assert_eq!(e.store().load_agents().await.unwrap().len(), before);
            let last = audit(&e).await.pop().unwrap();
            assert_eq!(last.draft.reason, "child_write_surface_tool");
            assert_eq!(last.draft.resource, child);
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

#[tokio::test]
async fn prebuilt_child_with_self_edit_flag_is_refused() {
    let e = lab().await;
    let err = e
        .delegate(
            &id("researcher"),
            prebuilt(
                "flagged",
                vec!["summarize".into()],
                Some(json!({"prompt_block_self_edit": true})),
            ),
        )
        .await
        .unwrap();
    assert!(matches!(
        err,
        Registration::Refused {
            refusal: RegistrationRefusal::Lockdown(_),
            ..
        }
    ));
    assert!(e.agent(&id("flagged")).is_err());
    // A non-boolean flag is a type error, never coerced.
    let err = e
        .delegate(
            &id("researcher"),
            prebuilt(
                "stringly",
                vec![],
                Some(json!({"prompt_block_self_edit": "true"})),
            ),
        )
        .await
        .unwrap();
    assert!(matches!(
        err,
        Registration::Refused {
            refusal: RegistrationRefusal::Lockdown(_),
            ..
        }
    ));
    assert_eq!(
        audit(&e).await.pop().unwrap().draft.reason,
        "child_self_edit_flag_invalid"
    );
}

#[tokio::test]
async fn spec_child_config_is_sanitised_and_recorded() {
    let e = lab().await;
    let req = RegisterAgent {
        id: id("from_spec"),
        parent: None,
        capabilities: BTreeSet::new(),
        tools: None,
        config: Some(json!({"prompt_block_self_edit": true, "model": "m"})),
    };
    let view = e
        .delegate(&id("researcher"), req)
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert_eq!(
        view.config,
        Some(json!({"prompt_block_self_edit": false, "model": "m"}))
    );
    let stored = e.store().load_agents().await.unwrap();
    let s = stored.iter().find(|a| a.id == id("from_spec")).unwrap();
    assert_eq!(
        s.config,
        Some(json!({"prompt_block_self_edit": false, "model": "m"}))
    );
    let log = audit(&e).await;
    assert!(
        log.iter()
            .any(|a| a.draft.reason == "child_self_edit_sanitised"
                && a.draft.resource == "from_spec")
    );
    // A config that never asked is stored unchanged, with no sanitisation record.
    let req = RegisterAgent {
        id: id("plain"),
        parent: None,
        capabilities: BTreeSet::new(),
        tools: None,
        config: Some(json!({"model": "m"})),
    };
    let view = e
        .delegate(&id("researcher"), req)
        .await
        .unwrap()
        .registered()
        .unwrap();
    assert_eq!(view.config, Some(json!({"model": "m"})));
    assert!(
        !audit(&e)
            .await
            .iter()
            .any(|a| a.draft.reason == "child_self_edit_sanitised" && a.draft.resource == "plain")
    );
}

#[tokio::test]
async fn root_agents_registered_by_the_operator_may_hold_block_tools() {
    let e = lab().await;
    e.register_agent(
        &Caller::Operator,
        prebuilt("editor_root", vec!["memory_block_append".into()], None),
    )
    .await
    .unwrap()
    .registered()
    .unwrap();
    assert!(e.agent(&id("editor_root")).is_ok());
}

#[test]
fn bundle_with_a_delegated_write_surface_is_refused() {
    let policy = LAB_POLICY.replace(
        "  - id: formatter\n    parent: researcher\n",
        "  - id: formatter\n    parent: researcher\n    tools: [MCP__notes__Memory_Block_Append]\n",
    );
    let err = warden_core::bundle::compile(&policy).unwrap_err();
    assert!(
        err.issues
            .iter()
            .any(|i| i.location == "agents[2]" && i.message.contains("Memory_Block_Append")),
        "{err:?}"
    );
}

const BLOCK_POLICY_EXTRA: &str =
    "  memory_block.append:\n    tags: [block_write]\n  prompt.rewrite:\n    tags: [block_write]\n";

fn block_policy() -> String {
    LAB_POLICY
        .replace("actions:\n", &format!("actions:\n{BLOCK_POLICY_EXTRA}"))
        .replace(
            "  - report.export\n",
            "  - report.export\n  - memory_block.append\n  - prompt.rewrite\n",
        )
        .replace(
            "  - id: report_manager\n    capabilities: [",
            "  - id: report_manager\n    capabilities: [memory_block.append, prompt.rewrite, ",
        )
}

#[tokio::test]
async fn block_write_actions_never_reach_a_delegated_child() {
    let e = lab_with(&block_policy()).await;
    let root = e.agent(&id("report_manager")).unwrap();
    assert!(
        root.effective_capabilities
            .iter()
            .any(|c| c.as_str() == "memory_block.append")
    );
    let req = RegisterAgent {
        id: id("greedy"),
        parent: None,
        capabilities: ["memory_block.append", "prompt.rewrite", "memory.read"]
            .iter()
            .map(|a| ActionName::parse(a).unwrap())
            .collect(),
        tools: None,
        config: None,
    };
    let view = e
        .delegate(&id("report_manager"), req)
        .await
        .unwrap()
        .registered()
        .unwrap();
    let eff: Vec<&str> = view
        .effective_capabilities
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(eff, ["memory.read"]);
}

/// For any delegation tree, no non-root agent's effective capabilities
/// contain a block-write action.
#[test]
fn no_delegated_agent_holds_a_block_write_action() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let policy = block_policy();
    let actions = [
        "memory.read",
        "memory.write",
        "memory_block.append",
        "prompt.rewrite",
        "artifact.save",
    ];
    proptest!(ProptestConfig { cases: 48, ..ProptestConfig::default() }, |(tree in prop::collection::vec((any::<prop::sample::Index>(), prop::collection::vec(any::<bool>(), 5)), 1..20))| {
        rt.block_on(async {
            let e = lab_with(&policy).await;
            let mut names = vec!["report_manager".to_string()];
            for (i, (parent, caps)) in tree.iter().enumerate() {
                let parent = names[parent.index(names.len())].clone();
                let name = format!("n{i}");
                let req = RegisterAgent {
                    id: id(&name),
                    parent: None,
                    capabilities: caps.iter().zip(actions).filter(|(b, _)| **b).map(|(_, a)| ActionName::parse(a).unwrap()).collect(),
                    tools: None,
                    config: None,
                };
                e.delegate(&id(&parent), req).await.unwrap()
        .registered()
        .unwrap();
                names.push(name);
            }
            for n in names.iter().skip(1) {
                let view = e.agent(&id(n)).unwrap();
                assert!(view.effective_capabilities.iter().all(|c| c.as_str() != "memory_block.append" && c.as_str() != "prompt.rewrite"), "{n}: {:?}", view.effective_capabilities);
            }
        });
    });
}

/// Defect 5: a pre-built Letta child is refused through the engine, and the
/// refusal leaves nothing behind but its decision record.
#[tokio::test]
async fn prebuilt_letta_child_is_refused_and_nothing_stored() {
    let e = lab().await;
    for (child, tools, config) in [
        (
            "letta_child",
            vec!["send_message", "core_memory_append"],
            None,
        ),
        ("letta_omni", vec!["mcp__letta__memory"], None),
        ("lookalike", vec!["c\u{43e}re_mem\u{200b}ory_replace"], None),
        (
            "nested_flag",
            vec!["send_message"],
            Some(json!({"agent": {"Prompt_Block_Self_Edit": true}})),
        ),
    ] {
        let agents_before = e.store().load_agents().await.unwrap();
        let audit_before = audit(&e).await.len();
        let out = e
            .delegate(
                &id("researcher"),
                prebuilt(
                    child,
                    tools.iter().map(|t| (*t).to_owned()).collect(),
                    config,
                ),
            )
            .await
            .unwrap();
        let Registration::Refused {
            refusal: RegistrationRefusal::Lockdown(err),
            ..
        } = out
        else {
            panic!("{child} should be refused: {out:?}");
        };
        assert!(e.agent(&id(child)).is_err());
        assert_eq!(e.store().load_agents().await.unwrap(), agents_before);
        let log = audit(&e).await;
        assert_eq!(log.len(), audit_before + 1, "only the refusal is recorded");
        let last = log.last().unwrap();
        assert_eq!(last.draft.reason, err.reason().to_string());
        assert_eq!(last.draft.resource, child);
    }
    // The read tools of the same framework pass.
    e.delegate(
        &id("researcher"),
        prebuilt(
            "letta_reader",
            vec![
                "send_message".into(),
                "archival_memory_search".into(),
                "read_memory_block".into(),
            ],
            None,
        ),
    )
    .await
    .unwrap()
    .registered()
    .unwrap();
}

/// The bundle's `lockdown:` section is the vocabulary registration uses.
#[tokio::test]
async fn the_bundle_vocabulary_is_enforced_at_registration() {
    let plain = lab().await;
    plain
        .delegate(
            &id("researcher"),
            prebuilt("langgraph_child", vec!["manage_memory".into()], None),
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    let policy = format!(
        "{LAB_POLICY}\nlockdown:\n  presets: [langgraph]\n  write_surface_names: [save_persona]\n"
    );
    let e = lab_with(&policy).await;
    for (child, tool) in [
        ("langgraph_child", "manage_memory"),
        ("custom_child", "mcp__srv__SavePersona"),
    ] {
        let before = e.store().load_agents().await.unwrap().len();
        let out = e
            .delegate(&id("researcher"), prebuilt(child, vec![tool.into()], None))
            .await
            .unwrap();
        assert!(
            matches!(
                out,
                Registration::Refused {
                    refusal: RegistrationRefusal::Lockdown(_),
                    ..
                }
            ),
            "{tool}"
        );
        assert_eq!(e.store().load_agents().await.unwrap().len(), before);
    }
}

#[tokio::test]
async fn near_miss_flags_of_a_spec_child_are_cleared_under_their_own_spelling() {
    let e = lab().await;
    let req = RegisterAgent {
        id: id("camel"),
        parent: None,
        capabilities: BTreeSet::new(),
        tools: None,
        config: Some(
            json!({"promptBlockSelfEdit": true, "agent": {"prompt_block_self_edit ": true}}),
        ),
    };
    let view = e
        .delegate(&id("researcher"), req)
        .await
        .unwrap()
        .registered()
        .unwrap();
    let want = json!({"promptBlockSelfEdit": false, "agent": {"prompt_block_self_edit ": false}});
    assert_eq!(view.config, Some(want.clone()));
    let stored = e.store().load_agents().await.unwrap();
    let s = stored.iter().find(|a| a.id == id("camel")).unwrap();
    assert_eq!(s.config, Some(want));
}
