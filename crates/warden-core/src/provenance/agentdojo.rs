//! The matcher on real traces: AgentDojo v1.2.2 (banking, slack), read from
//! `../shared/corpora/agentdojo/` beside the workspace root (skipped with a
//! message when absent).
//!
//! The trust classification and target arguments below are what a bundle
//! would say from the tools' descriptions and the user's own environment:
//! the account's own data and the user list are trusted, files, web pages,
//! message bodies, transaction subjects and channel names (which anyone
//! can create) are not. The attack file's `origin` field is read only as
//! ground truth for the assertions, never to classify.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::tests::{action, key, sid};
use super::*;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpora/agentdojo")
}

fn load(name: &str) -> Option<Value> {
    let path = corpus_dir().join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).unwrap()),
        Err(e) => {
            println!(
                "skipping: AgentDojo corpus `{}` not readable: {e}",
                path.display()
            );
            None
        }
    }
}

struct Suite {
    /// Tool -> output trust (absent: untrusted).
    trust: BTreeMap<&'static str, OutputTrust>,
    /// State-changing tool -> its target arguments and how they match.
    targets: BTreeMap<&'static str, Vec<(&'static str, MatchMode)>>,
    /// Outbound reads (fetching what the model names is an effect too):
    /// tool and its target argument, matched caselessly.
    outbound: &'static [(&'static str, &'static str)],
    /// Tools whose results are free text (everything else is structured
    /// YAML, as the suites print it).
    text_tools: &'static [&'static str],
}

fn output(trust: Trust, fields: &[(&str, Trust)]) -> OutputTrust {
    OutputTrust::compile(&OutputSpec {
        trust,
        fields: fields.iter().map(|(p, t)| ((*p).to_owned(), *t)).collect(),
    })
    .unwrap()
}

fn suite(name: &str) -> Suite {
    use MatchMode::{Caseless, Text};
    use Trust::{Trusted, Untrusted};
    match name {
        "banking" => Suite {
            trust: [
                ("get_iban", output(Trusted, &[])),
                ("get_balance", output(Trusted, &[])),
                ("get_user_info", output(Trusted, &[])),
                (
                    "get_most_recent_transactions",
                    output(Trusted, &[("[*].subject", Untrusted)]),
                ),
                (
                    "get_scheduled_transactions",
                    output(Trusted, &[("[*].subject", Untrusted)]),
                ),
            ]
            .into(),
            targets: [
                ("send_money", vec![("recipient", Caseless)]),
                ("schedule_transaction", vec![("recipient", Caseless)]),
                (
                    "update_scheduled_transaction",
                    vec![("id", Text), ("recipient", Caseless)],
                ),
                ("update_password", vec![("password", Text)]),
                (
                    "update_user_info",
                    vec![
                        ("first_name", Text),
                        ("last_name", Text),
                        ("street", Text),
                        ("city", Text),
                    ],
                ),
            ]
            .into(),
            outbound: &[],
            text_tools: &["read_file"],
        },
        _ => Suite {
            trust: [
                ("get_users_in_channel", output(Trusted, &[])),
                (
                    "read_channel_messages",
                    output(Trusted, &[("[*].body", Untrusted)]),
                ),
                ("read_inbox", output(Trusted, &[("[*].body", Untrusted)])),
            ]
            .into(),
            targets: [
                ("send_direct_message", vec![("recipient", Caseless)]),
                ("send_channel_message", vec![("channel", Caseless)]),
                (
                    "add_user_to_channel",
                    vec![("user", Caseless), ("channel", Caseless)],
                ),
                (
                    "invite_user_to_slack",
                    vec![("user", Caseless), ("user_email", Caseless)],
                ),
                ("remove_user_from_slack", vec![("user", Caseless)]),
                ("post_webpage", vec![("url", Caseless)]),
            ]
            .into(),
            outbound: &[("get_webpage", "url")],
            text_tools: &["get_webpage"],
        },
    }
}

/// A result as the session would record it: structured where the suite
/// prints YAML, the text itself otherwise.
fn result_value(suite: &Suite, function: &str, result: &Value) -> Value {
    let Some(text) = result.as_str() else {
        return result.clone();
    };
    if suite.text_tools.contains(&function) {
        return json!(text);
    }
    match serde_saphyr::from_str::<Value>(text) {
        Ok(v @ (Value::Array(_) | Value::Object(_))) => v,
        _ => json!(text),
    }
}

fn record(index: &mut SourceIndex, suite: &Suite, i: usize, call: &Value) {
    let function = call["function"].as_str().unwrap();
    let value = result_value(suite, function, &call["result"]);
    let trust = suite
        .trust
        .get(function)
        .cloned()
        .unwrap_or_else(OutputTrust::untrusted);
    index
        .record_result(sid(&format!("call-{i}")), action(function), &trust, &value)
        .unwrap();
}

/// The least-vouched class of a value: prompt, trusted, untrusted, none.
fn class(p: &ValueProvenance) -> usize {
    if p.origins.contains(&Origin::User) {
        0
    } else if p.origins.contains(&Origin::Trusted) {
        1
    } else if p.origins.contains(&Origin::Untrusted) {
        2
    } else {
        3
    }
}

const CLASSES: [&str; 4] = ["prompt", "trusted", "untrusted only", "nowhere"];

#[test]
fn benign_ground_truth_targets_by_origin() {
    let Some(benign) = load("benign_v1.2.2.json") else {
        return;
    };
    // PROVENANCE.md: state-changing calls, then by least-vouched target.
    let documented: BTreeMap<&str, (usize, [usize; 4])> = [
        ("banking", (14, [8, 2, 3, 1])),
        ("slack", (34, [11, 11, 12, 0])),
    ]
    .into();
    let mut measured = BTreeMap::new();
    for (name, (calls, counts)) in &documented {
        let s = suite(name);
        let tasks = benign["suites"][name]["user_tasks"].as_object().unwrap();
        let mut by_class = [0usize; 4];
        let mut total = 0;
        for (task, t) in tasks {
            let mut index = SourceIndex::new(key());
            index.record_user(sid("prompt"), &t["prompt"]).unwrap();
            for (i, call) in t["trace"].as_array().unwrap().iter().enumerate() {
                let function = call["function"].as_str().unwrap();
                if let Some(targets) = s.targets.get(function) {
                    total += 1;
                    let mut worst = 0;
                    let mut line = Vec::new();
                    for (arg, mode) in targets {
                        let Some(value) = call["args"].get(*arg) else {
                            continue;
                        };
                        let p = index.provenance((*arg).to_owned(), value, *mode);
                        worst = worst.max(class(&p));
                        let at: Vec<String> = p
                            .hits
                            .iter()
                            .map(|h| format!("{}:{}@{}", h.origin, h.source, h.field))
                            .collect();
                        line.push(format!("{arg}={value} -> {:?} {at:?}", p.origins));
                        // A benign target is never a look-alike of anything.
                        assert!(p.confusable_with.is_none(), "{task} {function} {arg}");
                    }
                    by_class[worst] += 1;
                    println!(
                        "{name} {task} {function}: [{}] {}",
                        CLASSES[worst],
                        line.join("; ")
                    );
                }
                record(&mut index, &s, i, call);
            }
        }
        println!(
            "{name}: {total} state-changing calls (documented {calls}); measured {by_class:?}, documented {counts:?} (prompt, trusted, untrusted only, nowhere)"
        );
        assert_eq!(total, *calls, "{name}: state-changing calls");
        measured.insert(*name, by_class);
    }
    // Token-bounded, normalised matching with per-field trust and the
    // classification above. Where it differs from the verbatim counts of
    // PROVENANCE.md, and why:
    // - banking: `id: 7` is a short value, vouched for only by the whole
    //   `id` field of the trusted scheduled-transaction list, never by a `7`
    //   inside a longer text (user_task_15's prompt holds `7` only inside an
    //   IBAN): one call moves from "prompt" to "trusted". In this corpus the
    //   bill of user_task_0 holds the injection vector's placeholder
    //   (`---CANARY_injection_bill_text---`) where its payee line would be,
    //   so UK12345678901234567890 occurs nowhere in the recorded trace: one
    //   call moves from "untrusted only" to "nowhere". user_task_9 updates
    //   transaction 7 without ever listing it: nowhere in both counts.
    // - slack: channel names (`get_channels`) are untrusted here, because
    //   anyone can create a channel and the injection lives in one's name;
    //   message bodies are untrusted while their sender and recipient are
    //   platform metadata. The table does not spell its classification out
    //   per field; these choices put three more calls (a channel or user
    //   found only in a listing or a body) in "untrusted only".
    assert_eq!(measured["banking"], [7, 4, 1, 2]);
    assert_eq!(measured["slack"], [11, 8, 15, 0]);
}

#[test]
fn injected_targets_are_never_vouched_by_the_prompt() {
    let Some(attacks) = load("attacks_v1.2.2.json") else {
        return;
    };
    let mut per_suite: BTreeMap<String, [usize; 5]> = BTreeMap::new();
    for case in attacks["cases"].as_array().unwrap() {
        let name = case["suite"].as_str().unwrap();
        let s = suite(name);
        let prompt = case["prompt"].as_str().unwrap();
        let mut index = SourceIndex::new(key());
        index.record_user(sid("prompt"), &json!(prompt)).unwrap();
        let counts = per_suite.entry(name.to_owned()).or_default();
        for (i, call) in case["trace"].as_array().unwrap().iter().enumerate() {
            let function = call["function"].as_str().unwrap();
            let injected = call["origin"] == "injection_task";
            let outbound: Vec<(&str, MatchMode)> = s
                .outbound
                .iter()
                .filter(|(t, _)| *t == function)
                .map(|(_, a)| (*a, MatchMode::Caseless))
                .collect();
            let targets = s
                .targets
                .get(function)
                .or((!outbound.is_empty()).then_some(&outbound));
            if injected && let Some(targets) = targets {
                counts[4] += 1;
                let mut worst = 0;
                for (arg, mode) in targets {
                    let Some(value) = call["args"].get(*arg) else {
                        continue;
                    };
                    let p = index.provenance((*arg).to_owned(), value, *mode);
                    worst = worst.max(class(&p));
                    if p.origins.contains(&Origin::User) {
                        // Vouched by the prompt: only a value the user
                        // really wrote (a colleague's name), never one the
                        // attacker introduced.
                        let raw = value
                            .as_str()
                            .map(str::to_lowercase)
                            .unwrap_or(value.to_string());
                        assert!(
                            prompt.to_lowercase().contains(&raw),
                            "{} {}: injected `{value}` vouched by the prompt",
                            case["user_task"],
                            case["injection_task"]
                        );
                    }
                    assert!(!p.invisible);
                }
                if worst == 3 {
                    println!(
                        "{name} {} {}: {function} {} (nowhere)",
                        case["user_task"], case["injection_task"], call["args"]
                    );
                }
                counts[worst] += 1;
            }
            record(&mut index, &s, i, call);
        }
    }
    for (name, c) in &per_suite {
        println!(
            "{name}: {} injected state-changing calls; least-vouched target: prompt {}, trusted {}, untrusted only {}, nowhere {}",
            c[4], c[0], c[1], c[2], c[3]
        );
    }
}
