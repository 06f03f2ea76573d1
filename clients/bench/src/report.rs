//! The results: one row per compared figure (scenario, metric, gyre,
//! reference, ratio, target, met?), printed as a table and written as JSON
//! together with each scenario's details.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;

/// Whether a row meets its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Met {
    Yes,
    No,
    /// No target, or the figure could not be measured.
    NA,
    /// Within noise of the target: can neither be claimed nor refuted.
    Noisy,
}

impl Met {
    pub fn from(ok: bool) -> Self {
        if ok { Met::Yes } else { Met::No }
    }

    fn label(self) -> &'static str {
        match self {
            Met::Yes => "yes",
            Met::No => "NO",
            Met::NA => "n/a",
            Met::Noisy => "noisy",
        }
    }
}

/// One compared figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub metric: String,
    pub gyre: String,
    pub reference: String,
    /// The compared value (a ratio, or a delta in the unit the metric names).
    pub ratio: Option<f64>,
    pub target: String,
    pub met: Met,
}

impl Row {
    pub fn new(scenario: &str, metric: &str) -> Self {
        Self {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            gyre: "-".into(),
            reference: "-".into(),
            ratio: None,
            target: "-".into(),
            met: Met::NA,
        }
    }

    pub fn gyre(mut self, v: impl Into<String>) -> Self {
        self.gyre = v.into();
        self
    }

    pub fn reference(mut self, v: impl Into<String>) -> Self {
        self.reference = v.into();
        self
    }

    /// Sets the compared value, its target text and whether it is met.
    pub fn compare(mut self, value: f64, target: &str, met: bool) -> Self {
        self.ratio = Some(value);
        self.target = target.to_owned();
        self.met = if value.is_finite() {
            Met::from(met)
        } else {
            Met::NA
        };
        self
    }

    /// Like [`Row::compare`] for "value <= limit" with a standard error:
    /// met or not only when the value is 2 standard errors clear of it.
    pub fn at_most(mut self, value: f64, sem: f64, limit: f64, target: &str) -> Self {
        self = self.compare(value, target, value <= limit);
        if self.met != Met::NA && (value - limit).abs() < 2.0 * sem {
            self.met = Met::Noisy;
        }
        self
    }

    /// A value shown without a target.
    pub fn value(mut self, value: f64) -> Self {
        self.ratio = Some(value);
        self
    }

    pub fn target(mut self, target: &str) -> Self {
        self.target = target.to_owned();
        self
    }
}

/// The result of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub id: String,
    pub title: String,
    pub rows: Vec<Row>,
    pub details: Value,
    pub error: Option<String>,
    pub seconds: f64,
}

/// The table of every row, aligned.
pub fn table(results: &[ScenarioResult]) -> String {
    let header = [
        "scenario",
        "metric",
        "gyre",
        "reference",
        "ratio/delta",
        "target",
        "met?",
    ];
    let mut rows: Vec<[String; 7]> = Vec::new();
    for r in results {
        if let Some(e) = &r.error {
            let first = e.lines().next().unwrap_or_default();
            rows.push([
                r.id.clone(),
                format!("FAILED: {first:.90}"),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                Met::NA.label().into(),
            ]);
        }
        for row in &r.rows {
            rows.push([
                row.scenario.clone(),
                row.metric.clone(),
                row.gyre.clone(),
                row.reference.clone(),
                row.ratio.map_or("-".into(), fmt_value),
                row.target.clone(),
                row.met.label().into(),
            ]);
        }
    }
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "| {} |", padded.join(" | "));
    };
    line(&mut out, &header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    let _ = writeln!(out, "|-{}-|", rule.join("-|-"));
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cells);
    }
    out
}

/// A ratio or delta with sensible precision.
pub fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Writes `report` as pretty JSON to `path`.
pub fn write_json(path: &Path, report: &Value) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// The command line, quoted for a POSIX shell.
pub fn command_line() -> String {
    std::env::args()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@+%".contains(c));
            if plain {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_and_flags() {
        let result = ScenarioResult {
            id: "S1".into(),
            title: "t".into(),
            rows: vec![
                Row::new("S1", "output tok/s")
                    .gyre("120.5")
                    .reference("100.0")
                    .compare(1.205, ">= 1.0", true),
            ],
            details: Value::Null,
            error: None,
            seconds: 0.0,
        };
        let failed = ScenarioResult {
            id: "S5".into(),
            error: Some("boom\nmore".into()),
            rows: vec![],
            ..result.clone()
        };
        let t = table(&[result, failed]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
        assert!(lines[2].contains("1.205") && lines[2].contains("yes"));
        assert!(lines[3].contains("FAILED: boom") && lines[3].contains("n/a"));
    }

    #[test]
    fn noisy_deltas_are_not_claimed() {
        let row = |v, sem| Row::new("S4", "d").at_most(v, sem, 50.0, "<= 50").met;
        assert_eq!(row(10.0, 5.0), Met::Yes);
        assert_eq!(row(500.0, 10.0), Met::No);
        assert_eq!(row(-1363.0, 1758.0), Met::Noisy);
        assert_eq!(row(f64::NAN, 1.0), Met::NA);
    }
}
