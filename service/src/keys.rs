//! The keys file (`--keys-file`, TOML, or YAML when its name ends in
//! `.yaml` or `.yml`; the same schema either way): tenants with their allowed
//! models, quotas, priority and weight, and the API keys that name them, each
//! key as the hex SHA-256 of its text (the file never holds a key in clear).
//!
//! ```toml
//! [tenants.acme]
//! models = ["tiny-qwen2"]        # model ids or aliases; default: all
//! requests_per_minute = 60
//! requests_per_day = 10000
//! tokens_per_minute = 100000     # prompt + completion
//! max_concurrent_streams = 4
//! priority = 0                   # added to each request's own
//! weight = 1                     # share under contention, at least 1
//!
//! [[keys]]
//! sha256 = "<64 hex digits: the SHA-256 of the key>"
//! tenant = "acme"
//! ```
//!
//! ```yaml
//! tenants:
//!   acme:
//!     models: [tiny-qwen2]
//!     requests_per_minute: 60
//!   trial:                       # no settings: no limits ({} works too)
//! keys:
//!   - sha256: "<64 hex digits>"
//!     tenant: acme
//! ```

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::quota::Limits;
use crate::tenant::Tenant;

/// Why a keys file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("cannot read the keys file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the keys file {path} is not valid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    /// A YAML tenant with nothing under it is null: no settings.
    #[serde(default)]
    tenants: BTreeMap<String, Option<TenantSpec>>,
    #[serde(default)]
    keys: Vec<KeySpec>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TenantSpec {
    models: Option<Vec<String>>,
    requests_per_minute: Option<u64>,
    requests_per_day: Option<u64>,
    tokens_per_minute: Option<u64>,
    max_concurrent_streams: Option<u64>,
    #[serde(default)]
    priority: i32,
    weight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeySpec {
    sha256: String,
    tenant: String,
}

/// What a tenant may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub tenant: Tenant,
    /// Model ids or aliases the tenant may use; None: every model.
    pub models: Option<Vec<String>>,
    pub limits: Limits,
}

impl Policy {
    /// Whether the tenant may use a model known by `names` (its id and
    /// aliases).
    pub fn allows<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        match &self.models {
            None => true,
            Some(allowed) => names.any(|n| allowed.iter().any(|a| a == n)),
        }
    }
}

/// How a keys file is written, told by its name: `.yaml` and `.yml` are
/// YAML, anything else TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Yaml,
}

impl Format {
    /// The format of the file at `path`, by its extension (any case).
    pub fn of(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml") => {
                Self::Yaml
            }
            _ => Self::Toml,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Toml => "TOML",
            Self::Yaml => "YAML",
        }
    }
}

/// A parsed keys file.
#[derive(Debug, Default)]
pub struct Keys {
    /// (key hash, index into `policies`).
    keys: Vec<([u8; 32], usize)>,
    policies: Vec<Arc<Policy>>,
}

/// The keys section as a reader of `format` would look for it.
fn keys_section(format: Format) -> &'static str {
    match format {
        Format::Toml => "no [[keys]] table",
        Format::Yaml => "no `keys:` list, or an empty one",
    }
}

/// The tenants section as a reader of `format` would look for it.
fn tenants_section(format: Format) -> &'static str {
    match format {
        Format::Toml => "has no [tenants] table",
        Format::Yaml => "is not under `tenants:`",
    }
}

/// Whether a YAML line holds nothing: blank, a comment or a document mark.
fn yaml_blank(line: &str) -> bool {
    let l = line.trim();
    l.is_empty() || l.starts_with('#') || l == "---" || l == "..."
}

/// The hex SHA-256 of a key, as the keys file lists it.
pub fn hash_key(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Keys {
    /// Reads and checks the keys file at `path`, in the format its name
    /// tells ([`Format::of`]).
    pub fn load(path: &std::path::Path) -> Result<Self, KeysError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, Format::of(path)).map_err(|message| KeysError::Invalid {
            path: shown,
            message,
        })
    }

    /// Parses and checks a keys file's text.
    pub fn parse(text: &str, format: Format) -> Result<Self, String> {
        let spec: FileSpec = match format {
            Format::Toml => toml::from_str(text).map_err(|e| format!("{}: {e}", format.name()))?,
            // An empty or comment-only YAML document is null: no keys.
            Format::Yaml if text.lines().all(yaml_blank) => FileSpec {
                tenants: BTreeMap::new(),
                keys: Vec::new(),
            },
            Format::Yaml => {
                serde_norway::from_str(text).map_err(|e| format!("{}: {e}", format.name()))?
            }
        };
        if spec.keys.is_empty() {
            return Err(format!("it lists no keys ({})", keys_section(format)));
        }
        let mut names = Vec::new();
        let mut policies = Vec::new();
        for (name, t) in spec.tenants {
            let t = t.unwrap_or_default();
            if name.is_empty() {
                return Err("a tenant's name is empty".into());
            }
            let weight = t.weight.unwrap_or(1);
            if weight == 0 {
                return Err(format!("tenant `{name}`: weight must be at least 1"));
            }
            if t.models.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!(
                    "tenant `{name}`: `models` is empty (leave it out to allow every model)"
                ));
            }
            policies.push(Arc::new(Policy {
                tenant: Tenant {
                    name: Arc::from(name.as_str()),
                    priority: t.priority,
                    weight,
                },
                models: t.models,
                limits: Limits {
                    requests_per_minute: t.requests_per_minute,
                    requests_per_day: t.requests_per_day,
                    tokens_per_minute: t.tokens_per_minute,
                    max_concurrent: t.max_concurrent_streams,
                },
            }));
            names.push(name);
        }
        let mut seen = HashSet::new();
        let mut keys = Vec::new();
        for (i, k) in spec.keys.iter().enumerate() {
            let hash = parse_hex32(&k.sha256).ok_or_else(|| {
                format!(
                    "keys[{i}].sha256 is not 64 hex digits (make one with `gyre keys hash`{})",
                    if format == Format::Yaml {
                        "; quote it in YAML"
                    } else {
                        ""
                    }
                )
            })?;
            if !seen.insert(hash) {
                return Err(format!("keys[{i}] repeats an earlier key"));
            }
            let index = names.iter().position(|n| *n == k.tenant).ok_or_else(|| {
                format!(
                    "keys[{i}] names tenant `{}`, which {}",
                    k.tenant,
                    tenants_section(format)
                )
            })?;
            keys.push((hash, index));
        }
        Ok(Self { keys, policies })
    }

    /// The policy of the tenant whose key is `key`. Every listed hash is
    /// compared, each in constant time, whether or not one matched.
    pub fn find(&self, key: &str) -> Option<Arc<Policy>> {
        let hash = Sha256::digest(key.as_bytes());
        let mut found = None;
        for (h, i) in &self.keys {
            if gyre_api::auth::constant_time_eq(h, hash.as_slice()) {
                found = Some(*i);
            }
        }
        found.and_then(|i| self.policies.get(i).cloned())
    }

    /// How many keys and tenants the file lists.
    pub fn counts(&self) -> (usize, usize) {
        (self.keys.len(), self.policies.len())
    }

    /// Each tenant's policy.
    pub fn policies(&self) -> &[Arc<Policy>] {
        &self.policies
    }
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
