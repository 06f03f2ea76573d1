//! The grammar that forces a tool call (`tool_choice` `required` or a
//! named function), in each format's own syntax.

use serde_json::{Value, json};

use super::ToolFormat;
use super::deepseek::{
    CALL_BEGIN as DS_CALL_BEGIN, CALL_END as DS_CALL_END, CALLS_BEGIN as DS_CALLS_BEGIN,
    CALLS_END as DS_CALLS_END, SEP as DS_SEP,
};
use crate::compact::compact;

/// A function the model may call: its name and parameters' JSON Schema.
pub struct FunctionSpec {
    pub name: String,
    pub parameters: Value,
}

impl FunctionSpec {
    /// The parameters' schema, always of an object: any object when the
    /// tool gave none, and `"type": "object"` added to a schema that names
    /// no type (`{}`, or properties alone), which would otherwise let the
    /// arguments be a string or a number, no call at all to a parser.
    pub fn parameters_schema(&self) -> Value {
        match &self.parameters {
            Value::Object(o) if o.contains_key("type") => self.parameters.clone(),
            Value::Object(o) => {
                let mut o = o.clone();
                o.insert("type".into(), json!("object"));
                Value::Object(o)
            }
            _ => json!({"type": "object"}),
        }
    }
}

/// Whether `parameters` (a tool's schema as given) can describe an object:
/// none given, no `type`, or a `type` of `"object"` (alone or among
/// others). OpenAI refuses the others; arguments are always an object.
pub fn parameters_are_an_object(parameters: &Value) -> bool {
    match parameters {
        Value::Null => true,
        Value::Object(o) => match o.get("type") {
            None => true,
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            Some(_) => false,
        },
        _ => false,
    }
}

/// A Lark grammar (llguidance dialect) whose every sentence is a valid call
/// in `format` to one of `functions` (at least one; several only when
/// `parallel`), with arguments valid against the function's schema.
pub fn forcing_grammar(format: ToolFormat, functions: &[FunctionSpec], parallel: bool) -> String {
    let key = if format == ToolFormat::Llama3Json {
        "parameters"
    } else {
        "arguments"
    };
    let one_of: Vec<Value> = functions
        .iter()
        .map(|f| {
            let params = f.parameters_schema();
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, key: params},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = compact(json!({"anyOf": one_of}));
    let many = if parallel { "+" } else { "" };
    match format {
        ToolFormat::Hermes => format!(
            "start: (\"<tool_call>\\n\" call \"\\n</tool_call>\\n\"){many}\ncall: %json {call}\n"
        ),
        ToolFormat::Mistral => {
            let mut list = json!({"type": "array", "items": {"anyOf": one_of}, "minItems": 1});
            if !parallel && let Some(o) = list.as_object_mut() {
                o.insert("maxItems".into(), json!(1));
            }
            let list = compact(list);
            format!("start: \"[TOOL_CALLS]\" calls\ncalls: %json {list}\n")
        }
        ToolFormat::DeepSeek => {
            // V3.1's form: name<sep>{arguments}, one rule per function.
            let rules: Vec<String> = functions
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let params = compact(f.parameters_schema());
                    let name = serde_json::to_string(&format!("{DS_CALL_BEGIN}{}{DS_SEP}", f.name))
                        .unwrap_or_default();
                    let end = serde_json::to_string(DS_CALL_END).unwrap_or_default();
                    format!("call{i}: {name} args{i} {end}\nargs{i}: %json {params}\n")
                })
                .collect();
            let alts: Vec<String> = (0..functions.len()).map(|i| format!("call{i}")).collect();
            let begin = serde_json::to_string(DS_CALLS_BEGIN).unwrap_or_default();
            let end = serde_json::to_string(DS_CALLS_END).unwrap_or_default();
            format!(
                "start: {begin} call{many} {end}\ncall: {}\n{}",
                alts.join(" | "),
                rules.concat()
            )
        }
        ToolFormat::Llama3Json | ToolFormat::Json => {
            if parallel {
                format!("start: call (\"; \" call)*\ncall: %json {call}\n")
            } else {
                format!("start: call\ncall: %json {call}\n")
            }
        }
    }
}
