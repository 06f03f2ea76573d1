//! Starting the server under test: `gyre serve --model DIR` on free ports
//! (port 0), its addresses read from the `... listening on http://ADDR`
//! lines it prints, its log kept in a file. Killed when dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running `gyre serve`.
pub struct Server {
    child: Child,
    pub grpc_url: String,
    pub http_addr: SocketAddr,
    pub log: PathBuf,
}

/// How to start it.
pub struct ServerOptions<'a> {
    pub bin: &'a Path,
    pub model: &'a Path,
    pub device: &'a str,
    /// libtorch intra-op threads (`OMP_NUM_THREADS`); 0 leaves the default.
    pub threads: usize,
    pub log: PathBuf,
    pub extra_args: &'a [String],
}

impl Server {
    pub async fn start(opts: ServerOptions<'_>) -> anyhow::Result<Self> {
        let log = std::fs::File::create(&opts.log)
            .with_context(|| format!("creating {}", opts.log.display()))?;
        let mut command = Command::new(opts.bin);
        command
            .arg("serve")
            .arg("--model")
            .arg(opts.model)
            .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
            .args(["--device", opts.device])
            .args(opts.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        if opts.threads > 0 {
            command.env("OMP_NUM_THREADS", opts.threads.to_string());
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", opts.bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let (mut grpc, mut http) = (None, None);
        let wait = async {
            while grpc.is_none() || http.is_none() {
                let Some(line) = lines.next_line().await? else {
                    bail!("gyre exited before listening");
                };
                if let Some(addr) = line.split("listening on http://").nth(1) {
                    let addr: SocketAddr = addr.trim().parse()?;
                    if line.contains("gRPC") {
                        grpc = Some(addr);
                    } else if line.contains("HTTP") {
                        http = Some(addr);
                    }
                }
            }
            anyhow::Ok(())
        };
        let waited = tokio::time::timeout(Duration::from_secs(600), wait).await;
        let failed = match waited {
            Err(_) => Some("timed out waiting for gyre to listen".to_owned()),
            Ok(Err(e)) => Some(format!("{e:#}")),
            Ok(Ok(())) => None,
        };
        if let Some(why) = failed {
            let _ = child.start_kill();
            let tail = std::fs::read_to_string(&opts.log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("{why}; log {}:\n{}", opts.log.display(), tail.join("\n"));
        }
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (Some(grpc), Some(http_addr)) = (grpc, http) else {
            bail!("gyre did not print both addresses");
        };
        Ok(Self {
            child,
            grpc_url: format!("http://{grpc}"),
            http_addr,
            log: opts.log,
        })
    }

    /// CPU time (user + system, every thread) the process has used so far,
    /// from `/proc/<pid>/stat`; None where that cannot be read.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        Some(stat_ticks(&stat)? as f64 / 100.0)
    }

    /// CPU time of each of the process's threads whose name starts with
    /// `prefix` (e.g. `tokio-` for the async and blocking workers that carry
    /// requests, not the engine's compute threads), by thread id, in
    /// seconds: from `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on the
    /// CPU), else from the thread's `stat` (clock ticks, 10 ms). None where
    /// neither can be read. [`ThreadCpu::since`] gives the time used between
    /// two readings.
    pub fn thread_cpu(&self, prefix: &str) -> Option<ThreadCpu> {
        let pid = self.child.id()?;
        let mut threads = HashMap::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let dir = task.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let schedstat = std::fs::read_to_string(dir.join("schedstat")).ok();
            let seconds = schedstat
                .as_deref()
                .and_then(schedstat_ns)
                .map(|ns| ns as f64 / 1e9)
                .or_else(|| {
                    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                    Some(stat_ticks(&stat)? as f64 / 100.0)
                });
            if let Some(seconds) = seconds {
                threads.insert(tid, seconds);
            }
        }
        Some(ThreadCpu(threads))
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// CPU time of a set of threads, by thread id (seconds).
#[derive(Debug, Clone, Default)]
pub struct ThreadCpu(HashMap<u32, f64>);

impl ThreadCpu {
    /// Seconds the threads used since `earlier`: each thread's growth, a
    /// thread new since then counted whole. (A thread that exited in
    /// between is not counted: its time went with it.)
    pub fn since(&self, earlier: &ThreadCpu) -> f64 {
        self.0
            .iter()
            .map(|(tid, now)| now - earlier.0.get(tid).copied().unwrap_or(0.0).min(*now))
            .sum()
    }
}

/// The time on the CPU of a `/proc/.../schedstat` line (its first field,
/// nanoseconds).
fn schedstat_ns(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

/// utime + stime of a `/proc/.../stat` line, in clock ticks (USER_HZ: 100
/// on every Linux architecture gyre builds for).
fn stat_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_time_is_each_threads_growth() {
        let before = ThreadCpu(HashMap::from([(1, 2.0), (2, 5.0), (3, 1.0)]));
        // 1 grew by 0.5, 2 by 0.25, 3 exited, 4 is new with 0.125.
        let after = ThreadCpu(HashMap::from([(1, 2.5), (2, 5.25), (4, 0.125)]));
        assert!((after.since(&before) - 0.875).abs() < 1e-12);
        assert_eq!(schedstat_ns("254258860 328138957 86\n"), Some(254_258_860));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn this_process_threads_can_be_read() {
        // The test's own threads: schedstat or stat parses for them.
        let pid = std::process::id();
        let dir = format!("/proc/{pid}/task/{pid}");
        let schedstat = std::fs::read_to_string(format!("{dir}/schedstat")).ok();
        let stat = std::fs::read_to_string(format!("{dir}/stat")).expect("stat");
        assert!(
            schedstat.as_deref().and_then(schedstat_ns).is_some() || stat_ticks(&stat).is_some()
        );
    }
}
