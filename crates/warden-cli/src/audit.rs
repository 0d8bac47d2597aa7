//! `warden audit verify` and `warden audit export`.
//!
//! Both open the database read-only and never change it: SQLite files
//! through `warden-sqlite`'s functions, PostgreSQL databases
//! (`postgres://...`, the schema the URL's `search_path` names) through
//! `warden-postgres`'s, which read one snapshot over one connection and
//! never migrate or create anything.

use std::io::{BufWriter, ErrorKind, Write};
use std::process::ExitCode;

use anyhow::anyhow;
use warden_store::{HeadAnchor, VerifyError};

/// Recompute the hash chain: exit 0 with the count and head when intact, 1
/// naming the first bad entry, 2 when the database cannot be read.
pub fn verify(database: &str, expect_head: Option<&str>) -> anyhow::Result<ExitCode> {
    let anchor: Option<HeadAnchor> = match expect_head {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|e| anyhow!("invalid --expect-head `{s}` (expected SEQ:HASH): {e}"))?,
        ),
    };
    let result = match backend(database)? {
        Backend::Sqlite => warden_sqlite::verify_audit(database, anchor),
        Backend::Postgres => runtime()?.block_on(warden_postgres::verify_audit(database, anchor)),
    };
    match result {
        Ok(report) => {
            println!(
                "ok: {} entries verified, head {}:{}",
                report.verified.count, report.verified.seq, report.verified.hash
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(VerifyError::Store(e)) => Err(anyhow!(
            "cannot read `{}`: {e}",
            crate::store::redact(database)
        )),
        Err(e) => {
            match e.seq() {
                Some(seq) => println!("broken at entry {seq}: {e}"),
                None => println!("broken: {e}"),
            }
            Ok(ExitCode::from(1))
        }
    }
}

/// Write entries after `after` as JSON Lines to standard output. A closed
/// pipe (`| head`) is success.
pub fn export(database: &str, after: u64) -> anyhow::Result<ExitCode> {
    let result = match backend(database)? {
        Backend::Sqlite => {
            let stdout = std::io::stdout();
            let mut out = BufWriter::new(stdout.lock());
            warden_sqlite::export_audit(database, after, &mut out)
                .map_err(|e| match e {
                    warden_sqlite::ExportError::Io(e) => Failure::Io(e),
                    other => Failure::Other(other.to_string()),
                })
                .and_then(|_| out.flush().map_err(Failure::Io))
        }
        // The export buffers and flushes its output itself; the driver
        // needs an output it can hold across awaits (not a stdout lock).
        Backend::Postgres => runtime()?
            .block_on(warden_postgres::export_audit(
                database,
                after,
                std::io::stdout(),
            ))
            .map(|_| ())
            .map_err(|e| match e {
                warden_postgres::ExportError::Io(e) => Failure::Io(e),
                other => Failure::Other(other.to_string()),
            }),
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(Failure::Io(e)) if e.kind() == ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(anyhow!(
            "cannot export `{}`: {e}",
            crate::store::redact(database)
        )),
    }
}

/// Why an export stopped, whichever backend it read.
enum Failure {
    /// Writing the output failed.
    Io(std::io::Error),
    /// Reading the log failed.
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Io(e) => write!(f, "cannot write the export: {e}"),
            Failure::Other(m) => f.write_str(m),
        }
    }
}

enum Backend {
    Sqlite,
    Postgres,
}

fn backend(url: &str) -> anyhow::Result<Backend> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else if warden_postgres::is_postgres_url(url) {
        Ok(Backend::Postgres)
    } else {
        Err(anyhow!(
            "unsupported database url `{}`: expected sqlite://PATH or postgres://...",
            crate::store::redact(url)
        ))
    }
}

/// A small runtime for the PostgreSQL driver (its connection runs on a
/// background task).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow!("starting the async runtime: {e}"))
}
