//! The keys file (`--keys-file`, TOML): tenants with their allowed models,
//! quotas, priority and weight, and the API keys that name them, each key
//! as the hex SHA-256 of its text (the file never holds a key in clear).
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
    #[serde(default)]
    tenants: BTreeMap<String, TenantSpec>,
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

/// A parsed keys file.
#[derive(Debug, Default)]
pub struct Keys {
    /// (key hash, index into `policies`).
    keys: Vec<([u8; 32], usize)>,
    policies: Vec<Arc<Policy>>,
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
    /// Reads and checks the keys file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, KeysError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|message| KeysError::Invalid {
            path: shown,
            message,
        })
    }

    /// Parses and checks a keys file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let spec: FileSpec = toml::from_str(text).map_err(|e| e.to_string())?;
        if spec.keys.is_empty() {
            return Err("it lists no [[keys]]".into());
        }
        let mut names = Vec::new();
        let mut policies = Vec::new();
        for (name, t) in spec.tenants {
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
                format!("keys[{i}].sha256 is not 64 hex digits (make one with `gyre keys hash`)")
            })?;
            if !seen.insert(hash) {
                return Err(format!("keys[{i}] repeats an earlier key"));
            }
            let index = names.iter().position(|n| *n == k.tenant).ok_or_else(|| {
                format!(
                    "keys[{i}] names tenant `{}`, which has no [tenants] table",
                    k.tenant
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
mod tests {
    use super::*;

    const FILE: &str = r#"
[tenants.acme]
models = ["m1"]
requests_per_minute = 3
tokens_per_minute = 500
priority = 2
weight = 4

[tenants.free]

[[keys]]
sha256 = "HASH_A"
tenant = "acme"

[[keys]]
sha256 = "HASH_B"
tenant = "free"
"#;

    fn file() -> String {
        FILE.replace("HASH_A", &hash_key("key-a"))
            .replace("HASH_B", &hash_key("key-b"))
    }

    #[test]
    fn keys_resolve_to_their_tenants() {
        let keys = Keys::parse(&file()).expect("valid");
        assert_eq!(keys.counts(), (2, 2));
        let a = keys.find("key-a").expect("key a");
        assert_eq!(&*a.tenant.name, "acme");
        assert_eq!((a.tenant.priority, a.tenant.weight), (2, 4));
        assert_eq!(a.limits.requests_per_minute, Some(3));
        assert_eq!(a.limits.tokens_per_minute, Some(500));
        assert!(a.allows(["x", "m1"].into_iter()));
        assert!(!a.allows(["m2"].into_iter()));
        let b = keys.find("key-b").expect("key b");
        assert_eq!(&*b.tenant.name, "free");
        assert_eq!(b.tenant.weight, 1);
        assert!(!b.limits.any());
        assert!(b.allows(["anything"].into_iter()));
        assert!(keys.find("key-c").is_none());
        assert!(keys.find("").is_none());
    }

    #[test]
    fn the_hash_is_sha256_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_files_say_why() {
        let cases = [
            ("", "no [[keys]]"),
            (
                "[[keys]]\nsha256 = \"abc\"\ntenant = \"t\"\n",
                "64 hex digits",
            ),
            (
                &format!("[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n", hash_key("k")),
                "no [tenants] table",
            ),
            (
                &format!(
                    "[tenants.t]\nweight = 0\n[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n",
                    hash_key("k")
                ),
                "weight",
            ),
            (
                &format!(
                    "[tenants.t]\nmodels = []\n[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n",
                    hash_key("k")
                ),
                "`models` is empty",
            ),
            (
                &format!(
                    "[tenants.t]\n[[keys]]\nsha256 = \"{h}\"\ntenant = \"t\"\n[[keys]]\nsha256 = \"{h}\"\ntenant = \"t\"\n",
                    h = hash_key("k")
                ),
                "repeats",
            ),
            ("[tenants.t]\nrpm = 3\n", "unknown field"),
        ];
        for (text, why) in cases {
            let err = Keys::parse(text).expect_err(text);
            assert!(err.contains(why), "{text:?}: {err}");
        }
    }
}
