//! Chat templates: the model's own Jinja template (from tokenizer_config.json)
//! rendered with minijinja the way transformers' `apply_chat_template` does:
//! trim_blocks and lstrip_blocks on, Python string methods through pycompat,
//! `raise_exception`, `strftime_now`, and a `tojson` that writes what
//! Python's `json.dumps` writes.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, syntax::SyntaxConfig};
use serde::Serialize;

/// A chat message as the template sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A compiled chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: Environment<'static>,
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
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("invalid chat template: {e}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders the conversation; `add_generation_prompt` appends the
    /// assistant header.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with(
            messages,
            add_generation_prompt,
            &serde_json::Map::new(),
            false,
        )
    }

    /// Renders with extra template variables (`chat_template_kwargs`, such
    /// as `enable_thinking`) and, with `continue_final_message`, cuts the
    /// text right after the last message's content so the model continues
    /// it (as transformers does).
    pub fn render_with(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        continue_final_message: bool,
    ) -> Result<String, TemplateError> {
        if continue_final_message && add_generation_prompt {
            return Err(TemplateError::Raised(
                "continue_final_message and add_generation_prompt cannot both be true".into(),
            ));
        }
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        // The fixed variables win over kwargs of the same name.
        let ctx = minijinja::context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
            ..Value::from(minijinja::value::Serde(kwargs))
        };
        let rendered = tmpl.render(ctx).map_err(|e| {
            if e.kind() == ErrorKind::InvalidOperation
                && let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED))
            {
                return TemplateError::Raised(msg.to_string());
            }
            TemplateError::Render(format!("{e:#}"))
        })?;
        if !continue_final_message {
            return Ok(rendered);
        }
        let last = messages.last().map(|m| m.content.as_str()).unwrap_or("");
        // Some templates trim message content; fall back to the trimmed text.
        for needle in [last, last.trim()] {
            if let Some(at) = rendered.rfind(needle).filter(|_| !needle.is_empty()) {
                return Ok(rendered[..at + needle.len()].to_string());
            }
        }
        Err(TemplateError::Raised(
            "continue_final_message is set but the final message does not appear in the rendered chat".into(),
        ))
    }
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
/// indent=indent)`, with Python's separators (", " and ": ").
fn tojson(v: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&v)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    py_dumps(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn py_dumps(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let (open_sep, item_sep, close_sep) = match indent {
        Some(n) => (
            format!("\n{}", " ".repeat(n * (depth + 1))),
            format!(",\n{}", " ".repeat(n * (depth + 1))),
            format!("\n{}", " ".repeat(n * depth)),
        ),
        None => (String::new(), ", ".to_string(), String::new()),
    };
    match v {
        J::Array(a) if !a.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                py_dumps(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        J::Object(o) if !o.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push_str(": ");
                py_dumps(x, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
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
        let sys = TemplateMessage {
            role: "system".into(),
            content: "x".into(),
            name: None,
        };
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
