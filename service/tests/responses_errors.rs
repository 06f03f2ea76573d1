//! Every bad field of a Responses request is INVALID_ARGUMENT (or NOT_FOUND
//! for unknown ids) with the field in OpenAI's spelling, before any event,
//! over real loopback gRPC; the server then still serves.

mod responses_util;

use gyre_api::v1::{
    ContentPart, CreateResponseRequest, FunctionCallItem, FunctionTool, Item, Items,
    JsonSchemaFormat, MessageItem, TextFormat, ToolChoice, content_part::Part,
    create_response_request::Input, item::Item as It, text_format::Format, tool_choice::Mode,
};
use gyre_service::responses::StoreConfig;
use responses_util::{Server, collect, text};
use tonic::Code;
use tonic_types::StatusExt;

fn items(list: Vec<Item>) -> Option<Input> {
    Some(Input::Items(Items { items: list }))
}

fn message(role: &str, part: Option<Part>) -> Item {
    Item {
        item: Some(It::Message(MessageItem {
            role: role.into(),
            content: vec![ContentPart { part }],
        })),
        ..Default::default()
    }
}

fn tool(name: &str, parameters: Option<&str>) -> FunctionTool {
    FunctionTool {
        name: name.into(),
        parameters: parameters.map(str::to_string),
        ..Default::default()
    }
}

/// Each request with the field it gets wrong.
fn cases() -> Vec<(CreateResponseRequest, &'static str)> {
    let base = || text("hi", 4);
    let with = |f: &dyn Fn(&mut CreateResponseRequest)| {
        let mut r = base();
        f(&mut r);
        r
    };
    let hi = || Some(Part::InputText("hi".into()));
    vec![
        (with(&|r| r.input = None), "input"),
        (
            with(&|r| r.input = Some(Input::Text(String::new()))),
            "input",
        ),
        (with(&|r| r.input = items(vec![])), "input"),
        (
            with(&|r| r.input = items(vec![message("robot", hi())])),
            "input[0].role",
        ),
        (
            with(&|r| r.input = items(vec![message("user", hi()), Item::default()])),
            "input[1]",
        ),
        (
            with(&|r| r.input = items(vec![message("user", None)])),
            "input[0].content[0]",
        ),
        (
            with(&|r| {
                r.input = items(vec![Item {
                    item: Some(It::FunctionCall(FunctionCallItem {
                        call_id: "call_1".into(),
                        name: "f".into(),
                        arguments: "{not json".into(),
                    })),
                    ..Default::default()
                }])
            }),
            "input[0].arguments",
        ),
        (
            with(&|r| r.max_output_tokens = Some(0)),
            "max_output_tokens",
        ),
        (with(&|r| r.top_logprobs = Some(21)), "top_logprobs"),
        (with(&|r| r.temperature = Some(2.5)), "temperature"),
        (with(&|r| r.temperature = Some(-0.1)), "temperature"),
        (with(&|r| r.top_p = Some(0.0)), "top_p"),
        (with(&|r| r.top_p = Some(1.5)), "top_p"),
        (
            with(&|r| r.include = vec!["file_search_call.results".into()]),
            "include[0]",
        ),
        (
            with(&|r| r.truncation = Some("sometimes".into())),
            "truncation",
        ),
        (
            with(&|r| r.service_tier = Some("gold".into())),
            "service_tier",
        ),
        (
            with(&|r| r.reasoning_effort = Some("extreme".into())),
            "reasoning.effort",
        ),
        (
            with(&|r| r.reasoning_summary = Some("long".into())),
            "reasoning.summary",
        ),
        (
            with(&|r| r.verbosity = Some("loud".into())),
            "text.verbosity",
        ),
        (
            with(&|r| {
                r.metadata = (0..17)
                    .map(|i| (format!("k{i}"), "v".to_string()))
                    .collect()
            }),
            "metadata",
        ),
        (
            with(&|r| r.metadata = [("k".repeat(65), "v".to_string())].into()),
            "metadata",
        ),
        (
            with(&|r| r.metadata = [("k".to_string(), "v".repeat(513))].into()),
            "metadata",
        ),
        (
            with(&|r| {
                r.background = Some(true);
                r.store = Some(false);
            }),
            "background",
        ),
        (
            with(&|r| {
                r.previous_response_id = Some("resp_x".into());
                r.conversation = Some("conv_x".into());
            }),
            "conversation",
        ),
        (
            with(&|r| r.tools = vec![tool("bad name!", None)]),
            "tools[0].name",
        ),
        (
            with(&|r| r.tools = vec![tool("f", None), tool("g", Some("[1, 2]"))]),
            "tools[1].parameters",
        ),
        (
            with(&|r| {
                r.tools = vec![tool("f", None)];
                r.tool_choice = Some(ToolChoice {
                    mode: Mode::Function as i32,
                    function: "g".into(),
                });
            }),
            "tool_choice",
        ),
        (
            with(&|r| {
                r.tool_choice = Some(ToolChoice {
                    mode: Mode::Required as i32,
                    function: String::new(),
                })
            }),
            "tool_choice",
        ),
        (
            with(&|r| {
                r.text_format = Some(TextFormat {
                    format: Some(Format::JsonSchema(JsonSchemaFormat {
                        name: "answer".into(),
                        schema: "{\"type\": ".into(),
                        ..Default::default()
                    })),
                })
            }),
            "text.format.schema",
        ),
        (
            with(&|r| {
                r.text_format = Some(TextFormat {
                    format: Some(Format::JsonSchema(JsonSchemaFormat {
                        name: "answer".into(),
                        schema: r#"{"type": "no-such-type"}"#.into(),
                        ..Default::default()
                    })),
                })
            }),
            "text.format.schema",
        ),
        (
            with(&|r| {
                r.text_format = Some(TextFormat {
                    format: Some(Format::JsonSchema(JsonSchemaFormat {
                        name: String::new(),
                        schema: "{}".into(),
                        ..Default::default()
                    })),
                })
            }),
            "text.format.name",
        ),
    ]
}

#[tokio::test]
async fn each_bad_field_is_invalid_argument_naming_it() {
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    for (req, field) in cases() {
        let e = c
            .create(req.clone())
            .await
            .err()
            .unwrap_or_else(|| panic!("{field}: accepted"));
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        let got = e
            .get_details_bad_request()
            .and_then(|b| b.field_violations.first().map(|v| v.field.clone()));
        assert_eq!(got.as_deref(), Some(field), "{}", e.message());
        // CountInputTokens validates the same way.
        let e = c
            .count_input_tokens(req)
            .await
            .expect_err("count refuses it too");
        assert_eq!(e.code(), Code::InvalidArgument, "{field}");
    }
    // Unknown ids are NOT_FOUND, naming the parameter.
    for (req, field) in [
        (
            CreateResponseRequest {
                previous_response_id: Some("resp_missing".into()),
                ..text("hi", 2)
            },
            "previous_response_id",
        ),
        (
            CreateResponseRequest {
                conversation: Some("conv_missing".into()),
                ..text("hi", 2)
            },
            "conversation",
        ),
    ] {
        let e = c.create(req).await.expect_err("unknown id");
        assert_eq!(e.code(), Code::NotFound);
        let got = e
            .get_details_bad_request()
            .and_then(|b| b.field_violations.first().map(|v| v.field.clone()));
        assert_eq!(got.as_deref(), Some(field));
        assert_eq!(
            e.get_details_error_info().expect("info").reason,
            "not_found"
        );
    }
    // Nothing was stored, and the server still serves.
    let ok = collect(c.create(text("hi", 2)).await.expect("valid").into_inner()).await;
    assert!(!ok.is_empty());
    server.stop().await;
}

fn field_of(e: &tonic::Status) -> String {
    e.get_details_bad_request()
        .and_then(|b| b.field_violations.first().map(|v| v.field.clone()))
        .unwrap_or_default()
}

#[tokio::test]
async fn unknown_ids_are_not_found_and_bad_conversations_invalid() {
    use gyre_api::v1::{
        CancelResponseRequest, CreateConversationRequest, DeleteConversationRequest,
        DeleteResponseRequest, GetConversationRequest, GetResponseRequest,
        ListConversationItemsRequest, ListInputItemsRequest, ReplayResponseRequest,
    };
    let server = Server::start(StoreConfig::default()).await;
    let mut c = server.client().await;
    let id = || "resp_0123".to_string();
    let conv = || "conv_0123".to_string();
    let mut found = Vec::new();
    let get = c.get(GetResponseRequest { response_id: id() }).await;
    found.push(("get", get.map(|_| ())));
    let del = c.delete(DeleteResponseRequest { response_id: id() }).await;
    found.push(("delete", del.map(|_| ())));
    let cancel = c.cancel(CancelResponseRequest { response_id: id() }).await;
    found.push(("cancel", cancel.map(|_| ())));
    let replay = c
        .replay(ReplayResponseRequest {
            response_id: id(),
            starting_after: None,
        })
        .await;
    found.push(("replay", replay.map(|_| ())));
    let items = c
        .list_input_items(ListInputItemsRequest {
            response_id: id(),
            ..Default::default()
        })
        .await;
    found.push(("input items", items.map(|_| ())));
    for (what, r) in found {
        let e = r.expect_err(what);
        assert_eq!(
            (e.code(), field_of(&e).as_str()),
            (Code::NotFound, "response_id"),
            "{what}"
        );
    }
    let mut found = Vec::new();
    let get = c
        .get_conversation(GetConversationRequest {
            conversation_id: conv(),
        })
        .await;
    found.push(("get", get.map(|_| ())));
    let del = c
        .delete_conversation(DeleteConversationRequest {
            conversation_id: conv(),
        })
        .await;
    found.push(("delete", del.map(|_| ())));
    let items = c
        .list_conversation_items(ListConversationItemsRequest {
            conversation_id: conv(),
            ..Default::default()
        })
        .await;
    found.push(("items", items.map(|_| ())));
    for (what, r) in found {
        let e = r.expect_err(what);
        assert_eq!(
            (e.code(), field_of(&e).as_str()),
            (Code::NotFound, "conversation_id"),
            "{what}"
        );
    }
    let hi = || message("user", Some(Part::InputText("hi".into())));
    for (req, field) in [
        (
            CreateConversationRequest {
                items: (0..21).map(|_| hi()).collect(),
                ..Default::default()
            },
            "items",
        ),
        (
            CreateConversationRequest {
                items: vec![hi(), message("robot", Some(Part::InputText("x".into())))],
                ..Default::default()
            },
            "items[1].role",
        ),
        (
            CreateConversationRequest {
                metadata: (0..17).map(|i| (format!("k{i}"), String::new())).collect(),
                ..Default::default()
            },
            "metadata",
        ),
    ] {
        let e = c.create_conversation(req).await.expect_err(field);
        assert_eq!(
            (e.code(), field_of(&e).as_str()),
            (Code::InvalidArgument, field)
        );
    }
    server.stop().await;
}
