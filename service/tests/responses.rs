//! gyre.v1.Responses over real loopback gRPC against the real server (a
//! tiny fixture model, an in-memory or on-disk store):
//! - the stream's events in OpenAI's order, numbered from 0 by one, item ids
//!   and texts agreeing with the stored response, which Get and Replay
//!   return (Replay from `starting_after` too);
//! - a forced function call, its output sent back through
//!   `previous_response_id`, and the answer; the history renders exactly
//!   as the same chat does;
//! - `truncation: "auto"` fits a long input; logprobs when included.

mod responses_util;

use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{
    self, CreateResponseRequest, FunctionCallOutputItem, FunctionTool, GetResponseRequest, Item,
    Items, ListInputItemsRequest, ReplayResponseRequest, ToolChoice,
    create_response_request::Input, item::Item as It, response_event::Event as Ev,
    tool_choice::Mode,
};
use gyre_service::responses::StoreConfig;
use responses_util::{Server, bad_field, check_stream, collect, kind, text, user};
use tonic::Code;

#[tokio::test]
async fn a_stream_is_in_order_stored_and_replayable() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let events = collect(
        c.create(text("Hello there", 8))
            .await
            .expect("create")
            .into_inner(),
    )
    .await;
    let resp = check_stream(&events);
    let kinds: Vec<&str> = events.iter().map(kind).collect();
    // One message: added, part added, deltas, text done, part done, done.
    assert_eq!(kinds[2], "output_item.added");
    assert_eq!(kinds[3], "content_part.added");
    let n = kinds.len();
    let end = if resp.status == "completed" {
        "completed"
    } else {
        "incomplete"
    };
    assert_eq!(kinds[n - 1], end);
    assert!(kinds[4..n - 4].iter().all(|k| *k == "output_text.delta"));
    assert_eq!(
        &kinds[n - 4..n - 1],
        ["output_text.done", "content_part.done", "output_item.done"]
    );
    let usage = resp.usage.expect("usage");
    assert!(usage.input_tokens > 0 && usage.output_tokens > 0 && usage.output_tokens <= 8);
    if resp.status == "incomplete" {
        assert_eq!(resp.incomplete_reason.as_deref(), Some("max_output_tokens"));
    }
    // Get returns what the stream ended with; Replay the same events.
    let got = c
        .get(GetResponseRequest {
            response_id: resp.id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got, resp);
    let replay = |after: Option<u64>| ReplayResponseRequest {
        response_id: resp.id.clone(),
        starting_after: after,
    };
    let all = collect(c.replay(replay(None)).await.expect("replay").into_inner()).await;
    assert_eq!(all, events);
    let tail = collect(
        c.replay(replay(Some(3)))
            .await
            .expect("replay")
            .into_inner(),
    )
    .await;
    assert_eq!(tail, events[4..]);
    server.stop().await;
}

fn weather_tool() -> FunctionTool {
    FunctionTool {
        name: "get_weather".into(),
        description: Some("The weather in a city".into()),
        parameters: Some(
            r#"{"type": "object", "properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"]}"#
                .into(),
        ),
        strict: None,
    }
}

#[tokio::test]
async fn a_function_call_round_trip_through_previous_response_id() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let first = CreateResponseRequest {
        tools: vec![weather_tool()],
        tool_choice: Some(ToolChoice {
            mode: Mode::Function as i32,
            function: "get_weather".into(),
        }),
        max_output_tokens: Some(64),
        ..text("Weather in Oslo?", 64)
    };
    let events = collect(c.create(first.clone()).await.expect("create").into_inner()).await;
    let resp = check_stream(&events);
    assert_eq!(resp.status, "completed", "{resp:?}");
    let call = match &resp.output[..] {
        [
            Item {
                item: Some(It::FunctionCall(f)),
                status,
                id,
            },
        ] => {
            assert!(id.starts_with("fc_") && status == "completed");
            f.clone()
        }
        other => panic!("expected one function call: {other:?}"),
    };
    assert_eq!(call.name, "get_weather");
    let args: serde_json::Value = serde_json::from_str(&call.arguments).expect("json arguments");
    assert_eq!(args, serde_json::json!({"city": "Oslo"}));
    assert!(call.call_id.starts_with("call_"));
    let kinds: Vec<&str> = events.iter().map(kind).collect();
    assert!(kinds.contains(&"function_call_arguments.delta"));
    let done = events
        .iter()
        .find_map(|e| match &e.event {
            Some(Ev::FunctionCallArgumentsDone(d)) => Some(d.clone()),
            _ => None,
        })
        .expect("arguments done");
    assert_eq!(done.name, "get_weather");

    // The call's output goes back with previous_response_id.
    let output = Item {
        item: Some(It::FunctionCallOutput(FunctionCallOutputItem {
            call_id: call.call_id.clone(),
            output: "sunny".into(),
        })),
        ..Default::default()
    };
    let second = CreateResponseRequest {
        input: Some(Input::Items(Items {
            items: vec![output.clone()],
        })),
        previous_response_id: Some(resp.id.clone()),
        tools: vec![weather_tool()],
        tool_choice: Some(ToolChoice {
            mode: Mode::None as i32,
            function: String::new(),
        }),
        ..text("", 6)
    };
    // Its history renders exactly as the same conversation in chat does.
    let count = c
        .count_input_tokens(second.clone())
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    let chat = v1::ChatInput {
        messages: vec![
            v1::ChatMessage {
                role: "user".into(),
                content: Some("Weather in Oslo?".into()),
                ..Default::default()
            },
            v1::ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![v1::ToolCall {
                    id: call.call_id.clone(),
                    r#type: "function".into(),
                    function: Some(v1::FunctionCall {
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                    }),
                }],
                ..Default::default()
            },
            v1::ChatMessage {
                role: "tool".into(),
                content: Some("sunny".into()),
                tool_call_id: Some(call.call_id.clone()),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut g = GenerationClient::new(server.channel().await);
    let tokens = g
        .tokenize(v1::TokenizeRequest {
            input: Some(v1::tokenize_request::Input::Chat(chat)),
            ..Default::default()
        })
        .await
        .expect("tokenize")
        .into_inner();
    assert_eq!(count as usize, tokens.token_ids.len(), "{}", tokens.prompt);
    assert!(tokens.prompt.contains("sunny") && tokens.prompt.contains("get_weather"));

    let events = collect(c.create(second).await.expect("create").into_inner()).await;
    let answer = check_stream(&events);
    assert_eq!(answer.usage.expect("usage").input_tokens, count);
    assert!(
        answer
            .output
            .iter()
            .all(|i| matches!(i.item, Some(It::Message(_))))
    );
    // Its input items are its own input only.
    let items = c
        .list_input_items(ListInputItemsRequest {
            response_id: answer.id.clone(),
            ..Default::default()
        })
        .await
        .expect("items")
        .into_inner();
    assert_eq!(items.data.len(), 1);
    assert_eq!(items.data[0].item, output.item);
    server.stop().await;
}

#[tokio::test]
async fn truncation_auto_drops_the_oldest_items_until_the_input_fits() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    // 30 long messages: far more than tiny-qwen2's 2048-token context.
    let items: Vec<Item> = (0..30)
        .map(|i| user(&format!("message {i}: {}", "words ".repeat(100))))
        .collect();
    let req = CreateResponseRequest {
        input: Some(Input::Items(Items {
            items: items.clone(),
        })),
        ..text("", 2)
    };
    let e = c.create(req.clone()).await.expect_err("too long");
    assert_eq!(
        (e.code(), bad_field(&e).as_str()),
        (Code::InvalidArgument, "input")
    );
    assert!(e.message().contains("truncation"), "{}", e.message());
    let auto = CreateResponseRequest {
        truncation: Some("auto".into()),
        ..req
    };
    let counted = c
        .count_input_tokens(auto.clone())
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    assert!(counted > 0 && counted < 2048, "{counted}");
    let resp = check_stream(&collect(c.create(auto).await.expect("create").into_inner()).await);
    let used = resp.usage.expect("usage").input_tokens;
    assert_eq!(used, counted);
    // All of the input is stored, truncated or not.
    let listed = c
        .list_input_items(ListInputItemsRequest {
            response_id: resp.id,
            limit: Some(100),
            ..Default::default()
        })
        .await
        .expect("items")
        .into_inner();
    assert_eq!(listed.data.len(), 30);
    server.stop().await;
}

#[tokio::test]
async fn logprobs_come_with_the_output_text_when_included() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let req = CreateResponseRequest {
        include: vec!["message.output_text.logprobs".into()],
        top_logprobs: Some(2),
        ..text("Hello there", 6)
    };
    let events = collect(c.create(req).await.expect("create").into_inner()).await;
    let resp = check_stream(&events);
    let done = events
        .iter()
        .find_map(|e| match &e.event {
            Some(Ev::OutputTextDone(d)) => Some(d.clone()),
            _ => None,
        })
        .expect("text done");
    assert!(!done.logprobs.is_empty());
    assert!(done.logprobs.iter().all(|l| l.top_logprobs.len() == 2));
    let streamed: usize = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Ev::OutputTextDelta(d)) => Some(d.logprobs.len()),
            _ => None,
        })
        .sum();
    assert_eq!(streamed, done.logprobs.len());
    assert!(done.logprobs.len() as u32 <= resp.usage.expect("usage").output_tokens);
    // Without the include, none.
    let plain = collect(
        c.create(text("Hello there", 6))
            .await
            .expect("create")
            .into_inner(),
    )
    .await;
    assert!(plain.iter().all(|e| match &e.event {
        Some(Ev::OutputTextDone(d)) => d.logprobs.is_empty(),
        _ => true,
    }));
    server.stop().await;
}
