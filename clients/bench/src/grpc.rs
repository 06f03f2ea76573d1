//! One streamed request over gRPC `gyre.v1.Generation/GenerateStream`, timed
//! from the client: every `Delta` carrying token ids is an output event.
//! Dropping the response stream cancels the call (RST_STREAM), which is how
//! `cancel_after` cancels.

use std::time::Instant;

use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{self, generate_response::Event, request::Input};
use tonic::transport::Channel;

use crate::load::{Prompt, RequestSpec};
use crate::stats::{Outcome, Record};

/// The `gyre.v1.Request` for `spec`: greedy, EOS ignored, exactly
/// `max_tokens` tokens unless cancelled.
pub fn request(spec: &RequestSpec) -> v1::Request {
    let input = match &spec.prompt {
        Prompt::Ids(ids) => Input::TokenIds(v1::TokenIds { ids: ids.clone() }),
        Prompt::Text(text) => Input::Text(text.clone()),
    };
    v1::Request {
        input: Some(input),
        model: spec.model.clone(),
        sampling: Some(v1::SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }),
        max_tokens: Some(spec.max_tokens),
        ignore_eos: true,
        skip_special_tokens: Some(false),
        cache_salt: spec.cache_salt.clone(),
        ..Default::default()
    }
}

/// Runs `spec` on `client`; `run_start` is the origin of `Record::sent_at`.
pub async fn generate(
    mut client: GenerationClient<Channel>,
    spec: &RequestSpec,
    run_start: Instant,
) -> Record {
    let request = request(spec);
    let sent = Instant::now();
    let mut record = Record::new(sent - run_start);
    record.outcome = match client.generate_stream(request).await {
        Err(status) => Outcome::Error(status_text(&status)),
        Ok(response) => read(response.into_inner(), spec, sent, &mut record).await,
    };
    record.elapsed = sent.elapsed();
    if record.tokens == 0 {
        record.tokens = record.events.iter().map(|e| e.1).sum();
    }
    record
}

async fn read(
    mut stream: tonic::Streaming<v1::GenerateResponse>,
    spec: &RequestSpec,
    sent: Instant,
    record: &mut Record,
) -> Outcome {
    let mut received = 0u32;
    loop {
        match stream.message().await {
            Err(status) => return Outcome::Error(status_text(&status)),
            Ok(None) => return Outcome::Error("stream ended without a Finish".to_owned()),
            Ok(Some(message)) => match message.event {
                Some(Event::Delta(delta)) if !delta.token_ids.is_empty() => {
                    let n = u32::try_from(delta.token_ids.len()).unwrap_or(u32::MAX);
                    record.events.push((sent.elapsed(), n));
                    received = received.saturating_add(n);
                    if spec.cancel_after.is_some_and(|k| received >= k) {
                        return Outcome::Cancelled; // dropping `stream` cancels
                    }
                }
                // `Rejected` is sent on the bidi `Generate` call only.
                Some(Event::Delta(_) | Event::Prompt(_) | Event::Rejected(_)) | None => {}
                Some(Event::Finish(finish)) => {
                    if let Some(usage) = finish.usage {
                        record.tokens = usage.completion_tokens;
                        record.prompt_tokens = usage.prompt_tokens;
                        record.cached_tokens = usage.cached_tokens;
                    }
                    let reason = v1::FinishReason::try_from(finish.reason)
                        .map_or("unknown", |r| r.as_str_name());
                    if let Some(error) = finish.error {
                        return Outcome::Error(format!("{reason}: {}", error.message));
                    }
                    let reason = reason.trim_start_matches("FINISH_REASON_");
                    return Outcome::Finished(reason.to_ascii_lowercase());
                }
            },
        }
    }
}

/// `CODE: message` of a gRPC status.
pub fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}
