//! The `warden` command. Thin: parsing in `cli`, work in the commands.
//!
//! Exit codes: 0 success (for `check`: admitted), 1 a negative answer
//! (`check`: rejected; `audit verify`: chain broken; `policy lint`:
//! problems found), 2 bad input or failure.

mod audit;
mod check;
mod checkpoint;
mod cli;
mod demo;
mod example;
mod keys;
mod mcp;
mod policy;
mod serve;
mod store;
mod sync;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the system allocator: the server allocates and frees
/// per request on every worker thread, where glibc's malloc spent about a
/// fifth of the server's CPU under load (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
