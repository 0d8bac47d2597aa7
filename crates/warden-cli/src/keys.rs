//! `warden keys`: the envelope signing keys stored in the database.
//!
//! `list` prints every stored key (generation, issuer, public key, when it
//! was made; never the seed), the last one current. `rotate` stores a new
//! random key as the next generation (recorded `envelope_key.rotate`): it
//! signs from then on, and every earlier key stays a verifying key, so
//! what it signed still verifies on every server. Running servers pick the
//! rotation up at their next reload (every `--sync-interval-ms`). On
//! SQLite the file is held by its one writing process: rotate while no
//! server runs on it.

use std::process::ExitCode;

use anyhow::Context;
use warden::envelope_keys;
use warden_core::time::Timestamp;
use warden_store::Store;

fn now() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Timestamp(ms)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn line(key: &warden_store::SigningKeyRecord, current: bool) -> anyhow::Result<String> {
    let issuer = warden_server::signing::issuer_of(&key.public_key)?;
    Ok(format!(
        "{}\t{issuer}\t{}\t{}{}",
        key.generation,
        hex::encode(key.public_key),
        key.created_at.0,
        if current { "\tcurrent" } else { "" }
    ))
}

/// `warden keys list --database URL`.
pub fn list(database: &str) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let store = crate::store::open(database).await?;
        let keys = store
            .signing_keys()
            .await
            .map_err(|e| anyhow::anyhow!("reading the keys: {e}"))?;
        if keys.is_empty() {
            println!("no envelope signing key stored yet (the first `warden serve` stores one)");
            return Ok(ExitCode::SUCCESS);
        }
        println!("generation\tissuer\tpublic_key\tcreated_at_ms");
        let last = keys.len() - 1;
        for (i, k) in keys.iter().enumerate() {
            println!("{}", line(k, i == last)?);
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `warden keys rotate --database URL`.
pub fn rotate(database: &str) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let store = crate::store::open(database).await?;
        let seed = warden_server::signing::random_seed()?;
        let key = envelope_keys::rotate(&store, seed, now(), "")
            .await
            .map_err(|e| anyhow::anyhow!("rotating the envelope signing key: {e}"))?;
        println!("stored a new current envelope signing key:");
        println!("{}", line(&key, true)?);
        println!(
            "earlier keys stay published as verifying keys; running servers switch at their next reload"
        );
        Ok(ExitCode::SUCCESS)
    })
}
