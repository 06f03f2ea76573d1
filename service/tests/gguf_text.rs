//! The text side of a GGUF model against transformers on the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): token ids for
//! assorted text, with and without special tokens, and the chat template's
//! renders. References: `tests/fixtures/make_gguf_refs.py` (`make models`).

use std::path::PathBuf;

use gyre_service::runtime::load_text;
use serde_json::Value;

fn manifest() -> Value {
    let dir = std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"));
    let p = dir.join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make the references first: `make models`",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("manifest parses")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn smollm2_gguf_tokenizer_and_template_match_transformers() {
    let m = manifest();
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let (tok, template) = load_text(&path).expect("loads from the GGUF");
    let reference = &m["transformers"];
    let cases = reference["tokenizer_cases"].as_array().expect("cases");
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let plain = tok.encode(text, false).expect("encodes");
        assert_eq!(plain.get_ids(), ids(&case["ids"]), "ids of {text:?}");
        let with = tok.encode(text, true).expect("encodes");
        assert_eq!(
            with.get_ids(),
            ids(&case["ids_with_specials"]),
            "ids of {text:?} with specials"
        );
        let back = tok.decode(plain.get_ids(), false).expect("decodes");
        assert_eq!(back, text, "round trip of {text:?}");
    }
    let template = template.expect("the GGUF carries a chat template");
    let mut rendered = 0;
    for case in reference["cases"].as_array().expect("cases") {
        let Some(messages) = case["messages"].as_array() else {
            continue;
        };
        let text = template.render(messages, true).expect("renders");
        assert_eq!(text, case["text"].as_str().expect("text"), "chat render");
        let enc = tok.encode(text.as_str(), false).expect("encodes");
        assert_eq!(enc.get_ids(), ids(&case["prompt_ids"]), "chat prompt ids");
        rendered += 1;
    }
    assert!(rendered >= 2, "expected chat cases in the references");
}
