//! The `gyre.v1.Generation` service over the engine.
//!
//! Each request runs in its own task: engine token events in, incremental
//! detokenizing and stop strings, typed events out through a bounded channel.
//! A failed send means the client left: the task ends, dropping the engine's
//! event receiver, which cancels the sequence at the engine's next step.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gyre_api::v1::{
    self, DetokenizeRequest, DetokenizeResponse, FinishReason, GenerateRequest, GenerateResponse,
    ListModelsRequest, ListModelsResponse, TokenizeRequest, TokenizeResponse,
    generate_response::Event as Ev, generation_server::Generation, tokenize_request,
};
use gyre_engine::{Event, FinishReason as EngineFinish};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::detok::IncrementalDecoder;
use crate::error::ServiceError;
use crate::reasoning::Splitter;
use crate::request::{self, Prepared};
use crate::runtime::ModelRuntime;
use crate::stop::{StopMatcher, StopOutcome};
use crate::tools::{ParsedCall, ToolFormat, ToolStream};

pub(crate) type Out = mpsc::Sender<Result<GenerateResponse, Status>>;
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// Events buffered per stream before the producer waits for the client.
pub(crate) const STREAM_BUFFER: usize = 64;

#[derive(Clone)]
pub struct GenerationService {
    models: Arc<Vec<Arc<ModelRuntime>>>,
    /// True once the server drains for shutdown: new requests get
    /// UNAVAILABLE, those already running finish.
    draining: tokio::sync::watch::Receiver<bool>,
}

impl GenerationService {
    pub fn new(
        models: Vec<Arc<ModelRuntime>>,
        draining: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            models: Arc::new(models),
            draining,
        }
    }

    /// Validates and submits a request; one event receiver per choice.
    pub(crate) async fn prepare(
        &self,
        req: v1::Request,
    ) -> Result<(Arc<Prepared>, Vec<Choice>), ServiceError> {
        if *self.draining.borrow() {
            return Err(ServiceError::Draining);
        }
        let models = self.models.clone();
        let prepared = tokio::task::spawn_blocking(move || request::prepare(&models, &req))
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))??;
        let rxs = prepared
            .model
            .engine
            .submit_n(prepared.engine_req.clone(), prepared.n)?;
        Ok((Arc::new(prepared), rxs))
    }

    /// Runs every choice of a prepared request in its own task.
    pub(crate) fn spawn_choices(
        id: &str,
        p: Arc<Prepared>,
        choices: Vec<Choice>,
        out: &Out,
        cancel: &watch::Receiver<bool>,
        mode: Mode,
        deadline: Option<Instant>,
    ) {
        for (index, events) in choices.into_iter().enumerate() {
            let tag = Tag {
                id: id.to_string(),
                index: index as u32,
            };
            tokio::spawn(run(
                tag,
                p.clone(),
                events,
                out.clone(),
                cancel.clone(),
                mode,
                deadline,
            ));
        }
    }
}

/// One choice's engine events.
type Choice = mpsc::UnboundedReceiver<Event>;

/// Which request and choice an event belongs to.
pub(crate) struct Tag {
    pub(crate) id: String,
    pub(crate) index: u32,
}

fn event(tag: &Tag, ev: Ev) -> GenerateResponse {
    GenerateResponse {
        request_id: tag.id.clone(),
        index: tag.index,
        event: Some(ev),
    }
}

pub(crate) fn request_error(e: &ServiceError) -> v1::RequestError {
    let (code, reason, field, message) = e.parts();
    v1::RequestError {
        code: code as i32,
        message: crate::error::bounded(message, crate::error::MAX_MESSAGE_BYTES),
        reason: reason.to_string(),
        field: field.unwrap_or_default(),
    }
}

/// How a request's failure is reported: a `Finish` with an error on the
/// multiplexed stream, or the call's status on a single-request stream.
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    Multiplexed,
    Single,
}

/// Drives one request to its end. Returns when it finished, was cancelled,
/// or the client went away.
async fn run(
    tag: Tag,
    p: Arc<Prepared>,
    mut events: Choice,
    out: Out,
    mut cancel: watch::Receiver<bool>,
    mode: Mode,
    deadline: Option<Instant>,
) {
    let id = &tag.id;
    let expired = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let tok = p.model.tokenizer.clone();
    let mut detok = IncrementalDecoder::new(p.skip_special);
    let mut stops = StopMatcher::new(p.stop.clone());
    let mut tools = ToolSplit::new(p.tool_format);
    // Stop strings apply to the whole output (reasoning too, as in vLLM);
    // what they release is then split into reasoning and answer.
    let mut reasoning = p.reasoning.map(|r| r.splitter());
    let prompt_tokens = p.engine_req.prompt.len() as u32;
    let mut generated = 0u32;
    let mut cached = 0u32;
    let mut pending_logprobs: Option<v1::TokenLogprob> = None;
    let mut prompt_logprobs: Vec<v1::TokenLogprob> = Vec::new();
    let usage = |completion, cached, r: &Option<Splitter>| v1::Usage {
        prompt_tokens,
        completion_tokens: completion,
        cached_tokens: cached,
        reasoning_tokens: r.as_ref().map(Splitter::reasoning_tokens),
    };
    let finish = |reason: FinishReason,
                  u: v1::Usage,
                  stop: Option<String>,
                  stop_id: Option<u32>| v1::Finish {
        reason: reason as i32,
        usage: Some(u),
        matched_stop: stop,
        matched_stop_token_id: stop_id,
        error: None,
    };
    loop {
        let ev = tokio::select! {
            biased;
            _ = cancelled(&mut cancel) => {
                let f = finish(FinishReason::Cancelled, usage(generated, cached, &reasoning), None, None);
                let _ = out.send(Ok(event(&tag, Ev::Finish(f)))).await;
                return;
            }
            // The call's deadline (grpc-timeout) passed: end it, which also
            // cancels the sequence in the engine.
            _ = &mut expired => {
                fail(&tag, &out, mode, ServiceError::DeadlineExceeded(generated)).await;
                return;
            }
            // The client went away: returning drops `events`, which cancels
            // the sequence in the engine.
            _ = out.closed() => {
                tracing::info!(request_id = %id, generated, "client went away; request cancelled");
                return;
            }
            ev = events.recv() => ev,
        };
        let msg = match ev {
            Some(Event::Prefilled { cached_tokens }) => {
                cached = cached_tokens;
                let Some(text) = p.echo.clone() else {
                    continue;
                };
                let first_token = match p.engine_req.prompt_logprobs {
                    Some(_) => p.engine_req.prompt.first().map_or_else(String::new, |&t| {
                        tok.decode(&[t], false).unwrap_or_default()
                    }),
                    None => String::new(),
                };
                event(
                    &tag,
                    Ev::Prompt(v1::PromptEcho {
                        text,
                        token_ids: p.engine_req.prompt.clone(),
                        logprobs: std::mem::take(&mut prompt_logprobs),
                        first_token,
                    }),
                )
            }
            Some(Event::PromptLogprobs(list)) => {
                prompt_logprobs.extend(list.into_iter().map(|lp| token_logprob(&tok, lp)));
                continue;
            }
            Some(Event::Logprobs(lp)) => {
                pending_logprobs = Some(token_logprob(&tok, lp));
                continue;
            }
            Some(Event::Token(t)) => {
                generated += 1;
                if p.engine_req.stop_token_ids.contains(&t) || is_eos(&p, t) {
                    // The stop token's text is never shown; Finished follows.
                    continue;
                }
                let piece = match detok.push(&tok, t) {
                    Ok(s) => s,
                    Err(e) => {
                        fail(
                            &tag,
                            &out,
                            mode,
                            ServiceError::Internal(format!("detokenize: {e}")),
                        )
                        .await;
                        return;
                    }
                };
                match stops.push(&piece) {
                    StopOutcome::Continue(text) => {
                        let (text, thought) = route(&mut reasoning, text, 1, false);
                        let (text, tool_calls) = tools.split(text);
                        event(
                            &tag,
                            Ev::Delta(v1::Delta {
                                text,
                                token_ids: vec![t],
                                logprobs: pending_logprobs.take().into_iter().collect(),
                                tool_calls,
                                reasoning: thought,
                            }),
                        )
                    }
                    StopOutcome::Stopped(mut text, s) => {
                        if p.include_stop {
                            text.push_str(&s);
                        }
                        let (text, thought) = route(&mut reasoning, text, 1, true);
                        let (text, tool_calls) = tools.split_last(text);
                        if out
                            .send(Ok(event(
                                &tag,
                                Ev::Delta(v1::Delta {
                                    text,
                                    reasoning: thought,
                                    token_ids: vec![t],
                                    logprobs: pending_logprobs.take().into_iter().collect(),
                                    tool_calls,
                                }),
                            )))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let f = finish(
                            tools.stop_reason(),
                            usage(generated, cached, &reasoning),
                            Some(s),
                            None,
                        );
                        let _ = out.send(Ok(event(&tag, Ev::Finish(f)))).await;
                        return;
                    }
                }
            }
            Some(Event::Finished { reason, usage: u }) => {
                let mut tail = detok.flush(&tok).unwrap_or_default();
                let (tail_calls, tail_thought);
                match stops.push(&tail) {
                    StopOutcome::Continue(t) => {
                        let (answer, thought) = route(&mut reasoning, t + &stops.finish(), 0, true);
                        tail_thought = thought;
                        (tail, tail_calls) = tools.split_last(answer);
                    }
                    StopOutcome::Stopped(mut t, s) => {
                        if p.include_stop {
                            t.push_str(&s);
                        }
                        let (t, thought) = route(&mut reasoning, t, 0, true);
                        let (text, tool_calls) = tools.split_last(t);
                        let _ = out
                            .send(Ok(event(
                                &tag,
                                Ev::Delta(v1::Delta {
                                    text,
                                    reasoning: thought,
                                    token_ids: vec![],
                                    logprobs: vec![],
                                    tool_calls,
                                }),
                            )))
                            .await;
                        let f = finish(
                            tools.stop_reason(),
                            usage(u.completion_tokens, u.cached_tokens, &reasoning),
                            Some(s),
                            None,
                        );
                        let _ = out.send(Ok(event(&tag, Ev::Finish(f)))).await;
                        return;
                    }
                }
                if !(tail.is_empty() && tail_thought.is_empty() && tail_calls.is_empty())
                    && out
                        .send(Ok(event(
                            &tag,
                            Ev::Delta(v1::Delta {
                                text: tail,
                                reasoning: tail_thought,
                                token_ids: vec![],
                                logprobs: vec![],
                                tool_calls: tail_calls,
                            }),
                        )))
                        .await
                        .is_err()
                {
                    return;
                }
                let f = match reason {
                    EngineFinish::Stop(t) => finish(
                        tools.stop_reason(),
                        usage(u.completion_tokens, u.cached_tokens, &reasoning),
                        None,
                        Some(t),
                    ),
                    EngineFinish::Length => finish(
                        FinishReason::Length,
                        usage(u.completion_tokens, u.cached_tokens, &reasoning),
                        None,
                        None,
                    ),
                };
                let _ = out.send(Ok(event(&tag, Ev::Finish(f)))).await;
                return;
            }
            Some(Event::Failed(e)) => {
                fail(&tag, &out, mode, ServiceError::Engine(e)).await;
                return;
            }
            None => {
                fail(
                    &tag,
                    &out,
                    mode,
                    ServiceError::Internal("engine dropped the request".into()),
                )
                .await;
                return;
            }
        };
        if out.send(Ok(msg)).await.is_err() {
            tracing::info!(request_id = %id, generated, "client went away; request cancelled");
            return;
        }
    }
}

/// Tool calls parsed out of one choice's text (when the request has tools).
struct ToolSplit {
    stream: Option<(ToolFormat, ToolStream)>,
    calls: u32,
}

impl ToolSplit {
    fn new(format: Option<ToolFormat>) -> Self {
        Self {
            stream: format.map(|f| (f, ToolStream::new(f))),
            calls: 0,
        }
    }

    fn typed(&mut self, format: ToolFormat, calls: Vec<ParsedCall>) -> Vec<v1::ToolCallDelta> {
        calls
            .into_iter()
            .map(|c| {
                let index = self.calls;
                self.calls += 1;
                v1::ToolCallDelta {
                    index,
                    id: format.call_id(),
                    name: c.name,
                    arguments: c.arguments,
                }
            })
            .collect()
    }

    /// Content and completed calls of new text.
    fn split(&mut self, text: String) -> (String, Vec<v1::ToolCallDelta>) {
        let Some((format, stream)) = self.stream.as_mut() else {
            return (text, Vec::new());
        };
        let format = *format;
        let (content, calls) = stream.push(&text);
        (content, self.typed(format, calls))
    }

    /// The same for the output's last text, flushing what was held back.
    fn split_last(&mut self, text: String) -> (String, Vec<v1::ToolCallDelta>) {
        let (mut content, mut calls) = self.split(text);
        if let Some((format, stream)) = self.stream.as_mut() {
            let format = *format;
            let (c, k) = stream.finish();
            content.push_str(&c);
            calls.extend(self.typed(format, k));
        }
        (content, calls)
    }

    /// A normal end is TOOL_CALLS once the model made calls.
    fn stop_reason(&self) -> FinishReason {
        if self.calls > 0 {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        }
    }
}

/// Splits released text (of `tokens` generated tokens) into answer and
/// reasoning; `last`: the output ends here, release everything.
fn route(r: &mut Option<Splitter>, text: String, tokens: u32, last: bool) -> (String, String) {
    let Some(s) = r else {
        return (text, String::new());
    };
    let mut out = s.push(&text, tokens);
    if last {
        let rest = s.finish();
        out.content.push_str(&rest.content);
        out.reasoning.push_str(&rest.reasoning);
    }
    (out.content, out.reasoning)
}

/// A token's log-probabilities for the API, with each token's text.
fn token_logprob(tok: &tokenizers::Tokenizer, lp: gyre_engine::TokenLogprobs) -> v1::TokenLogprob {
    let text = |id: u32| tok.decode(&[id], false).unwrap_or_default();
    v1::TokenLogprob {
        token_id: lp.token,
        logprob: lp.logprob,
        token: text(lp.token),
        top_logprobs: lp
            .top
            .into_iter()
            .map(|(id, logprob)| v1::TopLogprob {
                token_id: id,
                logprob,
                token: text(id),
            })
            .collect(),
    }
}

/// Resolves when the request's cancel switch is set (or its owner is gone).
async fn cancelled(switch: &mut watch::Receiver<bool>) {
    let _ = switch.wait_for(|c| *c).await;
}

fn is_eos(p: &Prepared, t: u32) -> bool {
    !p.engine_req.ignore_eos && p.model.engine.info().eos_token_ids.contains(&t)
}

pub(crate) async fn fail(tag: &Tag, out: &Out, mode: Mode, e: ServiceError) {
    let id = &tag.id;
    let _ = match mode {
        Mode::Single => out.send(Err(e.into())).await,
        Mode::Multiplexed => {
            if let (tonic::Code::Internal, ..) = e.parts() {
                tracing::error!(request_id = id, error = %e, "request failed");
            }
            let f = v1::Finish {
                reason: FinishReason::Error as i32,
                usage: None,
                matched_stop: None,
                matched_stop_token_id: None,
                error: Some(request_error(&e)),
            };
            out.send(Ok(event(tag, Ev::Finish(f)))).await
        }
    };
}

/// When the call must end, from its `grpc-timeout` header (gRPC's wire
/// format: up to 8 digits and a unit, H M S m u n). None without one.
fn deadline_of(meta: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let v = meta.get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(v)?;
    Some(Instant::now() + timeout)
}

fn parse_grpc_timeout(v: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[tonic::async_trait]
impl Generation for GenerationService {
    type GenerateStream = EventStream;
    type GenerateStreamStream = EventStream;

    async fn generate(
        &self,
        request: Request<Streaming<GenerateRequest>>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // The call's deadline bounds every request on the stream.
        let deadline = deadline_of(request.metadata());
        Ok(Response::new(crate::multiplex::serve(
            self.clone(),
            request.into_inner(),
            deadline,
        )))
    }

    async fn generate_stream(
        &self,
        request: Request<v1::Request>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let deadline = deadline_of(request.metadata());
        let mut req = request.into_inner();
        if req.request_id.is_empty() {
            req.request_id = format!("req-{:016x}", rand_id());
        }
        let id = req.request_id.clone();
        let (p, choices) = self.prepare(req).await?;
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let (cancel_tx, cancel_rx) = watch::channel(false);
        GenerationService::spawn_choices(&id, p, choices, &out, &cancel_rx, Mode::Single, deadline);
        // Nothing cancels a single-request stream but the client leaving
        // (noticed by each choice through its output channel); keep the
        // switch alive until every choice is done.
        tokio::spawn(async move { cancel_tx.closed().await });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn tokenize(
        &self,
        request: Request<TokenizeRequest>,
    ) -> Result<Response<TokenizeResponse>, Status> {
        let req = request.into_inner();
        let models = self.models.clone();
        let resp =
            tokio::task::spawn_blocking(move || -> Result<TokenizeResponse, ServiceError> {
                let model = request::resolve(&models, &req.model)?;
                let (prompt, ids) = match &req.input {
                    Some(tokenize_request::Input::Text(t)) => (
                        t.clone(),
                        model.encode(t, req.add_special_tokens.unwrap_or(true))?,
                    ),
                    Some(tokenize_request::Input::Chat(c)) => {
                        let text = crate::chat::render_chat_input(&model, c)?;
                        let ids = model.encode(&text, false)?;
                        (text, ids)
                    }
                    None => {
                        return Err(ServiceError::invalid(
                            "input",
                            "MISSING_INPUT",
                            "text or chat is required",
                        ));
                    }
                };
                Ok(TokenizeResponse {
                    token_ids: ids,
                    max_model_len: model.engine.info().max_model_len,
                    prompt,
                })
            })
            .await
            .map_err(|e| Status::from(ServiceError::Internal(e.to_string())))??;
        Ok(Response::new(resp))
    }

    async fn detokenize(
        &self,
        request: Request<DetokenizeRequest>,
    ) -> Result<Response<DetokenizeResponse>, Status> {
        let req = request.into_inner();
        let model = request::resolve(&self.models, &req.model)?;
        let text = model.decode(&req.token_ids, req.skip_special_tokens.unwrap_or(true))?;
        Ok(Response::new(DetokenizeResponse { text }))
    }

    async fn get_stats(
        &self,
        request: Request<v1::GetStatsRequest>,
    ) -> Result<Response<v1::EngineStats>, Status> {
        let model = request::resolve(&self.models, &request.into_inner().model)?;
        let s = model.engine.stats();
        Ok(Response::new(v1::EngineStats {
            model: model.id.clone(),
            waiting: s.waiting,
            running: s.running,
            block_size: s.block_size,
            kv_blocks_total: s.kv_blocks_total,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_cached: s.kv_blocks_cached,
            prefix_query_tokens_total: s.prefix_query_tokens_total,
            prefix_hit_tokens_total: s.prefix_hit_tokens_total,
            last_step_tokens: s.last_step_tokens,
            steps_total: s.steps_total,
            preemptions_total: s.preemptions_total,
            generated_tokens_total: s.generated_tokens_total,
        }))
    }

    async fn list_models(
        &self,
        _: Request<ListModelsRequest>,
    ) -> Result<Response<ListModelsResponse>, Status> {
        let models = self
            .models
            .iter()
            .map(|m| v1::Model {
                id: m.id.clone(),
                owned_by: m.owned_by.clone(),
                created: m.created,
                max_model_len: m.engine.info().max_model_len,
                vocab_size: m.engine.info().vocab_size,
                architecture: m.engine.info().architecture.clone(),
            })
            .collect();
        Ok(Response::new(ListModelsResponse { models }))
    }
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::parse_grpc_timeout;
    use std::time::Duration;

    #[test]
    fn grpc_timeout_header_parses_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "123456789S", "5x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
