//! `gyre bench ...`: the load generator's entry point. Runs the `gyre-bench`
//! binary built beside this one with the same arguments, and exits with its
//! status (on Unix it replaces this process).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

/// The arguments, passed through untouched (`gyre bench --help` is
/// gyre-bench's help).
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// gyre-bench's arguments (`gyre bench --help` shows them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<OsString>,
}

const NAME: &str = "gyre-bench";

/// `gyre-bench` beside the running binary.
fn bench_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("gyre bench: cannot tell where gyre is: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("gyre bench: {} has no directory", exe.display()))?;
    let bench = dir.join(format!("{NAME}{}", std::env::consts::EXE_SUFFIX));
    if !bench.is_file() {
        anyhow::bail!(
            "gyre bench: {} not found (it is built beside gyre): build it with `cargo build --release --workspace --bins` or `make build`",
            bench.display()
        );
    }
    Ok(bench)
}

/// `gyre bench` as the first argument: runs gyre-bench with the rest, before
/// anything else (the arguments are gyre-bench's, never gyre's). Returns
/// when it is not.
pub fn exec_if_first() {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == "bench") {
        exit_with(args.collect());
    }
}

/// Runs gyre-bench with `args` and exits with its status (1, with the
/// reason on stderr, when it cannot be run).
pub fn exit_with(args: Vec<OsString>) -> ! {
    let code = match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// Runs gyre-bench with `args`; its exit status (Unix: does not return
/// unless it cannot be started).
fn run(args: Vec<OsString>) -> anyhow::Result<i32> {
    let bench = bench_binary()?;
    let mut cmd = std::process::Command::new(&bench);
    cmd.args(args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        cmd.arg0(NAME);
        let err = cmd.exec();
        anyhow::bail!("gyre bench: cannot run {}: {err}", bench.display());
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .map_err(|e| anyhow::anyhow!("gyre bench: cannot run {}: {e}", bench.display()))?;
        Ok(status.code().unwrap_or(1))
    }
}
