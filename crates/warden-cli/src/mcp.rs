//! `warden mcp`: the stdio entry point of the MCP gateway (see
//! `warden_mcp::bridge`); `warden policy init --mcp` and `--mcp-url` (see
//! `warden_mcp::init`).

use std::process::ExitCode;

use anyhow::Context as _;
use warden_mcp::bridge::{BridgeConfig, run_stdio};
use warden_mcp::init::{init_from_command, init_from_url};

/// The variable holding the agent's token (never an argument: arguments
/// are visible to every user of the machine).
pub const TOKEN_ENV: &str = "WARDEN_TOKEN";

/// Relay stdio to `url`'s `/mcp` until stdin ends.
pub fn run(url: String, session: Option<String>) -> anyhow::Result<ExitCode> {
    let token = std::env::var(TOKEN_ENV)
        .with_context(|| format!("set {TOKEN_ENV} to the agent's token"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run_stdio(BridgeConfig {
        base_url: url,
        token,
        session,
    }))?;
    Ok(ExitCode::SUCCESS)
}

/// Print the starter bundle for server `name` launched by `command`, or
/// reached at `url` (streamable HTTP).
pub fn init(name: &str, command: &[String], url: Option<&str>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let bundle = match url {
        Some(url) => runtime.block_on(init_from_url(name, url))?,
        None => runtime.block_on(init_from_command(name, command))?,
    };
    print!("{bundle}");
    Ok(ExitCode::SUCCESS)
}
