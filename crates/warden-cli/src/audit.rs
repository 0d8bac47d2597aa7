//! `warden audit verify` and `warden audit export`.
//!
//! Both open the database read-only and never change it.

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
    };
    match result {
        Ok(report) => {
            println!(
                "ok: {} entries verified, head {}:{}",
                report.verified.count, report.verified.seq, report.verified.hash
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(VerifyError::Store(e)) => Err(anyhow!("cannot read `{database}`: {e}")),
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
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match backend(database)? {
        Backend::Sqlite => warden_sqlite::export_audit(database, after, &mut out),
    };
    match result {
        Ok(_) => {}
        Err(warden_sqlite::ExportError::Io(e)) if e.kind() == ErrorKind::BrokenPipe => {
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(anyhow!("cannot export `{database}`: {e}")),
    }
    match out.flush() {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e.into()),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

enum Backend {
    Sqlite,
}

fn backend(url: &str) -> anyhow::Result<Backend> {
    if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else {
        Err(anyhow!(
            "unsupported database url `{url}`: expected sqlite://PATH"
        ))
    }
}
