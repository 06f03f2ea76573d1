//! What to serve: a model's source plus its catalogue entry (name, aliases,
//! pinned version, deprecation and sunset dates, owner, KV budget), read
//! from a `--model` argument (`path[,key=value...]`) or a TOML config file
//! (`--config`, a `[[models]]` table per model).

use serde::Deserialize;

/// One model to serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSpec {
    /// A GGUF file, a HuggingFace directory or a hub id (as `--model`).
    pub source: String,
    /// For a hub id: branch, tag or commit.
    pub revision: Option<String>,
    /// The id clients use (default: from the source).
    pub name: Option<String>,
    /// Other names that resolve to this model.
    pub aliases: Vec<String>,
    /// The pinned version shown in the catalogue.
    pub version: Option<String>,
    /// Deprecation time, Unix seconds.
    pub deprecation: Option<i64>,
    /// Sunset time, Unix seconds.
    pub sunset: Option<i64>,
    pub owned_by: Option<String>,
    /// KV cache budget in MiB (default: the server's `--kv-cache-mib`).
    pub kv_cache_mib: Option<u64>,
    /// Prompt-lookup tokens proposed per step by default for this model
    /// (0: off; default: the server's `--prompt-lookup-tokens`).
    pub prompt_lookup: Option<u32>,
    /// A draft model for speculative decoding (a GGUF file or HuggingFace
    /// directory with this model's vocabulary).
    pub draft: Option<String>,
    /// Tokens the draft proposes per step by default, 0 to 64 (instead of
    /// generation_config.json's `num_assistant_tokens`; only with `draft`).
    pub draft_tokens: Option<u32>,
    /// Longest n-gram prompt lookup matches by default (1 to 16; default
    /// 2). Set by `--speculative-config`'s `prompt_lookup_max`.
    pub prompt_lookup_max: Option<u32>,
    /// Shortest n-gram prompt lookup matches (1 to 16, at most the
    /// longest; default 1). Set by `--speculative-config`'s
    /// `prompt_lookup_min`.
    pub prompt_lookup_min: Option<u32>,
}

/// A `--model` argument or config entry that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("--model `{0}`: the source (before the first comma) is empty")]
    EmptySource(String),
    #[error(
        "--model `{arg}`: `{item}` is not key=value (keys: name, alias, version, revision, deprecated, sunset, owned_by, kv_cache_mib, prompt_lookup, draft, draft_tokens)"
    )]
    NotKeyValue { arg: String, item: String },
    #[error(
        "--model `{arg}`: unknown key `{key}` (keys: name, alias, version, revision, deprecated, sunset, owned_by, kv_cache_mib, prompt_lookup, draft, draft_tokens)"
    )]
    UnknownKey { arg: String, key: String },
    #[error("--model `{arg}`: `{key}` is given twice")]
    Repeated { arg: String, key: String },
    #[error("{what}: `{value}` is not a date (YYYY-MM-DD, or RFC 3339 as 2026-12-31T12:00:00Z)")]
    BadDate { what: String, value: String },
    #[error("--model `{arg}`: kv_cache_mib `{value}` is not a whole number of MiB")]
    BadNumber { arg: String, value: String },
    #[error("{what}: {key} `{value}` is not a number of tokens from 0 to {max}")]
    BadLookup {
        what: String,
        key: &'static str,
        value: String,
        max: u32,
    },
    #[error("{what}: draft_tokens needs a draft model (`draft`)")]
    DraftTokensWithoutDraft { what: String },
    #[error("{what}: `{key}` must not be empty")]
    Empty { what: String, key: String },
    #[error("config file {path}: {message}")]
    Config { path: String, message: String },
}

const KEYS: [&str; 11] = [
    "name",
    "alias",
    "version",
    "revision",
    "deprecated",
    "sunset",
    "owned_by",
    "kv_cache_mib",
    "prompt_lookup",
    "draft",
    "draft_tokens",
];

impl ModelSpec {
    /// A plain source with nothing else set.
    pub fn source(source: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            ..Self::default()
        }
    }

    /// Parses `path[,name=N][,alias=A]...[,version=V][,revision=R]
    /// [,deprecated=DATE][,sunset=DATE][,owned_by=O][,kv_cache_mib=M]
    /// [,prompt_lookup=K][,draft=PATH][,draft_tokens=K]`.
    /// The source is everything before the first comma.
    pub fn parse(arg: &str) -> Result<Self, SpecError> {
        let mut parts = arg.split(',');
        let source = parts.next().unwrap_or_default().trim();
        if source.is_empty() {
            return Err(SpecError::EmptySource(arg.into()));
        }
        let mut spec = Self::source(source);
        for item in parts {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return Err(SpecError::NotKeyValue {
                    arg: arg.into(),
                    item: item.into(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            if !KEYS.contains(&key) {
                return Err(SpecError::UnknownKey {
                    arg: arg.into(),
                    key: key.into(),
                });
            }
            if value.is_empty() {
                return Err(SpecError::Empty {
                    what: format!("--model `{arg}`"),
                    key: key.into(),
                });
            }
            let what = || format!("--model `{arg}`: {key}");
            let once = |slot_set: bool| -> Result<(), SpecError> {
                if slot_set {
                    Err(SpecError::Repeated {
                        arg: arg.into(),
                        key: key.into(),
                    })
                } else {
                    Ok(())
                }
            };
            match key {
                "alias" => spec.aliases.push(value.into()),
                "name" => {
                    once(spec.name.is_some())?;
                    spec.name = Some(value.into());
                }
                "version" => {
                    once(spec.version.is_some())?;
                    spec.version = Some(value.into());
                }
                "revision" => {
                    once(spec.revision.is_some())?;
                    spec.revision = Some(value.into());
                }
                "owned_by" => {
                    once(spec.owned_by.is_some())?;
                    spec.owned_by = Some(value.into());
                }
                "deprecated" => {
                    once(spec.deprecation.is_some())?;
                    spec.deprecation = Some(parse_date(value, &what())?);
                }
                "sunset" => {
                    once(spec.sunset.is_some())?;
                    spec.sunset = Some(parse_date(value, &what())?);
                }
                "draft" => {
                    once(spec.draft.is_some())?;
                    spec.draft = Some(value.into());
                }
                "prompt_lookup" => {
                    once(spec.prompt_lookup.is_some())?;
                    spec.prompt_lookup = Some(tokens_per_step(
                        "prompt_lookup",
                        value,
                        &format!("--model `{arg}`"),
                    )?);
                }
                "draft_tokens" => {
                    once(spec.draft_tokens.is_some())?;
                    spec.draft_tokens = Some(tokens_per_step(
                        "draft_tokens",
                        value,
                        &format!("--model `{arg}`"),
                    )?);
                }
                _ => {
                    once(spec.kv_cache_mib.is_some())?;
                    spec.kv_cache_mib = Some(value.parse().map_err(|_| SpecError::BadNumber {
                        arg: arg.into(),
                        value: value.into(),
                    })?);
                }
            }
        }
        if spec.draft_tokens.is_some() && spec.draft.is_none() {
            return Err(SpecError::DraftTokensWithoutDraft {
                what: format!("--model `{arg}`"),
            });
        }
        Ok(spec)
    }
}

/// The config file's shape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    models: Vec<ConfigModel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigModel {
    source: String,
    revision: Option<String>,
    name: Option<String>,
    #[serde(default)]
    aliases: Vec<String>,
    version: Option<String>,
    deprecated: Option<String>,
    sunset: Option<String>,
    owned_by: Option<String>,
    kv_cache_mib: Option<u64>,
    prompt_lookup: Option<u32>,
    draft: Option<String>,
    draft_tokens: Option<u32>,
}

/// Speculative tokens per step (`key`'s value), checked against the
/// engine's maximum.
fn tokens_per_step(key: &'static str, value: &str, what: &str) -> Result<u32, SpecError> {
    let max = gyre_engine::MAX_SPECULATIVE_TOKENS;
    value
        .parse::<u32>()
        .ok()
        .filter(|&k| k <= max)
        .ok_or_else(|| SpecError::BadLookup {
            what: what.into(),
            key,
            value: value.into(),
            max,
        })
}

/// Parses a TOML config (`path` only names it in errors): a `[[models]]`
/// table per model with `source` and the keys `--model` takes (`aliases` a
/// list).
pub fn parse_config(text: &str, path: &str) -> Result<Vec<ModelSpec>, SpecError> {
    let file: ConfigFile = toml::from_str(text).map_err(|e| SpecError::Config {
        path: path.into(),
        message: e.message().to_string(),
    })?;
    file.models
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let what = |key: &str| format!("config file {path}: models[{i}].{key}");
            let nonempty = |key: &str, v: &Option<String>| match v {
                Some(s) if s.trim().is_empty() => Err(SpecError::Empty {
                    what: format!("config file {path}: models[{i}]"),
                    key: key.into(),
                }),
                _ => Ok(()),
            };
            nonempty("source", &Some(m.source.clone()))?;
            nonempty("name", &m.name)?;
            nonempty("version", &m.version)?;
            nonempty("draft", &m.draft)?;
            if m.aliases.iter().any(|a| a.trim().is_empty()) {
                return Err(SpecError::Empty {
                    what: format!("config file {path}: models[{i}]"),
                    key: "aliases".into(),
                });
            }
            let entry = format!("config file {path}: models[{i}]");
            let prompt_lookup = m
                .prompt_lookup
                .map(|k| tokens_per_step("prompt_lookup", &k.to_string(), &entry))
                .transpose()?;
            let draft_tokens = m
                .draft_tokens
                .map(|k| tokens_per_step("draft_tokens", &k.to_string(), &entry))
                .transpose()?;
            if draft_tokens.is_some() && m.draft.is_none() {
                return Err(SpecError::DraftTokensWithoutDraft { what: entry });
            }
            Ok(ModelSpec {
                source: m.source,
                revision: m.revision,
                name: m.name,
                aliases: m.aliases,
                version: m.version,
                deprecation: m
                    .deprecated
                    .as_deref()
                    .map(|d| parse_date(d, &what("deprecated")))
                    .transpose()?,
                sunset: m
                    .sunset
                    .as_deref()
                    .map(|d| parse_date(d, &what("sunset")))
                    .transpose()?,
                owned_by: m.owned_by,
                kv_cache_mib: m.kv_cache_mib,
                prompt_lookup,
                draft: m.draft,
                draft_tokens,
                prompt_lookup_max: None,
                prompt_lookup_min: None,
            })
        })
        .collect()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn num(s: &str, len: usize) -> Option<i64> {
    (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `YYYY-MM-DD` (midnight UTC) or RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac]`
/// with `Z` or `±HH:MM`) as Unix seconds.
pub fn parse_date(value: &str, what: &str) -> Result<i64, SpecError> {
    let bad = || SpecError::BadDate {
        what: what.into(),
        value: value.into(),
    };
    let v = value.trim();
    let (date, time) = match v.find(['T', 't']) {
        Some(i) => (&v[..i], Some(&v[i + 1..])),
        None => (v, None),
    };
    let mut d = date.split('-');
    let (Some(y), Some(m), Some(day), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    let (y, m, day) = (
        num(y, 4).ok_or_else(bad)?,
        num(m, 2).ok_or_else(bad)?,
        num(day, 2).ok_or_else(bad)?,
    );
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || day < 1 || day > days_in[(m - 1) as usize] {
        return Err(bad());
    }
    let mut secs = days_from_civil(y, m, day) * 86_400;
    if let Some(t) = time {
        let (clock, offset) = if let Some(c) = t.strip_suffix(['Z', 'z']) {
            (c, 0)
        } else {
            let i = t.rfind(['+', '-']).ok_or_else(bad)?;
            let (c, off) = t.split_at(i);
            let sign = if off.starts_with('-') { -1 } else { 1 };
            let (oh, om) = off[1..].split_once(':').ok_or_else(bad)?;
            let (oh, om) = (num(oh, 2).ok_or_else(bad)?, num(om, 2).ok_or_else(bad)?);
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            (c, sign * (oh * 3600 + om * 60))
        };
        let clock = clock.split('.').next().unwrap_or_default();
        let mut c = clock.split(':');
        let (Some(h), Some(mi), Some(s), None) = (c.next(), c.next(), c.next(), c.next()) else {
            return Err(bad());
        };
        let (h, mi, s) = (
            num(h, 2).ok_or_else(bad)?,
            num(mi, 2).ok_or_else(bad)?,
            num(s, 2).ok_or_else(bad)?,
        );
        if h > 23 || mi > 59 || s > 60 {
            return Err(bad());
        }
        secs += h * 3600 + mi * 60 + s - offset;
    }
    Ok(secs)
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
