//! The `--config FILE` of `gyre serve` and `gyre grpc`: a TOML file whose
//! `[[models]]` tables list models (`gyre_service::registry::spec`), and
//! whose top-level keys set flags by their long name (`kv-cache-mib = 512`
//! or `kv_cache_mib = 512`, `open-endpoints = true`, `model = ["a", "b"]`).
//!
//! Precedence, per flag: the command line, then the flag's environment
//! variable, then the file, then the flag's default. It is decided with
//! clap's own record of where each value came from
//! ([`ArgMatches::value_source`]): the command line is parsed once; each key
//! of the file whose flag got no value from the command line or the
//! environment is then added to the command line as `--flag=value`, and the
//! whole is parsed again, so a file's value goes through the same value
//! parser, conflicts and requirements as the flag typed by hand.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Context as _;
use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, FromArgMatches};
use gyre_service::registry::spec::{self, ModelSpec};

/// The subcommands whose flags a config file sets.
const CONFIGURED: [&str; 2] = ["serve", "grpc"];

/// The key of the models list (not a flag).
const MODELS_KEY: &str = "models";

/// Flags a config file may not set.
const NOT_IN_FILE: [&str; 3] = ["config", "help", "version"];

/// Parses the process's command line with `cmd`, the config file's flags
/// merged in. Usage errors and `--help` exit as clap's own parse does; a
/// config file that cannot be used is an error.
pub fn parse<T: FromArgMatches>(cmd: Command) -> anyhow::Result<T> {
    let matches = matches_from(cmd, std::env::args_os().collect())?;
    Ok(T::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

/// [`parse`]'s matches for `argv` (its first item the program's name).
pub fn matches_from(mut cmd: Command, argv: Vec<OsString>) -> anyhow::Result<ArgMatches> {
    cmd.build();
    let first = cmd
        .clone()
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| e.exit());
    let Some((name, sub)) = first.subcommand() else {
        return Ok(first);
    };
    if !CONFIGURED.contains(&name) {
        return Ok(first);
    }
    let Some(path) = sub.get_one::<std::path::PathBuf>("config") else {
        return Ok(first);
    };
    let table = read_table(path)?;
    let extra = file_args(&cmd, name, sub, &table, &path.display().to_string())?;
    if extra.is_empty() {
        return Ok(first);
    }
    let set: Vec<String> = extra
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut full = argv;
    full.extend(extra);
    cmd.try_get_matches_from(full).map_err(|e| {
        anyhow::anyhow!(
            "{}\n(with what config file {} sets: {})",
            clap_message(&e),
            path.display(),
            set.join(" ")
        )
    })
}

/// The file as a TOML table.
fn read_table(path: &Path) -> anyhow::Result<toml::Table> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
    text.parse::<toml::Table>()
        .map_err(|e| anyhow::anyhow!("config file {}: {}", path.display(), e.message()))
}

/// The models of config file `path` (its `[[models]]` tables).
pub fn models(path: &Path) -> anyhow::Result<Vec<ModelSpec>> {
    let mut table = read_table(path)?;
    let shown = path.display().to_string();
    let Some(models) = table.remove(MODELS_KEY) else {
        if table.is_empty() {
            anyhow::bail!("--config {shown}: lists no [[models]] and sets no flag");
        }
        return Ok(Vec::new());
    };
    let mut only = toml::Table::new();
    only.insert(MODELS_KEY.to_owned(), models);
    let text = toml::to_string(&only).with_context(|| format!("config file {shown}"))?;
    Ok(spec::parse_config(&text, &shown)?)
}

/// The command-line arguments that the file's top-level keys add to
/// subcommand `name` (whose first parse is `sub`): `--flag=value` for each
/// key whose flag has no value from the command line or the environment.
/// Every key is checked, whether it is used or not.
fn file_args(
    cmd: &Command,
    name: &str,
    sub: &ArgMatches,
    table: &toml::Table,
    path: &str,
) -> anyhow::Result<Vec<OsString>> {
    let this = cmd
        .find_subcommand(name)
        .with_context(|| format!("no subcommand {name}"))?;
    let mut out = Vec::new();
    for (key, value) in table {
        if key == MODELS_KEY {
            continue;
        }
        let long = key.replace('_', "-");
        let Some(arg) = find_flag(this, &long) else {
            let elsewhere = CONFIGURED
                .iter()
                .filter(|&&other| other != name)
                .filter_map(|other| cmd.find_subcommand(other))
                .any(|other| find_flag(other, &long).is_some());
            if elsewhere {
                // The same file serves `gyre serve` and `gyre grpc`: a flag
                // of the other one is not an error.
                continue;
            }
            anyhow::bail!(
                "config file {path}: unknown key `{key}` (not a flag of `gyre serve` or `gyre grpc`; models go in [[models]] tables)"
            );
        };
        let id = arg.get_id().as_str();
        if NOT_IN_FILE.contains(&id) {
            anyhow::bail!("config file {path}: `{key}` cannot be set in a config file");
        }
        let flag = arg.get_long().unwrap_or(&long);
        let args = flag_args(arg, flag, value)
            .map_err(|m| anyhow::anyhow!("config file {path}: `{key}`: {m}"))?;
        if matches!(
            sub.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        out.extend(args);
    }
    Ok(out)
}

/// The flag of `cmd` whose long name (or alias) is `long`.
fn find_flag<'a>(cmd: &'a Command, long: &str) -> Option<&'a Arg> {
    cmd.get_arguments().find(|a| {
        a.get_long() == Some(long)
            || a.get_all_aliases()
                .is_some_and(|aliases| aliases.contains(&long))
    })
}

/// `value` as arguments of `--flag`, each checked by the flag's own value
/// parser; the message says what is wrong.
fn flag_args(arg: &Arg, flag: &str, value: &toml::Value) -> Result<Vec<OsString>, String> {
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => match value {
            toml::Value::Boolean(on) => {
                // The flag's presence means its action's value: `true` for
                // SetTrue. The other value is the default (no argument).
                let present = matches!(arg.get_action(), ArgAction::SetTrue) == *on;
                Ok(if present {
                    vec![format!("--{flag}").into()]
                } else {
                    Vec::new()
                })
            }
            other => Err(format!(
                "expected true or false, found {}",
                type_name(other)
            )),
        },
        ArgAction::Set => {
            let v = scalar(value)?;
            check(arg, flag, &v)?;
            Ok(vec![format!("--{flag}={v}").into()])
        }
        ArgAction::Append => {
            let items = match value {
                toml::Value::Array(items) => items.iter().map(scalar).collect::<Result<_, _>>()?,
                one => vec![scalar(one)?],
            };
            items
                .into_iter()
                .map(|v| {
                    check(arg, flag, &v)?;
                    Ok(format!("--{flag}={v}").into())
                })
                .collect()
        }
        _ => Err("this flag cannot be set in a config file".to_owned()),
    }
}

/// One value as the command line would give it.
fn scalar(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Datetime(d) => Ok(d.to_string()),
        other => Err(format!(
            "expected a single value, found {}",
            type_name(other)
        )),
    }
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// Runs `value` through the flag's value parser alone (without the
/// environment and the flag's relations to others, which the full parse
/// checks).
fn check(arg: &Arg, flag: &str, value: &str) -> Result<(), String> {
    let probe = arg
        .clone()
        .env(Resettable::Reset)
        .requires(Resettable::Reset)
        .conflicts_with(Resettable::Reset)
        .overrides_with(Resettable::Reset)
        .required_unless_present(Resettable::Reset)
        .group(Resettable::Reset)
        .required(false)
        .global(false);
    Command::new("config")
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(probe)
        .try_get_matches_from([format!("--{flag}={value}")])
        .map(|_| ())
        .map_err(|e| clap_message(&e))
}

/// A clap error as one plain line, without the `error: ` prefix and the
/// usage hint.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.trim_start_matches("error: ");
    let text = text.split("\n\nUsage:").next().unwrap_or(text);
    let text = text
        .split("\n\nFor more information")
        .next()
        .unwrap_or(text);
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test command like gyre's: flattened groups, a global flag, an
    /// environment variable that is always set (PATH), a list, a boolean,
    /// a number with a range and a conflict.
    fn command() -> Command {
        #[derive(clap::Args)]
        struct Engine {
            #[arg(long, env = "GYRE_TEST_KV_CACHE_MIB_UNSET", default_value_t = 1024)]
            kv_cache_mib: u64,
            #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
            max_running: Option<u32>,
        }
        #[derive(clap::Args)]
        struct Model {
            #[arg(long)]
            model: Vec<String>,
            #[arg(long)]
            config: Option<std::path::PathBuf>,
            /// Read from PATH, which is always set.
            #[arg(long, env = "PATH")]
            from_env: Option<String>,
            #[arg(long, alias = "cors-origin", value_delimiter = ',')]
            cors_allow_origin: Vec<String>,
            #[command(flatten)]
            engine: Engine,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Serve {
                #[command(flatten)]
                model: Model,
                #[arg(long, default_value = "127.0.0.1:8000")]
                http_addr: String,
                #[arg(long)]
                open_endpoints: bool,
                #[arg(long, conflicts_with = "keys_file")]
                api_key: Option<String>,
                #[arg(long)]
                keys_file: Option<String>,
            },
            Grpc {
                #[command(flatten)]
                model: Model,
            },
            Other,
        }
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Sub,
            #[arg(long, global = true, default_value = "text")]
            log_format: String,
        }
        <Cli as clap::CommandFactory>::command()
    }

    fn config(text: &str) -> (tempfile_path::TempFile, String) {
        let file = tempfile_path::TempFile::new(text);
        let path = file.path.display().to_string();
        (file, path)
    }

    fn run(args: &[&str]) -> anyhow::Result<ArgMatches> {
        let argv = std::iter::once("gyre")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        matches_from(command(), argv)
    }

    fn sub(m: &ArgMatches) -> &ArgMatches {
        m.subcommand().map(|(_, s)| s).expect("a subcommand")
    }

    fn one<'a>(m: &'a ArgMatches, id: &str) -> Option<&'a str> {
        sub(m).get_one::<String>(id).map(String::as_str)
    }

    #[test]
    fn file_beats_defaults_and_loses_to_flags() {
        let (_f, path) = config(
            "http-addr = \"0.0.0.0:9000\"\nkv_cache_mib = 512\nopen-endpoints = true\n\
             log-format = \"json\"\nmodel = [\"a.gguf\", \"b.gguf\"]\ncors-origin = [\"https://x.example\"]\n",
        );
        let m = run(&["serve", "--config", &path]).expect("parses");
        assert_eq!(one(&m, "http_addr"), Some("0.0.0.0:9000"));
        assert_eq!(sub(&m).get_one::<u64>("kv_cache_mib"), Some(&512));
        assert!(sub(&m).get_flag("open_endpoints"));
        assert_eq!(one(&m, "log_format"), Some("json"));
        let models: Vec<&String> = sub(&m).get_many("model").expect("models").collect();
        assert_eq!(models, ["a.gguf", "b.gguf"]);
        let origins: Vec<&String> = sub(&m)
            .get_many("cors_allow_origin")
            .expect("cors")
            .collect();
        assert_eq!(origins, ["https://x.example"]);

        let m = run(&[
            "--log-format",
            "text",
            "serve",
            "--kv-cache-mib",
            "64",
            "--config",
            &path,
            "--http-addr=127.0.0.1:1",
            "--model",
            "c.gguf",
        ])
        .expect("parses");
        assert_eq!(one(&m, "http_addr"), Some("127.0.0.1:1"));
        assert_eq!(sub(&m).get_one::<u64>("kv_cache_mib"), Some(&64));
        assert_eq!(one(&m, "log_format"), Some("text"));
        // A list flag on the command line replaces the file's list.
        let models: Vec<&String> = sub(&m).get_many("model").expect("models").collect();
        assert_eq!(models, ["c.gguf"]);
        // What the command line did not give still comes from the file.
        assert!(sub(&m).get_flag("open_endpoints"));
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        let env = std::env::var("PATH").expect("PATH is set");
        // Default (nothing anywhere) is covered by the flag without env:
        // kv_cache_mib's variable is never set.
        let (_f, path) = config("kv-cache-mib = 256\nfrom-env = \"file\"\n");
        let m = run(&["serve", "--config", &path]).expect("parses");
        assert_eq!(one(&m, "from_env"), Some(env.as_str()), "env over file");
        assert_eq!(
            sub(&m).get_one::<u64>("kv_cache_mib"),
            Some(&256),
            "file over default"
        );
        let m = run(&["serve", "--config", &path, "--from-env", "flag"]).expect("parses");
        assert_eq!(one(&m, "from_env"), Some("flag"), "flag over env and file");
        let (_g, bare) = config("http-addr = \"x:1\"\n");
        let m = run(&["serve", "--config", &bare]).expect("parses");
        assert_eq!(
            sub(&m).get_one::<u64>("kv_cache_mib"),
            Some(&1024),
            "default"
        );
        assert_eq!(
            sub(&m).value_source("kv_cache_mib"),
            Some(ValueSource::DefaultValue)
        );
    }

    #[test]
    fn false_booleans_and_models_tables_add_nothing() {
        let (_f, path) =
            config("open_endpoints = false\n[[models]]\nsource = \"x.gguf\"\nname = \"x\"\n");
        let m = run(&["serve", "--config", &path]).expect("parses");
        assert!(!sub(&m).get_flag("open_endpoints"));
    }

    #[test]
    fn unknown_keys_name_the_key_and_the_file() {
        let (_f, path) = config("kv-cache-mib = 512\nno-such-flag = 1\n");
        let e = run(&["serve", "--config", &path])
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("`no-such-flag`") && e.contains(&path), "{e}");
        assert!(e.contains("unknown key"), "{e}");
        // The config flag itself cannot be set from the file.
        let (_g, path) = config("config = \"other.toml\"\n");
        let e = run(&["serve", "--config", &path])
            .expect_err("config key")
            .to_string();
        assert!(e.contains("`config`") && e.contains(&path), "{e}");
    }

    #[test]
    fn a_flag_of_the_other_subcommand_is_skipped() {
        let (_f, path) = config("http-addr = \"x:1\"\nkv-cache-mib = 8\n");
        let m = run(&["grpc", "--config", &path]).expect("parses");
        assert_eq!(sub(&m).get_one::<u64>("kv_cache_mib"), Some(&8));
    }

    #[test]
    fn wrong_types_name_the_key() {
        for (text, key, what) in [
            ("kv-cache-mib = \"lots\"\n", "kv-cache-mib", "lots"),
            ("kv-cache-mib = true\n", "kv-cache-mib", "true"),
            ("kv-cache-mib = [1, 2]\n", "kv-cache-mib", "a list"),
            ("max-running = 100\n", "max-running", "100"),
            (
                "open-endpoints = \"yes\"\n",
                "open-endpoints",
                "true or false",
            ),
            ("model = [[\"x\"]]\n", "model", "a list"),
            ("http_addr = { a = 1 }\n", "http_addr", "a table"),
        ] {
            let (_f, path) = config(text);
            let e = run(&["serve", "--config", &path])
                .expect_err(text)
                .to_string();
            assert!(e.contains(&format!("`{key}`")), "{text}: {e}");
            assert!(e.contains(&path) && e.contains(what), "{text}: {e}");
        }
        // Checked even when a flag overrides it.
        let (_f, path) = config("kv-cache-mib = \"lots\"\n");
        assert!(run(&["serve", "--config", &path, "--kv-cache-mib", "1"]).is_err());
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let (_f, path) = config("kv-cache-mib = \n");
        let e = run(&["serve", "--config", &path])
            .expect_err("syntax")
            .to_string();
        assert!(e.contains(&path), "{e}");
        let e = run(&["serve", "--config", "/no/such/gyre.toml"])
            .expect_err("missing")
            .to_string();
        assert!(e.contains("/no/such/gyre.toml"), "{e}");
    }

    #[test]
    fn conflicts_between_file_and_flags_are_reported_with_the_file() {
        let (_f, path) = config("api-key = \"k\"\n");
        let e = run(&["serve", "--config", &path, "--keys-file", "keys.toml"])
            .expect_err("conflict")
            .to_string();
        assert!(e.contains("--api-key") && e.contains(&path), "{e}");
    }

    #[test]
    fn other_subcommands_and_no_config_parse_as_usual() {
        assert!(run(&["other"]).is_ok());
        let m = run(&["serve"]).expect("parses");
        assert_eq!(one(&m, "http_addr"), Some("127.0.0.1:8000"));
    }

    #[test]
    fn models_come_from_the_tables_only() {
        let (_f, path) =
            config("kv-cache-mib = 8\n[[models]]\nsource = \"x.gguf\"\nname = \"x\"\n");
        let specs = models(Path::new(&path)).expect("models");
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].name.as_deref(), Some("x"));
        let (_g, flags_only) = config("kv-cache-mib = 8\n");
        assert!(
            models(Path::new(&flags_only))
                .expect("no models")
                .is_empty()
        );
        let (_h, empty) = config("");
        let e = models(Path::new(&empty)).expect_err("empty").to_string();
        assert!(e.contains("lists no [[models]]"), "{e}");
        let (_i, bad) = config("[[models]]\nsource = \"x\"\nnope = 1\n");
        let e = models(Path::new(&bad))
            .expect_err("bad model key")
            .to_string();
        assert!(e.contains("nope"), "{e}");
    }

    /// A file removed when dropped (no tempfile crate in this package).
    mod tempfile_path {
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub struct TempFile {
            pub path: std::path::PathBuf,
        }

        impl TempFile {
            pub fn new(text: &str) -> Self {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let path = std::env::temp_dir()
                    .join(format!("gyre-config-test-{}-{n}.toml", std::process::id()));
                std::fs::write(&path, text).expect("write the test config");
                Self { path }
            }
        }

        impl Drop for TempFile {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
