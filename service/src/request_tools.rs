//! A request's tools: whether it parses the calls the model writes, or
//! forces one (and with which functions), and which tool to blame when a
//! forcing grammar does not compile.

use gyre_api::v1::{self, request::Input};

use crate::error::ServiceError;
use crate::runtime::ModelRuntime;
use crate::tools::{FunctionSpec, ToolFormat};

/// What a request's tools ask for.
pub(super) enum ToolPlan {
    /// No tools, or tool_choice NONE.
    Off,
    /// AUTO: parse the calls the model makes.
    Parse(ToolFormat),
    /// REQUIRED or FUNCTION: force a call to one of these functions, each
    /// with its index among the tools (several calls when parallel).
    Force(ToolFormat, Vec<(usize, FunctionSpec)>, bool),
}

pub(super) fn tool_plan(model: &ModelRuntime, req: &v1::Request) -> Result<ToolPlan, ServiceError> {
    use v1::tool_choice::Mode;
    let chat = match &req.input {
        Some(Input::Chat(c)) => c,
        _ => return Ok(ToolPlan::Off),
    };
    let choice = chat.tool_choice.clone().unwrap_or_default();
    let mode = Mode::try_from(choice.mode).unwrap_or(Mode::Auto);
    if chat.tools.is_empty() {
        return match mode {
            Mode::Auto | Mode::None if chat.tool_choice.is_none() || mode == Mode::None => {
                Ok(ToolPlan::Off)
            }
            _ => Err(ServiceError::invalid(
                "chat.tool_choice",
                "TOOL_CHOICE_WITHOUT_TOOLS",
                "tool_choice needs tools",
            )),
        };
    }
    let format = model
        .tool_call_parser
        .or_else(|| {
            chat.chat_template
                .as_deref()
                .map(ToolFormat::detect)
                .or_else(|| model.template.as_ref().map(|t| t.tool_format))
        })
        .unwrap_or(ToolFormat::Json);
    let spec = |i: usize, t: &v1::Tool| -> Result<FunctionSpec, ServiceError> {
        let f = t.function.clone().unwrap_or_default();
        let parameters = match f.parameters.as_deref() {
            None | Some("") => serde_json::Value::Null,
            Some(text) => serde_json::from_str(text).map_err(|e| {
                ServiceError::invalid(
                    format!("chat.tools[{i}].function.parameters"),
                    "INVALID_TOOL",
                    format!(
                        "the parameters are not JSON: {}",
                        gyre_api::clip(&e.to_string())
                    ),
                )
            })?,
        };
        if !crate::tools::parameters_are_an_object(&parameters) {
            return Err(ServiceError::invalid(
                format!("chat.tools[{i}].function.parameters"),
                "INVALID_TOOL",
                format!(
                    "the parameters must be a JSON Schema of type \"object\" (a function's \
                     arguments are an object), got {}",
                    gyre_api::clip(&parameters.to_string())
                ),
            ));
        }
        Ok(FunctionSpec {
            name: f.name,
            parameters,
        })
    };
    let parallel = chat.parallel_tool_calls.unwrap_or(true);
    match mode {
        Mode::None => Ok(ToolPlan::Off),
        Mode::Auto => Ok(ToolPlan::Parse(format)),
        Mode::Required => {
            let functions = chat
                .tools
                .iter()
                .enumerate()
                .map(|(i, t)| spec(i, t).map(|f| (i, f)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ToolPlan::Force(format, functions, parallel))
        }
        Mode::Function => {
            let Some((i, t)) = chat.tools.iter().enumerate().find(|(_, t)| {
                t.function
                    .as_ref()
                    .is_some_and(|f| f.name == choice.function)
            }) else {
                return Err(ServiceError::invalid(
                    "chat.tool_choice",
                    "UNKNOWN_TOOL",
                    format!(
                        "tool_choice names `{}`, which is not among the tools",
                        gyre_api::clip(&choice.function)
                    ),
                ));
            };
            Ok(ToolPlan::Force(format, vec![(i, spec(i, t)?)], parallel))
        }
    }
}

/// Where a forcing grammar did not compile: the first function whose
/// parameters' schema does not compile alone, as an error naming that
/// tool's `parameters` (not the structured output the grammar became).
pub(super) fn tool_schema_error(
    g: &crate::structured::Grammars,
    functions: &[(usize, FunctionSpec)],
) -> Option<ServiceError> {
    functions.iter().find_map(|(i, f)| {
        let alone = v1::StructuredOutput {
            kind: Some(v1::structured_output::Kind::JsonSchema(
                f.parameters_schema().to_string(),
            )),
        };
        g.compile(&alone).err().map(|e| {
            ServiceError::invalid(
                format!("chat.tools[{i}].function.parameters"),
                "INVALID_TOOL",
                format!("the parameters' JSON Schema cannot be enforced: {e}"),
            )
        })
    })
}
