//! Prometheus metrics, written in the text exposition format by hand.
//!
//! - `warden_decisions_total{operation, verdict, reason}`: every decision
//!   appended to the audit log (counted by [`Metered`](crate::Metered) as
//!   the store appends it, so the counts match the log). `reason` is the
//!   code without its parameter (`visible_from`, not
//!   `visible_from:report_manager`) so agent names never become labels.
//! - `warden_http_requests_total{method, route, status}`.
//! - `warden_http_request_duration_seconds{method, route}`: a histogram.
//!
//! `route` is the matched route template (`/v1/memory/{namespace}/{key}`),
//! or `unmatched`, so label cardinality is bounded by the route table.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_core::audit::AuditDraft;
use warden_core::decision::Verdict;

/// Upper bounds of the latency histogram's buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// verdict index: allow, constrain, deny, escalate.
fn verdict_index(v: Verdict) -> usize {
    match v {
        Verdict::Allow => 0,
        Verdict::Constrain => 1,
        Verdict::Deny => 2,
        Verdict::Escalate => 3,
    }
}

const VERDICTS: [&str; 4] = ["allow", "constrain", "deny", "escalate"];

type DecisionCounts = HashMap<String, HashMap<String, [u64; 4]>>;
/// (method, route) -> (status -> count, latency).
type RequestStats = HashMap<(String, String), (HashMap<u16, u64>, Histogram)>;

/// The server's metrics registry.
#[derive(Debug, Default)]
pub struct Metrics {
    /// operation -> reason kind -> count per verdict.
    decisions: Mutex<DecisionCounts>,
    requests: Mutex<RequestStats>,
    /// Requests being handled now.
    in_flight: AtomicI64,
    /// More metrics rendered after these (the MCP gateway's counters).
    sources: Mutex<Vec<Source>>,
}

/// A renderer of more metrics in the text format.
#[derive(Clone)]
struct Source(Arc<dyn Fn() -> String + Send + Sync>);

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Source")
    }
}

/// Counts a request as in flight until dropped (also when the client goes
/// away and the handler is cancelled).
#[derive(Debug)]
pub struct InFlight<'m>(&'m Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Count a request as in flight until the guard is dropped.
    pub fn start_request(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Requests being handled now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Count the decisions in `drafts`.
    pub fn observe_drafts(&self, drafts: &[AuditDraft]) {
        if drafts.is_empty() {
            return;
        }
        let Ok(mut map) = self.decisions.lock() else {
            return;
        };
        for d in drafts {
            let kind = d.reason.split(':').next().unwrap_or("");
            let by_reason = match map.get_mut(d.operation.as_str()) {
                Some(m) => m,
                None => map.entry(d.operation.clone()).or_default(),
            };
            let counts = match by_reason.get_mut(kind) {
                Some(c) => c,
                None => by_reason.entry(kind.to_owned()).or_default(),
            };
            if let Some(c) = counts.get_mut(verdict_index(d.verdict)) {
                *c += 1;
            }
        }
    }

    /// Record one HTTP request.
    pub fn observe_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let Ok(mut map) = self.requests.lock() else {
            return;
        };
        let entry = match map.get_mut(&(method.to_owned(), route.to_owned())) {
            Some(e) => e,
            None => map
                .entry((method.to_owned(), route.to_owned()))
                .or_default(),
        };
        *entry.0.entry(status).or_default() += 1;
        let secs = elapsed.as_secs_f64();
        let h = &mut entry.1;
        h.count += 1;
        h.sum += secs;
        for (bound, slot) in LATENCY_BUCKETS.iter().zip(h.buckets.iter_mut()) {
            if secs <= *bound {
                *slot += 1;
            }
        }
    }

    /// How many decisions with this operation, verdict and reason kind were
    /// counted.
    pub fn decision_count(&self, operation: &str, verdict: Verdict, reason: &str) -> u64 {
        self.decisions
            .lock()
            .ok()
            .and_then(|m| {
                m.get(operation)
                    .and_then(|r| r.get(reason))
                    .and_then(|c| c.get(verdict_index(verdict)).copied())
            })
            .unwrap_or(0)
    }

    /// Render `source`'s metrics after these, in every [`Metrics::render`].
    pub fn add_source(&self, source: Arc<dyn Fn() -> String + Send + Sync>) {
        if let Ok(mut s) = self.sources.lock() {
            s.push(Source(source));
        }
    }

    /// The registry in the Prometheus text exposition format (0.0.4).
    pub fn render(&self) -> String {
        let mut out = self.render_own();
        let sources = self.sources.lock().map(|s| s.clone()).unwrap_or_default();
        for s in sources {
            out.push_str(&(s.0)());
        }
        out
    }

    fn render_own(&self) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP warden_decisions_total Governance decisions appended to the audit log.\n",
        );
        out.push_str("# TYPE warden_decisions_total counter\n");
        if let Ok(map) = self.decisions.lock() {
            let mut rows: Vec<(&String, &String, usize, u64)> = Vec::new();
            for (op, by_reason) in map.iter() {
                for (reason, counts) in by_reason {
                    for (i, n) in counts.iter().enumerate() {
                        if *n > 0 {
                            rows.push((op, reason, i, *n));
                        }
                    }
                }
            }
            rows.sort();
            for (op, reason, i, n) in rows {
                let _ = writeln!(
                    out,
                    "warden_decisions_total{{operation=\"{}\",verdict=\"{}\",reason=\"{}\"}} {n}",
                    escape(op),
                    VERDICTS.get(i).copied().unwrap_or("unknown"),
                    escape(reason)
                );
            }
        }
        out.push_str("# HELP warden_http_requests_in_flight Requests being handled now.\n");
        out.push_str("# TYPE warden_http_requests_in_flight gauge\n");
        let _ = writeln!(out, "warden_http_requests_in_flight {}", self.in_flight());
        let Ok(map) = self.requests.lock() else {
            return out;
        };
        let mut keys: Vec<&(String, String)> = map.keys().collect();
        keys.sort();
        out.push_str("# HELP warden_http_requests_total HTTP requests answered, by status.\n");
        out.push_str("# TYPE warden_http_requests_total counter\n");
        for key in &keys {
            let Some((statuses, _)) = map.get(*key) else {
                continue;
            };
            let mut st: Vec<_> = statuses.iter().collect();
            st.sort();
            for (status, n) in st {
                let _ = writeln!(
                    out,
                    "warden_http_requests_total{{method=\"{}\",route=\"{}\",status=\"{status}\"}} {n}",
                    escape(&key.0),
                    escape(&key.1)
                );
            }
        }
        out.push_str(
            "# HELP warden_http_request_duration_seconds Time from request to response head.\n",
        );
        out.push_str("# TYPE warden_http_request_duration_seconds histogram\n");
        for key in &keys {
            let Some((_, h)) = map.get(*key) else {
                continue;
            };
            let labels = format!("method=\"{}\",route=\"{}\"", escape(&key.0), escape(&key.1));
            for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets.iter()) {
                let _ = writeln!(
                    out,
                    "warden_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "warden_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "warden_http_request_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "warden_http_request_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        out
    }
}

/// Escape a label value: backslash, double quote and newline.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_core::time::Timestamp;

    fn draft(op: &str, verdict: Verdict, reason: &str) -> AuditDraft {
        AuditDraft {
            time: Timestamp(0),
            subject: "a".into(),
            operation: op.into(),
            resource: "r".into(),
            verdict,
            reason: reason.into(),
            policy_version: "v".into(),
            details: serde_json::Value::Null,
        }
    }

    #[test]
    fn counts_decisions_by_reason_kind_and_renders_text_format() {
        let m = Metrics::new();
        m.observe_drafts(&[
            draft("memory.read", Verdict::Allow, "visible_from:report_manager"),
            draft("memory.read", Verdict::Allow, "visible_from:researcher"),
            draft("memory.read", Verdict::Deny, "record_not_found"),
        ]);
        m.observe_request("GET", "/healthz", 200, Duration::from_micros(300));
        assert_eq!(
            m.decision_count("memory.read", Verdict::Allow, "visible_from"),
            2
        );
        let text = m.render();
        assert!(text.contains(
            "warden_decisions_total{operation=\"memory.read\",verdict=\"allow\",reason=\"visible_from\"} 2"
        ));
        assert!(text.contains(
            "warden_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.0005\"} 1"
        ));
        assert!(text.contains(
            "warden_http_request_duration_seconds_bucket{method=\"GET\",route=\"/healthz\",le=\"0.00025\"} 0"
        ));
        assert!(text.contains(
            "warden_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 1"
        ));
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\n");
    }
}
