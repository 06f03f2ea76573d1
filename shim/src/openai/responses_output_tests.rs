//! Unit tests of `responses_output` and `responses_events`: the keys OpenAI's
//! schemas require, and the values echoed from the request.

use super::*;
use crate::openai::responses_events::{error_event, event, terminal};

fn message(id: &str, text: &str) -> pb::Item {
    pb::Item {
        id: id.into(),
        status: "completed".into(),
        item: Some(pb::item::Item::Message(pb::MessageItem {
            role: "assistant".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::OutputText(pb::OutputText {
                    text: text.into(),
                    logprobs: vec![pb::TokenLogprob {
                        token_id: 1,
                        logprob: -0.5,
                        token: "é".into(),
                        ..Default::default()
                    }],
                })),
            }],
        })),
    }
}

fn sample() -> pb::Response {
    pb::Response {
        id: "resp_1".into(),
        created_at: 100,
        completed_at: Some(101),
        status: "completed".into(),
        model: "m".into(),
        output: vec![
            message("msg_1", "Hello, "),
            pb::Item {
                id: "fc_1".into(),
                status: String::new(),
                item: Some(pb::item::Item::FunctionCall(pb::FunctionCallItem {
                    call_id: "call_1".into(),
                    name: "f".into(),
                    arguments: "{\"a\":1}".into(),
                })),
            },
            message("msg_2", "world"),
        ],
        incomplete_reason: None,
        error: None,
        usage: Some(pb::ResponseUsage {
            input_tokens: 10,
            cached_tokens: 4,
            output_tokens: 5,
            reasoning_tokens: 2,
        }),
        request: Some(pb::CreateResponseRequest {
            temperature: Some(0.7),
            metadata: [("b".to_string(), "2".to_string()), ("a".into(), "1".into())]
                .into_iter()
                .collect(),
            tools: vec![pb::FunctionTool {
                name: "f".into(),
                parameters: Some("{\"type\":\"object\"}".into()),
                ..Default::default()
            }],
            previous_response_id: Some("resp_0".into()),
            ..Default::default()
        }),
    }
}

#[test]
fn response_has_every_required_key() {
    let v = response(&sample());
    for key in [
        "id",
        "object",
        "created_at",
        "status",
        "error",
        "incomplete_details",
        "instructions",
        "model",
        "tools",
        "output",
        "parallel_tool_calls",
        "metadata",
        "tool_choice",
        "temperature",
        "top_p",
        "usage",
        "store",
        "text",
        "truncation",
        "reasoning",
        "background",
        "service_tier",
        "conversation",
        "max_output_tokens",
        "output_text",
        "previous_response_id",
        "completed_at",
    ] {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["object"], "response");
    assert_eq!(v["output_text"], "Hello, world");
    // f32 echoed as the decimal the client sent.
    assert_eq!(v["temperature"], serde_json::json!(0.7));
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(v["parallel_tool_calls"], true);
    assert_eq!(v["store"], true);
    assert_eq!(v["previous_response_id"], "resp_0");
    assert_eq!(v["tools"][0]["parameters"]["type"], "object");
    assert_eq!(v["tools"][0]["strict"], Value::Null);
    assert_eq!(v["text"]["format"]["type"], "text");
    assert_eq!(
        serde_json::to_string(&v["metadata"]).ok().as_deref(),
        Some(r#"{"a":"1","b":"2"}"#)
    );
    let usage = &v["usage"];
    assert_eq!(usage["total_tokens"], 15);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 2);
    let call = &v["output"][1];
    assert_eq!(call["type"], "function_call");
    assert_eq!(
        (call["id"].as_str(), call["call_id"].as_str()),
        (Some("fc_1"), Some("call_1"))
    );
    assert_eq!(call["status"], "completed");
    let text = &v["output"][0]["content"][0];
    assert_eq!(text["annotations"], serde_json::json!([]));
    assert_eq!(text["logprobs"][0]["bytes"], serde_json::json!([195, 169]));
}

#[test]
fn optional_keys_that_may_not_be_null_are_left_out() {
    let mut r = sample();
    r.usage = None;
    let v = response(&r);
    // OpenAI's schema: `usage` and `user` may be absent, never null.
    assert!(v.get("usage").is_none() && v.get("user").is_none(), "{v}");
    // Nullable ones stay, as null.
    assert_eq!(v["prompt_cache_key"], Value::Null);
    if let Some(req) = r.request.as_mut() {
        req.user = Some("u".into());
    }
    assert_eq!(response(&r)["user"], "u");
}

#[test]
fn json_schema_format_echo() {
    let mut r = sample();
    let format = |description: Option<&str>| pb::TextFormat {
        format: Some(pb::text_format::Format::JsonSchema(pb::JsonSchemaFormat {
            name: "s".into(),
            description: description.map(str::to_owned),
            schema: r#"{"type":"object"}"#.into(),
            strict: Some(true),
        })),
    };
    if let Some(req) = r.request.as_mut() {
        req.text_format = Some(format(None));
    }
    let v = response(&r)["text"]["format"].clone();
    assert_eq!(
        v,
        serde_json::json!({"type": "json_schema", "name": "s",
                           "schema": {"type": "object"}, "strict": true})
    );
    if let Some(req) = r.request.as_mut() {
        req.text_format = Some(format(Some("d")));
    }
    assert_eq!(response(&r)["text"]["format"]["description"], "d");
}

#[test]
fn incomplete_and_failed_details() {
    let mut r = sample();
    r.status = "incomplete".into();
    r.incomplete_reason = Some("max_output_tokens".into());
    assert_eq!(
        response(&r)["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    r.status = "failed".into();
    r.error = Some(pb::ResponseError {
        code: "server_error".into(),
        message: "boom".into(),
    });
    let v = response(&r);
    assert_eq!(v["error"]["code"], "server_error");
    assert_eq!(v["error"]["message"], "boom");
}

#[test]
fn events_carry_type_and_sequence_number() {
    use pb::response_event::Event;
    let ev = |seq, e| pb::ResponseEvent {
        sequence_number: seq,
        event: Some(e),
    };
    let (kind, v) = event(&ev(
        3,
        Event::OutputTextDelta(pb::TextDelta {
            item_id: "msg_1".into(),
            output_index: 1,
            content_index: 0,
            delta: "Hi".into(),
            logprobs: vec![],
        }),
    ));
    assert_eq!(kind, "response.output_text.delta");
    assert_eq!(v["type"], kind);
    assert_eq!(v["sequence_number"], 3);
    assert_eq!(v["logprobs"], serde_json::json!([]));
    assert_eq!(
        (v["item_id"].as_str(), v["output_index"].as_u64()),
        (Some("msg_1"), Some(1))
    );

    let (kind, v) = event(&ev(
        4,
        Event::FunctionCallArgumentsDone(pb::ArgumentsDone {
            item_id: "fc_1".into(),
            output_index: 0,
            name: "f".into(),
            arguments: "{}".into(),
        }),
    ));
    assert_eq!(kind, "response.function_call_arguments.done");
    assert_eq!(
        (v["name"].as_str(), v["arguments"].as_str()),
        (Some("f"), Some("{}"))
    );

    let done = ev(9, Event::Completed(sample()));
    assert_eq!(event(&done).1["response"]["id"], "resp_1");
    assert!(terminal(&done).is_some());
    assert!(terminal(&ev(0, Event::Created(sample()))).is_none());

    let (kind, v) = error_event(7, "server_error", "lost", None);
    assert_eq!(kind, "error");
    assert_eq!(v["param"], Value::Null);
    assert_eq!(v["sequence_number"], 7);
}

#[test]
fn item_lists_name_their_ends() {
    let list = pb::ItemList {
        data: vec![message("a", "x"), message("b", "y")],
        has_more: true,
    };
    let v = item_list(&list);
    assert_eq!(
        (v["first_id"].as_str(), v["last_id"].as_str()),
        (Some("a"), Some("b"))
    );
    assert_eq!(v["object"], "list");
    assert_eq!(v["has_more"], true);
}
