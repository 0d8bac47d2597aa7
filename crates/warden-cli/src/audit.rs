//! `warden audit verify`, `warden audit export` and `warden audit keygen`.
//!
//! `verify --trust PUBKEY [--anchors FILE]` also checks the signed
//! checkpoints in the log and the anchor file (see
//! `warden_core::audit::checkpoint` for what they prove and what not), and
//! prints how many entries follow the newest signed head.
//!
//! Both open the database read-only and never change it: SQLite files
//! through `warden-sqlite`'s functions, PostgreSQL databases
//! (`postgres://...`, the schema the URL's `search_path` names) through
//! `warden-postgres`'s, which read one snapshot over one connection and
//! never migrate or create anything.

use std::io::{BufWriter, ErrorKind, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use warden_core::audit::checkpoint::{CheckpointVerifier, PublicKey, SignedCheckpoint, SigningKey};
use warden_store::{HeadAnchor, VerifyError};

/// Recompute the hash chain (and, with `trust`, check the signed
/// checkpoints and `anchors`): exit 0 with the count and head when intact,
/// 1 naming the first bad entry (or checkpoint), 2 when the database or an
/// argument cannot be read.
pub fn verify(
    database: &str,
    expect_head: Option<&str>,
    trust: &[String],
    anchors: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let anchor: Option<HeadAnchor> = match expect_head {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|e| anyhow!("invalid --expect-head `{s}` (expected SEQ:HASH): {e}"))?,
        ),
    };
    let checkpoints = match checkpoint_verifier(trust, anchors)? {
        Ok(v) => v,
        Err(e) => {
            println!("broken: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let result = match backend(database)? {
        Backend::Sqlite => warden_sqlite::verify_audit_with(database, anchor, checkpoints),
        Backend::Postgres => runtime()?.block_on(warden_postgres::verify_audit_with(
            database,
            anchor,
            checkpoints,
        )),
    };
    match result {
        Ok(report) => {
            println!(
                "ok: {} entries verified, head {}:{}",
                report.verified.count, report.verified.seq, report.verified.hash
            );
            if let Some(c) = report.checkpoints {
                let last = c.last_signed.map_or_else(
                    || "no signed head".to_owned(),
                    |l| format!("newest signed head {}:{}", l.seq, l.hash),
                );
                println!(
                    "checkpoints: {} signed checkpoints and {} anchors verified; {last}; {} entries after it are not signed yet",
                    c.checkpoints, c.anchors, c.unsigned_entries
                );
            }
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

/// The checkpoint verifier for `--trust` and `--anchors` (`None` without
/// `--trust`); the inner `Err` is an anchor file whose signatures are
/// refused (a broken log, exit 1), the outer one bad input (exit 2).
fn checkpoint_verifier(
    trust: &[String],
    anchors: Option<&Path>,
) -> anyhow::Result<Result<Option<CheckpointVerifier>, VerifyError>> {
    if trust.is_empty() {
        return Ok(Ok(None));
    }
    let keys = trust
        .iter()
        .map(|k| {
            PublicKey::from_hex(k)
                .map(|p| p.0)
                .map_err(|e| anyhow!("invalid --trust `{k}`: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut signed = Vec::new();
    if let Some(path) = anchors {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the anchors `{}`", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let cp: SignedCheckpoint = serde_json::from_str(line).map_err(|e| {
                anyhow!("`{}` line {}: not a checkpoint: {e}", path.display(), i + 1)
            })?;
            signed.push(cp);
        }
    }
    Ok(CheckpointVerifier::new(keys, &signed)
        .map(Some)
        .map_err(VerifyError::from))
}

/// Create a new audit signing key in `out` (the 32-byte seed as 64 hex
/// digits, mode 0600 on Unix; an existing file is refused) and print its
/// public key.
pub fn keygen(out: &Path) -> anyhow::Result<ExitCode> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow!("drawing a random key: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(out)
        .with_context(|| format!("creating the key file `{}`", out.display()))?;
    file.write_all(format!("{}\n", hex::encode(seed)).as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the key file `{}`", out.display()))?;
    println!("public key: {}", PublicKey(key.verifying_key()).to_hex());
    Ok(ExitCode::SUCCESS)
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
