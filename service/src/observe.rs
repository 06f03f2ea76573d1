//! What the service records about each request (a `GenerateStream` call,
//! each request started on a `Generate` stream, a Responses `Create`, an
//! `Embed` call): one `gyre::request` log line when it ends and, with
//! tracing on, its span and the engine's spans under it.
//!
//! A [`RequestObs`] is made when the call arrives (request id from the
//! `x-request-id` metadata or a fresh UUID, tenant, parent trace context
//! from `traceparent`), shared by the call's choice tasks, and does its
//! work when the last of them drops it. Each choice task keeps a
//! [`ChoiceRecorder`] that notes the instants the engine's events arrive
//! (the engine reports when it started the sequence's prefill); nothing
//! is traced live through the engine thread: the spans are built at the end
//! with explicit start and end times.
//!
//! Span attributes follow the OpenTelemetry GenAI semantic conventions.
//! Prompt and output text are kept (and logged) only with `--log-prompts`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use gyre_api::v1;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};

use crate::tenant::Tenant;

/// Process-wide settings, set once by the binary (off until then).
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Make spans (the binary installed an exporter).
    pub trace: bool,
    /// Put prompts and outputs in the request log line.
    pub log_prompts: bool,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Sets the process's [`Config`] (the first call wins).
pub fn configure(config: Config) {
    let _ = CONFIG.set(config);
}

fn config() -> Config {
    CONFIG.get().copied().unwrap_or_default()
}

/// The request-id metadata key (both ways).
pub const REQUEST_ID: &str = "x-request-id";

/// The request id a call carries, if usable (1 to 128 visible ASCII bytes).
fn given_id(meta: &tonic::metadata::MetadataMap) -> Option<String> {
    let s = meta.get(REQUEST_ID)?.to_str().ok()?;
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| s.to_owned())
}

struct MetaCarrier<'a>(&'a tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Extractor for MetaCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        ["traceparent", "tracestate"]
            .into_iter()
            .filter(|k| self.0.contains_key(*k))
            .collect()
    }
}

/// The parent trace context of a call's requests when tracing is on (see
/// [`RequestObs::child`]).
pub(crate) fn parent_for(meta: &tonic::metadata::MetadataMap) -> Option<Context> {
    config().trace.then(|| parent_of(meta))
}

/// The parent trace context a call's metadata carries (W3C).
fn parent_of(meta: &tonic::metadata::MetadataMap) -> Context {
    use opentelemetry::propagation::TextMapPropagator as _;
    opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&MetaCarrier(meta))
}

/// One choice's figures, as its task saw them.
#[derive(Default)]
struct ChoiceFigures {
    index: u32,
    started: Option<Instant>,
    prefilled: Option<Instant>,
    first_token: Option<Instant>,
    finished: Option<Instant>,
    detokenize: Duration,
    output_tokens: u32,
    finish_reason: Option<&'static str>,
    error: Option<tonic::Code>,
    text: String,
}

#[derive(Default)]
struct State {
    model: String,
    response_model: Option<String>,
    response_id: String,
    operation: &'static str,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    input_tokens: u32,
    prompt: Option<String>,
    submitted: Option<Instant>,
    error: Option<(tonic::Code, String)>,
    choices: Vec<ChoiceFigures>,
}

/// One call's record (see the module's comment).
pub(crate) struct RequestObs {
    /// The call's request id (returned as `x-request-id`).
    pub(crate) id: String,
    method: &'static str,
    tenant: Arc<str>,
    start: Instant,
    start_wall: SystemTime,
    parent: Option<Context>,
    config: Config,
    state: Mutex<State>,
}

impl RequestObs {
    /// The record of a call to `method` as it arrives.
    pub(crate) fn start<T>(req: &tonic::Request<T>, method: &'static str) -> Self {
        let id = given_id(req.metadata()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let parent = parent_for(req.metadata());
        Self::child(id, Tenant::of(req).name, parent, method)
    }

    /// The record of one of a call's requests (`id`: the request's own),
    /// under the call's `parent` context ([`parent_for`]).
    pub(crate) fn child(
        id: String,
        tenant: Arc<str>,
        parent: Option<Context>,
        method: &'static str,
    ) -> Self {
        let config = config();
        Self {
            id,
            method,
            tenant,
            start: Instant::now(),
            start_wall: SystemTime::now(),
            parent: parent.filter(|_| config.trace),
            config,
            state: Mutex::new(State::default()),
        }
    }

    /// Notes what a request that is not a `v1::Request` asks for: its
    /// GenAI operation, model and response id.
    pub(crate) fn describe(&self, operation: &'static str, model: &str, response_id: &str) {
        self.with(|s| {
            s.operation = operation;
            model.clone_into(&mut s.model);
            response_id.clone_into(&mut s.response_id);
        });
    }

    /// Notes an embedding request's model and its input tokens (it has no
    /// choices and no output tokens).
    pub(crate) fn embedded(&self, model: &str, input_tokens: u32) {
        self.with(|s| {
            s.response_model = Some(model.to_owned());
            s.input_tokens = input_tokens;
        });
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> Option<R> {
        self.state.lock().ok().map(|mut s| f(&mut s))
    }

    /// Notes what the request asks for.
    pub(crate) fn request(&self, req: &v1::Request) {
        self.with(|s| {
            s.model.clone_from(&req.model);
            s.response_id.clone_from(&req.request_id);
            s.operation = match req.input {
                Some(v1::request::Input::Chat(_)) => "chat",
                _ => "text_completion",
            };
            s.max_tokens = req.max_tokens;
            s.temperature = req.sampling.as_ref().and_then(|p| p.temperature);
        });
    }

    /// Notes the model that serves it and its prompt (just submitted).
    pub(crate) fn prepared(&self, model: &str, p: &crate::request::Prepared) {
        let prompt = self
            .config
            .log_prompts
            .then(|| p.model.decode(&p.engine_req.prompt, false).ok())
            .flatten();
        self.with(|s| {
            s.response_model = Some(model.to_owned());
            s.input_tokens = p.engine_req.prompt.len() as u32;
            s.prompt = prompt;
            s.submitted = Some(Instant::now());
        });
    }

    /// Notes that the call failed before any choice ran.
    pub(crate) fn failed(&self, status: &tonic::Status) {
        self.with(|s| s.error = Some((status.code(), status.message().to_owned())));
    }

    /// [`Self::failed`], with the service's error.
    pub(crate) fn failed_with(&self, e: &crate::error::ServiceError) {
        let (code, _, _, message) = e.parts();
        self.with(|s| s.error = Some((code, message)));
    }

    /// Whether choices should time their detokenizing and keep their text.
    fn detailed(&self) -> (bool, bool) {
        (self.config.trace, self.config.log_prompts)
    }
}

impl Drop for RequestObs {
    fn drop(&mut self) {
        let end = Instant::now();
        let Ok(s) = self.state.get_mut() else {
            return;
        };
        let s = std::mem::take(s);
        let status = match (&s.error, s.choices.iter().find_map(|c| c.error)) {
            (Some((code, _)), _) => *code,
            (None, Some(code)) => code,
            (None, None) => tonic::Code::Ok,
        };
        let output_tokens: u32 = s.choices.iter().map(|c| c.output_tokens).sum();
        let reasons: Vec<&str> = s.choices.iter().filter_map(|c| c.finish_reason).collect();
        let finish_reason = reasons.join(",");
        let latency_ms = end.duration_since(self.start).as_secs_f64() * 1000.0;
        let model = s.response_model.as_deref().unwrap_or(&s.model);
        let output = self.config.log_prompts.then(|| {
            s.choices
                .iter()
                .map(|c| c.text.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        });
        tracing::info!(
            target: "gyre::request",
            request_id = %self.id,
            tenant = %self.tenant,
            model,
            method = self.method,
            status = ?status,
            latency_ms,
            input_tokens = s.input_tokens,
            output_tokens,
            finish_reason,
            error = s.error.as_ref().map(|e| e.1.as_str()),
            prompt = s.prompt.as_deref(),
            output = output.as_deref(),
            "request finished"
        );
        if let Some(parent) = self.parent.take() {
            self.spans(&s, parent, status, end, output_tokens, &reasons);
        }
    }
}

impl RequestObs {
    fn wall(&self, t: Instant) -> SystemTime {
        match t.checked_duration_since(self.start) {
            Some(d) => self.start_wall + d,
            None => self.start_wall - self.start.duration_since(t),
        }
    }

    /// The call's span and, under it, each choice's engine spans.
    fn spans(
        &self,
        s: &State,
        parent: Context,
        status: tonic::Code,
        end: Instant,
        output_tokens: u32,
        reasons: &[&str],
    ) {
        let tracer = opentelemetry::global::tracer("gyre");
        let model = s.response_model.clone().unwrap_or_else(|| s.model.clone());
        let operation = if s.operation.is_empty() {
            "text_completion"
        } else {
            s.operation
        };
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.request.model", s.model.clone()),
            KeyValue::new("gen_ai.usage.input_tokens", i64::from(s.input_tokens)),
            KeyValue::new("gen_ai.usage.output_tokens", i64::from(output_tokens)),
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.method", self.method),
            KeyValue::new("rpc.grpc.status_code", status as i64),
            KeyValue::new("gyre.request_id", self.id.clone()),
            KeyValue::new("gyre.tenant", self.tenant.to_string()),
        ];
        if let Some(m) = &s.response_model {
            attrs.push(KeyValue::new("gen_ai.response.model", m.clone()));
        }
        if !s.response_id.is_empty() {
            attrs.push(KeyValue::new("gen_ai.response.id", s.response_id.clone()));
        }
        if let Some(n) = s.max_tokens {
            attrs.push(KeyValue::new("gen_ai.request.max_tokens", i64::from(n)));
        }
        if let Some(t) = s.temperature {
            attrs.push(KeyValue::new("gen_ai.request.temperature", f64::from(t)));
        }
        if !reasons.is_empty() {
            let list: Vec<opentelemetry::StringValue> =
                reasons.iter().map(|r| (*r).to_owned().into()).collect();
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(list.into()),
            ));
        }
        let mut span = tracer
            .span_builder(format!("{operation} {model}"))
            .with_kind(SpanKind::Server)
            .with_start_time(self.start_wall)
            .with_attributes(attrs)
            .start_with_context(&tracer, &parent);
        if status != tonic::Code::Ok {
            let message = s
                .error
                .as_ref()
                .map_or_else(|| format!("{status:?}"), |e| e.1.clone());
            span.set_status(Status::error(message));
        }
        let cx = parent.with_span(span);
        for c in &s.choices {
            self.choice_spans(&tracer, &cx, s.submitted, c);
        }
        cx.span().end_with_timestamp(self.wall(end));
    }

    fn choice_spans(
        &self,
        tracer: &opentelemetry::global::BoxedTracer,
        cx: &Context,
        submitted: Option<Instant>,
        c: &ChoiceFigures,
    ) {
        let index = KeyValue::new("gen_ai.choice.index", i64::from(c.index));
        let emit = |name: &'static str, from: Option<Instant>, to: Option<Instant>| {
            if let (Some(from), Some(to)) = (from, to) {
                let mut span = tracer
                    .span_builder(name)
                    .with_kind(SpanKind::Internal)
                    .with_start_time(self.wall(from.min(to)))
                    .with_attributes([index.clone()])
                    .start_with_context(tracer, cx);
                span.end_with_timestamp(self.wall(to));
            }
        };
        let submitted = submitted.map(|t| c.started.map_or(t, |s| t.min(s)));
        emit("queue_wait", submitted, c.started);
        emit("prefill", c.started, c.prefilled);
        emit("first_token", submitted, c.first_token);
        emit("decode", c.first_token, c.finished);
        // Detokenizing is spread over the whole decode: the span starts at
        // the first token and lasts as long as all of it took.
        emit(
            "detokenize",
            c.first_token,
            c.first_token.map(|t| t + c.detokenize),
        );
    }
}

/// What one choice's task notes as it runs; hands it to the call's
/// [`RequestObs`] when dropped (however the task ends).
pub(crate) struct ChoiceRecorder {
    obs: Option<Arc<RequestObs>>,
    figures: ChoiceFigures,
    time_detok: bool,
    keep_text: bool,
}

impl ChoiceRecorder {
    pub(crate) fn new(obs: Option<Arc<RequestObs>>, index: u32) -> Self {
        let (time_detok, keep_text) = obs.as_ref().map_or((false, false), |o| o.detailed());
        Self {
            obs,
            figures: ChoiceFigures {
                index,
                ..ChoiceFigures::default()
            },
            time_detok,
            keep_text,
        }
    }

    /// The engine started the prefill at `started`; it is done now.
    pub(crate) fn prefilled(&mut self, started: Instant) {
        self.figures.started = Some(started);
        self.figures.prefilled = Some(Instant::now());
    }

    /// A token arrived.
    pub(crate) fn token(&mut self) {
        if self.figures.first_token.is_none() {
            self.figures.first_token = Some(Instant::now());
        }
    }

    /// Runs `f` (detokenizing), timing it when traced.
    pub(crate) fn detokenize<R>(&mut self, f: impl FnOnce() -> R) -> R {
        if !self.time_detok {
            return f();
        }
        let t = Instant::now();
        let r = f();
        self.figures.detokenize += t.elapsed();
        r
    }

    /// Output text, kept with `--log-prompts`.
    pub(crate) fn text(&mut self, text: &str) {
        if self.keep_text {
            self.figures.text.push_str(text);
        }
    }

    /// The choice finished normally.
    pub(crate) fn finished(&mut self, reason: v1::FinishReason, output_tokens: u32) {
        self.figures.finished = Some(Instant::now());
        self.figures.output_tokens = output_tokens;
        self.figures.finish_reason = Some(finish_name(reason));
    }

    /// The choice failed with `code`.
    pub(crate) fn failed(&mut self, code: tonic::Code, output_tokens: u32) {
        self.figures.finished = Some(Instant::now());
        self.figures.output_tokens = output_tokens;
        self.figures.error = Some(code);
    }
}

impl Drop for ChoiceRecorder {
    fn drop(&mut self) {
        if let Some(obs) = self.obs.take() {
            let figures = std::mem::take(&mut self.figures);
            obs.with(|s| s.choices.push(figures));
        }
    }
}

/// A finish reason as OpenAI (and the GenAI conventions) name it.
fn finish_name(r: v1::FinishReason) -> &'static str {
    match r {
        v1::FinishReason::Stop => "stop",
        v1::FinishReason::Length => "length",
        v1::FinishReason::ToolCalls => "tool_calls",
        v1::FinishReason::Cancelled => "cancelled",
        v1::FinishReason::Error => "error",
        _ => "unspecified",
    }
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
