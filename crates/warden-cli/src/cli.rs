//! Command-line parsing and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Warden: a governance engine for hierarchical AI agents.
#[derive(Debug, Parser)]
#[command(name = "warden", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP governance service. Prints the policy, the database,
    /// where the operator token comes from and `listening on http://ADDR`
    /// (the real port when `--listen` asks for port 0). Stops on SIGTERM or
    /// SIGINT after finishing the requests in flight. Logs go to stderr,
    /// filtered by `WARDEN_LOG` (default `info`).
    Serve {
        /// Policy bundle (YAML or JSON); default: the bundled example
        /// policy (the lab document's report hierarchy).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Database URL: `sqlite://FILE`, `postgres://USER@HOST:PORT/DB`
        /// (several servers may share one; pick the schema with
        /// `?options=-csearch_path%3DNAME`) or `memory://` (nothing kept).
        #[arg(long, default_value = "sqlite://warden.db")]
        database: String,
        /// Address to listen on (`127.0.0.1:0` picks a free port).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// On PostgreSQL: how often (milliseconds) this server reconciles
        /// its cached hierarchy with the database in full, besides applying
        /// other servers' changes as they are notified. The longest a
        /// revocation made on another server can go unnoticed here when its
        /// notification is lost (plus one reload). Also how often the
        /// stored envelope signing keys are read again (a `warden keys
        /// rotate` takes effect within it).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        sync_interval_ms: u64,
        /// On PostgreSQL: how many group-commit writers this server runs,
        /// each with a connection of its own. Every server's writers take
        /// turns at the one audit head lock, so more writers mean smaller
        /// groups; a second one helps only a lone server a few milliseconds
        /// from its database.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
        pg_writers: u64,
        #[command(flatten)]
        audit_signing: crate::checkpoint::AuditSigningArgs,
        /// Most client connections open at once; a connection past the
        /// limit is answered `503 unavailable` and closed.
        #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        max_connections: u64,
        /// Milliseconds a connection has to deliver a complete request head
        /// (from its accept, or from the first byte of a later request);
        /// slower ones are closed.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        header_timeout_ms: u64,
        /// Milliseconds a kept-alive connection may wait for its next
        /// request before it is closed.
        #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
        idle_timeout_ms: u64,
    },
    /// Run the lab document's report-production scenario and print each
    /// acceptance criterion with its evidence.
    Demo,
    /// Admit an SOP or a plan offline, as a session admits its plan, and
    /// show per step the provenance its guarded arguments will meet (plan
    /// literals, bindings that are checked or can only escalate or be
    /// denied, bound arguments no rule guards): exit 0 admitted, 1
    /// rejected, 2 bad input.
    Check {
        /// Policy bundle (YAML or JSON).
        #[arg(long)]
        policy: PathBuf,
        /// The acting agent (declared in the bundle).
        #[arg(long)]
        agent: String,
        /// The SOP or plan file (JSON; a plan's argument values may be
        /// `{"$bind": {...}}`).
        sop: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Policy bundle tools.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// A stdio MCP server for clients that launch their servers as
    /// subprocesses: relays every message to a running `warden serve`'s
    /// `/mcp` with the agent's token (from `WARDEN_TOKEN`), so every tool
    /// call is decided there. Stops when stdin ends.
    Mcp {
        /// The server's base URL (plain http).
        #[arg(long, default_value = "http://127.0.0.1:7070")]
        url: String,
        /// Bind every call to this session (opened through the API, e.g.
        /// with the user's request as a trusted input).
        #[arg(long)]
        session: Option<String>,
    },
    /// Decision log tools.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// The envelope signing keys stored in the database (shared by every
    /// server on it; `WARDEN_ENVELOPE_SIGNING_KEY`, when set, wins).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// List the stored keys: generation, issuer, public key, creation
    /// time; the last is current (never the seed).
    List {
        /// Database URL (`sqlite://PATH` or `postgres://...`).
        #[arg(long)]
        database: String,
    },
    /// Store a new random key as the current one (recorded). Earlier keys
    /// stay published as verifying keys, so what they signed still
    /// verifies; running servers switch at their next reload (every
    /// `--sync-interval-ms`). On SQLite, run it while no server holds the
    /// file.
    Rotate {
        /// Database URL (`sqlite://PATH` or `postgres://...`).
        #[arg(long)]
        database: String,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Recompute the hash chain: exit 0 intact, 1 naming the first bad
    /// entry, 2 unreadable.
    Verify {
        /// Database URL (`sqlite://PATH` or `postgres://...`).
        #[arg(long)]
        database: String,
        /// A head exported earlier (`SEQ:HASH`, from a previous verify) that
        /// the chain must still reach: detects truncation and rewrites.
        #[arg(long)]
        expect_head: Option<String>,
        /// The public key (64 hex digits) of the server's audit signing key:
        /// every checkpoint in the log must be signed by a trusted key and
        /// the chain must pass through the head it signs (repeatable).
        #[arg(long, value_name = "PUBKEY")]
        trust: Vec<String>,
        /// An anchor file written by `warden serve --audit-anchor-file`:
        /// the chain must pass through, and reach, every checkpoint in it
        /// (needs `--trust`).
        #[arg(long, value_name = "FILE", requires = "trust")]
        anchors: Option<PathBuf>,
    },
    /// Generate an audit signing key for `warden serve --audit-key`: writes
    /// the secret seed (64 hex digits) to a new file readable only by its
    /// owner and prints the public key to pass to `audit verify --trust`.
    Keygen {
        /// The key file to create (refused if it exists).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Write the log as JSON Lines.
    Export {
        /// Database URL (`sqlite://PATH` or `postgres://...`).
        #[arg(long)]
        database: String,
        /// Only entries after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate a bundle; exit 1 listing every located problem.
    Lint {
        /// The bundle.
        file: PathBuf,
    },
    /// Print the bundle's JSON Schema.
    Schema,
    /// Write a starter bundle for an MCP server to stdout: launches
    /// COMMAND over stdio (`--mcp NAME -- COMMAND...`) or connects to a
    /// streamable-HTTP server (`--mcp-url NAME URL`), reads its tools and
    /// declares each (schema, output trust untrusted, tags from its
    /// annotations, provenance rules proposed for target-like arguments,
    /// all marked for review). Grants nothing.
    Init {
        /// The server's name in the bundle (tool `T` becomes action
        /// `NAME.T`), for a server launched by COMMAND.
        #[arg(
            long,
            value_name = "NAME",
            required_unless_present = "mcp_url",
            conflicts_with = "mcp_url",
            requires = "command"
        )]
        mcp: Option<String>,
        /// The server's name and the URL of a streamable-HTTP server.
        #[arg(long, num_args = 2, value_names = ["NAME", "URL"])]
        mcp_url: Option<Vec<String>>,
        /// The server's command and arguments (after `--`).
        #[arg(last = true)]
        command: Vec<String>,
    },
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve {
            policy,
            database,
            listen,
            sync_interval_ms,
            pg_writers,
            audit_signing,
            max_connections,
            header_timeout_ms,
            idle_timeout_ms,
        } => crate::serve::run(
            policy.as_deref(),
            &database,
            &listen,
            std::time::Duration::from_millis(sync_interval_ms),
            usize::try_from(pg_writers).unwrap_or(1),
            &audit_signing,
            warden_server::ConnectionLimits {
                max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
                header_timeout: std::time::Duration::from_millis(header_timeout_ms),
                idle_timeout: std::time::Duration::from_millis(idle_timeout_ms),
            },
        ),
        Command::Demo => crate::demo::run(),
        Command::Check {
            policy,
            agent,
            sop,
            json,
        } => crate::check::run(&policy, &agent, &sop, json),
        Command::Policy { command } => match command {
            PolicyCommand::Lint { file } => crate::policy::lint(&file),
            PolicyCommand::Schema => crate::policy::schema(),
            PolicyCommand::Init {
                mcp,
                mcp_url,
                command,
            } => match (mcp, mcp_url.as_deref()) {
                (_, Some([name, url])) => crate::mcp::init(name, &[], Some(url)),
                (Some(name), _) => crate::mcp::init(&name, &command, None),
                _ => anyhow::bail!("give --mcp NAME -- COMMAND... or --mcp-url NAME URL"),
            },
        },
        Command::Mcp { url, session } => crate::mcp::run(url, session),
        Command::Audit { command } => match command {
            AuditCommand::Verify {
                database,
                expect_head,
                trust,
                anchors,
            } => crate::audit::verify(
                &database,
                expect_head.as_deref(),
                &trust,
                anchors.as_deref(),
            ),
            AuditCommand::Keygen { out } => crate::audit::keygen(&out),
            AuditCommand::Export { database, after } => crate::audit::export(&database, after),
        },
        Command::Keys { command } => match command {
            KeysCommand::List { database } => crate::keys::list(&database),
            KeysCommand::Rotate { database } => crate::keys::rotate(&database),
        },
    }
}
