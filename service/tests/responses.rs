//! gyre.v1.Responses over real loopback gRPC against the real server (a
//! tiny fixture model, an in-memory or on-disk store):
//! - the stream's events in OpenAI's order, numbered from 0 by one, item ids
//!   and texts agreeing with the stored response, which Get and Replay
//!   return (Replay from `starting_after` too);
//! - a forced function call, its output sent back through
//!   `previous_response_id`, and the answer; the history renders exactly
//!   as the same chat does;
//! - background: detached from the call, pollable, cancellable, replayable
//!   while it runs; without background, dropping the call cancels;
//! - input items paginate; `store: false` stores nothing; the store's count
//!   bound evicts the oldest; conversations collect input and output.

mod responses_util;

use std::collections::HashMap;

use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{
    self, ContentPart, CreateConversationRequest, CreateResponseRequest, FunctionCallOutputItem,
    FunctionTool, GetResponseRequest, Item, Items, ListConversationItemsRequest,
    ListInputItemsRequest, MessageItem, ReplayResponseRequest, ToolChoice, content_part::Part,
    create_response_request::Input, item::Item as It, response_event::Event as Ev,
    tool_choice::Mode,
};
use gyre_service::responses::StoreConfig;
use responses_util::{Server, collect, created, kind, terminal, text, wait_for};
use tonic::Code;

fn user(t: &str) -> Item {
    Item {
        item: Some(It::Message(MessageItem {
            role: "user".into(),
            content: vec![ContentPart {
                part: Some(Part::InputText(t.into())),
            }],
        })),
        ..Default::default()
    }
}

/// The events agree with each other and with the final response.
fn check_stream(events: &[v1::ResponseEvent]) -> v1::Response {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence_number, i as u64);
    }
    assert_eq!(kind(&events[0]), "created");
    assert_eq!(kind(&events[1]), "in_progress");
    let last = events.last().expect("events");
    let resp = terminal(last).expect("ends with a terminal event").clone();
    assert_eq!(created(events).id, resp.id);
    let mut texts: HashMap<String, String> = HashMap::new();
    for e in events {
        match e.event.as_ref().expect("event") {
            Ev::OutputTextDelta(d) | Ev::ReasoningTextDelta(d) => {
                assert_eq!(resp.output[d.output_index as usize].id, d.item_id);
                texts
                    .entry(d.item_id.clone())
                    .or_default()
                    .push_str(&d.delta);
            }
            Ev::FunctionCallArgumentsDelta(d) => {
                assert_eq!(resp.output[d.output_index as usize].id, d.item_id);
                texts
                    .entry(d.item_id.clone())
                    .or_default()
                    .push_str(&d.delta);
            }
            Ev::OutputTextDone(d) | Ev::ReasoningTextDone(d) => {
                assert_eq!(texts.get(&d.item_id).cloned().unwrap_or_default(), d.text);
            }
            Ev::FunctionCallArgumentsDone(d) => {
                assert_eq!(
                    texts.get(&d.item_id).cloned().unwrap_or_default(),
                    d.arguments
                );
            }
            Ev::OutputItemAdded(x) | Ev::OutputItemDone(x) => {
                let item = x.item.as_ref().expect("item");
                assert_eq!(resp.output[x.output_index as usize].id, item.id);
            }
            _ => {}
        }
    }
    resp
}

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
async fn background_runs_detached_pollable_and_cancellable() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    // Detached: the stream is dropped after its first events, the
    // response still completes.
    let short = CreateResponseRequest {
        background: Some(true),
        ..text("Count with me", 4)
    };
    let mut s = c.create(short).await.expect("create").into_inner();
    let first = s.message().await.expect("event").expect("created");
    let second = s.message().await.expect("event").expect("queued");
    drop(s);
    let r = match first.event {
        Some(Ev::Created(r)) => r,
        e => panic!("{e:?}"),
    };
    assert_eq!(r.status, "queued");
    assert_eq!(kind(&second), "queued");
    let done = wait_for(&mut c, &r.id, |r| {
        r.status != "queued" && r.status != "in_progress"
    })
    .await;
    assert!(
        done.status == "completed" || done.status == "incomplete",
        "{done:?}"
    );
    assert!(!done.output.is_empty());

    // A long one: replayed live, then cancelled.
    let long = CreateResponseRequest {
        background: Some(true),
        temperature: Some(1.0),
        ..text("Tell me a long story", 100_000)
    };
    let mut s = c.create(long).await.expect("create").into_inner();
    let id = match s.message().await.expect("event").and_then(|e| e.event) {
        Some(Ev::Created(r)) => r.id,
        e => panic!("{e:?}"),
    };
    drop(s);
    let mut live = c
        .replay(ReplayResponseRequest {
            response_id: id.clone(),
            starting_after: Some(1),
        })
        .await
        .expect("replay")
        .into_inner();
    let e = live.message().await.expect("event").expect("one");
    assert_eq!(e.sequence_number, 2);
    let running = wait_for(&mut c, &id, |r| r.status == "in_progress").await;
    assert_eq!(running.id, id);
    let cancelled = c
        .cancel(v1::CancelResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!(cancelled.status, "cancelled");
    // The live replay ends, its numbers running on by one.
    let mut last = e.sequence_number;
    while let Some(e) = live.message().await.expect("replay stays healthy") {
        assert_eq!(e.sequence_number, last + 1);
        last = e.sequence_number;
    }
    let got = c
        .get(GetResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.status, "cancelled");
    // Cancelling again returns it unchanged.
    let again = c
        .cancel(v1::CancelResponseRequest { response_id: id })
        .await
        .expect("cancel again")
        .into_inner();
    assert_eq!(again, got);
    server.stop().await;
}

#[tokio::test]
async fn dropping_a_foreground_stream_cancels_it() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let long = CreateResponseRequest {
        temperature: Some(1.0),
        ..text("Tell me a long story", 100_000)
    };
    let mut s = c.create(long).await.expect("create").into_inner();
    let id = match s.message().await.expect("event").and_then(|e| e.event) {
        Some(Ev::Created(r)) => r.id,
        e => panic!("{e:?}"),
    };
    // Not background: Cancel is refused.
    let err = c
        .cancel(v1::CancelResponseRequest {
            response_id: id.clone(),
        })
        .await
        .expect_err("not background");
    assert_eq!(err.code(), Code::FailedPrecondition);
    drop(s);
    let r = wait_for(&mut c, &id, |r| r.status == "cancelled").await;
    assert!(r.completed_at.is_some());
    server.stop().await;
}

#[tokio::test]
async fn input_items_paginate_both_ways() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let items: Vec<Item> = (0..5).map(|i| user(&format!("message {i}"))).collect();
    let req = CreateResponseRequest {
        input: Some(Input::Items(Items { items })),
        ..text("", 2)
    };
    let resp = check_stream(&collect(c.create(req).await.expect("create").into_inner()).await);
    let list =
        |after: Option<String>, limit: Option<u32>, order: Option<&str>| ListInputItemsRequest {
            response_id: resp.id.clone(),
            after,
            limit,
            order: order.map(str::to_string),
        };
    let texts = |l: &v1::ItemList| -> Vec<String> {
        l.data
            .iter()
            .map(|i| match &i.item {
                Some(It::Message(m)) => match &m.content[0].part {
                    Some(Part::InputText(t)) => t.clone(),
                    p => panic!("{p:?}"),
                },
                i => panic!("{i:?}"),
            })
            .collect()
    };
    let page = c
        .list_input_items(list(None, Some(2), Some("asc")))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&page), ["message 0", "message 1"]);
    assert!(page.has_more);
    assert!(page.data.iter().all(|i| i.id.starts_with("in_")));
    let next = c
        .list_input_items(list(Some(page.data[1].id.clone()), Some(100), Some("asc")))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&next), ["message 2", "message 3", "message 4"]);
    assert!(!next.has_more);
    // Default order is newest first.
    let desc = c
        .list_input_items(list(None, Some(2), None))
        .await
        .expect("page")
        .into_inner();
    assert_eq!(texts(&desc), ["message 4", "message 3"]);
    for (bad, field) in [
        (list(None, Some(0), None), "limit"),
        (list(None, Some(101), None), "limit"),
        (list(None, None, Some("up")), "order"),
        (list(Some("in_nope".into()), None, None), "after"),
    ] {
        let e = c.list_input_items(bad).await.expect_err("bad");
        assert_eq!(e.code(), Code::InvalidArgument, "{field}");
        assert_eq!(bad_field(&e), field);
    }
    let e = c
        .list_input_items(ListInputItemsRequest {
            response_id: "resp_nope".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    server.stop().await;
}

pub fn bad_field(s: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    s.get_details_bad_request()
        .and_then(|b| b.field_violations.first().map(|v| v.field.clone()))
        .unwrap_or_default()
}

#[tokio::test]
async fn store_false_writes_nothing_and_bounds_evict_the_oldest() {
    let server = Server::start(StoreConfig {
        max_entries: 2,
        ..StoreConfig::default()
    })
    .await;
    let mut c = server.client().await;
    let unstored = CreateResponseRequest {
        store: Some(false),
        ..text("hi", 2)
    };
    let events = collect(c.create(unstored).await.expect("create").into_inner()).await;
    let id = check_stream(&events).id;
    let get = |id: &str| GetResponseRequest {
        response_id: id.to_string(),
    };
    assert_eq!(
        c.get(get(&id)).await.expect_err("not stored").code(),
        Code::NotFound
    );
    let replay = ReplayResponseRequest {
        response_id: id.clone(),
        starting_after: None,
    };
    assert_eq!(
        c.replay(replay).await.err().map(|e| e.code()),
        Some(Code::NotFound)
    );
    let chained = CreateResponseRequest {
        previous_response_id: Some(id.clone()),
        ..text("more", 2)
    };
    let e = c.create(chained).await.expect_err("unknown previous");
    assert_eq!(
        (e.code(), bad_field(&e).as_str()),
        (Code::NotFound, "previous_response_id")
    );

    let mut ids = Vec::new();
    for i in 0..3 {
        let events = collect(
            c.create(text(&format!("n{i}"), 2))
                .await
                .expect("create")
                .into_inner(),
        )
        .await;
        ids.push(check_stream(&events).id);
    }
    assert_eq!(
        c.get(get(&ids[0])).await.expect_err("evicted").code(),
        Code::NotFound
    );
    for id in &ids[1..] {
        c.get(get(id)).await.expect("kept");
    }
    // Delete, then it is gone.
    let d = c
        .delete(v1::DeleteResponseRequest {
            response_id: ids[2].clone(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert!(d.deleted);
    assert_eq!(
        c.get(get(&ids[2])).await.expect_err("deleted").code(),
        Code::NotFound
    );
    let again = c
        .delete(v1::DeleteResponseRequest {
            response_id: ids[2].clone(),
        })
        .await
        .expect_err("already deleted");
    assert_eq!(again.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn conversations_collect_input_and_output() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let conv = c
        .create_conversation(CreateConversationRequest {
            items: vec![user("first")],
            metadata: [("topic".to_string(), "tests".to_string())].into(),
        })
        .await
        .expect("create")
        .into_inner();
    assert!(conv.id.starts_with("conv_"));
    let req = CreateResponseRequest {
        conversation: Some(conv.id.clone()),
        ..text("second", 3)
    };
    let count = c
        .count_input_tokens(req.clone())
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    let resp = check_stream(&collect(c.create(req).await.expect("create").into_inner()).await);
    assert_eq!(resp.usage.expect("usage").input_tokens, count);
    let items = c
        .list_conversation_items(ListConversationItemsRequest {
            conversation_id: conv.id.clone(),
            order: Some("asc".into()),
            ..Default::default()
        })
        .await
        .expect("items")
        .into_inner();
    // The first item, the input, then the output.
    assert_eq!(items.data.len(), 2 + resp.output.len());
    assert_eq!(items.data[0].item, user("first").item);
    assert_eq!(items.data[1].item, user("second").item);
    assert_eq!(items.data[2..], resp.output[..]);
    // A second turn sees both earlier turns.
    let next = CreateResponseRequest {
        conversation: Some(conv.id.clone()),
        ..text("third", 2)
    };
    let more = c
        .count_input_tokens(next)
        .await
        .expect("count")
        .into_inner()
        .input_tokens;
    assert!(more > count);
    let got = c
        .get_conversation(v1::GetConversationRequest {
            conversation_id: conv.id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got, conv);
    c.delete_conversation(v1::DeleteConversationRequest {
        conversation_id: conv.id.clone(),
    })
    .await
    .expect("delete");
    let e = c
        .get_conversation(v1::GetConversationRequest {
            conversation_id: conv.id.clone(),
        })
        .await
        .expect_err("deleted");
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .create(CreateResponseRequest {
            conversation: Some(conv.id),
            ..text("x", 2)
        })
        .await
        .expect_err("unknown conversation");
    assert_eq!(
        (e.code(), bad_field(&e).as_str()),
        (Code::NotFound, "conversation")
    );
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
