//! What `--model` names: a local path (a GGUF file or a HuggingFace model
//! directory), or a HuggingFace hub id (`org/name`, or a bare `name`) found
//! offline in the local HuggingFace cache. An existing path always wins.
//!
//! The cache follows `huggingface_hub`'s own rules: the directory is
//! `HF_HUB_CACHE`, else the legacy `HUGGINGFACE_HUB_CACHE`, else
//! `$HF_HOME/hub`, with `HF_HOME` defaulting to
//! `$XDG_CACHE_HOME/huggingface` and `XDG_CACHE_HOME` to `~/.cache` (`~` and
//! `$VAR`s expanded). A model `org/name` lives in `models--org--name/`:
//! `refs/<branch or tag>` holds a commit hash, and `snapshots/<commit>/`
//! holds the files (symlinks into `blobs/`). A revision is looked up in
//! `refs/` first, then taken as a commit hash (a snapshot's name).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Where `--model` led.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the engine loads: a GGUF file or a model directory.
    pub path: PathBuf,
    /// Set when `--model` was a hub id found in the cache.
    pub hub: Option<HubModel>,
}

/// A model found in the HuggingFace cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    pub repo_id: String,
    /// The revision asked for (`main` unless `--revision` said otherwise).
    pub revision: String,
    /// The commit whose snapshot is served.
    pub commit: String,
}

/// Why `--model` could not be resolved. Every message says where it looked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error(
        "--model {model}: no such file or directory (--model takes a GGUF file, a HuggingFace \
         model directory, or a hub id in the HuggingFace cache; `make setup` links the default model)"
    )]
    NoSuchPath { model: String },
    #[error(
        "--model {model}: no such file or directory, and no such model in the HuggingFace cache \
         ({repo_dir} does not exist; the cache is {cache}, from HF_HUB_CACHE / HF_HOME). \
         gyre does not download: fetch it first (e.g. `hf download {model}`)"
    )]
    NotCached {
        model: String,
        cache: String,
        repo_dir: String,
    },
    #[error(
        "--model {model}: revision `{revision}` is neither a ref in {refs} nor a snapshot in \
         {snapshots} (cached snapshots: {cached})"
    )]
    UnknownRevision {
        model: String,
        revision: String,
        refs: String,
        snapshots: String,
        cached: String,
    },
    #[error(
        "--model {model}: {ref_file} names commit {commit}, but its snapshot {snapshot} is not in the cache"
    )]
    MissingSnapshot {
        model: String,
        ref_file: String,
        commit: String,
        snapshot: String,
    },
    #[error("--model {model}: the cached snapshot {snapshot} {what}")]
    Incomplete {
        model: String,
        snapshot: String,
        what: String,
    },
    #[error("--revision `{revision}` is not a branch, tag or commit name")]
    BadRevision { revision: String },
    #[error("--revision applies to hub ids only; {model} is a local path")]
    RevisionForPath { model: String },
}

/// The HuggingFace hub cache directory, by `huggingface_hub`'s rules, from
/// the environment `var` gives (the process's in [`hub_cache_dir`]).
pub fn hub_cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let expand = |v: OsString| expand_path(&v.to_string_lossy(), &var);
    if let Some(v) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return expand(v);
    }
    let home = match var("HF_HOME") {
        Some(v) => expand(v),
        None => {
            let xdg = var("XDG_CACHE_HOME")
                .map(|v| PathBuf::from(v.to_string_lossy().into_owned()))
                .unwrap_or_else(|| expand_path("~/.cache", &var));
            expand_path(&xdg.join("huggingface").to_string_lossy(), &var)
        }
    };
    home.join("hub")
}

/// The HuggingFace hub cache directory of this process's environment.
pub fn hub_cache_dir() -> PathBuf {
    hub_cache_dir_from(|k| std::env::var_os(k))
}

/// Python's `os.path.expandvars(os.path.expanduser(s))` for the forms that
/// matter here: a leading `~` (from `HOME`), then `$NAME` and `${NAME}`
/// (unknown names are left as they are).
fn expand_path(s: &str, var: &impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let s = match s.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match var("HOME") {
            Some(home) => format!("{}{rest}", home.to_string_lossy()),
            None => s.to_string(),
        },
        _ => s.to_string(),
    };
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, tail, braced) = match after.strip_prefix('{') {
            Some(b) => match b.find('}') {
                Some(end) => (&b[..end], &b[end + 1..], true),
                None => ("", after, false),
            },
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..], false)
            }
        };
        match (name.is_empty(), var(name)) {
            (false, Some(v)) => out.push_str(&v.to_string_lossy()),
            _ if name.is_empty() => out.push('$'),
            _ if braced => out.push_str(&format!("${{{name}}}")),
            _ => out.push_str(&format!("${name}")),
        }
        rest = if name.is_empty() { after } else { tail };
    }
    out.push_str(rest);
    PathBuf::from(out)
}

/// Whether `s` is a valid hub repo id (`huggingface_hub`'s
/// `validate_repo_id`): `name` or `namespace/name`, each 1-96 of
/// `[A-Za-z0-9_.-]`, starting and ending with a letter, digit or `_`, with
/// no `--` or `..`, not ending in `.git`.
pub fn is_repo_id(s: &str) -> bool {
    let part_ok = |p: &str| {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        (1..=96).contains(&p.len())
            && p.chars().all(|c| word(c) || c == '-' || c == '.')
            && p.starts_with(word)
            && p.ends_with(word)
    };
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| part_ok(p))
        && !s.contains("--")
        && !s.contains("..")
        && !s.ends_with(".git")
}

/// Resolves `--model` (and `--revision`) against the filesystem and the
/// hub cache at `cache`.
pub fn resolve(
    model: &str,
    revision: Option<&str>,
    cache: &Path,
) -> Result<Resolved, ResolveError> {
    let path = Path::new(model);
    if path.exists() {
        if revision.is_some() {
            return Err(ResolveError::RevisionForPath {
                model: model.into(),
            });
        }
        return Ok(Resolved {
            path: path.to_path_buf(),
            hub: None,
        });
    }
    if !is_repo_id(model) {
        return Err(ResolveError::NoSuchPath {
            model: model.into(),
        });
    }
    let revision = revision.unwrap_or("main");
    let rev_path = Path::new(revision);
    if revision.is_empty()
        || !rev_path
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(ResolveError::BadRevision {
            revision: revision.into(),
        });
    }
    let repo = cache.join(format!("models--{}", model.replace('/', "--")));
    if !repo.is_dir() {
        return Err(ResolveError::NotCached {
            model: model.into(),
            cache: cache.display().to_string(),
            repo_dir: repo.display().to_string(),
        });
    }
    let (refs, snapshots) = (repo.join("refs"), repo.join("snapshots"));
    let ref_file = refs.join(rev_path);
    let (commit, from_ref) = match std::fs::read_to_string(&ref_file) {
        Ok(text) => (text.trim().to_string(), true),
        Err(_) => (revision.to_string(), false),
    };
    let snapshot = snapshots.join(&commit);
    let commit_ok = !commit.is_empty() && !commit.contains(['/', '\\']) && commit != "..";
    if !commit_ok || !snapshot.is_dir() {
        if from_ref {
            return Err(ResolveError::MissingSnapshot {
                model: model.into(),
                ref_file: ref_file.display().to_string(),
                commit,
                snapshot: snapshot.display().to_string(),
            });
        }
        return Err(ResolveError::UnknownRevision {
            model: model.into(),
            revision: revision.into(),
            refs: refs.display().to_string(),
            snapshots: snapshots.display().to_string(),
            cached: joined(&list_dir(&snapshots, |_| true)),
        });
    }
    let path = checked_snapshot(model, &snapshot)?;
    Ok(Resolved {
        path,
        hub: Some(HubModel {
            repo_id: model.into(),
            revision: revision.into(),
            commit,
        }),
    })
}

/// Names in `dir` that `keep` accepts, sorted.
fn list_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| keep(n))
        .collect();
    names.sort();
    names
}

/// `names` for a message: comma-separated, or "none".
fn joined(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// What in `snapshot` the engine loads: the directory when it holds
/// `config.json` and `*.safetensors` weights, or its only `*.gguf` file.
/// Links whose blob is missing (an interrupted download) count as missing.
fn checked_snapshot(model: &str, snapshot: &Path) -> Result<PathBuf, ResolveError> {
    let incomplete = |what: String| ResolveError::Incomplete {
        model: model.into(),
        snapshot: snapshot.display().to_string(),
        what,
    };
    // Names listed whose target is (or is not) a readable file.
    let readable = |names: &[String], want: bool| -> Vec<String> {
        names
            .iter()
            .filter(|n| snapshot.join(n).is_file() == want)
            .cloned()
            .collect()
    };
    let everything = || joined(&list_dir(snapshot, |_| true));
    let config = list_dir(snapshot, |n| n == "config.json");
    if !readable(&config, false).is_empty() {
        return Err(incomplete(
            "links to a config.json whose blob is missing: re-download it".into(),
        ));
    }
    if config.is_empty() {
        let ggufs = readable(&list_dir(snapshot, |n| n.ends_with(".gguf")), true);
        return match ggufs.as_slice() {
            [one] => Ok(snapshot.join(one)),
            [] => Err(incomplete(format!(
                "has no config.json (and no *.gguf file); it holds: {}",
                everything()
            ))),
            many => Err(incomplete(format!(
                "has no config.json but several GGUF files ({}): pass the one to serve as --model <path>",
                many.join(", ")
            ))),
        };
    }
    let shards = list_dir(snapshot, |n| n.ends_with(".safetensors"));
    let missing = readable(&shards, false);
    if !missing.is_empty() {
        return Err(incomplete(format!(
            "links to weights whose blobs are missing ({}): re-download it",
            missing.join(", ")
        )));
    }
    if shards.is_empty() {
        return Err(incomplete(format!(
            "has no *.safetensors weights (gyre reads safetensors or GGUF); it holds: {}",
            everything()
        )));
    }
    Ok(snapshot.to_path_buf())
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
