//! `warden serve`'s audit signing: signed checkpoints of the decision log's
//! head, made by a background task, appended to the log and (with
//! `--audit-anchor-file`) to a file of JSON lines kept elsewhere. The same
//! task records the counts of request-rate refusals whose window closed.
//!
//! The key (a 32-byte Ed25519 seed, 64 hex digits, from `warden audit
//! keygen`) comes from `--audit-key FILE` or `WARDEN_AUDIT_SIGNING_KEY`;
//! never from the database, and it is never printed or logged (only its
//! public key is). Without a key no checkpoints are made. A checkpoint is
//! made when `--audit-checkpoint-every` entries were appended since the
//! last one, when `--audit-checkpoint-interval-ms` passed with new entries,
//! and once more on shutdown. What checkpoints prove and what they do not:
//! `warden_core::audit::checkpoint`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use warden::Engine;
use warden_core::audit::checkpoint::{
    PublicKey, SignedCheckpoint, SigningKey, signing_key_from_hex,
};
use warden_server::Metered;

use crate::store::AnyStore;

/// The environment variable holding the audit signing key (64 hex digits).
pub const AUDIT_SIGNING_KEY_ENV: &str = "WARDEN_AUDIT_SIGNING_KEY";

/// How often the task looks at the log.
const TICK: Duration = Duration::from_millis(250);

type ServerEngine = Engine<Metered<AnyStore>>;

/// `warden serve`'s audit signing options.
#[derive(Debug, clap::Args)]
pub struct AuditSigningArgs {
    /// Sign checkpoints of the audit log's head with the Ed25519 key in
    /// FILE (64 hex digits, from `warden audit keygen`); or set
    /// `WARDEN_AUDIT_SIGNING_KEY`. Without a key, no checkpoints are made.
    #[arg(long, value_name = "FILE")]
    audit_key: Option<PathBuf>,
    /// Also append every checkpoint to FILE (one JSON line each; keep it
    /// where the database's writers cannot rewrite it), for `warden audit
    /// verify --anchors FILE`.
    #[arg(long, value_name = "FILE")]
    audit_anchor_file: Option<PathBuf>,
    /// Make a checkpoint after this many new entries.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    audit_checkpoint_every: u64,
    /// Make a checkpoint at least this often (milliseconds) while entries
    /// are appended.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    audit_checkpoint_interval_ms: u64,
}

/// What the task signs with, and where it exports.
struct Signer {
    key: SigningKey,
    anchor_file: Option<PathBuf>,
    every: u64,
    interval: Duration,
}

/// The signing set up from [`AuditSigningArgs`] (none without a key).
pub struct AuditSigning(Option<Signer>);

impl AuditSigningArgs {
    /// Read the key (before anything is stored: a bad key stops startup
    /// early).
    pub fn load(&self) -> anyhow::Result<AuditSigning> {
        self.signer().map(AuditSigning)
    }

    fn signer(&self) -> anyhow::Result<Option<Signer>> {
        let text = match &self.audit_key {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the audit key `{}`", path.display()))?,
            ),
            None => std::env::var(AUDIT_SIGNING_KEY_ENV)
                .ok()
                .filter(|v| !v.is_empty()),
        };
        let Some(text) = text else {
            if self.audit_anchor_file.is_some() {
                return Err(anyhow!(
                    "--audit-anchor-file needs a signing key (--audit-key FILE or {AUDIT_SIGNING_KEY_ENV})"
                ));
            }
            return Ok(None);
        };
        let key = signing_key_from_hex(&text).map_err(|e| {
            anyhow!("the audit signing key must be 64 hex digits (a 32-byte Ed25519 seed): {e}")
        })?;
        Ok(Some(Signer {
            key,
            anchor_file: self.audit_anchor_file.clone(),
            every: self.audit_checkpoint_every,
            interval: Duration::from_millis(self.audit_checkpoint_interval_ms),
        }))
    }
}

/// The running task.
pub struct AuditTask {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl AuditTask {
    /// Start the task (printing the signing key's public key, if any).
    pub fn spawn(engine: ServerEngine, signing: AuditSigning) -> Self {
        let signer = signing.0;
        match &signer {
            Some(s) => println!(
                "audit checkpoints: signed by {} every {} entries or {} ms{}",
                hex_key(&s.key),
                s.every,
                s.interval.as_millis(),
                s.anchor_file
                    .as_ref()
                    .map(|p| format!(", anchors appended to `{}`", p.display()))
                    .unwrap_or_default()
            ),
            None => println!("audit checkpoints: none (no --audit-key or {AUDIT_SIGNING_KEY_ENV})"),
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(engine, signer, stopped));
        Self { stop, task }
    }

    /// Stop the task after a last flush and checkpoint.
    pub async fn finish(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

fn hex_key(key: &SigningKey) -> String {
    PublicKey(key.verifying_key()).to_hex()
}

async fn run(engine: ServerEngine, signer: Option<Signer>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut signed_at = match engine.audit_head().await {
        Ok(h) => h.seq,
        Err(_) => 0,
    };
    let mut last = Instant::now();
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.changed() => true,
        };
        if let Err(e) = engine.flush_refusal_counts().await {
            tracing::warn!(error = %e, "recording refusal counts failed");
        }
        if let Some(s) = &signer {
            let head = engine.audit_head().await.map(|h| h.seq).unwrap_or(0);
            let due = stopping
                || head >= signed_at.saturating_add(s.every)
                || (head > signed_at && last.elapsed() >= s.interval);
            if due {
                match engine.checkpoint_audit(&s.key).await {
                    Ok(Some(cp)) => {
                        signed_at = cp.checkpoint.seq.saturating_add(1);
                        last = Instant::now();
                        tracing::info!(seq = cp.checkpoint.seq, "audit checkpoint signed");
                        if let Some(path) = &s.anchor_file
                            && let Err(e) = append_anchor(path, &cp)
                        {
                            tracing::error!(error = %e, file = %path.display(), "writing the audit anchor failed");
                        }
                    }
                    Ok(None) => last = Instant::now(),
                    Err(e) => tracing::warn!(error = %e, "audit checkpoint failed"),
                }
            }
        }
        if stopping {
            return;
        }
    }
}

/// Append one checkpoint as a JSON line and flush it to disk.
fn append_anchor(path: &Path, cp: &SignedCheckpoint) -> anyhow::Result<()> {
    let mut line = serde_json::to_string(cp)?;
    line.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(line.as_bytes())?;
    file.sync_data()?;
    Ok(())
}
