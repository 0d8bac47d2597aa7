//! `warden serve`: the HTTP governance service.
//!
//! Order of startup matters: the listener is bound *before* an operator
//! token is generated, so a taken port can never leave a generated token
//! stored but never shown.

use std::io::{ErrorKind, IsTerminal};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use tokio::net::TcpListener;
use tokio::sync::watch;
use warden::SystemClock;
use warden_server::{
    AppState, ConnectionLimits, OperatorTokenSource, ServerConfig, ensure_operator_token,
};

use crate::example::EXAMPLE_POLICY;

/// How long requests in flight get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARDEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Run the service until SIGTERM or SIGINT.
pub fn run(
    policy: Option<&Path>,
    database: &str,
    listen: &str,
    sync_interval: Duration,
    pg_writers: usize,
    audit_signing: &crate::checkpoint::AuditSigningArgs,
    limits: ConnectionLimits,
) -> anyhow::Result<ExitCode> {
    init_tracing();
    let audit_signing = audit_signing.load()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(
        policy,
        database,
        listen,
        sync_interval,
        pg_writers,
        audit_signing,
        limits,
    ))
}

async fn serve(
    policy: Option<&Path>,
    database: &str,
    listen: &str,
    sync_interval: Duration,
    pg_writers: usize,
    audit_signing: crate::checkpoint::AuditSigning,
    limits: ConnectionLimits,
) -> anyhow::Result<ExitCode> {
    let (text, origin) = match policy {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("reading `{}`", p.display()))?,
            format!("`{}`", p.display()),
        ),
        None => (EXAMPLE_POLICY.to_owned(), "the bundled example".to_owned()),
    };
    let policy = warden_core::bundle::compile(&text).map_err(|e| {
        let list: Vec<String> = e.issues.iter().map(ToString::to_string).collect();
        anyhow!("invalid policy bundle {origin}:\n  {}", list.join("\n  "))
    })?;
    let version = policy.version.clone();

    let listener = TcpListener::bind(listen).await.map_err(|e| match e.kind() {
        ErrorKind::AddrInUse => anyhow!(
            "cannot listen on `{listen}`: the address is already in use (is another warden running? choose another with `--listen`)"
        ),
        ErrorKind::PermissionDenied => {
            anyhow!("cannot listen on `{listen}`: permission denied (ports below 1024 need privileges)")
        }
        _ => anyhow!("cannot listen on `{listen}`: {e}"),
    })?;
    let addr = listener.local_addr().context("reading the bound address")?;

    let shown = crate::store::redact(database);
    // On PostgreSQL, subscribe to other servers' changes before the engine
    // loads the agents: a change committed after the load is then
    // delivered (one committed before is applied again, harmlessly).
    let (store, feed) = if warden_postgres::is_postgres_url(database) {
        let options = warden_postgres::PgOptions {
            listen_heartbeat: sync_interval,
            writers: pg_writers,
            ..warden_postgres::PgOptions::default()
        };
        let pg = crate::store::open_postgres(database, options).await?;
        let changes = pg
            .subscribe()
            .await
            .with_context(|| format!("subscribing to changes in `{shown}`"))?;
        (
            crate::store::AnyStore::Postgres(pg.clone()),
            Some((pg, changes)),
        )
    } else {
        (crate::store::open(database).await?, None)
    };
    let state = AppState::open(
        policy,
        store,
        Arc::new(SystemClock),
        ServerConfig::default(),
    )
    .await
    .with_context(|| format!("opening the engine over `{shown}`"))?;
    // The stored envelope keys are read again every sync interval, so a
    // `warden keys rotate` reaches this server within one interval.
    tokio::spawn(reload_envelope_keys(state.clone(), sync_interval));
    if let Some((pg, changes)) = feed {
        tokio::spawn(crate::sync::follow(
            pg,
            changes,
            state.engine().clone(),
            sync_interval,
        ));
    }
    let env_token = std::env::var("WARDEN_OPERATOR_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let source = ensure_operator_token(&state, env_token.as_deref())
        .await
        .context("setting up the operator token")?;

    println!("policy: `{version}` from {origin}");
    println!("database: {shown}");
    match source {
        OperatorTokenSource::Environment => {
            println!("operator token: from WARDEN_OPERATOR_TOKEN");
        }
        OperatorTokenSource::Generated(token) => {
            println!(
                "operator token: generated on first start; shown once, only its hash is stored:"
            );
            println!("  {token}");
        }
        OperatorTokenSource::Existing => println!(
            "operator token: the one generated on an earlier start (only its hash is stored; set WARDEN_OPERATOR_TOKEN to use your own)"
        ),
    }
    let audit_task = crate::checkpoint::AuditTask::spawn(state.engine().clone(), audit_signing);
    let signals = ShutdownSignals::install()?;
    println!("listening on http://{addr}");
    tracing::info!(%addr, policy = %version, database = %shown, "serving");

    let (stop_tx, mut stop_rx) = watch::channel(false);
    let shutdown = async move {
        signals.recv().await;
        tracing::info!("shutting down: finishing requests in flight");
        let _ = stop_tx.send(true);
    };
    let server = warden_server::serve_with(listener, state, limits, shutdown);
    let forced = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = server => result.context("serving")?,
        () = forced => {
            tracing::warn!("requests still open after {} s; exiting anyway", SHUTDOWN_GRACE.as_secs());
        }
    }
    audit_task.finish().await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Reload the stored envelope keys every `interval` (nothing to do when the
/// key comes from the environment).
async fn reload_envelope_keys<S: warden_store::Store>(state: AppState<S>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match state.reload_envelope_keys().await {
            Ok(true) => {
                let signer = state.signer();
                tracing::info!(issuer = %signer.issuer(), "envelope signing key rotated");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "reloading the envelope signing keys failed"),
        }
    }
}

/// SIGINT (Ctrl-C) and SIGTERM, caught from the moment this is built: it is
/// built before the address is printed, so a signal sent as soon as a
/// client sees the server (a supervisor, a test) is never handled by the
/// default action (exit without draining).
struct ShutdownSignals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                terminate: signal(SignalKind::terminate()).context("catching SIGTERM")?,
                interrupt: signal(SignalKind::interrupt()).context("catching SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves on the first signal.
    async fn recv(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
