//! `warden policy lint` and `warden policy schema`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// Lint a bundle: print every located problem, exit 1 if any.
pub fn lint(file: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading `{}`", file.display()))?;
    match warden_core::bundle::compile(&text) {
        Ok(policy) => {
            println!(
                "ok: policy `{}`: {} actions, {} agents, {} memory records",
                policy.version,
                policy.catalogue.len(),
                policy.agents.len(),
                policy.memory.len()
            );
            // What each provenance rule and output trust declaration means.
            for line in policy.explain_provenance() {
                println!("  {line}");
            }
            // What the `lockdown:` section adds to the built-in vocabulary.
            if policy.spec.lockdown.is_some() {
                for line in policy.explain_lockdown() {
                    println!("  {line}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            for issue in &e.issues {
                println!("{}: {issue}", file.display());
            }
            println!("{} problem(s)", e.issues.len());
            Ok(ExitCode::from(1))
        }
    }
}

/// Print the bundle's JSON Schema. A reader that stops early (`| head`,
/// `| true`) is not an error: the command exits quietly.
pub fn schema() -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let text = serde_json::to_string_pretty(&warden_core::bundle::schema())?;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
    }
}
