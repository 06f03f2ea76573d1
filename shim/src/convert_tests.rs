//! OpenAI requests to proto: every field mapped, and the errors that name
//! their params.

use super::*;
use serde_json::json;

fn chat(body: Value) -> Result<(pb::Request, StreamMode), ApiError> {
    ChatRequest::from_body(&body)?.into_proto("id-1")
}

fn completion(body: Value) -> Result<(pb::Request, StreamMode), ApiError> {
    let (mut reqs, mode) = CompletionRequest::from_body(&body)?.into_protos("id-1")?;
    Ok((reqs.remove(0), mode))
}

fn param(err: ApiError) -> Value {
    assert_eq!(err.status(), http::StatusCode::BAD_REQUEST, "{err}");
    err.body()["error"]["param"].clone()
}

#[test]
fn chat_maps_every_field() {
    let (req, mode) = chat(json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"b": 2}}}
            ]},
            {"role": "tool", "content": "ok", "tool_call_id": "c1"},
        ],
        "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -1,
        "max_tokens": 10, "max_completion_tokens": 20, "stop": "END",
        "stream": true, "stream_options": {"include_usage": true}, "n": 1,
        "user": "ignored", "presence_penalty": 0,
    }))
    .expect("valid");
    assert_eq!(
        mode,
        StreamMode {
            stream: true,
            include_usage: true,
            ..StreamMode::default()
        }
    );
    assert_eq!(req.request_id, "id-1");
    assert_eq!(req.model, "m");
    assert_eq!(req.max_tokens, Some(20));
    assert_eq!(req.stop, vec!["END".to_owned()]);
    let sampling = req.sampling.expect("sampling");
    assert_eq!(sampling.temperature, Some(0.5));
    assert_eq!(sampling.top_p, Some(0.9));
    assert_eq!(sampling.top_k, Some(40));
    assert_eq!(sampling.seed, Some(u64::MAX));
    let Some(pb::request::Input::Chat(input)) = req.input else {
        panic!("chat input expected");
    };
    let contents: Vec<_> = input
        .messages
        .iter()
        .map(|m| m.content.as_deref())
        .collect();
    assert_eq!(contents, [Some("be brief"), Some("hi"), None, Some("ok")]);
    let calls: Vec<_> = input.messages[2]
        .tool_calls
        .iter()
        .map(|c| {
            let f = c.function.as_ref().expect("function");
            (c.id.as_str(), f.name.as_str(), f.arguments.as_str())
        })
        .collect();
    assert_eq!(calls, [("c1", "f", "{\"a\": 1}"), ("c2", "g", "{\"b\":2}")]);
    assert_eq!(input.messages[3].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(input.messages[1].name.as_deref(), Some("ann"));
}

#[test]
fn unset_fields_stay_unset() {
    let (req, mode) =
        chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).expect("valid");
    assert_eq!(mode, StreamMode::default());
    assert_eq!(req.sampling, Some(pb::SamplingParams::default()));
    assert_eq!(req.max_tokens, None);
    assert!(req.stop.is_empty());
}

#[test]
fn chat_errors_name_params() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    assert_eq!(
        param(chat(json!({"messages": msgs})).expect_err("no model")),
        "model"
    );
    assert_eq!(
        param(chat(json!({"model": "m"})).expect_err("no messages")),
        "messages"
    );
    let cases = [
        (
            json!({"model": "m", "messages": msgs, "temperature": "hot"}),
            "temperature",
        ),
        (json!({"model": "m", "messages": msgs, "stop": [1]}), "stop"),
        (
            json!({"model": "m", "messages": msgs, "max_tokens": -1}),
            "max_tokens",
        ),
        (
            json!({"model": "m", "messages": msgs, "top_k": -5}),
            "top_k",
        ),
        (
            json!({"model": "m", "messages": msgs, "stream": "yes"}),
            "stream",
        ),
        (json!({"model": 3, "messages": msgs}), "model"),
        (json!({"model": "m", "messages": "hi"}), "messages"),
        (
            json!({"model": "m", "messages": [{"content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": 1}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "m", "messages": msgs, "tools": [{"type": "function"}]}),
            "tools[0].function",
        ),
        (
            json!({"model": "m", "messages": msgs, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            json!({"model": "m", "messages": msgs, "prediction": {"type": "guess", "content": "x"}}),
            "prediction.type",
        ),
        (
            json!({"model": "m", "messages": msgs, "prediction": {"type": "content", "content": 5}}),
            "prediction.content",
        ),
    ];
    for (body, expected) in cases {
        let err = chat(body.clone()).expect_err("invalid");
        assert_eq!(param(err), expected, "{body}");
    }
}

#[test]
fn completion_prompts() {
    let (req, _) = completion(json!({"model": "m", "prompt": "once"})).expect("text");
    assert_eq!(req.input, Some(pb::request::Input::Text("once".into())));
    let (req, _) = completion(json!({"model": "m", "prompt": ["once"]})).expect("list");
    assert_eq!(req.input, Some(pb::request::Input::Text("once".into())));
    let (req, _) = completion(json!({"model": "m", "prompt": [1, 2, 3]})).expect("ids");
    let ids = pb::TokenIds { ids: vec![1, 2, 3] };
    assert_eq!(req.input, Some(pb::request::Input::TokenIds(ids)));
    let (req, _) =
        completion(json!({"model": "m", "prompt": "x", "stop": ["a", "b"]})).expect("stop list");
    assert_eq!(req.stop, vec!["a".to_owned(), "b".to_owned()]);
}

#[test]
fn completion_errors_name_params() {
    let cases = [
        (json!({"model": "m"}), "prompt"),
        (json!({"model": "m", "prompt": ["a", 2]}), "prompt"),
        (json!({"model": "m", "prompt": [[]]}), "prompt"),
        (json!({"model": "m", "prompt": {}}), "prompt"),
        (
            json!({"model": "m", "prompt": "x", "best_of": 3, "stream": true}),
            "stream",
        ),
        (
            json!({"model": "m", "prompt": "x", "length_penalty": 0.5}),
            "length_penalty",
        ),
        (
            json!({"model": "m", "prompt": "x", "best_of": 2, "early_stopping": "soon"}),
            "early_stopping",
        ),
        (json!({"model": "m", "prompt": "x", "seed": "s"}), "seed"),
    ];
    for (body, expected) in cases {
        let err = completion(body.clone()).expect_err("invalid");
        assert_eq!(param(err), expected, "{body}");
    }
}

#[test]
fn beam_search_fields_map_to_the_proto() {
    let body = json!({"model": "m", "prompt": "x", "best_of": 4, "n": 2,
                      "length_penalty": 0.5, "early_stopping": "never"});
    let (req, _) = completion(body).expect("valid");
    let b = req.beam.expect("beam search");
    assert_eq!((b.width, b.length_penalty), (4, Some(0.5)));
    assert_eq!(b.early_stopping, pb::EarlyStopping::Never as i32);
    assert_eq!(req.n, Some(2));
    let body = json!({"model": "m", "prompt": "x", "use_beam_search": true, "n": 3,
                      "early_stopping": true});
    let b = completion(body)
        .expect("valid")
        .0
        .beam
        .expect("beam search");
    assert_eq!(b.width, 3, "vLLM: best_of defaults to n");
    assert_eq!(b.early_stopping, pb::EarlyStopping::Always as i32);
    let (req, _) = completion(json!({"model": "m", "prompt": "x", "best_of": 1})).expect("ok");
    assert_eq!(req.beam, None, "best_of 1 samples");
}

#[test]
fn logprobs_map_to_the_proto() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    let (req, _) =
        chat(json!({"model": "m", "messages": msgs, "logprobs": true, "top_logprobs": 3}))
            .expect("valid");
    assert_eq!(req.logprobs, Some(3));
    let (req, _) = chat(json!({"model": "m", "messages": msgs, "logprobs": true})).expect("valid");
    assert_eq!(req.logprobs, Some(0));
    let (req, _) = chat(json!({"model": "m", "messages": msgs})).expect("valid");
    assert_eq!(req.logprobs, None);
    let (req, _) = completion(json!({"model": "m", "prompt": "x", "logprobs": 5})).expect("valid");
    assert_eq!(req.logprobs, Some(5));
    assert_eq!((req.echo, req.prompt_logprobs), (false, None));
}

#[test]
fn echo_asks_for_the_prompt_and_its_logprobs() {
    let (req, _) = completion(json!({"model": "m", "prompt": "x", "echo": true})).expect("ok");
    assert_eq!((req.echo, req.prompt_logprobs), (true, None));
    let body = json!({"model": "m", "prompt": "x", "echo": true, "logprobs": 2});
    let (req, _) = completion(body).expect("ok");
    assert_eq!((req.echo, req.prompt_logprobs), (true, Some(2)));
}

#[test]
fn prompt_batches_become_one_request_each() {
    let body = json!({"model": "m", "prompt": ["a", "b", "c"], "n": 2});
    let (reqs, _) = CompletionRequest::from_body(&body)
        .and_then(|r| r.into_protos("id"))
        .expect("valid");
    let ids: Vec<_> = reqs.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["id", "id-1", "id-2"]);
    assert_eq!(reqs[2].input, Some(pb::request::Input::Text("c".into())));
    assert!(reqs.iter().all(|r| r.n == Some(2)));
    let body = json!({"model": "m", "prompt": [[1, 2], [3]]});
    let (reqs, _) = CompletionRequest::from_body(&body)
        .and_then(|r| r.into_protos("id"))
        .expect("valid");
    assert_eq!(
        reqs[1].input,
        Some(pb::request::Input::TokenIds(pb::TokenIds { ids: vec![3] }))
    );
    let (req, _) = completion(json!({"model": "m", "prompt": [[4, 5]]})).expect("batch of one");
    assert_eq!(
        req.input,
        Some(pb::request::Input::TokenIds(pb::TokenIds {
            ids: vec![4, 5]
        }))
    );
}

#[test]
fn n_maps_to_the_proto() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3});
    let (req, _) = chat(body).expect("valid");
    assert_eq!(req.n, Some(3));
}

#[test]
fn a_prediction_maps_to_its_text() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    let (r, _) = chat(json!({"model": "m", "messages": msgs,
        "prediction": {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}))
    .expect("valid");
    assert_eq!(r.prediction.as_deref(), Some("a\nb"));
    let (r, _) = chat(json!({"model": "m", "messages": msgs})).expect("valid");
    assert_eq!(r.prediction, None);
}
