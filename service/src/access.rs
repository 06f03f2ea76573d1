//! Who may call, and how much: the one enforcement point for both
//! protocols (the HTTP shim forwards its client's `Authorization`).
//!
//! [`Authenticate`] is the interceptor in front of the generation,
//! responses and embeddings services (and of health and reflection unless
//! they are left open): it resolves `authorization: Bearer <key>` to the
//! key's [`Tenant`](crate::tenant::Tenant) (request extensions) and its [`Caller`] (the tenant's
//! policy and quota counters). Where a request's model is resolved, the
//! caller checks the model (PERMISSION_DENIED) and admits the request
//! against its quotas (RESOURCE_EXHAUSTED), giving an [`Admission`] that
//! settles the token reservation to the real count when dropped.
//!
//! The keys file is reloaded when it changes and on SIGHUP; a file that does
//! not parse keeps the previous keys. Reloads and quota changes go to the
//! audit log (target `gyre::audit`), as counts and limits, never keys.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::{Request, Status};

use crate::error::{RateLimited, ServiceError};
use crate::keys::{Keys, KeysError, Policy};
use crate::quota::{Quota, Snapshot, format_reset};

/// The audit log's `tracing` target.
pub const AUDIT: &str = "gyre::audit";

/// How often the keys file's modification time is checked.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The keys of a server with a keys file, and its tenants' counters (kept
/// across reloads, by tenant name).
pub struct KeyStore {
    path: PathBuf,
    keys: RwLock<Arc<Keys>>,
    quotas: Mutex<HashMap<Arc<str>, Quota>>,
    /// The file's (modification time, length) when last read.
    stamp: Mutex<Option<(SystemTime, u64)>>,
}

fn stamp(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl KeyStore {
    /// Reads the keys file (an error fails the start).
    pub fn open(path: PathBuf) -> Result<Arc<Self>, KeysError> {
        let before = stamp(&path);
        let keys = Keys::load(&path)?;
        let (k, t) = keys.counts();
        tracing::info!(target: AUDIT, path = %path.display(), keys = k, tenants = t, "keys file loaded");
        Ok(Arc::new(Self {
            path,
            keys: RwLock::new(Arc::new(keys)),
            quotas: Mutex::new(HashMap::new()),
            stamp: Mutex::new(before),
        }))
    }

    fn current(&self) -> Arc<Keys> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `token` is one of the current keys (for routes outside the
    /// gRPC services, such as the HTTP port's `/metrics`).
    pub fn knows(&self, token: &str) -> bool {
        self.current().find(token).is_some()
    }

    /// Reads the file again; on an error keeps the current keys and logs
    /// why. `why`: what asked for the reload (for the log).
    pub fn reload(&self, why: &str) -> bool {
        let before = stamp(&self.path);
        *lock(&self.stamp) = before;
        let new = match Keys::load(&self.path) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(target: AUDIT, trigger = why, error = %e, "keys file reload failed; keeping the previous keys");
                return false;
            }
        };
        let old = self.current();
        for p in new.policies() {
            let before = old
                .policies()
                .iter()
                .find(|o| o.tenant.name == p.tenant.name);
            match before {
                Some(o) if **o == **p => {}
                Some(o) => {
                    tracing::info!(target: AUDIT, tenant = %p.tenant.name, before = ?o.limits, after = ?p.limits, models = ?p.models, priority = p.tenant.priority, weight = p.tenant.weight, "tenant changed")
                }
                None => {
                    tracing::info!(target: AUDIT, tenant = %p.tenant.name, limits = ?p.limits, models = ?p.models, "tenant added")
                }
            }
        }
        for o in old.policies() {
            if !new
                .policies()
                .iter()
                .any(|p| p.tenant.name == o.tenant.name)
            {
                tracing::info!(target: AUDIT, tenant = %o.tenant.name, "tenant removed");
            }
        }
        let (k, t) = new.counts();
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
        tracing::info!(target: AUDIT, trigger = why, keys = k, tenants = t, "keys file reloaded");
        true
    }

    /// Reloads when the file's modification time or length changed.
    fn reload_if_changed(&self) {
        let now = stamp(&self.path);
        if now.is_some() && now != *lock(&self.stamp) {
            self.reload("file changed");
        }
    }

    /// Watches the file (every [`WATCH_EVERY`]) and SIGHUP, reloading on
    /// either, for as long as the runtime runs.
    pub fn spawn_reloader(self: &Arc<Self>) {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            loop {
                tick.tick().await;
                store.reload_if_changed();
            }
        });
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let store = self.clone();
            match signal(SignalKind::hangup()) {
                Ok(mut hup) => {
                    tokio::spawn(async move {
                        while hup.recv().await.is_some() {
                            store.reload("SIGHUP");
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
            }
        }
    }

    fn admit(
        self: &Arc<Self>,
        policy: &Arc<Policy>,
        reserve: u64,
    ) -> Result<Admission, ServiceError> {
        let now = Instant::now();
        let name = policy.tenant.name.clone();
        let result =
            lock(&self.quotas)
                .entry(name.clone())
                .or_default()
                .admit(now, &policy.limits, reserve);
        match result {
            Ok(snapshot) => Ok(Admission {
                store: self.clone(),
                tenant: name,
                reserve,
                prompt: AtomicU64::new(0),
                generated: AtomicU64::new(0),
                submitted: AtomicBool::new(false),
                snapshot,
            }),
            Err(r) => {
                tracing::info!(tenant = %name, limit = r.limit.as_str(), reserve, "rate limited");
                metrics::counter!(
                    "gyre:rate_limit_rejections_total",
                    "tenant" => name.to_string(),
                    "limit" => r.limit.as_str(),
                )
                .increment(1);
                let message = match r.limit {
                    crate::quota::Limit::TokensPerMinute => format!(
                        "rate limit reached for tokens per minute: this request may use {} tokens (prompt + max_tokens), more than the tenant has left; retry after {}",
                        r.reserve,
                        format_reset(r.retry_after)
                    ),
                    crate::quota::Limit::Concurrent => {
                        "rate limit reached for concurrent streams: wait for one of this tenant's requests to end".to_string()
                    }
                    limit => format!(
                        "rate limit reached for {}; retry after {}",
                        limit.as_str().replace('_', " "),
                        format_reset(r.retry_after)
                    ),
                };
                Err(ServiceError::RateLimited(Box::new(RateLimited {
                    message,
                    limit: r.limit.as_str(),
                    retry_after: r.retry_after,
                    headers: headers(&r.snapshot),
                })))
            }
        }
    }

    /// The rate-limit headers of `policy`'s tenant as its counters stand
    /// now (nothing counted: a tenant with no request yet has its whole
    /// allowance).
    fn headers_now(&self, policy: &Policy) -> Vec<(&'static str, String)> {
        let now = Instant::now();
        let quotas = lock(&self.quotas);
        let snapshot = match quotas.get(&policy.tenant.name) {
            Some(q) => q.snapshot(now, &policy.limits),
            None => Quota::default().snapshot(now, &policy.limits),
        };
        headers(&snapshot)
    }

    fn settle(&self, tenant: &Arc<str>, reserve: u64, used: u64) {
        if let Some(q) = lock(&self.quotas).get_mut(tenant) {
            q.settle(Instant::now(), reserve, used);
        }
    }
}

/// The rate-limit headers (OpenAI's names) of a snapshot.
pub fn headers(s: &Snapshot) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some((limit, left, reset)) = s.requests {
        out.push(("x-ratelimit-limit-requests", limit.to_string()));
        out.push(("x-ratelimit-remaining-requests", left.to_string()));
        out.push(("x-ratelimit-reset-requests", format_reset(reset)));
    }
    if let Some((limit, left, reset)) = s.tokens {
        out.push(("x-ratelimit-limit-tokens", limit.to_string()));
        out.push(("x-ratelimit-remaining-tokens", left.to_string()));
        out.push(("x-ratelimit-reset-tokens", format_reset(reset)));
    }
    out
}

/// Puts `headers` into gRPC metadata.
pub fn put_headers(meta: &mut MetadataMap, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        if let Ok(v) = AsciiMetadataValue::try_from(value.as_str()) {
            meta.insert(*name, v);
        }
    }
}

/// How the server authenticates calls.
#[derive(Clone, Default)]
pub enum Auth {
    /// No key: every call is the anonymous tenant's.
    #[default]
    Open,
    /// `--api-key`: one key, the anonymous tenant, no quotas.
    Key(Arc<str>),
    /// `--keys-file`.
    Keys(Arc<KeyStore>),
}

/// The caller of a request authenticated with the keys file: its policy
/// (as the file said when the call began) and the counters. In the
/// request's extensions beside its [`Tenant`](crate::tenant::Tenant).
#[derive(Clone)]
pub struct Caller {
    policy: Arc<Policy>,
    store: Arc<KeyStore>,
}

impl Caller {
    /// The caller of `req`, if it was authenticated with the keys file.
    pub fn of<T>(req: &Request<T>) -> Option<Self> {
        req.extensions().get::<Caller>().cloned()
    }

    /// PERMISSION_DENIED unless the tenant may use the model known by
    /// `names` (its id first); `asked`: the name the request used.
    pub fn check_model<'a>(
        &self,
        asked: &str,
        names: impl Iterator<Item = &'a str>,
    ) -> Result<(), ServiceError> {
        if self.policy.allows(names) {
            Ok(())
        } else {
            Err(ServiceError::ModelNotAllowed(asked.to_string()))
        }
    }

    /// The tenant's rate-limit headers as they stand now (see
    /// [`crate::limit_headers`], which puts them on every answer).
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        self.store.headers_now(&self.policy)
    }

    /// Admits a request that may use up to `reserve` tokens.
    pub fn admit(&self, reserve: u64) -> Result<Admission, ServiceError> {
        self.store.admit(&self.policy, reserve)
    }
}

/// An admitted request. Dropping it ends the request: its reservation
/// settles to the prompt plus the tokens generated (nothing when it never
/// reached the engine).
pub struct Admission {
    store: Arc<KeyStore>,
    tenant: Arc<str>,
    reserve: u64,
    prompt: AtomicU64,
    generated: AtomicU64,
    submitted: AtomicBool,
    snapshot: Snapshot,
}

impl Admission {
    /// The engine took the request, with this many prompt tokens.
    pub fn submitted(&self, prompt: u64) {
        self.prompt.store(prompt, Ordering::Relaxed);
        self.submitted.store(true, Ordering::Relaxed);
    }

    /// One more token generated.
    pub fn generated(&self) {
        self.generated.fetch_add(1, Ordering::Relaxed);
    }

    /// The rate-limit headers as of the admission.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        headers(&self.snapshot)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let used = if self.submitted.load(Ordering::Relaxed) {
            self.prompt.load(Ordering::Relaxed) + self.generated.load(Ordering::Relaxed)
        } else {
            0
        };
        self.store.settle(&self.tenant, self.reserve, used);
    }
}

/// The interceptor that checks `authorization: Bearer <key>` (scheme in
/// any case, keys compared in constant time) and attaches the tenant.
#[derive(Clone)]
pub struct Authenticate {
    auth: Auth,
}

impl Authenticate {
    pub fn new(auth: Auth) -> Self {
        Self { auth }
    }
}

const MISSING: &str =
    "missing API key: send `Authorization: Bearer <key>` (gRPC metadata `authorization`)";

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match &self.auth {
            Auth::Open => Ok(req),
            Auth::Key(key) => match got {
                Some(got) if gyre_api::auth::bearer_matches(got, key) => Ok(req),
                Some(_) => Err(Status::unauthenticated("invalid API key")),
                None => Err(Status::unauthenticated(MISSING)),
            },
            Auth::Keys(store) => {
                let Some(token) = got.and_then(gyre_api::auth::bearer_token) else {
                    return Err(Status::unauthenticated(MISSING));
                };
                let Some(policy) = store.current().find(token) else {
                    return Err(Status::unauthenticated("invalid API key"));
                };
                req.extensions_mut().insert(policy.tenant.clone());
                req.extensions_mut().insert(Caller {
                    policy,
                    store: store.clone(),
                });
                Ok(req)
            }
        }
    }
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
