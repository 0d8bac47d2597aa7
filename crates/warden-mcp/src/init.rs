//! `warden policy init --mcp NAME -- COMMAND...` (a server launched over
//! stdio) and `warden policy init --mcp-url NAME URL` (a streamable-HTTP
//! server): a starter bundle written from an upstream's `tools/list`.
//!
//! Every tool is declared with its advertised input schema and output
//! trust `untrusted`; tags come from the server's annotations
//! (`destructiveHint` → `state_changing`, `openWorldHint` → `external`;
//! a tool the server calls read-only and not destructive gets neither);
//! arguments that look like targets (recipients, accounts, URLs, paths,
//! hosts: by name) get a proposed provenance rule `from: [user, trusted],
//! otherwise: escalate`. Each is marked for review in a comment.
//! Annotations are the server's hints, never trusted for permissions: the
//! bundle declares no agent and no environment capability, so it grants
//! nothing until a human edits it.

use std::fmt::Write as _;

use rmcp::model::Tool;
use serde_json::Value;
use warden_core::mcp::{
    DEFAULT_CALL_TIMEOUT_MS, McpServer, McpTransport, tool_action, valid_server_name,
};
use warden_core::provenance::Trust;

use crate::upstream::{UpstreamClient, UpstreamError, connect};

/// Name fragments that make an argument look like a target.
const TARGET_WORDS: [&str; 17] = [
    "recipient",
    "email",
    "address",
    "account",
    "iban",
    "url",
    "uri",
    "link",
    "path",
    "file",
    "host",
    "domain",
    "phone",
    "channel",
    "destination",
    "target",
    "webhook",
];

/// Argument names that are targets whole.
const TARGET_NAMES: [&str; 5] = ["to", "cc", "bcc", "dest", "user"];

/// Whether an argument called `name` looks like a target.
pub fn looks_like_target(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    TARGET_NAMES.contains(&lower.as_str()) || TARGET_WORDS.iter().any(|w| lower.contains(w))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// How the starter bundle's server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source<'a> {
    /// Launched with this command over stdio.
    Command(&'a [String]),
    /// A streamable-HTTP server at this URL.
    Url(&'a str),
}

/// The starter bundle for server `name` reached as `source`, from its
/// advertised `tools`.
pub fn starter_bundle(name: &str, source: &Source<'_>, tools: &[Tool]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Starter bundle for the MCP server `{name}`, written by `warden policy init --mcp`\n\
         # from its tools/list. Annotations are the server's hints, never trusted for\n\
         # permissions: review every entry marked REVIEW. It grants nothing: add the\n\
         # actions you accept to `environment_capabilities` and to agents' capabilities."
    );
    let _ = writeln!(out, "policy_version: {}", json(&format!("{name}-starter")));
    let _ = writeln!(out, "mcp_servers:\n  {name}:");
    match source {
        Source::Command(command) => {
            let _ = writeln!(out, "    command: {}", json(command));
        }
        Source::Url(url) => {
            let _ = writeln!(out, "    url: {}", json(url));
        }
    }
    let _ = writeln!(
        out,
        "    trust: untrusted  # REVIEW: `trusted` only if third parties cannot write what it returns"
    );
    let _ = writeln!(out, "actions:");
    let mut skipped = Vec::new();
    for tool in tools {
        let Some(action) = tool_action(name, &tool.name) else {
            skipped.push(tool.name.to_string());
            continue;
        };
        let _ = writeln!(out, "  {}:", json(&action.as_str()));
        if let Some(d) = &tool.description {
            let _ = writeln!(out, "    # {}", one_line(d));
        }
        let schema = Value::Object((*tool.input_schema).clone());
        let _ = writeln!(out, "    arguments: {}", json(&schema));
        let _ = writeln!(out, "    output: {{trust: untrusted}}");
        let mut tags = Vec::new();
        if let Some(a) = &tool.annotations {
            let read_only = a.read_only_hint == Some(true);
            if !read_only && a.destructive_hint != Some(false) {
                tags.push("state_changing");
            }
            if a.open_world_hint == Some(true) {
                tags.push("external");
            }
        }
        if !tags.is_empty() {
            let _ = writeln!(
                out,
                "    tags: [{}]  # REVIEW: from the server's annotations (hints)",
                tags.join(", ")
            );
        }
        let mut rules = Vec::new();
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (arg, spec) in props {
                if !looks_like_target(arg)
                    || !arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    continue;
                }
                let path = match spec.get("type").and_then(Value::as_str) {
                    Some("array") => format!("{arg}[*]"),
                    Some("string") | None => arg.clone(),
                    Some(_) => continue,
                };
                rules.push(path);
            }
        }
        if !rules.is_empty() {
            let _ = writeln!(out, "    provenance:");
            for path in rules {
                let _ = writeln!(
                    out,
                    "      # REVIEW: `{path}` looks like a target: only the user's request or a trusted result may supply it"
                );
                let _ = writeln!(
                    out,
                    "      - {{argument: {}, from: [user, trusted], otherwise: escalate}}",
                    json(&path)
                );
            }
        }
    }
    for s in skipped {
        let _ = writeln!(
            out,
            "  # skipped tool {}: its name cannot be an action name",
            json(&s)
        );
    }
    out
}

/// Launch `command` as server `name` (in the caller's environment), read
/// its tools and write its starter bundle.
pub async fn init_from_command(name: &str, command: &[String]) -> Result<String, UpstreamError> {
    init(
        name,
        McpTransport::Stdio {
            argv: command.to_vec(),
            env: Default::default(),
        },
        &Source::Command(command),
    )
    .await
}

/// Connect to the streamable-HTTP server at `url` as server `name`, read
/// its tools and write its starter bundle.
pub async fn init_from_url(name: &str, url: &str) -> Result<String, UpstreamError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(UpstreamError::Start {
            server: name.to_owned(),
            message: format!("`{url}` is not an http:// or https:// URL"),
        });
    }
    init(
        name,
        McpTransport::Http {
            url: url.to_owned(),
        },
        &Source::Url(url),
    )
    .await
}

async fn init(
    name: &str,
    transport: McpTransport,
    source: &Source<'_>,
) -> Result<String, UpstreamError> {
    if !valid_server_name(name) {
        return Err(UpstreamError::Start {
            server: name.to_owned(),
            message: "a server name is 1 to 64 of [A-Za-z0-9_-]".into(),
        });
    }
    let config = McpServer {
        name: name.to_owned(),
        transport,
        trust: Trust::Untrusted,
        call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
        escalation_wait_ms: 0,
    };
    let (service, tools) = connect(&config, true, UpstreamClient::default()).await?;
    let _ = service.cancel().await;
    Ok(starter_bundle(name, source, &tools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(v: Value) -> Tool {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_starter_bundle_declares_every_tool_and_grants_nothing() {
        let tools = [
            tool(
                json!({"name": "send_email", "description": "Send\nan email.",
                "inputSchema": {"type": "object", "properties": {
                    "to": {"type": "string"}, "cc": {"type": "array", "items": {"type": "string"}},
                    "body": {"type": "string"}, "count": {"type": "integer"}}},
                "annotations": {"destructiveHint": true, "openWorldHint": true}}),
            ),
            tool(
                json!({"name": "read_inbox", "inputSchema": {"type": "object"},
                "annotations": {"readOnlyHint": true}}),
            ),
            tool(json!({"name": "bad name", "inputSchema": {"type": "object"}})),
        ];
        let command = ["python3".to_owned(), "m.py".to_owned()];
        let text = starter_bundle("mail", &Source::Command(&command), &tools);
        let policy = warden_core::bundle::compile(&text).unwrap();
        assert!(policy.spec.agents.is_empty());
        assert!(policy.spec.environment_capabilities.is_empty());
        assert_eq!(policy.mcp_servers().len(), 1);
        let send =
            &policy.spec.actions[&warden_core::ids::ActionName::parse("mail.send_email").unwrap()];
        let tags: Vec<&str> = send.tags.iter().map(|t| t.as_str()).collect();
        assert_eq!(tags, vec!["state_changing", "external"]);
        let rules: Vec<&str> = send
            .provenance
            .iter()
            .map(|r| r.argument.as_str())
            .collect();
        assert_eq!(rules, vec!["cc[*]", "to"]);
        assert_eq!(
            send.arguments.as_ref().unwrap()["properties"]["count"],
            json!({"type": "integer"})
        );
        let read =
            &policy.spec.actions[&warden_core::ids::ActionName::parse("mail.read_inbox").unwrap()];
        assert!(read.tags.is_empty() && read.provenance.is_empty());
        assert!(text.contains("# Send an email."));
        assert!(text.contains("# skipped tool \"bad name\""));
        assert_eq!(text.matches("REVIEW").count(), 5, "{text}");
        // The same tools from a streamable-HTTP server: `url:` instead.
        let text = starter_bundle("mail", &Source::Url("http://127.0.0.1:9/mcp"), &tools);
        let policy = warden_core::bundle::compile(&text).unwrap();
        assert_eq!(
            policy.mcp_servers()[0].transport,
            McpTransport::Http {
                url: "http://127.0.0.1:9/mcp".into()
            }
        );
        assert!(!text.contains("command:"));
    }

    #[test]
    fn targets_are_recognised_by_name() {
        for yes in [
            "to",
            "recipients",
            "accountId",
            "iban",
            "url",
            "file_path",
            "Host",
        ] {
            assert!(looks_like_target(yes), "{yes}");
        }
        for no in ["body", "amount", "subject", "count", "tone"] {
            assert!(!looks_like_target(no), "{no}");
        }
    }
}
