//! The models one server serves: a catalogue of entries, each a model of
//! some kind (generative, [`ModelKind::Generate`], or a sentence-embedding
//! encoder, [`ModelKind::Embed`]) with its catalogue card (id, aliases,
//! pinned version, owner, creation time, deprecation and sunset dates).
//! Requests resolve a name or alias here; the admin service inserts and
//! removes entries while the server runs, and the per-model
//! grpc.health.v1 statuses follow.
//!
//! Each route asks for the kind it serves ([`Registry::runtime`],
//! [`Registry::embedder`]): a name of the other kind is a 400
//! (`WRONG_MODEL_KIND`, naming `model`), not an unknown model, and an empty
//! name is the first model of the kind asked for.

pub mod load;
pub mod memory;
pub mod spec;
pub mod speculative;

use std::sync::{Arc, OnceLock, RwLock};

use gyre_api::v1;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::embeddings::EmbeddingRuntime;
use crate::error::ServiceError;
use crate::runtime::ModelRuntime;

/// What an entry serves.
pub enum ModelKind {
    /// Chat and completions (and tokenize / detokenize).
    Generate(Arc<ModelRuntime>),
    /// Embeddings.
    Embed(Arc<EmbeddingRuntime>),
}

/// The error for a request that names a model of the other kind.
pub fn wrong_kind(model: &str, wanted: &str, is: &str) -> ServiceError {
    ServiceError::invalid(
        "model",
        "WRONG_MODEL_KIND",
        format!(
            "the model `{}` is {is} model; this endpoint needs {wanted} model",
            gyre_api::clip(model)
        ),
    )
}

/// A model's catalogue entry.
#[derive(Debug, Clone, Default)]
pub struct Card {
    pub id: String,
    pub aliases: Vec<String>,
    pub version: String,
    pub owned_by: String,
    /// Unix seconds.
    pub created: i64,
    /// Unix seconds.
    pub deprecation: Option<i64>,
    /// Unix seconds.
    pub sunset: Option<i64>,
    /// Where it was loaded from.
    pub source: String,
    /// Bytes its budget reserves (weights and KV cache), for admission of
    /// later models.
    pub reserved_bytes: u64,
    /// Of which the KV cache (a draft model's pool included).
    pub kv_bytes: u64,
    /// Its draft model's path, as given, when it has one.
    pub draft: Option<String>,
}

/// One served model.
pub struct Entry {
    pub card: Card,
    pub kind: ModelKind,
}

impl Entry {
    /// An entry for a generative runtime whose card says nothing beyond the
    /// runtime's own id, owner and creation time.
    pub fn generative(rt: Arc<ModelRuntime>) -> Self {
        Self {
            card: Card {
                id: rt.id.clone(),
                owned_by: rt.owned_by.clone(),
                created: rt.created,
                ..Card::default()
            },
            kind: ModelKind::Generate(rt),
        }
    }

    /// An entry for an embedding runtime, with nothing beyond its id,
    /// owner and creation time on the card.
    pub fn embedding(rt: Arc<EmbeddingRuntime>) -> Self {
        Self {
            card: Card {
                id: rt.id.clone(),
                owned_by: rt.owned_by.clone(),
                created: rt.created,
                ..Card::default()
            },
            kind: ModelKind::Embed(rt),
        }
    }

    /// The generative runtime; an embedding model has none.
    pub fn generative_runtime(&self) -> Result<&Arc<ModelRuntime>, ServiceError> {
        match &self.kind {
            ModelKind::Generate(rt) => Ok(rt),
            ModelKind::Embed(_) => Err(wrong_kind(&self.card.id, "a generative", "an embedding")),
        }
    }

    /// The embedding runtime; a generative model has none.
    pub fn embedding_runtime(&self) -> Result<&Arc<EmbeddingRuntime>, ServiceError> {
        match &self.kind {
            ModelKind::Embed(rt) => Ok(rt),
            ModelKind::Generate(_) => {
                Err(wrong_kind(&self.card.id, "an embedding", "a generative"))
            }
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ModelKind::Generate(_) => "generate",
            ModelKind::Embed(_) => "embed",
        }
    }

    /// Whether the model has no request running or waiting.
    pub fn is_idle(&self) -> bool {
        let (running, waiting) = self.load();
        running == 0 && waiting == 0
    }

    /// Requests running and waiting (an embedding model counts its queued
    /// calls as waiting).
    pub fn load(&self) -> (u32, u32) {
        match &self.kind {
            ModelKind::Generate(rt) => {
                let s = rt.engine.stats();
                (s.running, s.waiting)
            }
            ModelKind::Embed(rt) => (0, rt.engine.stats().pending),
        }
    }

    /// Waits until the model has no request running or waiting.
    pub async fn wait_idle(&self) {
        match &self.kind {
            ModelKind::Generate(rt) => {
                rt.engine
                    .wait_stats(|s| s.running == 0 && s.waiting == 0)
                    .await;
            }
            ModelKind::Embed(rt) => rt.engine.wait_idle().await,
        }
    }

    /// The id and every alias.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.card.id.as_str()).chain(self.card.aliases.iter().map(String::as_str))
    }

    pub fn answers_to(&self, name: &str) -> bool {
        self.names().any(|n| n == name)
    }

    /// The `deprecation` (RFC 9745: `@<unix seconds>`) and `sunset`
    /// (RFC 8594: an HTTP date) header values of this model, when set.
    pub fn notice(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(d) = self.card.deprecation {
            out.push(("deprecation", format!("@{d}")));
        }
        if let Some(s) = self.card.sunset {
            out.push(("sunset", http_date(s)));
        }
        out
    }

    /// The catalogue entry as `gyre.v1.Model`.
    pub fn to_proto(&self) -> v1::Model {
        let c = &self.card;
        let mut m = v1::Model {
            id: c.id.clone(),
            owned_by: c.owned_by.clone(),
            created: c.created,
            aliases: c.aliases.clone(),
            version: c.version.clone(),
            deprecation: c.deprecation,
            sunset: c.sunset,
            kind: self.kind_name().into(),
            ..Default::default()
        };
        match &self.kind {
            ModelKind::Generate(rt) => {
                let info = rt.engine.info();
                m.max_model_len = info.max_model_len;
                m.vocab_size = info.vocab_size;
                m.architecture = info.architecture.clone();
                m.chat = rt.template.is_some();
            }
            ModelKind::Embed(rt) => {
                let info = rt.engine.info();
                m.max_model_len = info.max_seq_length;
                m.vocab_size = info.vocab_size;
                m.architecture = info.architecture.clone();
            }
        }
        m
    }
}

/// An HTTP date (IMF-fixdate, RFC 9110) of Unix seconds; times before 1970
/// are given as the epoch.
pub fn http_date(unix: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0).unsigned_abs());
    httpdate::fmt_http_date(t)
}

/// The served models, in order (the first is the default for `model: ""`).
#[derive(Default)]
pub struct Registry {
    entries: RwLock<Vec<Arc<Entry>>>,
    /// Per-model health, attached when the gRPC routes are built.
    health: OnceLock<HealthReporter>,
}

impl Registry {
    /// A registry of `entries`; every id and alias must be unique.
    pub fn new(entries: Vec<Entry>) -> Result<Self, ServiceError> {
        let reg = Self::default();
        {
            let mut list = reg.write();
            for e in entries {
                if let Some(taken) = e.names().find(|n| list.iter().any(|o| o.answers_to(n))) {
                    return Err(ServiceError::ModelExists(taken.to_string()));
                }
                if let Some(dup) = e.card.aliases.iter().find(|a| **a == e.card.id) {
                    return Err(ServiceError::ModelExists(dup.clone()));
                }
                list.push(Arc::new(e));
            }
        }
        Ok(reg)
    }

    /// A registry of `entries` as given (a repeated name resolves to the
    /// first entry that has it).
    pub fn unchecked(entries: Vec<Entry>) -> Self {
        Self {
            entries: RwLock::new(entries.into_iter().map(Arc::new).collect()),
            health: OnceLock::new(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Entry>>> {
        self.entries.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<Entry>>> {
        self.entries.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every model, in order.
    pub fn list(&self) -> Vec<Arc<Entry>> {
        self.read().clone()
    }

    /// The model `name` (an id or alias; "" is the first model). A
    /// deprecated model still resolves, with a warning in the log.
    pub fn resolve(&self, name: &str) -> Result<Arc<Entry>, ServiceError> {
        self.resolve_where(name, |_| true)
    }

    /// The model `name` for a route that serves `kind` ("generate" or
    /// "embed"): "" is the first model of that kind (or, with none, the
    /// first model, which the route then refuses as the wrong kind).
    pub fn resolve_kind(&self, name: &str, kind: &str) -> Result<Arc<Entry>, ServiceError> {
        self.resolve_where(name, |e| e.kind_name() == kind)
    }

    fn resolve_where(
        &self,
        name: &str,
        first: impl Fn(&Entry) -> bool,
    ) -> Result<Arc<Entry>, ServiceError> {
        let list = self.read();
        let found = if name.is_empty() {
            list.iter().find(|e| first(e)).or_else(|| list.first())
        } else {
            list.iter().find(|e| e.answers_to(name))
        };
        let entry = found
            .cloned()
            .ok_or_else(|| ServiceError::ModelNotFound(name.to_string()))?;
        drop(list);
        if let Some(d) = entry.card.deprecation {
            tracing::warn!(
                model = %entry.card.id,
                requested = %gyre_api::clip(name),
                deprecation = %http_date(d),
                sunset = entry.card.sunset.map(http_date),
                "request for a deprecated model"
            );
        }
        Ok(entry)
    }

    /// The generative runtime of `name`.
    pub fn runtime(&self, name: &str) -> Result<Arc<ModelRuntime>, ServiceError> {
        self.resolve_kind(name, "generate")?
            .generative_runtime()
            .cloned()
    }

    /// The entry and embedding runtime of `name`.
    pub fn embedder(
        &self,
        name: &str,
    ) -> Result<(Arc<Entry>, Arc<EmbeddingRuntime>), ServiceError> {
        let entry = self.resolve_kind(name, "embed")?;
        let rt = entry.embedding_runtime()?.clone();
        Ok((entry, rt))
    }

    /// Bytes promised to the models served.
    pub fn reserved_bytes(&self) -> u64 {
        self.read().iter().map(|e| e.card.reserved_bytes).sum()
    }

    /// Whether `name` is free (no id or alias of a served model).
    pub fn check_free<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ServiceError> {
        let list = self.read();
        for n in names {
            if list.iter().any(|e| e.answers_to(n)) {
                return Err(ServiceError::ModelExists(n.to_string()));
            }
        }
        Ok(())
    }

    /// Serves `entry` (its names must be free) and reports it SERVING.
    pub async fn insert(&self, entry: Entry) -> Result<Arc<Entry>, ServiceError> {
        let entry = Arc::new(entry);
        {
            let mut list = self.write();
            if let Some(taken) = entry.names().find(|n| list.iter().any(|o| o.answers_to(n))) {
                return Err(ServiceError::ModelExists(taken.to_string()));
            }
            list.push(entry.clone());
        }
        self.set_health(&entry, ServingStatus::Serving).await;
        Ok(entry)
    }

    /// Stops resolving `name` (an id or alias) at once and clears its
    /// health; the caller drains what it was running.
    pub async fn remove(&self, name: &str) -> Result<Arc<Entry>, ServiceError> {
        let entry = {
            let mut list = self.write();
            let i = list
                .iter()
                .position(|e| e.answers_to(name))
                .ok_or_else(|| ServiceError::ModelNotFound(name.to_string()))?;
            list.remove(i)
        };
        if let Some(h) = self.health.get() {
            let mut h = h.clone();
            for n in entry.names() {
                h.clear_service_status(n).await;
            }
        }
        Ok(entry)
    }

    /// Waits until no model served has a request running or waiting.
    pub async fn wait_idle(&self) {
        for e in self.list() {
            e.wait_idle().await;
        }
    }

    /// Attaches the health reporter and reports every model SERVING.
    pub async fn attach_health(&self, health: HealthReporter) {
        if self.health.set(health).is_err() {
            return;
        }
        for e in self.list() {
            self.set_health(&e, ServingStatus::Serving).await;
        }
    }

    /// Reports every model NOT_SERVING (the server drains).
    pub async fn all_not_serving(&self) {
        for e in self.list() {
            self.set_health(&e, ServingStatus::NotServing).await;
        }
    }

    async fn set_health(&self, entry: &Entry, status: ServingStatus) {
        if let Some(h) = self.health.get() {
            for n in entry.names() {
                h.set_service_status(n, status).await;
            }
        }
    }
}
