//! A network namespace per server, joined to the host by two veth pairs:
//! one carries the server's traffic to PostgreSQL (the link the faults are
//! injected on, with `tc netem`), the other the clients' requests to the
//! server (never faulted, so a client always hears what the server says).
//! Faults are root qdiscs on both ends of the database link: `netem`
//! delay and loss where the kernel has it (a slow, congested token bucket
//! where it does not), and a FIFO that holds no packet for a silent cut.
//!
//! Needs root (`ip netns`, `ip link`, `tc`); without them the test skips.
//! Names and addresses are derived from the process id and a tag, so
//! parallel tests do not collide; dropping the value deletes the namespace
//! and with it both pairs.

use std::process::{Command, Output};

use super::cluster::Skip;

/// The qdisc of a silent cut.
const CUT: &[&str] = &["pfifo", "limit", "0"];

pub(super) struct Netns {
    name: String,
    /// Host end of the database link.
    db_host_dev: String,
    /// Namespace end of the database link.
    db_ns_dev: String,
    /// The host's address on the database link: where PostgreSQL is
    /// reached from inside the namespace.
    pub(super) db_host_addr: String,
    /// The namespace's address on the client link: where the server
    /// listens.
    pub(super) listen_addr: String,
    /// Whether `tc netem` is available.
    netem: bool,
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn must(program: &str, args: &[&str]) {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Netns {
    /// A namespace for server number `tag` (0 to 99), its loopback up and
    /// both links configured.
    pub(super) fn create(tag: u32) -> Result<Self, Skip> {
        let pid = std::process::id();
        let name = format!("wpgf{pid}n{tag}");
        let add = Command::new("ip").args(["netns", "add", &name]).output();
        match add {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "skipped: cannot create a network namespace (`ip netns add`, needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => return Err(format!("skipped: cannot run `ip`: {e}")),
        }
        // From here on, dropping `ns` deletes the namespace.
        let octet2 = 100 + pid % 100;
        let short = pid % 100_000;
        let link = |kind: char| {
            (
                format!("wf{short}{tag}{kind}h"),
                format!("wf{short}{tag}{kind}n"),
            )
        };
        let (db_host_dev, db_ns_dev) = link('d');
        let (cl_host_dev, cl_ns_dev) = link('c');
        let subnet = |k: u32| format!("10.{octet2}.{}", tag * 2 + k);
        let mut ns = Self {
            netem: false,
            db_host_addr: format!("{}.1", subnet(0)),
            listen_addr: format!("{}.2", subnet(1)),
            name,
            db_host_dev,
            db_ns_dev,
        };
        ns.exec_must("ip", &["link", "set", "lo", "up"]);
        for (k, host_dev, ns_dev) in [
            (0, &ns.db_host_dev, &ns.db_ns_dev),
            (1, &cl_host_dev, &cl_ns_dev),
        ] {
            must(
                "ip",
                &[
                    "link", "add", host_dev, "type", "veth", "peer", "name", ns_dev, "netns",
                    &ns.name,
                ],
            );
            must(
                "ip",
                &[
                    "addr",
                    "add",
                    &format!("{}.1/30", subnet(k)),
                    "dev",
                    host_dev,
                ],
            );
            must("ip", &["link", "set", host_dev, "up"]);
            ns.exec_must(
                "ip",
                &["addr", "add", &format!("{}.2/30", subnet(k)), "dev", ns_dev],
            );
            ns.exec_must("ip", &["link", "set", ns_dev, "up"]);
        }
        // netem may be missing (a kernel without `sch_netem`): find out now.
        ns.netem = run(
            "tc",
            &[
                "qdisc",
                "replace",
                "dev",
                &ns.db_host_dev,
                "root",
                "netem",
                "delay",
                "0ms",
            ],
        )
        .status
        .success();
        let mut specs = ns.degradations();
        specs.push(CUT.to_vec());
        for spec in specs {
            let mut args = vec!["qdisc", "replace", "dev", &ns.db_host_dev, "root"];
            args.extend_from_slice(&spec);
            let probe = run("tc", &args);
            if !probe.status.success() {
                return Err(format!(
                    "skipped: the qdisc `{}` is unavailable: {}",
                    spec.join(" "),
                    String::from_utf8_lossy(&probe.stderr).trim()
                ));
            }
        }
        ns.clear();
        Ok(ns)
    }

    /// `ip netns exec NAME program`: a command run inside the namespace
    /// (`ip` execs it in place, so the child's pid is the program's).
    pub(super) fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    fn exec_must(&self, program: &str, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        must("ip", &all);
    }

    /// The degraded links the tests run through, each as the `tc` qdisc
    /// spec applied to both directions: with netem, a 20 ms delay each
    /// way, then 5% loss each way; without it (the kernel lacks
    /// `sch_netem`), a slow link (token bucket at 512 kbit/s), then a
    /// slower one whose small queue drops what overflows it.
    pub(super) fn degradations(&self) -> Vec<Vec<&'static str>> {
        if self.netem {
            vec![vec!["netem", "delay", "20ms"], vec!["netem", "loss", "5%"]]
        } else {
            vec![
                vec!["tbf", "rate", "512kbit", "burst", "4kb", "latency", "200ms"],
                vec!["tbf", "rate", "256kbit", "burst", "1600", "limit", "6000"],
            ]
        }
    }

    /// Apply the qdisc `spec` to both directions of the database link,
    /// replacing what was there.
    pub(super) fn degrade(&self, spec: &[&str]) {
        let mut host = vec!["qdisc", "replace", "dev", &self.db_host_dev, "root"];
        host.extend_from_slice(spec);
        must("tc", &host);
        let mut inner = vec!["qdisc", "replace", "dev", &self.db_ns_dev, "root"];
        inner.extend_from_slice(spec);
        self.exec_must("tc", &inner);
    }

    /// Cut the database link silently: every packet either way is dropped
    /// (a FIFO that holds none), as by a partition; nothing tells either
    /// end.
    pub(super) fn cut(&self) {
        self.degrade(CUT);
    }

    /// Remove every injected fault from the database link.
    pub(super) fn clear(&self) {
        let _ = run("tc", &["qdisc", "del", "dev", &self.db_host_dev, "root"]);
        let _ = run(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "tc",
                "qdisc",
                "del",
                "dev",
                &self.db_ns_dev,
                "root",
            ],
        );
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys its veth ends, and with them the
        // host ends.
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}
