//! Property tests for invariants 1-5 of the design brief, over random
//! hierarchies, memory and SOPs.

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;
use warden::{Caller, RegisterAgent};
use warden_core::capability::CapSet;
use warden_core::hierarchy::{AgentSpec, Hierarchy, HierarchyLimits};
use warden_core::ids::{ActionName, AgentId};
use warden_core::memory::{MemoryRecord, RecordClass, Resolution, Visibility, resolve};
use warden_core::time::Timestamp;
use warden_store::Store;

use crate::support::*;

const ACTIONS: [&str; 6] = [
    "memory.read",
    "memory.write",
    "document.summarize",
    "artifact.save",
    "external.upload",
    "report.export",
];

/// A random forest: agent i's parent is some j < i (or none).
fn forest() -> impl Strategy<Value = Vec<(Option<usize>, Vec<bool>)>> {
    prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            any::<bool>(),
            prop::collection::vec(any::<bool>(), ACTIONS.len()),
        ),
        1..24,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (pick, root, caps))| {
                let parent = if i == 0 || root {
                    None
                } else {
                    Some(pick.index(i))
                };
                (parent, caps)
            })
            .collect()
    })
}

fn build(forest: &[(Option<usize>, Vec<bool>)], env: &[bool]) -> Hierarchy {
    let index_of = |a: &ActionName| {
        ACTIONS
            .iter()
            .position(|x| *x == a.as_str())
            .map(|i| i as u16)
    };
    let env = CapSet::from_indices(
        env.iter()
            .enumerate()
            .filter(|(_, b)| **b)
            .map(|(i, _)| i as u16),
    );
    let mut h = Hierarchy::new(env, CapSet::new(), HierarchyLimits::default());
    for (i, (parent, caps)) in forest.iter().enumerate() {
        let spec = AgentSpec {
            id: AgentId::parse(&format!("a{i}")).unwrap(),
            parent: parent.map(|p| AgentId::parse(&format!("a{p}")).unwrap()),
            capabilities: caps
                .iter()
                .enumerate()
                .filter(|(_, b)| **b)
                .map(|(j, _)| ActionName::parse(ACTIONS[j]).unwrap())
                .collect(),
        };
        h.register(&spec, &index_of).unwrap();
    }
    h
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Invariant 3: effective(child) ⊆ effective(parent), and effective =
    /// environment ∩ declared along the whole lineage.
    #[test]
    fn capabilities_narrow_down_the_hierarchy(f in forest(), env in prop::collection::vec(any::<bool>(), ACTIONS.len())) {
        let h = build(&f, &env);
        for (idx, node) in h.iter() {
            if let Some(p) = node.parent() {
                prop_assert!(node.effective().is_subset(h.node(p).unwrap().effective()));
            }
            for (a, name) in ACTIONS.iter().enumerate() {
                let expected = env[a] && h.lineage(idx).all(|(_, n)| n.declared().iter().any(|d| d.as_str() == *name));
                prop_assert_eq!(node.effective().contains(a as u16), expected);
            }
        }
    }

    /// Invariant 1: a resolved value keeps its owner (an agent on the
    /// reader's lineage) and is exactly that owner's stored value.
    #[test]
    fn provenance_is_preserved(
        f in forest(),
        owners in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<i32>()), 0..12),
        reader in any::<prop::sample::Index>(),
    ) {
        let h = build(&f, &[true; 6]);
        let mut records: Vec<MemoryRecord> = Vec::new();
        for (o, vis, v) in owners {
            let owner = AgentId::parse(&format!("a{}", o.index(f.len()))).unwrap();
            if records.iter().any(|r| r.owner == owner) { continue; }
            records.push(MemoryRecord {
                namespace: ns("n"), key: key("k"), value: json!(v), owner,
                visibility: [Visibility::Private, Visibility::Children, Visibility::Descendants][vis as usize],
                class: RecordClass::Preference, revision: 1, created_at: Timestamp(0), updated_at: Timestamp(0),
            });
        }
        let r = reader.index(f.len());
        let reader_id = AgentId::parse(&format!("a{r}")).unwrap();
        let ridx = h.index_of(reader_id.as_str()).unwrap();
        let lineage: Vec<AgentId> = h.lineage(ridx).map(|(_, n)| n.id().clone()).collect();
        match resolve(&reader_id, lineage.iter(), |o| records.iter().find(|x| &x.owner == o), Timestamp(1)) {
            Resolution::Found { record, reason } => {
                prop_assert!(lineage.contains(&record.owner));
                let stored = records.iter().find(|x| x.owner == record.owner).unwrap();
                prop_assert_eq!(&stored.value, &record.value);
                prop_assert_eq!(reason.as_str(), format!("visible_from:{}", record.owner));
                // Nothing nearer exists.
                let pos = lineage.iter().position(|a| a == &record.owner).unwrap();
                for nearer in &lineage[..pos] {
                    prop_assert!(records.iter().all(|x| &x.owner != nearer));
                }
            }
            Resolution::NotFound => prop_assert!(records.iter().all(|x| !lineage.contains(&x.owner))),
            Resolution::Denied { reason } => prop_assert!(reason.as_str().starts_with("not_visible_from:")),
            Resolution::Combined { .. } => prop_assert!(false, "no policy records were generated"),
        }
    }
}

/// Invariant 2: visibility never grants a write. Random agents attempt
/// random writes into random owners' scopes; every stored record was written
/// by its owner, and every non-owner attempt was denied and recorded.
#[test]
fn visibility_never_grants_a_write() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let agents = ["report_manager", "researcher", "formatter"];
    proptest!(ProptestConfig { cases: 48, ..ProptestConfig::default() }, |(attempts in prop::collection::vec((0usize..3, 0usize..3, 0u8..3, any::<i16>()), 1..16))| {
        rt.block_on(async {
            let e = lab().await;
            for (actor, owner, vis, v) in &attempts {
                let mut req = write_req("shared", "k", json!(v));
                req.owner_agent_id = Some(id(agents[*owner]));
                req.visibility = Some([Visibility::Private, Visibility::Children, Visibility::Descendants][*vis as usize]);
                let out = e.write(&id(agents[*actor]), req).await.unwrap();
                if actor != owner {
                    assert!(!out.decision.permits());
                    assert!(out.record.is_none());
                }
            }
            let log = audit(&e).await;
            for a in agents {
                let stored = e.store().get_records(ns("shared"), key("k"), vec![id(a)]).await.unwrap();
                for r in stored {
                    // Every revision of this record was an owner_write by its owner.
                    let writes = log.iter().filter(|x| x.draft.resource == format!("{a}:shared.k") && x.draft.reason == "owner_write");
                    assert!(writes.clone().all(|x| x.draft.subject == a));
                    assert_eq!(writes.count() as u64, r.revision);
                }
            }
        });
    });
}

fn arbitrary_sop() -> impl Strategy<Value = (usize, Vec<(String, String)>)> {
    let action = prop_oneof![
        Just("document.summarize".to_string()),
        Just("artifact.save".to_string()),
        Just("external.upload".to_string()),
        Just("report.export".to_string()),
        Just("memory.read".to_string()),
        "[a-z]{1,8}\\.[a-z]{1,8}",
    ];
    let path = prop_oneof![
        Just("internal/a.txt".to_string()),
        Just("../x".to_string()),
        "[a-z/.]{0,12}"
    ];
    (0usize..3, prop::collection::vec((action, path), 1..8))
}

/// Invariants 4 and 5: a rejected SOP never invokes a handler, and an SOP
/// with an unknown action is never admitted.
#[test]
fn rejected_sops_never_run_and_unknown_actions_never_pass() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let agents = ["report_manager", "researcher", "formatter"];
    proptest!(ProptestConfig { cases: 96, ..ProptestConfig::default() }, |((agent, steps) in arbitrary_sop())| {
        rt.block_on(async {
            let e = lab().await;
            let (handlers, effects) = recording_handlers();
            let steps_json: Vec<_> = steps.iter().enumerate().map(|(i, (a, p))| {
                let args = match a.as_str() {
                    "document.summarize" => json!({"document_id": "doc1"}),
                    "memory.read" => json!({"namespace": "project", "key": "client_region"}),
                    "external.upload" => json!({"destination": "https://uploads.example.com/x"}),
                    _ => json!({"path": p}),
                };
                json!({"step_id": format!("s{i}"), "action": a, "arguments": args})
            }).collect();
            let text = json!({"sop_id": "p", "version": 1, "steps": steps_json}).to_string();
            let sop = warden_core::sop::parse_sop(&text, &e.policy().sop_limits).unwrap();
            let known: BTreeSet<&str> = ACTIONS.iter().copied().collect();
            let report = e.execute_sop(&id(agents[agent]), &sop, &handlers, None).await.unwrap();
            if steps.iter().any(|(a, _)| !known.contains(a.as_str())) {
                assert!(!report.admitted);
            }
            if !report.admitted {
                assert!(effects.lock().unwrap().is_empty());
                assert!(report.steps.is_empty());
            }
        });
    });
}

#[tokio::test]
async fn delegated_children_never_exceed_their_parent() {
    let e = lab().await;
    let view = e
        .register_agent(
            &Caller::Agent(id("researcher")),
            RegisterAgent {
                id: id("wide"),
                parent: Some(id("researcher")),
                capabilities: ACTIONS
                    .iter()
                    .map(|a| ActionName::parse(a).unwrap())
                    .collect(),
                tools: None,
                config: None,
            },
        )
        .await
        .unwrap()
        .registered()
        .unwrap();
    let parent = e.agent(&id("researcher")).unwrap();
    assert!(
        view.effective_capabilities
            .iter()
            .all(|c| parent.effective_capabilities.contains(c))
    );
    assert!(
        !view
            .effective_capabilities
            .iter()
            .any(|c| c.as_str() == "external.upload")
    );
}
