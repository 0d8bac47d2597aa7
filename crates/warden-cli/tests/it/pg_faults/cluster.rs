//! A throwaway PostgreSQL cluster: `initdb` into a temporary directory,
//! `pg_ctl` on a free port, stopped and started again by the tests, and
//! stopped (`-m immediate`) and removed when dropped. The machine's own
//! server is never touched.
//!
//! The binaries are looked up in `WARDEN_TEST_PG_BIN` (a directory), then
//! on `PATH`, then in `/usr/lib/postgresql/*/bin`; run as root, the cluster
//! belongs to the `postgres` user (`initdb` refuses root) and the commands
//! run through `runuser`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Why there is no cluster: printed by the test as its skip message.
pub(super) type Skip = String;

pub(super) struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    as_postgres: bool,
    /// The TCP port it listens on.
    pub(super) port: u16,
}

fn find_bin() -> Option<PathBuf> {
    let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("WARDEN_TEST_PG_BIN") {
        let dir = PathBuf::from(dir);
        return has_both(&dir).then_some(dir);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(d) = on_path.into_iter().find(|d| has_both(d)) {
        return Some(d);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| has_both(d))
        .collect();
    versions.sort();
    versions.pop()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Cluster {
    /// A new cluster listening on `listen_addresses` (e.g. `127.0.0.1`, or
    /// `*` to be reachable from network namespaces), trusting every
    /// connection (it exists only for this test), started.
    pub(super) fn start(listen_addresses: &str) -> Result<Self, Skip> {
        let bin = find_bin().ok_or_else(|| {
            "skipped: no PostgreSQL server binaries (initdb, pg_ctl) found in WARDEN_TEST_PG_BIN, on PATH or in /usr/lib/postgresql/*/bin".to_owned()
        })?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("warden-pgfault-")
            .tempdir()
            .unwrap();
        if as_postgres {
            let chown = Command::new("chown")
                .args(["postgres:"])
                .arg(dir.path())
                .output()
                .map_err(|e| format!("skipped: cannot run chown: {e}"))?;
            if !chown.status.success() {
                return Err(format!(
                    "skipped: running as root and there is no `postgres` user to own a throwaway cluster: {}",
                    String::from_utf8_lossy(&chown.stderr).trim()
                ));
            }
        }
        let cluster = Self {
            bin,
            dir,
            as_postgres,
            port: free_port(),
        };
        let data = cluster.data();
        let init = cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        if !init.status.success() {
            return Err(format!(
                "skipped: initdb failed: {}",
                String::from_utf8_lossy(&init.stderr).trim()
            ));
        }
        // The faults are process and network faults, not power loss: the
        // operating system's page cache survives them, so `fsync` is off to
        // keep the test light; `synchronous_commit` stays `on`, so a commit
        // is acknowledged only once its WAL is written.
        let conf = format!(
            "listen_addresses = '{listen_addresses}'\nport = {}\nunix_socket_directories = '{}'\n\
             fsync = off\nmax_connections = 100\nlog_min_messages = warning\n",
            cluster.port,
            cluster.dir.path().display()
        );
        append(&data.join("postgresql.conf"), &conf);
        append(&data.join("pg_hba.conf"), "host all all 0.0.0.0/0 trust\n");
        cluster.start_again();
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.args(args).output().unwrap()
    }

    /// `postgres://postgres@HOST:PORT/postgres` with `params` appended as
    /// the query string.
    pub(super) fn url(&self, host: &str, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "?" };
        format!(
            "postgres://postgres@{host}:{}/postgres{sep}{params}",
            self.port
        )
    }

    /// `pg_ctl stop -m MODE` (`immediate`: every process killed at once,
    /// crash recovery on the next start; `fast`: sessions terminated, then a
    /// clean shutdown), waiting until it has stopped.
    pub(super) fn stop(&self, mode: &str) {
        let data = self.data();
        let out = self.run(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", mode, "-w", "stop"],
        );
        assert!(out.status.success(), "pg_ctl stop: {out:?}");
    }

    /// `pg_ctl start`, waiting until it accepts connections.
    pub(super) fn start_again(&self) {
        let data = self.data();
        let log = self.dir.path().join("postgres.log");
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {out:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}
