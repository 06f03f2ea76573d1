//! The event builder without an engine: pipeline pieces in, events out.

use super::*;
use gyre_api::v1::{Delta, Finish, ToolCallDelta, Usage};

fn builder(opts: Options) -> Builder {
    Builder::new(
        Response {
            id: "resp_1".into(),
            status: "in_progress".into(),
            ..Default::default()
        },
        opts,
    )
}

fn text(t: &str) -> Delta {
    Delta {
        text: t.into(),
        ..Default::default()
    }
}

fn reasoning(t: &str) -> Delta {
    Delta {
        reasoning: t.into(),
        ..Default::default()
    }
}

fn call(index: u32, name: &str, args: &str) -> Delta {
    Delta {
        tool_calls: vec![ToolCallDelta {
            index,
            id: if name.is_empty() {
                String::new()
            } else {
                format!("abcdefghijklmnopqrstuv{index:02}")
            },
            name: name.into(),
            arguments: args.into(),
        }],
        ..Default::default()
    }
}

fn finish(reason: FinishReason) -> Finish {
    Finish {
        reason: reason as i32,
        usage: Some(Usage {
            prompt_tokens: 7,
            completion_tokens: 5,
            cached_tokens: 3,
            reasoning_tokens: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn kind(e: &ResponseEvent) -> &'static str {
    match e.event.as_ref().expect("event") {
        Ev::Created(_) => "created",
        Ev::Queued(_) => "queued",
        Ev::InProgress(_) => "in_progress",
        Ev::OutputItemAdded(_) => "item_added",
        Ev::OutputItemDone(_) => "item_done",
        Ev::ContentPartAdded(_) => "part_added",
        Ev::ContentPartDone(_) => "part_done",
        Ev::OutputTextDelta(_) => "text_delta",
        Ev::OutputTextDone(_) => "text_done",
        Ev::ReasoningTextDelta(_) => "reasoning_delta",
        Ev::ReasoningTextDone(_) => "reasoning_done",
        Ev::FunctionCallArgumentsDelta(_) => "args_delta",
        Ev::FunctionCallArgumentsDone(_) => "args_done",
        Ev::Completed(_) => "completed",
        Ev::Incomplete(_) => "incomplete",
        Ev::Failed(_) => "failed",
        Ev::Error(_) => "error",
    }
}

/// Runs deltas then a finish; all events.
fn run(b: &mut Builder, deltas: &[Delta], f: Finish) -> Vec<ResponseEvent> {
    let mut out = b.created();
    out.extend(b.in_progress());
    for d in deltas {
        out.extend(b.delta(d));
    }
    out.extend(b.finish(&f, 42));
    out
}

/// Checks numbering, that every item event names the item at its index
/// in the final response, and that deltas concatenate to the done texts.
fn check_consistent(events: &[ResponseEvent], resp: &Response) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence_number, i as u64, "numbered from 0 by one");
    }
    let id_at = |i: u32| resp.output[i as usize].id.clone();
    let mut deltas: std::collections::HashMap<String, String> = Default::default();
    for e in events {
        match e.event.as_ref().expect("event") {
            Ev::OutputItemAdded(x) | Ev::OutputItemDone(x) => {
                assert_eq!(x.item.as_ref().expect("item").id, id_at(x.output_index));
            }
            Ev::ContentPartAdded(p) | Ev::ContentPartDone(p) => {
                assert_eq!(p.item_id, id_at(p.output_index));
            }
            Ev::OutputTextDelta(d) | Ev::ReasoningTextDelta(d) => {
                assert_eq!(d.item_id, id_at(d.output_index));
                deltas
                    .entry(d.item_id.clone())
                    .or_default()
                    .push_str(&d.delta);
            }
            Ev::FunctionCallArgumentsDelta(d) => {
                assert_eq!(d.item_id, id_at(d.output_index));
                deltas
                    .entry(d.item_id.clone())
                    .or_default()
                    .push_str(&d.delta);
            }
            Ev::OutputTextDone(d) | Ev::ReasoningTextDone(d) => {
                assert_eq!(d.item_id, id_at(d.output_index));
                assert_eq!(deltas.get(&d.item_id).cloned().unwrap_or_default(), d.text);
            }
            Ev::FunctionCallArgumentsDone(d) => {
                assert_eq!(d.item_id, id_at(d.output_index));
                assert_eq!(
                    deltas.get(&d.item_id).cloned().unwrap_or_default(),
                    d.arguments
                );
            }
            _ => {}
        }
    }
}

#[test]
fn reasoning_then_message_in_openais_order() {
    let mut b = builder(Options::default());
    let events = run(
        &mut b,
        &[
            reasoning("Let me"),
            reasoning(" think."),
            text("\n\n"),
            text("Hello"),
            text(" world"),
        ],
        finish(FinishReason::Stop),
    );
    let kinds: Vec<&str> = events.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "in_progress",
            "item_added",
            "part_added",
            "reasoning_delta",
            "reasoning_delta",
            "reasoning_done",
            "part_done",
            "item_done",
            "item_added",
            "part_added",
            "text_delta",
            "text_delta",
            "text_done",
            "part_done",
            "item_done",
            "completed",
        ]
    );
    let resp = b.response().clone();
    check_consistent(&events, &resp);
    assert_eq!(resp.status, "completed");
    assert_eq!(resp.completed_at, Some(42));
    assert_eq!(resp.output.len(), 2);
    assert!(resp.output[0].id.starts_with("rs_"));
    assert!(resp.output[1].id.starts_with("msg_"));
    assert!(resp.output.iter().all(|i| i.status == "completed"));
    match &resp.output[1].item {
        Some(It::Message(m)) => match &m.content[0].part {
            Some(Part::OutputText(t)) => assert_eq!(t.text, "\n\nHello world"),
            p => panic!("{p:?}"),
        },
        i => panic!("{i:?}"),
    }
    let u = resp.usage.expect("usage");
    assert_eq!(
        (
            u.input_tokens,
            u.output_tokens,
            u.cached_tokens,
            u.reasoning_tokens
        ),
        (7, 5, 3, 2)
    );
    // The last event carries the whole final response.
    match events.last().and_then(|e| e.event.as_ref()) {
        Some(Ev::Completed(r)) => assert_eq!(r, b.response()),
        e => panic!("{e:?}"),
    }
}

#[test]
fn function_calls_stream_arguments_and_blank_text_makes_no_message() {
    let mut b = builder(Options::default());
    let events = run(
        &mut b,
        &[
            call(0, "get_weather", "{\"city\":"),
            call(0, "", " \"Paris\"}"),
            text("\n"),
            call(1, "get_time", ""),
            call(1, "", "{}"),
        ],
        finish(FinishReason::ToolCalls),
    );
    let kinds: Vec<&str> = events.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "in_progress",
            "item_added",
            "args_delta",
            "args_delta",
            "args_done",
            "item_done",
            "item_added",
            "args_delta",
            "args_done",
            "item_done",
            "completed",
        ]
    );
    let resp = b.response().clone();
    check_consistent(&events, &resp);
    let calls: Vec<(String, String, String)> = resp
        .output
        .iter()
        .map(|i| match &i.item {
            Some(It::FunctionCall(f)) => (f.call_id.clone(), f.name.clone(), f.arguments.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(calls[0].1, "get_weather");
    assert_eq!(calls[0].2, "{\"city\": \"Paris\"}");
    assert_eq!(calls[1].1, "get_time");
    assert!(calls.iter().all(|c| c.0.starts_with("call_")));
    let done_names: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Ev::FunctionCallArgumentsDone(d)) => Some(d.name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(done_names, ["get_weather", "get_time"]);
}

#[test]
fn max_tool_calls_drops_later_calls() {
    let mut b = builder(Options {
        max_tool_calls: Some(1),
        ..Default::default()
    });
    let events = run(
        &mut b,
        &[call(0, "a", "{}"), call(1, "b", "{"), call(1, "", "}")],
        finish(FinishReason::ToolCalls),
    );
    check_consistent(&events, b.response());
    assert_eq!(b.response().output.len(), 1);
}

#[test]
fn length_ends_incomplete_and_errors_fail() {
    let mut b = builder(Options::default());
    let events = run(&mut b, &[text("Hel")], finish(FinishReason::Length));
    assert_eq!(events.last().map(kind), Some("incomplete"));
    let r = b.response();
    assert_eq!(r.status, "incomplete");
    assert_eq!(r.incomplete_reason.as_deref(), Some("max_output_tokens"));
    assert_eq!(r.output[0].status, "incomplete");
    // OpenAI's completed_at is there only when the status is completed.
    assert_eq!(r.completed_at, None);

    let mut b = builder(Options::default());
    let mut f = finish(FinishReason::Error);
    f.error = Some(v1::RequestError {
        code: tonic::Code::Internal as i32,
        message: "the model failed".into(),
        ..Default::default()
    });
    let events = run(&mut b, &[text("x")], f);
    assert_eq!(events.last().map(kind), Some("failed"));
    assert_eq!(b.response().completed_at, None);
    let e = b.response().error.clone().expect("error");
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("server_error", "the model failed")
    );
}

#[test]
fn cancelled_sends_nothing_more() {
    let mut b = builder(Options::default());
    let mut out = b.created();
    out.extend(b.delta(&text("a")));
    assert!(b.finish(&finish(FinishReason::Cancelled), 1).is_empty());
    assert_eq!(b.response().status, "cancelled");
    assert!(b.ended());
    assert_eq!(b.response().output[0].status, "incomplete");
}

#[test]
fn queued_responses_announce_it() {
    let mut b = Builder::new(
        Response {
            status: "queued".into(),
            ..Default::default()
        },
        Options::default(),
    );
    let kinds: Vec<&str> = b.created().iter().map(kind).collect();
    assert_eq!(kinds, ["created", "queued"]);
    assert!(!b.ended());
    let e = b.in_progress();
    assert_eq!(e[0].sequence_number, 2);
    assert_eq!(b.response().status, "in_progress");
}

#[test]
fn logprobs_go_with_the_text_they_belong_to() {
    let lp = |id: u32| v1::TokenLogprob {
        token_id: id,
        ..Default::default()
    };
    let mut b = builder(Options {
        logprobs: true,
        ..Default::default()
    });
    let d1 = Delta {
        logprobs: vec![lp(1)],
        ..Default::default()
    };
    let d2 = Delta {
        text: "ab".into(),
        logprobs: vec![lp(2)],
        ..Default::default()
    };
    let events = run(&mut b, &[d1, d2], finish(FinishReason::Stop));
    let done = events
        .iter()
        .find_map(|e| match &e.event {
            Some(Ev::OutputTextDone(d)) => Some(d.clone()),
            _ => None,
        })
        .expect("text done");
    let ids: Vec<u32> = done.logprobs.iter().map(|l| l.token_id).collect();
    assert_eq!(ids, [1, 2]);
}
