//! One choice's task: engine events in, through the choice's output
//! [`Pipeline`], proto events out through a bounded channel.
//!
//! A failed send means the client left: the task ends, dropping the engine's
//! event receiver, which cancels the sequence at the engine's next step.

use std::sync::Arc;

use gyre_api::v1::{self, FinishReason, generate_response::Event as Ev};
use gyre_engine::{Event, FinishReason as EngineFinish};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::detok;
use crate::error::ServiceError;
use crate::grpc::{Mode, Out, Tag, event, fail};
use crate::metrics::ChoiceMetrics;
use crate::observe::ChoiceRecorder;
use crate::pipeline::{Config, Output, Pipeline};
use crate::request::Prepared;

/// One choice's engine events.
pub(crate) type Choice = mpsc::UnboundedReceiver<Event>;

fn pipeline_for(p: &Prepared) -> Pipeline {
    Pipeline::new(Config {
        skip_special: p.skip_special,
        stop: p.stop.clone(),
        include_stop: p.include_stop,
        reasoning: p.reasoning.as_ref().map(|r| r.splitter()),
        tool_format: p.tool_format,
        forced_tools: p.forced_tools,
        single_call: p.single_call,
        context: detok::context(&p.engine_req.prompt).to_vec(),
    })
}

/// A delta for what the pipeline released.
fn delta(out: Output, token_ids: Vec<u32>, logprobs: Option<v1::TokenLogprob>) -> Ev {
    Ev::Delta(v1::Delta {
        text: out.text,
        token_ids,
        logprobs: logprobs.into_iter().collect(),
        tool_calls: out
            .tool_calls
            .into_iter()
            .map(|c| v1::ToolCallDelta {
                index: c.index,
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect(),
        reasoning: out.reasoning,
    })
}

/// Drives one choice to its end. Returns when it finished, was cancelled,
/// or the client went away.
pub(crate) async fn run(
    tag: Tag,
    p: Arc<Prepared>,
    mut events: Choice,
    out: Out,
    mut cancel: watch::Receiver<bool>,
    mode: Mode,
    deadline: Option<Instant>,
) {
    let id = &tag.id;
    let mut rec = ChoiceRecorder::new(tag.obs.clone(), tag.index);
    let expired = async move {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    let tok = p.model.tokenizer.clone();
    let mut pipe = pipeline_for(&p);
    let prompt_tokens = p.engine_req.prompt.len() as u32;
    let mut generated = 0u32;
    let mut cached = 0u32;
    let mut pending_logprobs: Option<v1::TokenLogprob> = None;
    let mut m = ChoiceMetrics::new(&p.model.id, p.arrived, tag.index == 0);
    let mut prompt_logprobs: Vec<v1::TokenLogprob> = Vec::new();
    // The tokens a log-probability's token strings are read after: the
    // prompt's last few, then the choice's own tokens as they come.
    let mut recent: Vec<u32> = detok::context(&p.engine_req.prompt).to_vec();
    // Speculative tokens (proposed, accepted) over the verification steps
    // seen so far; `None` while it has not speculated.
    let mut speculated: Option<(u32, u32)> = None;
    // Beam search: (score, cumulative log-probability), sent before Finished.
    let mut beam: Option<(f32, f32)> = None;
    let finish = |pipe: &Pipeline,
                  beam: Option<(f32, f32)>,
                  reason: FinishReason,
                  completion: u32,
                  cached: u32,
                  stop: Option<String>,
                  stop_id: Option<u32>,
                  speculated: Option<(u32, u32)>| {
        Ev::Finish(v1::Finish {
            reason: reason as i32,
            usage: Some(v1::Usage {
                prompt_tokens,
                completion_tokens: completion,
                cached_tokens: cached,
                reasoning_tokens: pipe.reasoning_tokens(),
                speculative_proposed_tokens: speculated.map(|(p, _)| p),
                speculative_accepted_tokens: speculated.map(|(_, a)| a),
            }),
            matched_stop: stop,
            matched_stop_token_id: stop_id,
            error: None,
            beam_score: beam.map(|b| b.0),
            cumulative_logprob: beam.map(|b| b.1),
        })
    };
    loop {
        let ev = tokio::select! {
            biased;
            _ = cancelled(&mut cancel) => {
                rec.finished(FinishReason::Cancelled, generated);
                m.ended(Some("abort"), generated);
                let f = finish(&pipe, None, FinishReason::Cancelled, generated, cached, None, None, speculated);
                let _ = out.send(Ok(event(&tag, f))).await;
                return;
            }
            // The call's deadline (grpc-timeout) passed: end it, which also
            // cancels the sequence in the engine.
            _ = &mut expired => {
                rec.failed(tonic::Code::DeadlineExceeded, generated);
                m.ended(Some("abort"), generated);
                fail(&tag, &out, mode, ServiceError::DeadlineExceeded(generated)).await;
                return;
            }
            // The client went away: returning drops `events`, which cancels
            // the sequence in the engine.
            _ = out.closed() => {
                rec.failed(tonic::Code::Cancelled, generated);
                m.ended(Some("abort"), generated);
                tracing::info!(request_id = %id, generated, "client went away; request cancelled");
                return;
            }
            ev = events.recv() => ev,
        };
        // The messages this event gives; `true`: the choice ends with them.
        let (msgs, last) = match ev {
            Some(Event::Prefilled {
                cached_tokens,
                started,
            }) => {
                rec.prefilled(started);
                cached = cached_tokens;
                m.prefilled(prompt_tokens, cached_tokens);
                let Some(text) = p.echo.clone() else {
                    continue;
                };
                let first_token = match p.engine_req.prompt_logprobs {
                    Some(_) => p.engine_req.prompt.first().map_or_else(String::new, |&t| {
                        tok.decode(&[t], false).unwrap_or_default()
                    }),
                    None => String::new(),
                };
                let echo = Ev::Prompt(v1::PromptEcho {
                    text,
                    token_ids: p.engine_req.prompt.clone(),
                    logprobs: std::mem::take(&mut prompt_logprobs),
                    first_token,
                });
                (vec![echo], false)
            }
            Some(Event::PromptLogprobs(list)) => {
                // The first batch starts at prompt token 1.
                let prompt = &p.engine_req.prompt;
                for lp in list {
                    let at = (prompt_logprobs.len() + 1).min(prompt.len());
                    prompt_logprobs.push(token_logprob(&tok, &prompt[..at], lp));
                }
                continue;
            }
            Some(Event::Speculated { proposed, accepted }) => {
                let (p0, a0) = speculated.unwrap_or_default();
                speculated = Some((p0 + proposed, a0 + accepted));
                continue;
            }
            Some(Event::Beam {
                score,
                cumulative_logprob,
            }) => {
                beam = Some((score, cumulative_logprob));
                continue;
            }
            Some(Event::Logprobs(lp)) => {
                pending_logprobs = Some(token_logprob(&tok, &recent, lp));
                continue;
            }
            Some(Event::Token(t)) => {
                generated += 1;
                if p.engine_req.logprobs.is_some() {
                    if recent.len() == detok::CONTEXT {
                        recent.remove(0);
                    }
                    recent.push(t);
                }
                if let Some(a) = &p.admission {
                    a.generated();
                }
                rec.token();
                m.token();
                if p.engine_req.stop_token_ids.contains(&t) || is_eos(&p, t) {
                    // The stop token's text is never shown; Finished follows.
                    continue;
                }
                let o = match rec.detokenize(|| pipe.push_token(&tok, t)) {
                    Ok(o) => o,
                    Err(e) => {
                        rec.failed(tonic::Code::Internal, generated);
                        m.ended(None, generated);
                        let e = ServiceError::Internal(format!("detokenize: {e}"));
                        fail(&tag, &out, mode, e).await;
                        return;
                    }
                };
                let stop = o.stop.clone();
                rec.text(&o.text);
                let d = delta(o, vec![t], pending_logprobs.take());
                match stop {
                    None => (vec![d], false),
                    Some(s) => {
                        let reason = pipe.stop_reason();
                        rec.finished(reason, generated);
                        m.ended(Some(reason_label(reason)), generated);
                        let f = finish(
                            &pipe,
                            None,
                            reason,
                            generated,
                            cached,
                            Some(s),
                            None,
                            speculated,
                        );
                        (vec![d, f], true)
                    }
                }
            }
            Some(Event::Finished {
                reason,
                usage: u,
                timings,
            }) => {
                let o = rec.detokenize(|| pipe.finish(&tok));
                rec.text(&o.text);
                let (matched, stop_id) = match (&o.stop, reason) {
                    (Some(s), _) => (Some(s.clone()), None),
                    (None, EngineFinish::Stop(t)) => (None, Some(t)),
                    (None, EngineFinish::Length) => (None, None),
                };
                let why = match (&o.stop, reason) {
                    (None, EngineFinish::Length) => FinishReason::Length,
                    _ => pipe.stop_reason(),
                };
                rec.finished(why, u.completion_tokens);
                m.finished(reason_label(why), u, timings);
                let f = finish(
                    &pipe,
                    beam,
                    why,
                    u.completion_tokens,
                    u.cached_tokens,
                    matched,
                    stop_id,
                    speculated,
                );
                let mut msgs = Vec::new();
                // A stop string in the tail always gets its (maybe empty)
                // delta, as a stop string mid-output does.
                if !o.is_empty() {
                    msgs.push(delta(o, vec![], None));
                }
                msgs.push(f);
                (msgs, true)
            }
            Some(Event::Failed(e)) => {
                let e = ServiceError::Engine(e);
                rec.failed(e.parts().0, generated);
                m.ended(None, generated);
                fail(&tag, &out, mode, e).await;
                return;
            }
            None => {
                rec.failed(tonic::Code::Internal, generated);
                m.ended(None, generated);
                let e = ServiceError::Internal("engine dropped the request".into());
                fail(&tag, &out, mode, e).await;
                return;
            }
        };
        for msg in msgs {
            if out.send(Ok(event(&tag, msg))).await.is_err() {
                rec.failed(tonic::Code::Cancelled, generated);
                m.ended(Some("abort"), generated);
                tracing::info!(request_id = %id, generated, "client went away; request cancelled");
                return;
            }
        }
        if last {
            return;
        }
    }
}

/// The `finished_reason` label of a finish reason (vLLM's names).
fn reason_label(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
        FinishReason::Stop | FinishReason::Unspecified => "stop",
    }
}

/// A token's log-probabilities for the API, with each token's text as it
/// reads after `before` (the tokens before it; [`detok::TokenTexts`]).
fn token_logprob(
    tok: &tokenizers::Tokenizer,
    before: &[u32],
    lp: gyre_engine::TokenLogprobs,
) -> v1::TokenLogprob {
    let mut texts = detok::TokenTexts::after(tok, before);
    let token = texts.text(lp.token);
    v1::TokenLogprob {
        token_id: lp.token,
        logprob: lp.logprob,
        token_bytes: texts.bytes(lp.token, &token),
        token,
        top_logprobs: lp
            .top
            .into_iter()
            .map(|(id, logprob)| {
                let token = texts.text(id);
                v1::TopLogprob {
                    token_id: id,
                    logprob,
                    token_bytes: texts.bytes(id, &token),
                    token,
                }
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
