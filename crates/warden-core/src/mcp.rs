//! The `mcp_servers:` section: upstream MCP servers the gateway reaches,
//! and the rules that tie their tools to the action catalogue.
//!
//! ```yaml
//! mcp_servers:
//!   mail:
//!     command: [python3, mail_server.py]   # launched over stdio
//!     env: {MAIL_DIR: /srv/mail}           # optional
//!     trust: untrusted                     # output trust of its tools
//!   search:
//!     url: http://127.0.0.1:8931/mcp       # streamable HTTP
//!     trust: untrusted
//! ```
//!
//! Tool `T` of server `S` is the catalogue action `S.T`: its `actions:`
//! entry gives its schema, rules, provenance rules, output trust (when it
//! has no `output:`, the server's `trust`), tags and limits. A tool with no
//! `actions:` entry is never listed and never callable.
//!
//! Server names are identifiers without a `.` (so `S.T` splits one way).
//!
//! ## Schema compatibility
//!
//! The gateway checks each tool's advertised input schema against the
//! declared one ([`check_schema`]) and refuses to expose a tool whose
//! schema *widened*: the upstream advertises a property the declaration
//! does not name (an argument the policy never checks), or gives a
//! property both name a JSON type the declaration does not allow
//! (`integer` is within `number`). An advertised *required* property the
//! declaration does not name makes the tool incompatible as well (no call
//! the declaration admits could satisfy the upstream). Narrowing (fewer
//! properties, fewer types) is compatible. A declaration without an
//! `arguments` schema admits any arguments, so nothing can widen it.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ActionName;
use crate::provenance::Trust;

/// Default time an upstream has to answer one call.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// Default time an escalated call is held waiting for a reviewer.
pub const DEFAULT_ESCALATION_WAIT_MS: u64 = 60_000;
/// Longest either timeout may be set to (an hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// One entry of `mcp_servers:` as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// The program and its arguments, launched over stdio (exactly one of
    /// `command` and `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The URL of a streamable-HTTP MCP server (exactly one of `command`
    /// and `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Environment variables set for a launched server (its only
    /// environment besides `PATH`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The trust of its tools' results, unless an action's `output:` says
    /// otherwise.
    pub trust: Trust,
    /// How long one call may take before it is an error of that call
    /// (default 30000 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// How long an escalated call is held waiting for a reviewer before it
    /// returns a tool error naming the escalation (default 60000 ms; 0
    /// answers at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation_wait_ms: Option<u64>,
}

/// How the gateway reaches a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// Launched as a child process, spoken to over its stdin and stdout.
    Stdio {
        /// Program and arguments (at least the program).
        argv: Vec<String>,
        /// Environment variables.
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP at this URL.
    Http {
        /// The endpoint.
        url: String,
    },
}

/// One compiled `mcp_servers:` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    /// Its name: the `S` of `S.T`.
    pub name: String,
    /// How it is reached.
    pub transport: McpTransport,
    /// The output trust of its tools by default.
    pub trust: Trust,
    /// Longest one call may take.
    pub call_timeout_ms: u64,
    /// Longest an escalated call is held.
    pub escalation_wait_ms: u64,
}

/// Whether `name` may name a server: 1 to 64 of `[A-Za-z0-9_-]` (no `.`).
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Compile the section, pushing every problem with its location.
pub(crate) fn compile_servers(
    specs: &BTreeMap<String, McpServerSpec>,
    push: &mut impl FnMut(String, String),
) -> Vec<McpServer> {
    let mut out = Vec::with_capacity(specs.len());
    for (name, spec) in specs {
        let at = format!("mcp_servers.{name}");
        if !valid_server_name(name) {
            push(
                at.clone(),
                "a server name is 1 to 64 of [A-Za-z0-9_-] (no `.`: tool `T` of server `S` is action `S.T`)"
                    .into(),
            );
            continue;
        }
        let transport = match (&spec.command, &spec.url) {
            (Some(argv), None) => {
                if argv.is_empty() || argv.first().is_some_and(String::is_empty) {
                    push(
                        format!("{at}.command"),
                        "must name a program: [PROGRAM, ARGS...]".into(),
                    );
                    continue;
                }
                for key in spec.env.keys() {
                    if key.is_empty() || key.contains('=') || key.contains('\0') {
                        push(
                            format!("{at}.env"),
                            format!("`{key}` is not a variable name"),
                        );
                    }
                }
                McpTransport::Stdio {
                    argv: argv.clone(),
                    env: spec.env.clone(),
                }
            }
            (None, Some(url)) => {
                match url::Url::parse(url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                    _ => {
                        push(
                            format!("{at}.url"),
                            format!("`{url}` is not an http or https URL"),
                        );
                        continue;
                    }
                }
                if !spec.env.is_empty() {
                    push(
                        format!("{at}.env"),
                        "only a launched server (`command`) takes an environment".into(),
                    );
                }
                McpTransport::Http { url: url.clone() }
            }
            (Some(_), Some(_)) => {
                push(at, "give `command` or `url`, not both".into());
                continue;
            }
            (None, None) => {
                push(
                    at,
                    "give `command` (a server launched over stdio) or `url` (streamable HTTP)"
                        .into(),
                );
                continue;
            }
        };
        let mut timeout = |field: &str, value: Option<u64>, default: u64, min: u64| {
            let v = value.unwrap_or(default);
            if v < min || v > MAX_TIMEOUT_MS {
                push(
                    format!("{at}.{field}"),
                    format!("must be {min} to {MAX_TIMEOUT_MS}"),
                );
            }
            v
        };
        let call_timeout_ms = timeout(
            "call_timeout_ms",
            spec.call_timeout_ms,
            DEFAULT_CALL_TIMEOUT_MS,
            1,
        );
        let escalation_wait_ms = timeout(
            "escalation_wait_ms",
            spec.escalation_wait_ms,
            DEFAULT_ESCALATION_WAIT_MS,
            0,
        );
        out.push(McpServer {
            name: name.clone(),
            transport,
            trust: spec.trust,
            call_timeout_ms,
            escalation_wait_ms,
        });
    }
    out
}

/// The catalogue action of tool `tool` of server `server`, if the tool's
/// name can be one.
pub fn tool_action(server: &str, tool: &str) -> Option<ActionName> {
    ActionName::parse(&format!("{server}.{tool}")).ok()
}

/// The server and tool of an action `S.T` (split at the first `.`).
pub fn split_action(action: &str) -> Option<(&str, &str)> {
    action
        .split_once('.')
        .filter(|(s, t)| !s.is_empty() && !t.is_empty() && valid_server_name(s))
}

/// The JSON types a schema's `type` allows (`None`: no `type`, any).
fn types_of(schema: &Value) -> Option<BTreeSet<String>> {
    match schema.get("type")? {
        Value::String(s) => Some(BTreeSet::from([s.clone()])),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        ),
        _ => None,
    }
}

fn properties(schema: &Value) -> Option<&serde_json::Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

/// Check an upstream tool's advertised input schema against the declared
/// one (see the module docs for what widening is). `Ok` when compatible;
/// otherwise every problem, one line each.
pub fn check_schema(declared: Option<&Value>, advertised: &Value) -> Result<(), Vec<String>> {
    let Some(declared) = declared else {
        return Ok(());
    };
    let mut problems = Vec::new();
    let empty = serde_json::Map::new();
    let declared_props = properties(declared).unwrap_or(&empty);
    let advertised_props = properties(advertised).unwrap_or(&empty);
    // By name, whatever order the JSON map keeps (serde_json's
    // `preserve_order` feature, turned on by another crate of a build,
    // would otherwise reorder the problems).
    let mut advertised_props: Vec<(&String, &Value)> = advertised_props.iter().collect();
    advertised_props.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (name, adv) in advertised_props {
        let Some(dec) = declared_props.get(name) else {
            problems.push(format!(
                "advertises argument `{name}`, which the declared schema does not name"
            ));
            continue;
        };
        if let (Some(adv_types), Some(dec_types)) = (types_of(adv), types_of(dec)) {
            for t in &adv_types {
                let within =
                    dec_types.contains(t) || (t == "integer" && dec_types.contains("number"));
                if !within {
                    problems.push(format!(
                        "argument `{name}` may be of type `{t}`, which the declared schema does not allow"
                    ));
                }
            }
        }
    }
    if let Some(required) = advertised.get("required").and_then(Value::as_array) {
        for r in required.iter().filter_map(Value::as_str) {
            if !declared_props.contains_key(r) {
                problems.push(format!(
                    "requires argument `{r}`, which the declared schema does not name"
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(yaml: &str) -> (Vec<McpServer>, Vec<(String, String)>) {
        let specs: BTreeMap<String, McpServerSpec> = serde_saphyr::from_str(yaml).unwrap();
        let mut issues = Vec::new();
        let out = compile_servers(&specs, &mut |l, m| issues.push((l, m)));
        (out, issues)
    }

    #[test]
    fn stdio_and_http_servers_compile_with_defaults() {
        let (servers, issues) = compile(
            "mail: {command: [python3, mail.py], env: {A: b}, trust: untrusted}\n\
             web: {url: 'http://127.0.0.1:9/mcp', trust: trusted, call_timeout_ms: 5, escalation_wait_ms: 0}\n",
        );
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(
            servers,
            vec![
                McpServer {
                    name: "mail".into(),
                    transport: McpTransport::Stdio {
                        argv: vec!["python3".into(), "mail.py".into()],
                        env: BTreeMap::from([("A".into(), "b".into())]),
                    },
                    trust: Trust::Untrusted,
                    call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
                    escalation_wait_ms: DEFAULT_ESCALATION_WAIT_MS,
                },
                McpServer {
                    name: "web".into(),
                    transport: McpTransport::Http {
                        url: "http://127.0.0.1:9/mcp".into()
                    },
                    trust: Trust::Trusted,
                    call_timeout_ms: 5,
                    escalation_wait_ms: 0,
                },
            ]
        );
    }

    #[test]
    fn bad_entries_are_located() {
        let (servers, issues) = compile(
            "a.b: {command: [x], trust: trusted}\n\
             both: {command: [x], url: 'http://h/', trust: trusted}\n\
             neither: {trust: trusted}\n\
             empty: {command: [], trust: trusted}\n\
             ftp: {url: 'ftp://h/', trust: trusted}\n\
             envurl: {url: 'http://h/', env: {A: b}, trust: trusted}\n\
             badenv: {command: [x], env: {'A=B': c}, trust: trusted}\n\
             slow: {command: [x], trust: trusted, call_timeout_ms: 0}\n",
        );
        let locations: Vec<&str> = issues.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            locations,
            vec![
                "mcp_servers.a.b",
                "mcp_servers.badenv.env",
                "mcp_servers.both",
                "mcp_servers.empty.command",
                "mcp_servers.envurl.env",
                "mcp_servers.ftp.url",
                "mcp_servers.neither",
                "mcp_servers.slow.call_timeout_ms",
            ]
        );
        assert_eq!(
            servers.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            vec!["badenv", "envurl", "slow"]
        );
    }

    #[test]
    fn unknown_fields_and_missing_trust_are_refused() {
        for bad in [
            "s: {command: [x]}\n",
            "s: {command: [x], trust: maybe}\n",
            "s: {command: [x], trust: trusted, extra: 1}\n",
        ] {
            assert!(
                serde_saphyr::from_str::<BTreeMap<String, McpServerSpec>>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn actions_split_at_the_first_dot() {
        assert_eq!(split_action("mail.send.now"), Some(("mail", "send.now")));
        assert_eq!(split_action("memory"), None);
        assert_eq!(split_action(".x"), None);
        assert_eq!(tool_action("mail", "send").unwrap().as_str(), "mail.send");
        assert!(tool_action("mail", "has space").is_none());
    }

    #[test]
    fn narrowing_is_compatible_and_widening_is_refused() {
        let declared = json!({"type": "object", "properties": {
            "to": {"type": "string"}, "n": {"type": "number"}, "cc": {"type": "array"}
        }, "required": ["to"]});
        // Same, fewer properties, integer within number: compatible.
        assert_eq!(check_schema(Some(&declared), &declared), Ok(()));
        let narrower = json!({"type": "object", "properties": {
            "to": {"type": "string"}, "n": {"type": "integer"}
        }});
        assert_eq!(check_schema(Some(&narrower), &narrower), Ok(()));
        assert_eq!(check_schema(Some(&declared), &narrower), Ok(()));
        // No declared schema: nothing to widen.
        assert_eq!(
            check_schema(None, &json!({"properties": {"x": {}}})),
            Ok(())
        );
        let wider = json!({"type": "object", "properties": {
            "to": {"type": ["string", "array"]}, "bcc": {"type": "string"},
            "n": {"type": "number"}
        }, "required": ["to", "token"]});
        assert_eq!(
            check_schema(Some(&declared), &wider),
            Err(vec![
                "advertises argument `bcc`, which the declared schema does not name".to_owned(),
                "argument `to` may be of type `array`, which the declared schema does not allow"
                    .to_owned(),
                "requires argument `token`, which the declared schema does not name".to_owned(),
            ])
        );
    }
}
