//! Starting llama.cpp's `llama-server` for L1: on a GGUF file, on a free
//! port (port 0; the address is read from the `listening on http://ADDR`
//! line it logs once the model is loaded), its log copied to a file. Killed
//! when dropped.
//!
//! It runs as the issue's comparison asks: `slots` parallel sequences with
//! continuous batching, no prompt cache (neither the per-slot reuse nor the
//! RAM cache), no web UI, `threads` threads for decoding and for prompts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// A running `llama-server`.
pub struct LlamaServer {
    child: Child,
    pub http_addr: SocketAddr,
    pub log: PathBuf,
}

/// The OpenMP settings of how idle threads wait, which the references
/// (llama-server here, transformers in `reference.rs`) do not inherit
/// from the bench's environment: they run with OpenMP's defaults, as
/// their users run them.
pub(crate) const OPENMP_WAITS: [&str; 3] = ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"];

/// How to start it.
pub struct LlamaOptions<'a> {
    pub bin: &'a Path,
    pub model: &'a Path,
    pub threads: usize,
    /// Parallel sequences (`-np`).
    pub slots: usize,
    /// Context of each slot, in tokens (`-c` is this times `slots`).
    pub slot_context: usize,
    pub log: PathBuf,
    /// More arguments, after these.
    pub extra_args: &'a [String],
}

impl LlamaOptions<'_> {
    /// The command-line arguments after the binary.
    pub fn args(&self) -> Vec<String> {
        let threads = self.threads.max(1).to_string();
        let mut args: Vec<String> = vec!["--model".into(), self.model.display().to_string()];
        for (flag, value) in [
            ("--host", "127.0.0.1".to_owned()),
            ("--port", "0".to_owned()),
            ("--parallel", self.slots.to_string()),
            ("--ctx-size", (self.slots * self.slot_context).to_string()),
            ("--threads", threads.clone()),
            ("--threads-batch", threads),
            ("--cache-ram", "0".to_owned()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        args.extend(["--cont-batching", "--no-cache-prompt", "--no-webui"].map(String::from));
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

impl LlamaServer {
    pub async fn start(opts: LlamaOptions<'_>) -> anyhow::Result<Self> {
        let mut log = tokio::fs::File::create(&opts.log)
            .await
            .with_context(|| format!("creating {}", opts.log.display()))?;
        let mut command = Command::new(opts.bin);
        command.args(opts.args());
        // llama.cpp's OpenMP threads meet at every op's barrier; told to
        // sleep there (`OMP_WAIT_POLICY=PASSIVE`, which gyre itself runs
        // with and a shell may have exported), it decoded a quarter as
        // fast.
        for var in OPENMP_WAITS {
            command.env_remove(var);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", opts.bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let wait = async {
            loop {
                let Some(line) = lines.next_line().await? else {
                    bail!("llama-server exited before listening");
                };
                log.write_all(format!("{line}\n").as_bytes()).await?;
                if let Some(addr) = listening_addr(&line) {
                    return anyhow::Ok(addr);
                }
            }
        };
        let addr = match tokio::time::timeout(Duration::from_secs(300), wait).await {
            Ok(Ok(addr)) => addr,
            failed => {
                let why = match failed {
                    Err(_) => "timed out waiting for llama-server to listen".to_owned(),
                    Ok(Err(e)) => format!("{e:#}"),
                    Ok(Ok(_)) => unreachable!(),
                };
                let _ = child.start_kill();
                let tail = std::fs::read_to_string(&opts.log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!("{why}; log {}:\n{}", opts.log.display(), tail.join("\n"));
            }
        };
        // Keep copying the log so the server never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if log.write_all(format!("{line}\n").as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            http_addr: addr,
            log: opts.log,
        })
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The address of a `... listening on http://HOST:PORT` log line.
fn listening_addr(line: &str) -> Option<SocketAddr> {
    let addr = line.split("listening on http://").nth(1)?;
    addr.split_whitespace()
        .next()?
        .trim_end_matches('/')
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_listening_line() {
        let line = "main: server is listening on http://127.0.0.1:41235";
        assert_eq!(
            listening_addr(line),
            Some("127.0.0.1:41235".parse().expect("addr"))
        );
        let line = "srv  main: listening on http://127.0.0.1:8080\r";
        assert_eq!(listening_addr(line).map(|a| a.port()), Some(8080));
        assert_eq!(listening_addr("load_model: loading"), None);
        assert_eq!(listening_addr("listening on http://[::1"), None);
    }

    #[test]
    fn asks_for_slots_without_prompt_cache() {
        let opts = LlamaOptions {
            bin: Path::new("llama-server"),
            model: Path::new("/m.gguf"),
            threads: 2,
            slots: 16,
            slot_context: 256,
            log: PathBuf::from("/tmp/l.log"),
            extra_args: &["--threads".into(), "1".into()],
        };
        let args = opts.args().join(" ");
        assert!(args.starts_with("--model /m.gguf --host 127.0.0.1 --port 0"));
        assert!(args.ends_with("--no-webui --threads 1"), "{args}");
        for want in [
            "--parallel 16",
            "--ctx-size 4096",
            "--threads 2 --threads-batch 2",
            "--cache-ram 0",
            "--cont-batching",
            "--no-cache-prompt",
        ] {
            assert!(args.contains(want), "{want} in {args}");
        }
    }
}
