//! Logging set-up shared by `gyre` and `gyre-shim`: human-readable lines on
//! stderr, coloured only when stderr is a terminal (and `NO_COLOR` is
//! unset), plain text in files and pipes, or one JSON object a line with
//! `--log-format json`. `RUST_LOG` filters (default `info`).

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object a line (`timestamp`, `level`, `target`, `fields`).
    Json,
}

/// Whether text logs get ANSI colours: only on a terminal, never with
/// `NO_COLOR` set.
pub fn colour(stderr_is_terminal: bool, no_color: bool) -> bool {
    stderr_is_terminal && !no_color
}

/// Installs the global subscriber (call once, first thing after parsing the
/// command line).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty()),
            ))
            .init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, false));
        assert!(!colour(false, false));
        assert!(!colour(true, true));
    }
}
