//! Chat templates: the model's own Jinja template (from tokenizer_config.json,
//! `--chat-template`, or a request's own when the server trusts them)
//! rendered with minijinja the way transformers' `apply_chat_template` does:
//! trim_blocks and lstrip_blocks on, loop controls, Python string methods
//! through pycompat, `raise_exception`, `strftime_now`, a `tojson` that writes
//! what Python's `json.dumps` writes, none and booleans printed as Python
//! prints them, reasoning aliased as transformers aliases it, and
//! `continue_final_message` cut where transformers cuts.
//!
//! Messages and tools arrive here as JSON already normalised from the wire
//! (see `chat.rs`): this module only renders.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, syntax::SyntaxConfig};
use serde_json::{Map, Value as Json};

/// A compiled chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The tool-call format the template asks its model to use.
    pub tool_format: crate::tools::ToolFormat,
    source: String,
    source_mentions_content: bool,
    bos_token: String,
    eos_token: String,
}

/// Why rendering failed; `Raised` carries the template's own message.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{0}")]
    Raised(String),
    #[error("chat template error: {0}")]
    Render(String),
}

/// What one render needs besides the template: the conversation, the tools
/// and the options of `apply_chat_template`.
#[derive(Debug, Clone, Copy)]
pub struct RenderArgs<'a> {
    /// Messages as JSON objects (`role`, `content`, ...).
    pub messages: &'a [Json],
    /// Tools in OpenAI's function-tool shape; `None` renders as none.
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`).
    pub kwargs: &'a Map<String, Json>,
    pub continue_final_message: bool,
}

/// The marker transformers appends to the final message to find where it
/// ends in the rendered text (`continue_final_message`).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The names a message's reasoning goes by; transformers copies it to the
/// first (`reasoning_content`) and to `thinking` (gpt-oss templates).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_test("iterable", is_iterable);
        env.add_test("sequence", is_sequence);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("invalid chat template: {e}"))?;
        Ok(Self {
            env,
            tool_format: crate::tools::ToolFormat::detect(source),
            source: source.to_string(),
            source_mentions_content: source.contains("content"),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders plain messages with no tools, kwargs or continuation.
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(RenderArgs {
            messages,
            tools: None,
            add_generation_prompt,
            kwargs: &Map::new(),
            continue_final_message: false,
        })
    }

    /// Renders as `apply_chat_template(tokenize=False, ...)` does, with
    /// tools, extra template variables and, with `continue_final_message`,
    /// the text cut right after the last message's content so the model
    /// continues it.
    pub fn render_with(&self, args: RenderArgs<'_>) -> Result<String, TemplateError> {
        if args.continue_final_message && args.add_generation_prompt {
            return Err(TemplateError::Raised(
                "continue_final_message and add_generation_prompt cannot both be true".into(),
            ));
        }
        let mut messages: Vec<Json> = args.messages.iter().map(alias_reasoning).collect();
        let mut final_text = None;
        if args.continue_final_message {
            let Some(last) = messages.last_mut().and_then(Json::as_object_mut) else {
                return Err(TemplateError::Raised(
                    "continue_final_message is set but the conversation is empty!".into(),
                ));
            };
            let Some(Json::String(text)) = last.get("content").cloned() else {
                return Err(TemplateError::Raised(
                    "continue_final_message is set but the final message has no \"content\" to continue!".into(),
                ));
            };
            if !self.source_mentions_content {
                return Err(TemplateError::Raised(
                    "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template".into(),
                ));
            }
            last.insert(
                "content".into(),
                Json::String(format!("{text}{CONTINUE_TAG}")),
            );
            final_text = Some(text);
        }
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        // As in transformers, kwargs may override the special tokens, but
        // not the conversation, tools or add_generation_prompt.
        let specials = minijinja::context! {
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        };
        let ctx = minijinja::context! {
            messages => Value::from(minijinja::value::Serde(&messages)),
            tools => args.tools.map(|t| Value::from(minijinja::value::Serde(t))).unwrap_or(Value::from(())),
            documents => Value::from(()),
            add_generation_prompt => args.add_generation_prompt,
            ..minijinja::context! {
                ..Value::from(minijinja::value::Serde(args.kwargs)),
                ..specials
            }
        };
        let rendered = tmpl.render(ctx).map_err(|e| {
            if e.kind() == ErrorKind::InvalidOperation
                && let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED))
            {
                return TemplateError::Raised(msg.to_string());
            }
            TemplateError::Render(format!("{e:#}"))
        })?;
        let Some(text) = final_text else {
            return Ok(rendered);
        };
        let tag = CONTINUE_TAG.trim_end();
        let Some(at) = rendered
            .rfind(tag)
            .filter(|_| rendered.contains(text.trim()))
        else {
            return Err(TemplateError::Raised(
                "continue_final_message is set but the final message does not appear in the chat after applying the chat template".into(),
            ));
        };
        if rendered[at..].starts_with(CONTINUE_TAG) {
            Ok(rendered[..at].to_string())
        } else {
            // The template trimmed the message's trailing space.
            Ok(rendered[..at].trim_end().to_string())
        }
    }
}

/// A message as transformers hands it to the template: reasoning under any
/// of its names is copied to `thinking` (first) and `reasoning_content`.
fn alias_reasoning(message: &Json) -> Json {
    let Some(obj) = message.as_object() else {
        return message.clone();
    };
    let Some(reasoning) = REASONING_FIELDS
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()))
    else {
        return message.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in obj {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), reasoning.clone());
    Json::Object(out)
}

/// `is iterable` as in Python: strings, lists and dicts are, none is not.
fn is_iterable(v: &Value) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(
        v.kind(),
        K::Undefined | K::String | K::Bytes | K::Seq | K::Map | K::Iterable
    )
}

/// `is sequence` as in Python (anything with a length and indexing):
/// strings and dicts are sequences too.
fn is_sequence(v: &Value) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(
        v.kind(),
        K::Undefined | K::String | K::Bytes | K::Seq | K::Map
    )
}

/// Prints values as Jinja2 under Python prints them: `None`, `True`,
/// `False`; undefined prints nothing.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    let text = match value.kind() {
        minijinja::value::ValueKind::None => "None",
        minijinja::value::ValueKind::Bool if value.is_true() => "True",
        minijinja::value::ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

const RAISED: &str = "raised: ";

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

/// `strftime_now(fmt)`: the current UTC time formatted with the common
/// strftime directives the templates use (%d %m %Y %y %B %b %H %M %S %j %A %a).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_time(secs, &fmt)
}

fn format_time(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wd = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(wd),
            Some('a') => out.push_str(&wd[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`, with
/// Python's default separators (", " and ": ", or "," and ": " when
/// indenting).
fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let json = serde_json::to_value(&v)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let style = DumpStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    style.dump(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// The options of Python's `json.dumps` that templates use.
struct DumpStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl DumpStyle {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        let quoted = Json::String(s.to_string()).to_string();
        if !self.ensure_ascii {
            out.push_str(&quoted);
            return;
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }

    fn dump(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Array(a) if !a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.dump(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Json::Object(o) if !o.is_empty() => {
                let mut entries: Vec<(&String, &Json)> = o.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.dump(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            Json::String(s) => self.string(s, out),
            other => out.push_str(&other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_like_strftime() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_309;
        assert_eq!(format_time(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            format_time(t, "%A %B %j %H:%M:%S %%"),
            "Friday July 208 13:25:09 %"
        );
    }

    #[test]
    fn raise_exception_surfaces_the_templates_message() {
        let t = ChatTemplate::new(
            "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok",
            "<s>",
            "</s>",
        )
        .expect("compiles");
        let sys = serde_json::json!({"role": "system", "content": "x"});
        match t.render(&[sys], true) {
            Err(TemplateError::Raised(m)) => assert_eq!(m, "System role not supported"),
            other => panic!("expected a raised error, got {other:?}"),
        }
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "")
            .expect("compiles");
        let env = &t.env;
        let out = env
            .get_template("chat")
            .and_then(|tm| {
                tm.render(minijinja::context! { x => Value::from(minijinja::value::Serde(serde_json::json!({"a": [1, "é"], "b": {}}))) })
            })
            .expect("renders");
        assert_eq!(
            out,
            "{\"a\": [1, \"é\"], \"b\": {}}|{\n  \"a\": [\n    1,\n    \"é\"\n  ],\n  \"b\": {}\n}"
        );
    }
}
