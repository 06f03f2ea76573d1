//! Every tool-call format's forcing grammar compiles with llguidance against
//! a real tokenizer (tiny-qwen2's), and a grammar-valid call parses back to
//! the function and arguments it encodes.

use std::path::PathBuf;

use gyre_api::v1;
use gyre_engine::{ModelInfo, Sampling};
use gyre_service::structured::Grammars;
use gyre_service::tools::{FunctionSpec, ToolFormat, forcing_grammar, parse_all};
use serde_json::json;

fn model_dir(name: &str) -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join(name)
}

#[test]
fn forcing_grammars_compile_for_every_format() {
    let info = ModelInfo {
        architecture: "Qwen2ForCausalLM".into(),
        vocab_size: 151_936,
        max_model_len: 2048,
        kv_capacity_tokens: 2048,
        eos_token_ids: vec![151_645],
        bos_token_id: None,
        default_sampling: Sampling::default(),
        device: "cpu".into(),
        dtype: "Float".into(),
        draft_model: None,
    };
    let grammars = Grammars::load(
        &std::fs::read_to_string(model_dir("tiny-qwen2").join("tokenizer.json"))
            .expect("tokenizer.json"),
        &info,
    )
    .expect("token trie");
    let functions = vec![
        FunctionSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"]}),
        },
        FunctionSpec {
            name: "get_time".into(),
            parameters: serde_json::Value::Null,
        },
    ];
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Mistral,
        ToolFormat::DeepSeek,
        ToolFormat::Llama3Json,
        ToolFormat::Json,
    ] {
        for parallel in [false, true] {
            let lark = forcing_grammar(format, &functions, parallel);
            let s = v1::StructuredOutput {
                kind: Some(v1::structured_output::Kind::Grammar(lark.clone())),
            };
            let compiled = grammars.compile(&s);
            assert!(
                matches!(compiled, Ok(Some(_))),
                "{} (parallel {parallel}): {:?}\n{lark}",
                format.name(),
                compiled.err()
            );
        }
    }
    // What the grammars produce, the parsers read back.
    let samples = [
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n",
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
        ),
        (
            ToolFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            ToolFormat::Llama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
        ),
    ];
    for (format, text) in samples {
        let (content, calls) = parse_all(format, text);
        assert_eq!(content, "", "{}", format.name());
        assert_eq!(calls.len(), 1, "{}", format.name());
        assert_eq!(calls[0].name, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&calls[0].arguments).expect("json");
        assert_eq!(args, json!({"city": "Oslo"}));
    }
}
