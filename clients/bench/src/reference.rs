//! The transformers reference: `hf_reference.py` run as a subprocess with a
//! JSON spec (prompts, output length, threads), answering one JSON line.
//! Also locates the Python interpreter and the bench's Python scripts.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::process::Command;

/// What `hf_reference.py` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfResult {
    pub mode: String,
    pub tok_per_s: f64,
    pub seconds: f64,
    pub runs: Vec<f64>,
    pub batch: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub threads: usize,
    pub device: String,
    pub dtype: String,
    pub attn_implementation: Option<String>,
    pub torch: String,
    pub transformers: String,
}

/// Where the Python side lives.
#[derive(Debug, Clone, Serialize)]
pub struct Python {
    pub interpreter: PathBuf,
    pub scripts: PathBuf,
}

impl Python {
    /// `interpreter`, else `.venv/bin/python` in the working directory, else
    /// `~/.cache/gyre/venv/bin/python`, else `python3`. `scripts`, else
    /// `clients/bench` in the working directory, else this crate's source
    /// directory.
    pub fn locate(interpreter: Option<PathBuf>, scripts: Option<PathBuf>) -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let interpreter = interpreter.unwrap_or_else(|| {
            [
                PathBuf::from(".venv/bin/python"),
                home.join(".cache/gyre/venv/bin/python"),
            ]
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("python3"))
        });
        let scripts = scripts.unwrap_or_else(|| {
            let here = PathBuf::from("clients/bench");
            if here.join("hf_reference.py").exists() {
                here
            } else {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            }
        });
        Self {
            interpreter,
            scripts,
        }
    }

    /// Runs `script` with `args`; returns its stdout, failing with the tail
    /// of its stderr.
    pub async fn run(&self, script: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
        let path = self.scripts.join(script);
        let mut command = Command::new(&self.interpreter);
        for var in crate::llama_server::OPENMP_WAITS {
            command.env_remove(var);
        }
        let output = command
            .arg(&path)
            .args(args)
            .env("HF_HUB_OFFLINE", "1")
            .env("TOKENIZERS_PARALLELISM", "false")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| {
                format!("running {} {}", self.interpreter.display(), path.display())
            })?;
        if !output.status.success() {
            let err = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = err.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("{script} failed ({}):\n{}", output.status, tail.join("\n"));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Builds the bench model into `out` (a no-op when it is up to date).
    pub async fn make_model(&self, out: &Path, preset: &str) -> anyhow::Result<String> {
        let stdout = self
            .run(
                "make_bench_model.py",
                &[
                    "--out".as_ref(),
                    out.as_os_str(),
                    "--preset".as_ref(),
                    preset.as_ref(),
                ],
            )
            .await?;
        Ok(stdout.trim().to_owned())
    }
}

/// One reference measurement.
pub struct HfSpec<'a> {
    pub model: &'a Path,
    pub prompts: &'a [Vec<u32>],
    pub new_tokens: u32,
    pub threads: usize,
    pub repeats: usize,
    /// "generate" or "ttft".
    pub mode: &'a str,
    pub device: &'a str,
    /// Where to write the spec file.
    pub scratch: &'a Path,
}

/// Runs `hf_reference.py` on `spec`.
pub async fn run_hf(python: &Python, spec: HfSpec<'_>) -> anyhow::Result<HfResult> {
    let input = json!({
        "prompts": spec.prompts,
        "new_tokens": spec.new_tokens,
        "threads": spec.threads,
        "repeats": spec.repeats,
        "mode": spec.mode,
        "device": spec.device,
    });
    let file = spec.scratch.join(format!(
        "hf-{}-b{}-l{}.json",
        spec.mode,
        spec.prompts.len(),
        spec.new_tokens
    ));
    std::fs::write(&file, input.to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    let stdout = python
        .run(
            "hf_reference.py",
            &[
                "--model".as_ref(),
                spec.model.as_os_str(),
                "--input".as_ref(),
                file.as_os_str(),
            ],
        )
        .await?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("hf_reference.py printed no JSON")?;
    serde_json::from_str(line).with_context(|| format!("reading {line:.300}"))
}

/// One job of `hf_sweep.py`: `mode` on the first B of `prompts`, for each B
/// in `batches`.
pub struct HfJob<'a> {
    pub name: &'a str,
    /// "generate" or "ttft".
    pub mode: &'a str,
    pub prompts: &'a [Vec<u32>],
    pub batches: &'a [usize],
    pub new_tokens: u32,
}

/// One batch size of a job: its figure, or why there is none (e.g. out of
/// memory).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfPoint {
    pub batch: usize,
    pub result: Option<HfResult>,
    pub error: Option<String>,
}

/// One job's batch sizes, in the order asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfJobResult {
    pub name: String,
    pub mode: String,
    pub points: Vec<HfPoint>,
}

impl HfJobResult {
    /// The point of batch size `batch`.
    pub fn point(&self, batch: usize) -> Option<&HfPoint> {
        self.points.iter().find(|p| p.batch == batch)
    }
}

/// What `hf_sweep.py` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfSweep {
    pub load_seconds: f64,
    pub threads: usize,
    pub device: String,
    pub dtype: String,
    pub attn_implementation: Option<String>,
    pub torch: String,
    pub transformers: String,
    pub jobs: Vec<HfJobResult>,
}

impl HfSweep {
    /// The job called `name`.
    pub fn job(&self, name: &str) -> Option<&HfJobResult> {
        self.jobs.iter().find(|j| j.name == name)
    }
}

/// Runs `hf_sweep.py` on `jobs`: the model at `model` is loaded once, and
/// every batch size of every job gets one warm-up and `repeats` timed runs.
pub async fn run_hf_sweep(
    python: &Python,
    model: &Path,
    jobs: &[HfJob<'_>],
    threads: usize,
    repeats: usize,
    device: &str,
    scratch: &Path,
) -> anyhow::Result<HfSweep> {
    let jobs: Vec<_> = jobs
        .iter()
        .map(|j| {
            json!({
                "name": j.name,
                "mode": j.mode,
                "prompts": j.prompts,
                "batches": j.batches,
                "new_tokens": j.new_tokens,
            })
        })
        .collect();
    let names: Vec<&str> = jobs.iter().filter_map(|j| j["name"].as_str()).collect();
    let input = json!({
        "threads": threads,
        "repeats": repeats,
        "device": device,
        "jobs": jobs,
    });
    let file = scratch.join(format!("hf-sweep-{}.json", names.join("-")));
    std::fs::write(&file, input.to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    let stdout = python
        .run(
            "hf_sweep.py",
            &[
                "--model".as_ref(),
                model.as_os_str(),
                "--input".as_ref(),
                file.as_os_str(),
            ],
        )
        .await?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("hf_sweep.py printed no JSON")?;
    serde_json::from_str(line).with_context(|| format!("reading {line:.300}"))
}
