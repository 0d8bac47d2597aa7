//! Aggregation over runs, the Markdown tables and the SVG plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::timing::{Stats, median};

/// One timed cell and engine in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Scenario key (`s1`…).
    pub scenario: String,
    /// Depth.
    pub depth: usize,
    /// `hot` / `churn`.
    pub mode: String,
    /// Number of agents in the hierarchy.
    pub agents: usize,
    /// Run index.
    pub run: usize,
    /// The statistics.
    pub stats: Stats,
}

/// One cell and engine over all runs.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Row {
    /// Scenario key.
    pub scenario: String,
    /// Depth.
    pub depth: usize,
    /// Mode.
    pub mode: String,
    /// Agents.
    pub agents: usize,
    /// Engine label.
    pub engine: String,
    /// Median over runs of the run medians, ns per decision (per SOP for S4).
    pub median_ns: f64,
    /// Median over runs of the run p99s.
    pub p99_ns: f64,
    /// Each run's median.
    pub run_medians: Vec<f64>,
    /// Spread of the run medians: (max - min) / median, percent.
    pub spread_pct: f64,
    /// Decisions per timed batch (last run).
    pub batch: usize,
    /// Samples per run (last run).
    pub samples: usize,
}

type Key = (String, usize, String, usize, String);

/// Fold the per-run samples into rows (in first-seen order).
pub fn aggregate(samples: &[Sample]) -> Vec<Row> {
    let mut order: Vec<Key> = Vec::new();
    let mut groups: BTreeMap<Key, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        let k = (
            s.scenario.clone(),
            s.depth,
            s.mode.clone(),
            s.agents,
            s.stats.engine.clone(),
        );
        if !groups.contains_key(&k) {
            order.push(k.clone());
        }
        groups.entry(k).or_default().push(s);
    }
    order
        .into_iter()
        .filter_map(|k| {
            let g = groups.get(&k)?;
            let meds: Vec<f64> = g.iter().map(|s| s.stats.median_ns).collect();
            let p99s: Vec<f64> = g.iter().map(|s| s.stats.p99_ns).collect();
            let m = median(&meds);
            let lo = meds.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = meds.iter().copied().fold(0.0, f64::max);
            let last = g.last()?;
            Some(Row {
                scenario: k.0,
                depth: k.1,
                mode: k.2,
                agents: k.3,
                engine: k.4,
                median_ns: m,
                p99_ns: median(&p99s),
                run_medians: meds,
                spread_pct: if m > 0.0 { 100.0 * (hi - lo) / m } else { 0.0 },
                batch: last.stats.batch,
                samples: last.stats.samples,
            })
        })
        .collect()
}

/// Human-friendly duration.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "–".into()
    } else if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "–".into()
    } else if r >= 100.0 {
        format!("{r:.0}×")
    } else if r >= 10.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.2}×")
    }
}

fn scenario_name(key: &str) -> &'static str {
    match key {
        "s1" => "S1 inherit",
        "s2" => "S2 intersect",
        "s3" => "S3 resolve",
        "s4" => "S4 preflight (per 50-step SOP)",
        _ => "?",
    }
}

/// The comparison table: one row per scenario, depth, mode and engine, with
/// the ratio to Warden (other ÷ Warden: how many times faster Warden is).
pub fn comparison_table(rows: &[Row], agents: usize) -> String {
    let mut out = String::new();
    out.push_str(
        "| scenario | mode | depth | engine | median | p99 | run spread | other ÷ Warden |\n",
    );
    out.push_str("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
    for r in rows.iter().filter(|r| r.agents == agents) {
        let warden = rows
            .iter()
            .find(|w| {
                w.engine == "warden"
                    && w.scenario == r.scenario
                    && w.depth == r.depth
                    && w.mode == r.mode
                    && w.agents == r.agents
            })
            .map_or(f64::NAN, |w| w.median_ns);
        let ratio = if r.engine == "warden" {
            "1".to_owned()
        } else {
            fmt_ratio(r.median_ns / warden)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.0}% | {} |",
            scenario_name(&r.scenario),
            r.mode,
            r.depth,
            r.engine,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            r.spread_pct,
            ratio
        );
    }
    out
}

/// Best (lowest-median) row among engines whose label starts with `prefix`.
pub fn best<'r>(
    rows: &'r [Row],
    scenario: &str,
    depth: usize,
    mode: &str,
    agents: usize,
    prefix: &str,
) -> Option<&'r Row> {
    rows.iter()
        .filter(|r| {
            r.scenario == scenario
                && r.depth == depth
                && r.mode == mode
                && r.agents == agents
                && r.engine.starts_with(prefix)
        })
        .min_by(|a, b| a.median_ns.total_cmp(&b.median_ns))
}

/// Lowest-median row of a cell among engines `pick` accepts.
fn best_by<'r>(
    rows: &'r [Row],
    scenario: &str,
    depth: usize,
    mode: &str,
    agents: usize,
    pick: impl Fn(&str) -> bool,
) -> Option<&'r Row> {
    rows.iter()
        .filter(|r| {
            r.scenario == scenario
                && r.depth == depth
                && r.mode == mode
                && r.agents == agents
                && pick(&r.engine)
        })
        .min_by(|a, b| a.median_ns.total_cmp(&b.median_ns))
}

fn is_fair_cedar(e: &str) -> bool {
    e.starts_with("cedar-1p")
}

fn is_vm(e: &str) -> bool {
    e.starts_with("rego-vm")
}

/// Warden against each other engine per cell: today's forms (the best of
/// `cedar` / `cedar-walk`, of `rego-reach` / `rego-closure` on the
/// interpreter) and the fairest (`cedar-1p`, `rego-vm`).
pub fn summary_table(rows: &[Row], agents: usize) -> String {
    let mut out = String::new();
    out.push_str("| scenario | mode | depth | Warden | Cedar (today's best form) | ÷ Warden | fairest Cedar (cedar-1p) | ÷ Warden | Rego interpreter (best) | ÷ Warden | Rego VM (rego-vm) | ÷ Warden |\n");
    out.push_str(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut cells: Vec<(String, String, usize)> = Vec::new();
    for r in rows.iter().filter(|r| r.agents == agents) {
        let c = (r.scenario.clone(), r.mode.clone(), r.depth);
        if !cells.contains(&c) {
            cells.push(c);
        }
    }
    cells.sort_by(|a, b| (&a.0, a.1 != "hot", a.2).cmp(&(&b.0, b.1 != "hot", b.2)));
    for (s, m, d) in cells {
        let w = best_by(rows, &s, d, &m, agents, |e: &str| e == "warden");
        let wm = w.map_or(f64::NAN, |r| r.median_ns);
        let picks: [&dyn Fn(&str) -> bool; 4] = [
            &|e: &str| e.starts_with("cedar") && !is_fair_cedar(e),
            &is_fair_cedar,
            &|e: &str| e.starts_with("rego") && !is_vm(e),
            &is_vm,
        ];
        let mut line = format!("| {} | {m} | {d} | {} |", scenario_name(&s), fmt_ns(wm));
        for pick in picks {
            let r = best_by(rows, &s, d, &m, agents, pick);
            let cell = r.map_or("–".into(), |r| {
                format!("{} ({})", fmt_ns(r.median_ns), r.engine)
            });
            let ratio = fmt_ratio(r.map_or(f64::NAN, |r| r.median_ns) / wm);
            let _ = write!(line, " {cell} | {ratio} |");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The random-agent table: per scenario and engine, the median at each
/// size, the growth from the small to the large hierarchy, and the ratio to
/// Warden at each size.
pub fn scale_table(rows: &[Row], small: usize, large: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | engine | {small} agents | p99 | {large} agents | p99 | {large} ÷ {small} | ÷ Warden at {small} | ÷ Warden at {large} |"
    );
    out.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.scenario.clone(), r.engine.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let find = |s: &str, e: &str, n: usize| {
        rows.iter()
            .find(|r| r.scenario == s && r.engine == e && r.agents == n)
    };
    for (s, e) in keys {
        let a = find(&s, &e, small);
        let b = find(&s, &e, large);
        let wa = find(&s, "warden", small).map_or(f64::NAN, |r| r.median_ns);
        let wb = find(&s, "warden", large).map_or(f64::NAN, |r| r.median_ns);
        let m = |r: Option<&Row>| r.map_or(f64::NAN, |r| r.median_ns);
        let p = |r: Option<&Row>| r.map_or(f64::NAN, |r| r.p99_ns);
        let (ra, rb) = if e == "warden" {
            ("1".to_owned(), "1".to_owned())
        } else {
            (fmt_ratio(m(a) / wa), fmt_ratio(m(b) / wb))
        };
        let _ = writeln!(
            out,
            "| {} | {e} | {} | {} | {} | {} | {} | {ra} | {rb} |",
            scenario_name(&s),
            fmt_ns(m(a)),
            fmt_ns(p(a)),
            fmt_ns(m(b)),
            fmt_ns(p(b)),
            fmt_ratio(m(b) / m(a)),
        );
    }
    out
}

/// A plain table of rows with the ratio of each to `base`'s median.
pub fn plain_table(rows: &[Row], base: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | engine | median | p99 | run spread | ÷ {base} |"
    );
    out.push_str("| --- | --- | ---: | ---: | ---: | ---: |\n");
    for r in rows {
        let b = rows
            .iter()
            .find(|x| x.engine == base && x.scenario == r.scenario)
            .map_or(f64::NAN, |x| x.median_ns);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0}% | {} |",
            r.scenario.to_uppercase(),
            r.engine,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            r.spread_pct,
            fmt_ratio(r.median_ns / b)
        );
    }
    out
}

const COLORS: [(&str, &str); 12] = [
    ("warden", "#d62728"),
    ("cedar-1p", "#08306b"),
    ("cedar-1p (slice)", "#08306b"),
    ("rego-vm", "#8c564b"),
    ("cedar", "#1f77b4"),
    ("cedar (add)", "#1f77b4"),
    ("cedar (slice)", "#17becf"),
    ("cedar-walk", "#9467bd"),
    ("cedar-walk (add)", "#9467bd"),
    ("cedar-walk (slice)", "#c5b0d5"),
    ("rego-reach", "#2ca02c"),
    ("rego-closure", "#ff7f0e"),
];

fn color(engine: &str) -> &'static str {
    COLORS
        .iter()
        .find(|(e, _)| *e == engine)
        .map_or("#7f7f7f", |(_, c)| c)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Latency against depth, one panel per scenario and mode, log scale,
/// one line per engine (hand-written SVG, no plotting dependency).
pub fn svg(rows: &[Row], agents: usize, title: &str) -> String {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.agents == agents).collect();
    let mut depths: Vec<usize> = rows.iter().map(|r| r.depth).collect();
    depths.sort_unstable();
    depths.dedup();
    let panels: Vec<(&str, &str)> = ["hot", "churn"]
        .iter()
        .flat_map(|m| ["s1", "s2", "s3", "s4"].into_iter().map(move |s| (s, *m)))
        .collect();
    let ticks: Vec<(f64, String)> = depths.iter().map(|d| (*d as f64, d.to_string())).collect();
    let dmax = depths.last().copied().unwrap_or(64) as f64;
    plot(
        &rows,
        title,
        &|r: &Row| r.depth as f64,
        (0.0, dmax),
        &ticks,
        "depth",
        &panels,
    )
}

/// Latency against the number of agents (log scale), one panel per
/// scenario, one line per engine.
pub fn agents_svg(rows: &[Row], title: &str) -> String {
    let rows: Vec<&Row> = rows.iter().collect();
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.agents).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let lx = |n: usize| (n.max(1) as f64).log10();
    let ticks: Vec<(f64, String)> = sizes.iter().map(|n| (lx(*n), n.to_string())).collect();
    let lo = sizes.first().map_or(3.0, |n| lx(*n));
    let hi = sizes.last().map_or(6.0, |n| lx(*n));
    let mode = rows.first().map_or("random", |r| r.mode.as_str());
    let panels: Vec<(&str, &str)> = ["s1", "s2", "s3", "s4"]
        .into_iter()
        .map(|s| (s, mode))
        .collect();
    plot(
        &rows,
        title,
        &|r: &Row| lx(r.agents),
        (lo - 0.3, hi + 0.3),
        &ticks,
        "agents (log scale)",
        &panels,
    )
}

fn plot(
    rows: &[&Row],
    title: &str,
    xof: &dyn Fn(&Row) -> f64,
    (dmin, dmax): (f64, f64),
    ticks: &[(f64, String)],
    xlabel: &str,
    panels: &[(&str, &str)],
) -> String {
    let (pw, ph) = (330.0, 230.0);
    let (ml, mr, mt, mb) = (58.0, 12.0, 28.0, 36.0);
    let cols = 4;
    let nrows = panels.len().div_ceil(cols) as f64;
    let legend_h = 40.0;
    let width = cols as f64 * pw;
    let height = 30.0 + nrows * ph + legend_h;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    let mut engines_seen: Vec<String> = Vec::new();
    for (i, (s, m)) in panels.iter().enumerate() {
        let x0 = (i % cols) as f64 * pw;
        let y0 = 30.0 + (i / cols) as f64 * ph;
        let pr: Vec<&&Row> = rows
            .iter()
            .filter(|r| r.scenario == *s && r.mode == *m)
            .collect();
        if pr.is_empty() {
            continue;
        }
        let lo = pr
            .iter()
            .map(|r| r.median_ns)
            .fold(f64::INFINITY, f64::min)
            .max(1.0);
        let hi = pr.iter().map(|r| r.median_ns).fold(1.0, f64::max);
        let (llo, lhi) = (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        );
        let (ix0, ix1) = (x0 + ml, x0 + pw - mr);
        let (iy0, iy1) = (y0 + mt, y0 + ph - mb);
        let sx = |d: f64| ix0 + (d - dmin) / (dmax - dmin) * (ix1 - ix0);
        let sy = |ns: f64| iy1 - (ns.max(1.0).log10() - llo) / (lhi - llo) * (iy1 - iy0);
        let _ = writeln!(
            o,
            r##"<rect x="{ix0}" y="{iy0}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
            ix1 - ix0,
            iy1 - iy0
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">{} — {m}</text>"#,
            (ix0 + ix1) / 2.0,
            y0 + 18.0,
            esc(scenario_name(s))
        );
        let mut e = llo as i32;
        while e as f64 <= lhi {
            let y = sy(10f64.powi(e));
            let label = fmt_ns(10f64.powi(e));
            let _ = writeln!(
                o,
                r##"<line x1="{ix0}" y1="{y}" x2="{ix1}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
                ix0 - 4.0,
                y + 4.0
            );
            e += 1;
        }
        for (tx, d) in ticks {
            let x = sx(*tx);
            let _ = writeln!(
                o,
                r##"<line x1="{x}" y1="{iy1}" x2="{x}" y2="{}" stroke="#999"/><text x="{x}" y="{}" text-anchor="middle">{d}</text>"##,
                iy1 + 4.0,
                iy1 + 16.0
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">{xlabel}</text>"#,
            (ix0 + ix1) / 2.0,
            iy1 + 30.0
        );
        let mut engines: Vec<&str> = pr.iter().map(|r| r.engine.as_str()).collect();
        engines.dedup();
        let mut uniq: Vec<&str> = Vec::new();
        for e in engines {
            if !uniq.contains(&e) {
                uniq.push(e);
            }
        }
        for eng in uniq {
            if !engines_seen.iter().any(|x| x == eng) {
                engines_seen.push(eng.to_owned());
            }
            let mut pts: Vec<(f64, f64)> = pr
                .iter()
                .filter(|r| r.engine == eng)
                .map(|r| (sx(xof(r)), sy(r.median_ns)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let c = color(eng);
            let dash = if eng.contains("slice") {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for (x, y) in pts {
                let _ = writeln!(o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{c}"/>"#);
            }
        }
    }
    let ly = 30.0 + nrows * ph + 14.0;
    let mut lx = 20.0;
    for eng in engines_seen {
        let c = color(&eng);
        let dash = if eng.contains("slice") {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 18.0,
            lx + 22.0,
            ly + 4.0,
            esc(&eng)
        );
        lx += 30.0 + 7.0 * eng.len() as f64;
    }
    o.push_str("</svg>\n");
    o
}
