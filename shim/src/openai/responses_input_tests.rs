//! Unit tests of `responses_input`: item shapes and the `param` of each
//! error.

use super::*;
use serde_json::json;

fn param(err: ApiError) -> String {
    assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
    err.body()["error"]["param"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn parse(v: Value) -> Result<Vec<pb::Item>, ApiError> {
    match input(&v)? {
        pb::create_response_request::Input::Items(items) => Ok(items.items),
        pb::create_response_request::Input::Text(t) => panic!("text {t}"),
    }
}

#[test]
fn a_string_is_text() {
    assert_eq!(
        input(&json!("hi")).ok(),
        Some(pb::create_response_request::Input::Text("hi".into()))
    );
}

#[test]
fn shorthand_and_typed_messages() {
    use pb::content_part::Part;
    let items = parse(json!([
        {"role": "user", "content": "hello"},
        {"type": "message", "role": "assistant", "content": "hi there", "id": "msg_1"},
        {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"role": "assistant", "content": [
            {"type": "output_text", "text": "ok", "annotations": []},
            {"type": "refusal", "refusal": "no"}]},
    ]))
    .expect("parses");
    assert_eq!(items.len(), 4);
    let msg = |i: usize| match &items[i].item {
        Some(pb::item::Item::Message(m)) => m.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(msg(0).role, "user");
    assert_eq!(
        msg(0).content[0].part,
        Some(Part::InputText("hello".into()))
    );
    // An assistant's string content is its own earlier output.
    assert!(matches!(&msg(1).content[0].part, Some(Part::OutputText(t)) if t.text == "hi there"));
    assert_eq!(items[1].id, "msg_1");
    assert_eq!(
        msg(2).content[0].part,
        Some(Part::InputText("be brief".into()))
    );
    assert_eq!(msg(3).content[1].part, Some(Part::Refusal("no".into())));
}

#[test]
fn function_calls_outputs_and_reasoning() {
    use pb::item::Item;
    let items = parse(json!([
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
         "content": [{"type": "reasoning_text", "text": "think"}]},
    ]))
    .expect("parses");
    assert!(
        matches!(&items[0].item, Some(Item::FunctionCall(c)) if c.call_id == "call_1" && c.name == "f" && c.arguments == "{}")
    );
    assert!(matches!(&items[1].item, Some(Item::FunctionCallOutput(o)) if o.output == "42"));
    assert!(matches!(&items[2].item, Some(Item::FunctionCallOutput(o)) if o.output == "ab"));
    assert!(
        matches!(&items[3].item, Some(Item::Reasoning(r)) if r.text == "think" && r.summary == ["s"])
    );
}

#[test]
fn errors_name_the_place() {
    let cases = [
        (json!(5), "input"),
        (json!(["x"]), "input[0]"),
        (json!([{"content": "x"}]), "input[0].type"),
        (json!([{"type": 3}]), "input[0].type"),
        (json!([{"role": "user"}]), "input[0].content"),
        (json!([{"role": 1, "content": "x"}]), "input[0].role"),
        (json!([{"role": "user", "content": 7}]), "input[0].content"),
        (
            json!([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_text", "text": 5}]}]),
            "input[1].content[0].text",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            "input[0].content[0].type",
        ),
        (
            json!([{"type": "item_reference", "id": "x"}]),
            "input[0].type",
        ),
        (
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "input[0].call_id",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "c"}]),
            "input[0].output",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "c", "output": 1}]),
            "input[0].output",
        ),
        (
            json!([{"type": "reasoning", "summary": [{"type": "x", "text": "t"}]}]),
            "input[0].summary[0].type",
        ),
        (
            json!([{"type": "message", "role": "user", "content": "x", "id": 5}]),
            "input[0].id",
        ),
    ];
    for (v, want) in cases {
        let got = param(parse(v.clone()).expect_err(&v.to_string()));
        assert_eq!(got, want, "{v}");
    }
}
