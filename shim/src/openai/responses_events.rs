//! Proto `ResponseEvent`s -> OpenAI's `ResponseStreamEvent` JSON: each
//! event is `{"type", "sequence_number", ...}` with the fields its schema
//! requires, named as the SSE event (`event: response.output_text.delta`).

use gyre_api::v1 as pb;
use serde_json::{Value, json};

use super::responses_output::{event_logprob, item, part, response};

/// The event's `type` and its JSON.
pub fn event(e: &pb::ResponseEvent) -> (&'static str, Value) {
    use pb::response_event::Event;
    let seq = e.sequence_number;
    let Some(event) = &e.event else {
        // An event of a kind this shim does not know (a newer service).
        return error_event(seq, "server_error", "An unknown event was received.", None);
    };
    let with_response = |kind: &'static str, r: &pb::Response| {
        (
            kind,
            json!({"type": kind, "sequence_number": seq, "response": response(r)}),
        )
    };
    let with_item = |kind: &'static str, i: &pb::ItemEvent| {
        let item = i.item.as_ref().map_or(Value::Null, item);
        (
            kind,
            json!({"type": kind, "sequence_number": seq, "output_index": i.output_index,
                   "item": item}),
        )
    };
    let with_part = |kind: &'static str, p: &pb::PartEvent| {
        let part = p.part.as_ref().map_or(Value::Null, part);
        (
            kind,
            json!({"type": kind, "sequence_number": seq, "item_id": p.item_id,
                   "output_index": p.output_index, "content_index": p.content_index,
                   "part": part}),
        )
    };
    let logprobs = |l: &[pb::TokenLogprob]| l.iter().map(event_logprob).collect::<Vec<_>>();
    match event {
        Event::Created(r) => with_response("response.created", r),
        Event::Queued(r) => with_response("response.queued", r),
        Event::InProgress(r) => with_response("response.in_progress", r),
        Event::Completed(r) => with_response("response.completed", r),
        Event::Incomplete(r) => with_response("response.incomplete", r),
        Event::Failed(r) => with_response("response.failed", r),
        Event::OutputItemAdded(i) => with_item("response.output_item.added", i),
        Event::OutputItemDone(i) => with_item("response.output_item.done", i),
        Event::ContentPartAdded(p) => with_part("response.content_part.added", p),
        Event::ContentPartDone(p) => with_part("response.content_part.done", p),
        Event::OutputTextDelta(d) => {
            let kind = "response.output_text.delta";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "content_index": d.content_index,
                       "delta": d.delta, "logprobs": logprobs(&d.logprobs)}),
            )
        }
        Event::OutputTextDone(d) => {
            let kind = "response.output_text.done";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "content_index": d.content_index,
                       "text": d.text, "logprobs": logprobs(&d.logprobs)}),
            )
        }
        Event::ReasoningTextDelta(d) => {
            let kind = "response.reasoning_text.delta";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "content_index": d.content_index,
                       "delta": d.delta}),
            )
        }
        Event::ReasoningTextDone(d) => {
            let kind = "response.reasoning_text.done";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "content_index": d.content_index,
                       "text": d.text}),
            )
        }
        Event::FunctionCallArgumentsDelta(d) => {
            let kind = "response.function_call_arguments.delta";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "delta": d.delta}),
            )
        }
        Event::FunctionCallArgumentsDone(d) => {
            let kind = "response.function_call_arguments.done";
            (
                kind,
                json!({"type": kind, "sequence_number": seq, "item_id": d.item_id,
                       "output_index": d.output_index, "name": d.name,
                       "arguments": d.arguments}),
            )
        }
        Event::Error(err) => error_event(seq, &err.code, &err.message, err.param.as_deref()),
    }
}

/// OpenAI's `error` event.
pub fn error_event(
    seq: u64,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> (&'static str, Value) {
    (
        "error",
        json!({"type": "error", "sequence_number": seq, "code": code, "message": message,
               "param": param}),
    )
}

/// The final response of a terminal event (`completed`, `incomplete`,
/// `failed`), if `e` is one.
pub fn terminal(e: &pb::ResponseEvent) -> Option<&pb::Response> {
    use pb::response_event::Event;
    match e.event.as_ref()? {
        Event::Completed(r) | Event::Incomplete(r) | Event::Failed(r) => Some(r),
        _ => None,
    }
}
