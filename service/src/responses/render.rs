//! A Responses request as the generation request chat makes: its
//! instructions, history and input items become chat messages (rendered by
//! the chat path, `crate::chat`, unchanged), its settings the fields of
//! `v1::Request`. Errors the generation path reports in chat's spelling are
//! renamed to the Responses request's fields (`remap`).
//!
//! Items to messages: a `message` is a message of its role (its text parts
//! joined by newlines); `function_call` items become the `tool_calls` of an
//! assistant turn (joining the assistant message just before them, or a
//! new one); `function_call_output` a `tool` message; a `reasoning` item
//! the `reasoning_content` of the next assistant turn.

use gyre_api::v1::{
    self, ChatInput, ChatMessage, CreateResponseRequest, FunctionCall, FunctionDefinition, Item,
    StructuredOutput, Tool, ToolCall, content_part::Part, item::Item as It,
    request::Input as ReqInput, structured_output::Kind, text_format::Format,
};

use super::validate::INCLUDE_LOGPROBS;
use crate::error::ServiceError;

/// Chat messages for `instructions`, then `items`.
pub fn messages(instructions: Option<&str>, items: &[Item]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::new();
    if let Some(text) = instructions {
        out.push(ChatMessage {
            role: "system".into(),
            content: Some(text.to_string()),
            ..Default::default()
        });
    }
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn that calls may join.
    let mut open_turn = false;
    for item in items {
        match &item.item {
            Some(It::Message(m)) => {
                let text = m
                    .content
                    .iter()
                    .filter_map(|p| match &p.part {
                        Some(Part::InputText(t) | Part::Refusal(t)) => Some(t.as_str()),
                        Some(Part::OutputText(t)) => Some(t.text.as_str()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                let assistant = m.role == "assistant";
                out.push(ChatMessage {
                    role: m.role.clone(),
                    content: Some(text),
                    reasoning_content: if assistant { reasoning.take() } else { None },
                    ..Default::default()
                });
                open_turn = assistant;
            }
            Some(It::FunctionCall(f)) => {
                let call = ToolCall {
                    id: f.call_id.clone(),
                    r#type: "function".into(),
                    function: Some(FunctionCall {
                        name: f.name.clone(),
                        arguments: f.arguments.clone(),
                    }),
                };
                match out.last_mut() {
                    Some(last) if open_turn => last.tool_calls.push(call),
                    _ => {
                        out.push(ChatMessage {
                            role: "assistant".into(),
                            content: None,
                            tool_calls: vec![call],
                            reasoning_content: reasoning.take(),
                            ..Default::default()
                        });
                        open_turn = true;
                    }
                }
            }
            Some(It::FunctionCallOutput(o)) => {
                out.push(ChatMessage {
                    role: "tool".into(),
                    content: Some(o.output.clone()),
                    tool_call_id: Some(o.call_id.clone()),
                    ..Default::default()
                });
                open_turn = false;
            }
            Some(It::Reasoning(r)) => {
                let text = if r.text.is_empty() {
                    r.summary.join("\n")
                } else {
                    r.text.clone()
                };
                reasoning = Some(text);
                open_turn = false;
            }
            None => {}
        }
    }
    out
}

/// The generation request for `r` over `messages`.
pub fn generation_request(
    id: &str,
    r: &CreateResponseRequest,
    messages: Vec<ChatMessage>,
) -> v1::Request {
    let tools = r
        .tools
        .iter()
        .map(|t| Tool {
            r#type: "function".into(),
            function: Some(FunctionDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
                strict: t.strict,
            }),
        })
        .collect();
    let kwargs = r.reasoning_effort.as_ref().map(|e| prost_types::Struct {
        fields: [(
            "reasoning_effort".to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(e.clone())),
            },
        )]
        .into_iter()
        .collect(),
    });
    let chat = ChatInput {
        messages,
        tools,
        tool_choice: r.tool_choice.clone(),
        parallel_tool_calls: r.parallel_tool_calls,
        chat_template_kwargs: kwargs,
        ..Default::default()
    };
    let mut sampling = r.sampling.clone().unwrap_or_default();
    if r.temperature.is_some() {
        sampling.temperature = r.temperature;
    }
    if r.top_p.is_some() {
        sampling.top_p = r.top_p;
    }
    let structured = match r.text_format.as_ref().and_then(|f| f.format.as_ref()) {
        Some(Format::JsonObject(true)) => Some(StructuredOutput {
            kind: Some(Kind::JsonObject(true)),
        }),
        Some(Format::JsonSchema(s)) => Some(StructuredOutput {
            kind: Some(Kind::JsonSchema(s.schema.clone())),
        }),
        _ => None,
    };
    let logprobs = r
        .include
        .iter()
        .any(|i| i == INCLUDE_LOGPROBS)
        .then(|| r.top_logprobs.unwrap_or(0));
    v1::Request {
        request_id: id.to_string(),
        model: r.model.clone(),
        input: Some(ReqInput::Chat(chat)),
        sampling: Some(sampling),
        max_tokens: r.max_output_tokens,
        clamp_max_tokens: true,
        logprobs,
        n: Some(1),
        cache_salt: r.prompt_cache_key.clone(),
        structured,
        ..Default::default()
    }
}

/// A generation error with its field renamed from chat's spelling to the
/// Responses request's.
pub fn remap(e: ServiceError) -> ServiceError {
    match e {
        ServiceError::InvalidArgument {
            field,
            reason,
            message,
        } => ServiceError::InvalidArgument {
            field: rename(&field),
            reason,
            message,
        },
        ServiceError::Unservable {
            field,
            reason,
            message,
        } => ServiceError::Unservable {
            field: rename(&field),
            reason,
            message,
        },
        ServiceError::Engine(gyre_engine::EngineError::ContextTooLong { prompt, max, .. }) => {
            ServiceError::invalid(
                "input",
                "CONTEXT_LENGTH_EXCEEDED",
                format!(
                    "this model's maximum context length is {max} tokens and the input has \
                     {prompt}; truncation \"auto\" drops the oldest items until it fits"
                ),
            )
        }
        ServiceError::Engine(e @ gyre_engine::EngineError::ExceedsKvCapacity { .. }) => {
            ServiceError::invalid("input", "EXCEEDS_KV_CAPACITY", e.to_string())
        }
        other => other,
    }
}

fn rename(field: &str) -> String {
    if let Some(rest) = field.strip_prefix("chat.tools") {
        return format!("tools{}", rest.replace(".function", ""));
    }
    if field.starts_with("chat.messages") || field == "input" || field.starts_with("input.") {
        return "input".into();
    }
    if let Some(rest) = field.strip_prefix("sampling.") {
        return match rest {
            "temperature" | "top_p" => rest.to_string(),
            _ => field.to_string(),
        };
    }
    match field {
        "chat.tool_choice" => "tool_choice".into(),
        "chat.chat_template_kwargs" => "reasoning.effort".into(),
        "structured" => "text.format.schema".into(),
        "logprobs" => "top_logprobs".into(),
        "max_tokens" => "max_output_tokens".into(),
        f => f.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gyre_api::v1::{
        FunctionCallItem, FunctionCallOutputItem, MessageItem, OutputText, ReasoningItem,
    };

    fn item(i: It) -> Item {
        Item {
            item: Some(i),
            ..Default::default()
        }
    }

    #[test]
    fn items_become_chat_turns_in_order() {
        let items = vec![
            item(It::Message(MessageItem {
                role: "user".into(),
                content: vec![v1::ContentPart {
                    part: Some(Part::InputText("weather?".into())),
                }],
            })),
            item(It::Reasoning(ReasoningItem {
                text: "think".into(),
                ..Default::default()
            })),
            item(It::FunctionCall(FunctionCallItem {
                call_id: "call_1".into(),
                name: "get".into(),
                arguments: "{}".into(),
            })),
            item(It::FunctionCall(FunctionCallItem {
                call_id: "call_2".into(),
                name: "get".into(),
                arguments: "{\"a\":1}".into(),
            })),
            item(It::FunctionCallOutput(FunctionCallOutputItem {
                call_id: "call_1".into(),
                output: "sunny".into(),
            })),
            item(It::Message(MessageItem {
                role: "assistant".into(),
                content: vec![v1::ContentPart {
                    part: Some(Part::OutputText(OutputText {
                        text: "It is sunny".into(),
                        ..Default::default()
                    })),
                }],
            })),
        ];
        let m = messages(Some("be brief"), &items);
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(m[0].content.as_deref(), Some("be brief"));
        assert_eq!(m[2].tool_calls.len(), 2);
        assert_eq!(m[2].tool_calls[1].id, "call_2");
        assert_eq!(m[2].reasoning_content.as_deref(), Some("think"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m[4].content.as_deref(), Some("It is sunny"));
        assert_eq!(m[4].reasoning_content, None);
    }

    #[test]
    fn settings_map_onto_the_generation_request() {
        let r = CreateResponseRequest {
            model: "m".into(),
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_logprobs: Some(3),
            include: vec![INCLUDE_LOGPROBS.into()],
            max_output_tokens: Some(7),
            prompt_cache_key: Some("tenant".into()),
            reasoning_effort: Some("low".into()),
            parallel_tool_calls: Some(false),
            text_format: Some(v1::TextFormat {
                format: Some(Format::JsonObject(true)),
            }),
            ..Default::default()
        };
        let g = generation_request("resp_1", &r, Vec::new());
        let s = g.sampling.expect("sampling");
        assert_eq!((s.temperature, s.top_p), (Some(0.5), Some(0.9)));
        assert_eq!(g.logprobs, Some(3));
        assert_eq!(g.max_tokens, Some(7));
        assert!(g.clamp_max_tokens);
        assert_eq!(g.cache_salt.as_deref(), Some("tenant"));
        assert_eq!(
            g.structured.and_then(|s| s.kind),
            Some(Kind::JsonObject(true))
        );
        let Some(ReqInput::Chat(chat)) = g.input else {
            panic!("chat input");
        };
        assert_eq!(chat.parallel_tool_calls, Some(false));
        let effort = chat
            .chat_template_kwargs
            .and_then(|k| k.fields.get("reasoning_effort").cloned())
            .and_then(|v| v.kind);
        assert_eq!(
            effort,
            Some(prost_types::value::Kind::StringValue("low".into()))
        );
        // Without the include, no logprobs whatever top_logprobs says.
        let plain = generation_request(
            "resp_2",
            &CreateResponseRequest {
                top_logprobs: Some(3),
                ..Default::default()
            },
            Vec::new(),
        );
        assert_eq!(plain.logprobs, None);
    }

    #[test]
    fn chat_fields_are_renamed() {
        for (chat, ours) in [
            ("chat.tools[1].function.parameters", "tools[1].parameters"),
            ("chat.tool_choice", "tool_choice"),
            ("sampling.temperature", "temperature"),
            ("structured", "text.format.schema"),
            ("logprobs", "top_logprobs"),
            ("chat.messages[3].content", "input"),
            ("sampling.min_p", "sampling.min_p"),
        ] {
            assert_eq!(rename(chat), ours);
        }
    }
}
