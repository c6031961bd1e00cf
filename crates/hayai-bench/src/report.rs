//! Leaderboard and score-evolution chart over a results directory (`results/*/`).
//!
//! Each run directory contributes one entry built from whichever of `summary.json`,
//! `ppl_summary.json`, `verify.json` and `run_environment.json` it holds (directories with none of
//! them are not runs and are ignored; a present but malformed file is an error). TPS comes from
//! `summary.json` (`tps`), or from `verify.json` (median public TPS) for verify-only runs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::util;

/// One run in the leaderboard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportEntry {
    pub run: String,
    pub timestamp: Option<String>,
    pub unix_time: Option<f64>,
    pub model: Option<String>,
    pub tps: Option<f64>,
    pub ppl: Option<f64>,
    pub completed: Option<u64>,
    pub failed: Option<u64>,
    pub verdict: Option<String>,
}

/// Options of [`run_report`].
#[derive(Debug, Clone, Serialize)]
pub struct ReportOptions {
    pub results_root: PathBuf,
    /// Where to write the markdown leaderboard (not written when `None`).
    pub markdown_out: Option<PathBuf>,
    /// Where to write the SVG chart (not written when `None`).
    pub svg_out: Option<PathBuf>,
}

/// What [`run_report`] returns.
#[derive(Debug, Clone)]
pub struct Report {
    /// Sorted by TPS, best first (runs without TPS last).
    pub entries: Vec<ReportEntry>,
    pub markdown: String,
    pub svg: String,
}

impl Report {
    /// Print the markdown leaderboard to stdout.
    pub fn print(&self) {
        print!("{}", self.markdown);
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = util::read_to_string(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Results {
            path: path.to_path_buf(),
            msg: format!("not JSON: {e}"),
        })
}

fn f(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

fn s(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

/// Build the entry for one run directory; `None` when it holds no result files.
pub fn read_run(dir: &Path) -> Result<Option<ReportEntry>> {
    let summary = read_json(&dir.join("summary.json"))?;
    let ppl = read_json(&dir.join("ppl_summary.json"))?;
    let verify = read_json(&dir.join("verify.json"))?;
    let env = read_json(&dir.join("run_environment.json"))?;
    if summary.is_none() && ppl.is_none() && verify.is_none() {
        return Ok(None);
    }
    let run = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let docs = [&summary, &verify, &ppl, &env];
    let first_str = |k: &str| docs.iter().filter_map(|d| d.as_ref()).find_map(|d| s(d, k));
    let first_f = |k: &str| docs.iter().filter_map(|d| d.as_ref()).find_map(|d| f(d, k));
    let tps = summary.as_ref().and_then(|v| f(v, "tps")).or_else(|| {
        verify
            .as_ref()
            .and_then(|v| v.pointer("/public/median_tps"))
            .and_then(Value::as_f64)
    });
    let ppl_value = ppl
        .as_ref()
        .and_then(|v| f(v, "ppl"))
        .or_else(|| verify.as_ref().and_then(|v| f(v, "ppl")));
    let (completed, failed) = match &summary {
        Some(v) => (
            v.get("completed").and_then(Value::as_u64),
            v.get("failed").and_then(Value::as_u64),
        ),
        None => (None, None),
    };
    Ok(Some(ReportEntry {
        run,
        timestamp: first_str("timestamp"),
        unix_time: first_f("unix_time"),
        model: first_str("model"),
        tps,
        ppl: ppl_value,
        completed,
        failed,
        verdict: verify.as_ref().and_then(|v| s(v, "verdict")),
    }))
}

/// Read every run under `root` (sorted by TPS, best first).
pub fn scan_results(root: &Path) -> Result<Vec<ReportEntry>> {
    let rd = std::fs::read_dir(root).map_err(|e| Error::io(root, e))?;
    let mut dirs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut entries = Vec::new();
    for d in dirs {
        if let Some(e) = read_run(&d)? {
            entries.push(e);
        }
    }
    sort_by_tps(&mut entries);
    Ok(entries)
}

/// Best TPS first; runs without a TPS last; ties by run name.
pub fn sort_by_tps(entries: &mut [ReportEntry]) {
    entries.sort_by(|a, b| match (a.tps, b.tps) {
        (Some(x), Some(y)) => y.total_cmp(&x).then_with(|| a.run.cmp(&b.run)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.run.cmp(&b.run),
    });
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The markdown leaderboard, rows in the order given.
pub fn render_markdown(entries: &[ReportEntry]) -> String {
    let mut o = String::from("# hayai results\n\n");
    o.push_str("| # | run | date | model | TPS | PPL | completed | verdict |\n");
    o.push_str("|---:|---|---|---|---:|---:|---:|---|\n");
    for (i, e) in entries.iter().enumerate() {
        let date = e
            .timestamp
            .as_deref()
            .map(|t| t.replace('T', " ").trim_end_matches('Z').to_string())
            .unwrap_or_else(|| "-".into());
        let completed = match (e.completed, e.failed) {
            (Some(c), Some(f)) if f > 0 => format!("{c} ({f} failed)"),
            (Some(c), _) => c.to_string(),
            _ => "-".into(),
        };
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            i + 1,
            md_cell(&e.run),
            md_cell(&date),
            md_cell(e.model.as_deref().unwrap_or("-")),
            e.tps.map_or("-".into(), |v| format!("{v:.2}")),
            e.ppl.map_or("-".into(), |v| format!("{v:.4}")),
            completed,
            md_cell(e.verdict.as_deref().unwrap_or("-")),
        ));
    }
    if entries.is_empty() {
        o.push_str("\n_No runs found._\n");
    }
    o
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum and tick step covering `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// Score evolution: TPS over time, one point per run (runs with both a TPS and a time), hand-written
/// SVG. Points are joined in time order; a dashed line tracks the best score so far.
pub fn render_svg(entries: &[ReportEntry]) -> String {
    const W: f64 = 860.0;
    const H: f64 = 420.0;
    const L: f64 = 70.0;
    const R: f64 = 30.0;
    const T: f64 = 40.0;
    const B: f64 = 70.0;
    let mut pts: Vec<(f64, f64, &ReportEntry)> = entries
        .iter()
        .filter_map(|e| Some((e.unix_time?, e.tps?, e)))
        .filter(|(t, v, _)| t.is_finite() && v.is_finite())
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.2.run.cmp(&b.2.run)));
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">hayai score evolution (output TPS)</text>\n",
        W / 2.0
    );
    if pts.is_empty() {
        o.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no runs with a TPS yet</text>\n</svg>\n",
            W / 2.0,
            H / 2.0
        ));
        return o;
    }
    let (t0, t1) = (pts[0].0, pts[pts.len() - 1].0);
    let (t0, t1) = if t1 - t0 < 1.0 {
        (t0 - 3600.0, t1 + 3600.0)
    } else {
        (t0, t1)
    };
    let vmax = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let (ymax, step) = nice_axis(vmax * 1.05);
    let x = |t: f64| L + (t - t0) / (t1 - t0) * (W - L - R);
    let y = |v: f64| H - B - v / ymax * (H - T - B);
    // Axes and horizontal grid.
    let mut v = 0.0;
    while v <= ymax + step * 1e-9 {
        o.push_str(&format!(
            "<line x1=\"{L}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4}</text>\n",
            y(v),
            W - R,
            L - 6.0,
            y(v) + 4.0,
            if step < 1.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.0}")
            }
        ));
        v += step;
    }
    o.push_str(&format!(
        "<line x1=\"{L}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/>\n\
         <line x1=\"{L}\" y1=\"{T}\" x2=\"{L}\" y2=\"{0}\" stroke=\"black\"/>\n\
         <text x=\"16\" y=\"{2}\" transform=\"rotate(-90 16 {2})\" text-anchor=\"middle\">TPS</text>\n",
        H - B,
        W - R,
        (T + H - B) / 2.0
    ));
    // Time labels at both ends (and the middle when the span allows).
    let mut labels = vec![t0, t1];
    if pts.len() > 2 {
        labels.insert(1, (t0 + t1) / 2.0);
    }
    for t in labels {
        let stamp = util::rfc3339_utc(t);
        o.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            x(t),
            H - B + 18.0,
            xml_escape(&stamp[..16].replace('T', " "))
        ));
    }
    o.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">run time (UTC)</text>\n",
        (L + W - R) / 2.0,
        H - 20.0
    ));
    // Best-so-far step line.
    let mut best = f64::MIN;
    let mut best_path = Vec::new();
    for (t, v, _) in &pts {
        if *v > best {
            if best > f64::MIN {
                best_path.push(format!("{:.1},{:.1}", x(*t), y(best)));
            }
            best = *v;
        }
        best_path.push(format!("{:.1},{:.1}", x(*t), y(best)));
    }
    o.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#2a9d3a\" stroke-dasharray=\"5,4\"/>\n",
        best_path.join(" ")
    ));
    let line: Vec<String> = pts
        .iter()
        .map(|(t, v, _)| format!("{:.1},{:.1}", x(*t), y(*v)))
        .collect();
    o.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"1.5\"/>\n",
        line.join(" ")
    ));
    for (t, v, e) in &pts {
        let colour = match e.verdict.as_deref() {
            Some("INVALID") => "#d62728",
            _ => "#1f5fbf",
        };
        o.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{colour}\"><title>{}: {:.2} TPS{}</title></circle>\n",
            x(*t),
            y(*v),
            xml_escape(&e.run),
            v,
            e.ppl.map_or(String::new(), |p| format!(", PPL {p:.4}"))
        ));
    }
    o.push_str("</svg>\n");
    o
}

/// Scan, render, and write the requested files.
pub fn run_report(opts: &ReportOptions) -> Result<Report> {
    let entries = scan_results(&opts.results_root)?;
    let markdown = render_markdown(&entries);
    let svg = render_svg(&entries);
    if let Some(p) = &opts.markdown_out {
        write_text(p, &markdown)?;
    }
    if let Some(p) = &opts.svg_out {
        write_text(p, &svg)?;
    }
    Ok(Report {
        entries,
        markdown,
        svg,
    })
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(dir: &Path, run: &str, file: &str, v: Value) {
        let d = dir.join(run);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(file), v.to_string()).unwrap();
    }

    #[test]
    fn scans_and_renders_a_results_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        put(
            root,
            "slow",
            "summary.json",
            json!({"tps": 50.5, "model": "m1", "completed": 128, "failed": 0,
            "timestamp": "2026-11-01T10:00:00Z", "unix_time": 1_793_527_200.0}),
        );
        put(
            root,
            "slow",
            "ppl_summary.json",
            json!({"ppl": 2.3456, "model": "m1"}),
        );
        put(
            root,
            "fast",
            "summary.json",
            json!({"tps": 120.25, "model": "m|2", "completed": 127, "failed": 1,
            "timestamp": "2026-11-02T10:00:00Z", "unix_time": 1_793_613_600.0}),
        );
        put(
            root,
            "verified",
            "verify.json",
            json!({"verdict": "INVALID", "ppl": 2.5,
            "public": {"median_tps": 99.0}, "model": "m1", "timestamp": "2026-11-03T10:00:00Z",
            "unix_time": 1_793_700_000.0}),
        );
        put(
            root,
            "pplonly",
            "ppl_summary.json",
            json!({"ppl": 3.0, "model": "m3"}),
        );
        std::fs::create_dir_all(root.join("not-a-run")).unwrap();

        let out_md = root.join("out/leaderboard.md");
        let out_svg = root.join("out/evolution.svg");
        let rep = run_report(&ReportOptions {
            results_root: root.to_path_buf(),
            markdown_out: Some(out_md.clone()),
            svg_out: Some(out_svg.clone()),
        })
        .unwrap();
        let runs: Vec<&str> = rep.entries.iter().map(|e| e.run.as_str()).collect();
        assert_eq!(runs, ["fast", "verified", "slow", "pplonly"]);
        let md = std::fs::read_to_string(out_md).unwrap();
        let rows: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| #"))
            .collect();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            rows[0],
            "| 1 | fast | 2026-11-02 10:00:00 | m\\|2 | 120.25 | - | 127 (1 failed) | - |"
        );
        assert!(
            rows[1].contains("| 99.00 | 2.5000 | - | INVALID |"),
            "{}",
            rows[1]
        );
        assert!(rows[2].contains("| slow |") && rows[2].contains("| 2.3456 |"));
        assert!(rows[3].starts_with("| 4 | pplonly |"));
        let svg = std::fs::read_to_string(out_svg).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 3); // pplonly has no TPS/time
        assert!(svg.contains("<title>fast: 120.25 TPS</title>"));
        assert!(svg.contains("fill=\"#d62728\"")); // the INVALID run
        assert_eq!(svg.matches("<svg").count(), svg.matches("</svg>").count());
    }

    #[test]
    fn malformed_result_file_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("bad");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("summary.json"), "{oops").unwrap();
        let e = scan_results(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("summary.json"), "{e}");
    }

    #[test]
    fn svg_handles_empty_and_single_points() {
        assert!(render_svg(&[]).contains("no runs with a TPS"));
        let one = ReportEntry {
            run: "a<b".into(),
            timestamp: None,
            unix_time: Some(1.0e9),
            model: None,
            tps: Some(7.0),
            ppl: None,
            completed: None,
            failed: None,
            verdict: None,
        };
        let svg = render_svg(&[one]);
        assert!(svg.contains("a&lt;b: 7.00 TPS"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert_eq!(nice_axis(7.35), (8.0, 2.0));
        assert_eq!(nice_axis(523.0), (600.0, 200.0));
        assert!(render_markdown(&[]).contains("No runs found"));
    }
}
