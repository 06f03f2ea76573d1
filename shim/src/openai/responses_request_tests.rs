//! Unit tests of `responses_request`: every field reaches the proto, and
//! wrong types are 400s naming the field.

use super::*;
use serde_json::json;

fn parse(v: Value) -> Result<ResponsesRequest, ApiError> {
    ResponsesRequest::from_body(&v)
}

fn param(v: Value) -> String {
    let err = parse(v.clone()).expect_err(&v.to_string());
    assert_eq!(err.status(), http::StatusCode::BAD_REQUEST, "{v}");
    err.body()["error"]["param"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn every_field_reaches_the_proto() {
    use pb::text_format::Format;
    let r = parse(json!({
        "model": "m", "input": "hi", "instructions": "be nice", "stream": true,
        "tools": [{"type": "function", "name": "f", "description": "d",
                   "parameters": {"type": "object", "properties": {}}, "strict": true}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": false, "max_tool_calls": 2,
        "text": {"format": {"type": "json_schema", "name": "s",
                            "schema": {"type": "object"}, "strict": true},
                 "verbosity": "low"},
        "reasoning": {"effort": "high", "summary": "auto"},
        "temperature": 0.5, "top_p": 0.9, "top_logprobs": 3,
        "include": ["message.output_text.logprobs"], "max_output_tokens": 16.0,
        "metadata": {"k": "v"}, "store": false, "previous_response_id": "resp_1",
        "conversation": {"id": "conv_1"}, "prompt_cache_key": "pk", "user": "u",
        "safety_identifier": "s", "service_tier": "flex", "truncation": "auto",
        "background": true, "seed": 7, "top_k": 5, "unknown_key": [1],
    }))
    .expect("parses");
    assert!(r.stream);
    let p = r.proto;
    assert_eq!(p.model, "m");
    assert_eq!(
        p.input,
        Some(pb::create_response_request::Input::Text("hi".into()))
    );
    assert_eq!(p.instructions.as_deref(), Some("be nice"));
    assert_eq!(p.tools.len(), 1);
    assert_eq!(
        p.tools[0].parameters.as_deref(),
        Some(r#"{"type":"object","properties":{}}"#)
    );
    assert_eq!(p.tools[0].strict, Some(true));
    let choice = p.tool_choice.expect("tool_choice");
    assert_eq!(choice.mode, pb::tool_choice::Mode::Function as i32);
    assert_eq!(choice.function, "f");
    assert_eq!(p.parallel_tool_calls, Some(false));
    assert_eq!(p.max_tool_calls, Some(2));
    match p.text_format.and_then(|f| f.format) {
        Some(Format::JsonSchema(s)) => {
            assert_eq!(
                (s.name.as_str(), s.schema.as_str()),
                ("s", r#"{"type":"object"}"#)
            );
            assert_eq!(s.strict, Some(true));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.verbosity.as_deref(), Some("low"));
    assert_eq!(p.reasoning_effort.as_deref(), Some("high"));
    assert_eq!(p.reasoning_summary.as_deref(), Some("auto"));
    assert_eq!(
        (p.temperature, p.top_p, p.top_logprobs),
        (Some(0.5), Some(0.9), Some(3))
    );
    assert_eq!(p.include, ["message.output_text.logprobs"]);
    assert_eq!(p.max_output_tokens, Some(16));
    assert_eq!(p.metadata.get("k").map(String::as_str), Some("v"));
    assert_eq!(p.store, Some(false));
    assert_eq!(p.previous_response_id.as_deref(), Some("resp_1"));
    assert_eq!(p.conversation.as_deref(), Some("conv_1"));
    assert_eq!(p.prompt_cache_key.as_deref(), Some("pk"));
    assert_eq!(p.user.as_deref(), Some("u"));
    assert_eq!(p.safety_identifier.as_deref(), Some("s"));
    assert_eq!(p.service_tier.as_deref(), Some("flex"));
    assert_eq!(p.truncation.as_deref(), Some("auto"));
    assert_eq!(p.background, Some(true));
    let sampling = p.sampling.expect("sampling");
    assert_eq!((sampling.seed, sampling.top_k), (Some(7), Some(5)));
}

#[test]
fn minimal_body_leaves_everything_unset() {
    let r = parse(json!({"input": [{"role": "user", "content": "x"}]})).expect("parses");
    assert!(!r.stream);
    assert_eq!(r.proto.model, "");
    assert_eq!(r.proto.sampling, None);
    assert_eq!(r.proto.tool_choice, None);
    let r = parse(json!({"conversation": "conv_9", "tool_choice": "required"})).expect("parses");
    assert_eq!(r.proto.conversation.as_deref(), Some("conv_9"));
    assert_eq!(
        r.proto.tool_choice.map(|c| c.mode),
        Some(pb::tool_choice::Mode::Required as i32)
    );
}

#[test]
fn wrong_types_name_the_param() {
    let cases = [
        (json!({"model": 1}), "model"),
        (json!({"stream": "yes"}), "stream"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"top_p": []}), "top_p"),
        (json!({"max_output_tokens": -1}), "max_output_tokens"),
        (json!({"max_output_tokens": 2.5}), "max_output_tokens"),
        (json!({"top_logprobs": "3"}), "top_logprobs"),
        (json!({"metadata": {"k": 1}}), "metadata.k"),
        (json!({"metadata": "x"}), "metadata"),
        (json!({"store": 1}), "store"),
        (json!({"background": "no"}), "background"),
        (json!({"include": "x"}), "include"),
        (json!({"previous_response_id": 5}), "previous_response_id"),
        (json!({"instructions": ["x"]}), "instructions"),
        (json!({"tools": {}}), "tools"),
        (json!({"tools": ["x"]}), "tools[0]"),
        (
            json!({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}),
            "tools[1].type",
        ),
        (json!({"tools": [{"name": "f"}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function"}]}), "tools[0].name"),
        (
            json!({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}),
            "tools[0].parameters",
        ),
        (
            json!({"tools": [{"type": "function", "name": "f", "strict": "x"}]}),
            "tools[0].strict",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tool_choice": 3}), "tool_choice"),
        (
            json!({"tool_choice": {"type": "file_search"}}),
            "tool_choice.type",
        ),
        (
            json!({"tool_choice": {"type": "function"}}),
            "tool_choice.name",
        ),
        (json!({"text": "x"}), "text"),
        (
            json!({"text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "s"}}}),
            "text.format.schema",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "schema": {}}}}),
            "text.format.name",
        ),
        (json!({"text": {"verbosity": 1}}), "text.verbosity"),
        (json!({"reasoning": {"effort": 1}}), "reasoning.effort"),
        (json!({"reasoning": "high"}), "reasoning"),
        (json!({"conversation": 5}), "conversation"),
        (json!({"conversation": {}}), "conversation.id"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
            "input[0].content[0].text",
        ),
        (json!({"logit_bias": {"x": 1}}), "logit_bias.x"),
    ];
    for (v, want) in cases {
        assert_eq!(param(v.clone()), want, "{v}");
    }
}
