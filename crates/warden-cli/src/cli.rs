//! Command-line parsing and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The bundled example policy (the lab document's report hierarchy).
pub const EXAMPLE_POLICY: &str = include_str!("../../../examples/report-hierarchy/policy.yaml");

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
        /// Database URL: `sqlite://FILE` or `memory://` (nothing kept).
        #[arg(long, default_value = "sqlite://warden.db")]
        database: String,
        /// Address to listen on (`127.0.0.1:0` picks a free port).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
    },
    /// Run the lab document's report-production scenario and print each
    /// acceptance criterion with its evidence.
    Demo,
    /// Preflight an SOP offline: exit 0 admitted, 1 rejected, 2 bad input.
    Check {
        /// Policy bundle (YAML or JSON).
        #[arg(long)]
        policy: PathBuf,
        /// The acting agent (declared in the bundle).
        #[arg(long)]
        agent: String,
        /// The SOP file (JSON).
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
    /// Decision log tools.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Recompute the hash chain: exit 0 intact, 1 naming the first bad
    /// entry, 2 unreadable.
    Verify {
        /// Database URL (`sqlite://PATH`).
        #[arg(long)]
        database: String,
        /// A head exported earlier (`SEQ:HASH`, from a previous verify) that
        /// the chain must still reach: detects truncation and rewrites.
        #[arg(long)]
        expect_head: Option<String>,
    },
    /// Write the log as JSON Lines.
    Export {
        /// Database URL (`sqlite://PATH`).
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
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve {
            policy,
            database,
            listen,
        } => crate::serve::run(policy.as_deref(), &database, &listen),
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
        },
        Command::Audit { command } => match command {
            AuditCommand::Verify {
                database,
                expect_head,
            } => crate::audit::verify(&database, expect_head.as_deref()),
            AuditCommand::Export { database, after } => crate::audit::export(&database, after),
        },
    }
}
